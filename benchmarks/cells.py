"""A benchmark cell in a process of its own: killed with what it started after a timeout, its result
read from `<folder>/result.json`, or a crash line from its log. The corpus benchmarks run one model
per cell so that an exporter's crash or a hang costs that cell alone.

The parent calls `run_cell("benchmarks.AREA.NAME", CELL, folder, ...)`, which runs
`python -m benchmarks.AREA.NAME --cell CELL --out FOLDER` from the repository root; that module's
`if __name__ == "__main__": cells.serve(cell)` runs `cell(CELL, FOLDER)` and writes its result."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from benchmarks import harness


def run_cell(module: str, cell: str, folder: Path, timeout: int, fields: dict) -> dict:
    """`python -m MODULE --cell CELL --out FOLDER`; its result, with `fields` and the seconds it took."""
    folder.mkdir(parents=True, exist_ok=True)
    result = folder / "result.json"
    result.unlink(missing_ok=True)
    start = time.time()
    with open(folder / "cell.log", "w") as log:  # the exporters print their progress
        proc = subprocess.Popen([sys.executable, "-m", module, "--cell", cell, "--out", str(folder.resolve())],
                                cwd=harness.ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout)
            crash = f"cell process exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the cell and the roam it started
            proc.wait()
            crash = f"timed out after {timeout} s"
    r = json.loads(result.read_text()) if result.exists() else fields | {
        "crash": f"{crash}: {last_line(folder / 'cell.log')}"}
    return r | {"seconds": round(time.time() - start, 1)}


def serve(cell: Callable[[str, Path], dict]) -> None:
    """The cell process's side: `--cell CELL --out FOLDER` -> `cell(CELL, FOLDER)` into FOLDER/result.json."""
    p = argparse.ArgumentParser(description="one benchmark cell, run by benchmarks.cells.run_cell")
    p.add_argument("--cell", required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    result = cell(a.cell, a.out)
    (a.out / "result.json").write_text(json.dumps(result, indent=1))


def last_line(path: Path) -> str:
    lines = path.read_text(errors="replace").strip().splitlines()
    return lines[-1][:300] if lines else ""
