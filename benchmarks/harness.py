"""What every benchmark repeats, written once: where its results go, the machine and commit they were
measured on, its wall and CPU seconds and peak memory, and its tables.

A benchmark is a module `benchmarks/AREA/NAME.py` holding
    TAKES                   one line: how long it runs on the 2-core development machine and what it
                            needs beyond roam's install (`python -m benchmarks list` prints it)
    main(argv) -> results   parses its own options, measures, returns plain JSON values
    table(results) -> str   those results as markdown (printed, and BENCHMARKS.md's section)
`python -m benchmarks run AREA/NAME [options]` calls `main` under `Measured` and writes
`benchmarks/results/AREA/NAME.json`: the results beside the command that made them, the date, the
machine, the commit and the costs. BENCHMARKS.md and the README's results table are written from
those files alone (`python -m benchmarks md`)."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

from roam_cli.core.fileio import write_atomic

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
# What benchmarks build for themselves (exported suites, corpora): inside the repository, ignored by git.
CACHE = ROOT / "benchmarks" / ".cache"
MIB = 2**20


def machine() -> dict:
    """The machine in the words a reader compares by: cores, memory, CPU, OS, Python, onnxruntime."""
    try:
        import onnxruntime
        ort = onnxruntime.__version__
    except ImportError:
        ort = None
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"cores": os.cpu_count(), "memory_gib": round(memory / 2**30), "cpu": cpu_name(),
            "system": f"{platform.system()} {platform.machine()}", "python": platform.python_version(),
            "onnxruntime": ort}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def commit() -> str | None:
    """HEAD's hash, with "+changes" when the work tree differs from it; None outside a clone."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    head = git("rev-parse", "--short=12", "HEAD")
    if head.returncode != 0:
        return None
    dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    return head.stdout.strip() + ("+changes" if dirty else "")


class Measured:
    """Wall and CPU seconds (this process and the children it waited for) and peak RSS of a block, and
    the machine's load when it began (the timings of a shared machine depend on it)."""

    def __enter__(self):
        self.wall = time.perf_counter()
        self.cpu = cpu_seconds()
        self.load = round(os.getloadavg()[0], 2)
        return self

    def __exit__(self, *exc):
        self.wall_s = round(time.perf_counter() - self.wall, 1)
        self.cpu_s = round(cpu_seconds() - self.cpu, 1)
        # ru_maxrss is KiB on Linux: the largest of this process and of any one child
        self.peak_rss_mib = round(max(resource.getrusage(who).ru_maxrss
                                      for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024)


def cpu_seconds() -> float:
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                   resource.getrusage(resource.RUSAGE_CHILDREN)))


def record(name: str, argv: list[str], results, cost: Measured) -> dict:
    """The results file's content: the results beside everything needed to trust and remake them."""
    command = " ".join(["python -m benchmarks run", name, *argv])
    return {"benchmark": name, "command": command, "date": datetime.date.today().isoformat(),
            "machine": machine(), "commit": commit(), "wall_s": cost.wall_s, "cpu_s": cost.cpu_s,
            "peak_rss_mib": cost.peak_rss_mib, "load_at_start": cost.load, "results": results}


def results_path(name: str) -> Path:
    return RESULTS / f"{name}.json"


def save(path: Path, content: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(content, indent=1) + "\n")


def load(name: str) -> dict:
    """The saved record of benchmark `name` (AREA/NAME, or AREA/NAME.VARIANT for a second run)."""
    return json.loads(results_path(name).read_text())


def options(module: str, doc: str) -> argparse.ArgumentParser:
    """The option parser of the benchmark whose `__name__` is `module`, named as `run` calls it."""
    name = "/".join(module.split(".")[1:])
    return argparse.ArgumentParser(prog=f"python -m benchmarks run {name}", description=doc.strip().split("\n", 1)[0])


def needs_torch(torch, module: str) -> None:
    """Stops in one line where the benchmark `module` (its `__name__`) found no torch."""
    if torch is None:
        name = "/".join(module.split(".")[1:])
        sys.exit(f"{name} needs the bench extra (torch, transformers): pip install -e '.[bench]'")


def quiet_torch(torch, threads: int = 1) -> None:
    """torch's exporters warn about every traced Hugging Face construct: warnings and log lines off,
    and torch on `threads` threads (the cells run side by side)."""
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(threads)


def markdown_table(header: list[str], rows: list[list], align: str | None = None) -> str:
    """A markdown table; `align` one letter per column, "l" or "r" (default: first column left)."""
    align = align or "l" + "r" * (len(header) - 1)
    rule = ["---" if a == "l" else "---:" for a in align]
    lines = [header, rule, *rows]
    return "\n".join("| " + " | ".join(str(c) for c in line) + " |" for line in lines) + "\n"


def mib(n: float | None, digits: int = 0) -> str:
    return "–" if n is None else f"{n / MIB:,.{digits}f}"


def signed_percent(share: float, digits: int = 1) -> str:
    """A change as the pages write it, with a real minus sign: −35.1 %, +1.9 %."""
    return f"{100 * share:+.{digits}f} %".replace("-", "−")


def gib(n: float | None, digits: int = 2) -> str:
    return "–" if n is None else f"{n / 2**30:,.{digits}f}"


def needs(path: Path, how: str) -> Path:
    """`path` if it exists; else the benchmark stops with one line saying how to make it."""
    if not path.exists():
        sys.exit(f"{path} is missing: {how}")
    return path
