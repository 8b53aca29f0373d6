"""roam's layout engine and google/minimalloc side by side on minimalloc's challenging instances, as a
decision problem at one capacity: whether each fits, and each one's seconds.

    git clone https://github.com/google/minimalloc benchmarks/.cache/minimalloc   # its source and instances
    python -m benchmarks run order_layout/layout_csv                  # its benchmarks/challenging/*.csv
    python -m benchmarks run order_layout/layout_csv DIR --capacity 1048576 --time-limit 60 --jobs 1
    python -m benchmarks run order_layout/layout_csv --only A,B,C     # a subset (file-name prefixes)

The eleven challenging instances fit a capacity of 1,048,576; in 8 of them the peak of live bytes is
exactly that, so only a layout with zero fragmentation fits. minimalloc is built from the clone's
source in this run's temp folder (never part of roam); the build needs g++, pkg-config and abseil
(Debian: apt-get install -y g++ pkg-config libabsl-dev); without them the results have roam's side
only and say why. Debian's abseil (20220623) lacks the logging library minimalloc's main.cc and
converter.cc need, so the build compiles minimalloc's solver sources (minimalloc, solver, sweeper,
validator .cc) with minimalloc_run.cc beside this file, our driver, and a one-line stand-in for
absl/log/log.h (solver.cc only uses DLOG, which a -DNDEBUG build compiles out anyway). Flags: -O3
-DNDEBUG, as a CMake Release build.

Times: minimalloc's Solve() as its driver measures it; roam's layout.place() (heuristics, search)
in this process; neither includes reading the CSV. Both get the same capacity and time limit, run
one after the other on the same instance. Every layout, minimalloc's too, is checked here (no
overlap between buffers live together, every top within the capacity) before it counts. About two
minutes (minimalloc takes seconds per instance, roam under one)."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness
from roam_cli import layout
from roam_cli.layout.csv_io import read_csv

TAKES = "about 2 min; needs a clone of google/minimalloc in benchmarks/.cache/minimalloc, g++ and libabsl-dev"
MINIMALLOC = harness.CACHE / "minimalloc"
CLONE = "git clone https://github.com/google/minimalloc benchmarks/.cache/minimalloc"
DRIVER = Path(__file__).resolve().parent / "minimalloc_run.cc"
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
    """Compile minimalloc's solver with our driver in ``work``: (binary, "commit ...") or (None, why)."""
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
        return None, f"no minimalloc source at {src} ({CLONE}, or pass one with --minimalloc)"
    stand_in = tree / "shim" / "absl" / "log" / "log.h"
    stand_in.parent.mkdir(parents=True)
    stand_in.write_text("#pragma once\n#include <iostream>\n#define DLOG(severity) if (true) {} else std::cerr\n")
    binary = work / "minimalloc_run"
    cmd = ["g++", "-O3", "-DNDEBUG", "-std=c++20", f"-I{tree / 'shim'}", f"-I{tree / 'src'}",
           str(DRIVER), *(str(tree / "src" / f) for f in SOLVER_SOURCES), "-o", str(binary), *libs.stdout.split()]
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


