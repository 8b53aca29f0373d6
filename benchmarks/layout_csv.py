#!/usr/bin/env python3
"""roam's layout engine and google/minimalloc side by side on minimalloc-format CSVs, as a
decision problem at one capacity: one row per instance, both times and their ratio.

    python benchmarks/layout_csv.py                       # ../shared/bench/minimalloc-challenging
    python benchmarks/layout_csv.py DIR --capacity 1048576 --time-limit 60 --jobs 1
    python benchmarks/layout_csv.py --only A,B,C          # a subset (file-name prefixes)
    python benchmarks/layout_csv.py --minimalloc SRC      # minimalloc's source (see below)

minimalloc is built from its public source in this run's temp folder (never part of roam):
SRC is a checkout of github.com/google/minimalloc or a bare git directory of it; by default the
search tool's fetch location (/work/.mirror/google+minimalloc/repo).  The build needs g++,
pkg-config and abseil (Debian: apt-get install -y g++ pkg-config libabsl-dev); without them the
table has roam's side only, and the header says why.  Debian's abseil (20220623) lacks the
logging library minimalloc's main.cc and converter.cc need, so the build compiles minimalloc's
solver sources (minimalloc, solver, sweeper, validator .cc) with benchmarks/minimalloc_run.cc,
our driver, and a one-line stand-in for absl/log/log.h (solver.cc only uses DLOG, which a
-DNDEBUG build compiles out anyway).  Flags: -O3 -DNDEBUG, as a CMake Release build.

Times: minimalloc's Solve() as its driver measures it; roam's layout.place() (heuristics, search)
in this process; neither includes reading the CSV.  Both get the same capacity and time limit,
run one after the other on the same instance.  Every layout, minimalloc's too, is checked here
(no overlap between buffers live together, every top within the capacity) before it counts.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from roam_cli import layout  # noqa: E402
from roam_cli.layout.csv_io import read_csv  # noqa: E402

DEFAULT_DIR = ROOT.parent / "shared" / "bench" / "minimalloc-challenging"
DEFAULT_MINIMALLOC = Path("/work/.mirror/google+minimalloc/repo")
SOLVER_SOURCES = ("minimalloc.cc", "solver.cc", "sweeper.cc", "validator.cc")
ABSL = ("absl_statusor", "absl_flat_hash_map", "absl_flat_hash_set", "absl_btree", "absl_time",
        "absl_strings")


def overlaps(buffers, offsets) -> int:
    """Number of pairs that are live together and overlap in address (must be 0)."""
    order = sorted(range(len(buffers)), key=lambda i: buffers[i][0])
    bad = 0
    active: list[int] = []
    for i in order:
        lo, hi, size = buffers[i]
        active = [j for j in active if buffers[j][1] > lo]
        for j in active:
            if size and buffers[j][2] and offsets[i] < offsets[j] + buffers[j][2] and offsets[j] < offsets[i] + size:
                bad += 1
        active.append(i)
    return bad


def valid(buffers, offsets, capacity) -> bool:
    return (len(offsets) == len(buffers) and all(o >= 0 for o in offsets)
            and max(o + b[2] for o, b in zip(offsets, buffers)) <= capacity and not overlaps(buffers, offsets))


def build_minimalloc(src: Path, work: Path) -> tuple[Path | None, str]:
    """Compile minimalloc's solver with our driver in ``work``: (binary, "") or (None, why)."""
    if shutil.which("g++") is None or shutil.which("pkg-config") is None:
        return None, "needs g++ and pkg-config (apt-get install -y g++ pkg-config libabsl-dev)"
    libs = subprocess.run(["pkg-config", "--libs", *ABSL], capture_output=True, text=True)
    if libs.returncode:
        return None, "abseil not found (apt-get install -y libabsl-dev)"
    tree = work / "minimalloc"
    if (src / "src" / "solver.cc").is_file():
        shutil.copytree(src / "src", tree / "src")
    elif (src / "HEAD").is_file():  # a bare git directory
        tree.mkdir()
        archive = subprocess.run(["git", f"--git-dir={src}", "archive", "HEAD", "src"], capture_output=True)
        if archive.returncode:
            return None, f"cannot read {src}: {archive.stderr.decode().strip()}"
        subprocess.run(["tar", "x", "-C", str(tree)], input=archive.stdout, check=True)
    else:
        return None, (f"no minimalloc source at {src} (git clone https://github.com/google/minimalloc, "
                      "or the search tool's fetch of github:google/minimalloc; pass it with --minimalloc)")
    stand_in = tree / "shim" / "absl" / "log" / "log.h"
    stand_in.parent.mkdir(parents=True)
    stand_in.write_text("#pragma once\n#include <iostream>\n#define DLOG(severity) if (true) {} else std::cerr\n")
    binary = work / "minimalloc_run"
    cmd = ["g++", "-O3", "-DNDEBUG", "-std=c++20", f"-I{tree / 'shim'}", f"-I{tree / 'src'}",
           str(ROOT / "benchmarks" / "minimalloc_run.cc"), *(str(tree / "src" / f) for f in SOLVER_SOURCES),
           "-o", str(binary), *libs.stdout.split()]
    built = subprocess.run(cmd, capture_output=True, text=True)
    if built.returncode:
        return None, "build failed: " + (built.stderr.strip().splitlines() or ["?"])[-1]
    git_dir = src if (src / "HEAD").is_file() else src / ".git"
    commit = subprocess.run(["git", f"--git-dir={git_dir}", "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    return binary, f"commit {commit}" if commit else "a copy without git history"


def run_minimalloc(binary, csv, buffers, capacity, time_limit, work):
    """(seconds | None, fits): minimalloc's own time, and whether its layout passed our check."""
    out = work / "offsets.txt"
    try:
        done = subprocess.run([str(binary), str(csv), str(capacity), str(time_limit), str(out)],
                              capture_output=True, text=True, timeout=time_limit + 30)
    except subprocess.TimeoutExpired:
        return None, False
    words = done.stdout.split()
    if len(words) < 2:
        return None, False
    if words[0] != "solved":
        return float(words[1]), False
    offsets = [int(v) for v in out.read_text().split()]
    return float(words[1]), valid(buffers, offsets, capacity)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", default=str(DEFAULT_DIR))
    ap.add_argument("--capacity", type=int, default=1_048_576)
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per instance, each solver")
    ap.add_argument("--jobs", type=int, default=1, help="roam's processes (minimalloc uses one)")
    ap.add_argument("--only", default="", help="comma-separated file-name prefixes")
    ap.add_argument("--minimalloc", type=Path, default=DEFAULT_MINIMALLOC, help="minimalloc's source")
    args = ap.parse_args(argv)
    files = sorted(Path(args.folder).glob("*.csv"))
    if args.only:
        keep = tuple(args.only.split(","))
        files = [f for f in files if f.name.startswith(keep)]
    if not files:
        print(f"no CSV files in {args.folder}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="roam-layout-bench-") as tmp:
        work = Path(tmp)
        binary, note = build_minimalloc(args.minimalloc.resolve(), work)
        load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
        print(f"# layout benchmark: capacity {args.capacity:,}, time limit {args.time_limit:g} s per solver, "
              f"roam jobs {args.jobs}; {platform.machine()} x{os.cpu_count()} CPUs, load average {load}, "
              f"Python {platform.python_version()}")
        print(f"# minimalloc: {f'built from {args.minimalloc} ({note})' if binary else 'not run: ' + note}")
        head = (f"{'instance':<12} {'buffers':>7} {'peak live':>11} {'roam height':>11} {'roam fits':>9} "
                f"{'roam s':>8} {'minimalloc fits':>15} {'minimalloc s':>12} {'minimalloc/roam':>15}")
        print(head)
        print("-" * len(head))
        fits = {"roam": 0, "minimalloc": 0}
        faster = 0
        for f in files:
            ids, buffers = read_csv(f)
            mm_s, mm_fits = (run_minimalloc(binary, f, buffers, args.capacity, args.time_limit, work)
                             if binary else (None, False))
            t = time.perf_counter()
            placed = layout.place(buffers, "roam", time_limit=args.time_limit, jobs=args.jobs,
                                  capacity=args.capacity)
            roam_s = time.perf_counter() - t
            roam_fits = valid(buffers, placed.offsets, args.capacity)
            fits["roam"] += roam_fits
            fits["minimalloc"] += mm_fits
            ratio = f"{mm_s / roam_s:.1f}x" if roam_fits and mm_fits and roam_s > 0 else "-"
            faster += roam_fits and (not mm_fits or roam_s < mm_s)
            print(f"{f.stem:<12} {len(buffers):>7} {layout.peak_live(buffers):>11,} {placed.arena:>11,} "
                  f"{'yes' if roam_fits else 'no':>9} {roam_s:>8.2f} "
                  f"{('yes' if mm_fits else 'no') if binary else '-':>15} "
                  f"{f'{mm_s:.2f}' if mm_s is not None else '-':>12} {ratio:>15}", flush=True)
        print("-" * len(head))
        print(f"fits (checked here): roam {fits['roam']} of {len(files)}, minimalloc "
              f"{fits['minimalloc'] if binary else '-'} of {len(files)}; roam fits and is faster on "
              f"{faster} of {len(files)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
