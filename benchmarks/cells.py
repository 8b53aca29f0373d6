"""A benchmark cell in a process of its own: killed with what it started after a timeout, its result
read from `<folder>/result.json`, or a crash line from its log. The corpus benchmarks run one model
per cell so that an exporter's crash or a hang costs that cell alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def run_cell(script: str, cell: str, folder: Path, timeout: int, fields: dict) -> dict:
    """`python script --cell CELL --out FOLDER`; its result, with `fields` and the seconds it took."""
    folder.mkdir(parents=True, exist_ok=True)
    result = folder / "result.json"
    result.unlink(missing_ok=True)
    start = time.time()
    with open(folder / "cell.log", "w") as log:  # the exporters print their progress
        proc = subprocess.Popen([sys.executable, script, "--cell", cell, "--out", str(folder)],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
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


def last_line(path: Path) -> str:
    lines = path.read_text(errors="replace").strip().splitlines()
    return lines[-1][:300] if lines else ""