def main(argv: list[str]) -> dict:
    ap = harness.options(__name__, __doc__)
    ap.add_argument("folder", nargs="?", type=Path, help="minimalloc-format CSVs (default: the clone's "
                    "benchmarks/challenging)")
    ap.add_argument("--capacity", type=int, default=1_048_576)
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per instance, each solver")
    ap.add_argument("--jobs", type=int, default=1, help="roam's processes (minimalloc uses one)")
    ap.add_argument("--only", default="", help="comma-separated file-name prefixes")
    ap.add_argument("--minimalloc", type=Path, default=MINIMALLOC, help="minimalloc's source (a clone or a bare "
                    "git directory; default benchmarks/.cache/minimalloc)")
    args = ap.parse_args(argv)
    folder = args.folder or harness.needs(MINIMALLOC / "benchmarks" / "challenging", CLONE)
    files = sorted(folder.glob("*.csv"))
    if args.only:
        files = [f for f in files if f.name.startswith(tuple(args.only.split(",")))]
    if not files:
        sys.exit(f"no CSV files in {folder}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="roam-layout-bench-") as tmp:
        work = Path(tmp)
        binary, note = build_minimalloc(args.minimalloc.resolve(), work)
        print(f"minimalloc: {'built, ' + note if binary else 'not run: ' + note}", file=sys.stderr)
        for f in files:
            _, buffers = read_csv(f)
            mm_s, mm_fits = (run_minimalloc(binary, f, buffers, args.capacity, args.time_limit, work)
                             if binary else (None, None))
            t = time.perf_counter()
            placed = layout.place(buffers, "roam", time_limit=args.time_limit, jobs=args.jobs, capacity=args.capacity)
            roam_s = time.perf_counter() - t
            rows.append({"instance": f.stem, "buffers": len(buffers), "peak_live": layout.peak_live(buffers),
                         "roam_height": placed.arena, "roam_fits": valid(buffers, placed.offsets, args.capacity),
                         "roam_s": round(roam_s, 3), "minimalloc_fits": mm_fits,
                         "minimalloc_s": None if mm_s is None else round(mm_s, 3)})
            print(f"{f.stem}: roam {roam_s:.2f} s, minimalloc {mm_s} s", file=sys.stderr, flush=True)
    return {"capacity": args.capacity, "time_limit": args.time_limit, "jobs": args.jobs,
            "minimalloc": note if binary else None, "minimalloc_not_run": None if binary else note,
            "load_average": [round(v, 2) for v in os.getloadavg()], "rows": rows}


def summary(results: dict) -> dict:
    """How many fit each way, and minimalloc's seconds over roam's where both fit."""
    rows = results["rows"]
    both = [r for r in rows if r["roam_fits"] and r["minimalloc_fits"]]
    ratios = [r["minimalloc_s"] / r["roam_s"] for r in both if r["roam_s"] > 0]
    return {"instances": len(rows), "roam_fits": sum(r["roam_fits"] for r in rows),
            "minimalloc_fits": sum(bool(r["minimalloc_fits"]) for r in rows),
            "roam_s": sum(r["roam_s"] for r in rows),
            "minimalloc_s": sum(r["minimalloc_s"] or 0 for r in rows) if results["minimalloc"] else None,
            "median_speedup": statistics.median(ratios) if ratios else None,
            "roam_faster": sum(r["roam_fits"] and (not r["minimalloc_fits"] or r["roam_s"] < r["minimalloc_s"])
                               for r in rows)}


def table(results: dict) -> str:
    ran = results["minimalloc"] is not None
    rows = [[r["instance"], f"{r['buffers']:,}", f"{r['peak_live']:,}", f"{r['roam_height']:,}",
             "yes" if r["roam_fits"] else "no", f"{r['roam_s']:.2f}",
             ("yes" if r["minimalloc_fits"] else "no") if ran else "–",
             "–" if r["minimalloc_s"] is None else f"{r['minimalloc_s']:.2f}",
             f"{r['minimalloc_s'] / r['roam_s']:,.1f}x" if r["roam_fits"] and r["minimalloc_fits"] and r["roam_s"]
             else "–"] for r in results["rows"]]
    s = summary(results)
    text = harness.markdown_table(["instance", "buffers", "peak live B", "roam height B", "roam fits", "roam s",
                                   "minimalloc fits", "minimalloc s", "minimalloc s / roam s"], rows)
    who = (f"minimalloc ({results['minimalloc']}) fits {s['minimalloc_fits']} of {s['instances']} in "
           f"{s['minimalloc_s']:.1f} s; " if ran else f"minimalloc not run: {results['minimalloc_not_run']}; ")
    speed = f", median {s['median_speedup']:.0f}x faster where both fit" if s["median_speedup"] else ""
    return (text + f"\nCapacity {results['capacity']:,} B, time limit {results['time_limit']:g} s per instance and "
            f"solver, roam --jobs {results['jobs']}. {who}roam fits {s['roam_fits']} of {s['instances']} in "
            f"{s['roam_s']:.1f} s{speed}. Every layout checked here (no overlap, within the capacity).\n")
