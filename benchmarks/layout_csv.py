#!/usr/bin/env python3
"""Run the `roam` layout engine on every minimalloc-format CSV in a folder, as a decision
problem at a fixed capacity, and print one row per instance.

    python benchmarks/layout_csv.py                       # ../shared/bench/minimalloc-challenging
    python benchmarks/layout_csv.py DIR --capacity 1048576 --time-limit 60 --jobs 2
    python benchmarks/layout_csv.py --only A,B,C          # a subset (file-name prefixes)

Columns: instance, buffers, peak live bytes (the lower bound), height of the layout found,
whether it fits the capacity, seconds (wall clock, including the heuristics), solver status and
search nodes.  Every layout is checked for overlaps before it is reported.  The machine is
printed in the header (CPU count, Python); timings depend on it and on its load.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from roam_cli import layout  # noqa: E402
from roam_cli.layout.csv_io import read_csv  # noqa: E402

DEFAULT_DIR = ROOT.parent / "shared" / "bench" / "minimalloc-challenging"


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", default=str(DEFAULT_DIR))
    ap.add_argument("--capacity", type=int, default=1_048_576)
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per instance")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--only", default="", help="comma-separated file-name prefixes")
    args = ap.parse_args(argv)
    files = sorted(Path(args.folder).glob("*.csv"))
    if args.only:
        keep = tuple(args.only.split(","))
        files = [f for f in files if f.name.startswith(keep)]
    if not files:
        print(f"no CSV files in {args.folder}", file=sys.stderr)
        return 2
    print(f"# roam layout-csv benchmark: capacity {args.capacity:,}, time limit {args.time_limit:g} s, "
          f"jobs {args.jobs}; {platform.machine()} x{os.cpu_count()} CPUs, Python {platform.python_version()}")
    head = f"{'instance':<16} {'buffers':>7} {'peak live':>11} {'height':>11} {'fits':>5} {'seconds':>8}  {'status':<12} {'nodes':>9}"
    print(head)
    print("-" * len(head))
    solved = 0
    total_s = 0.0
    for f in files:
        ids, buffers = read_csv(f)
        t = time.perf_counter()
        placed = layout.place(buffers, "roam", time_limit=args.time_limit, jobs=args.jobs,
                              capacity=args.capacity)
        secs = time.perf_counter() - t
        total_s += secs
        bad = overlaps(buffers, placed.offsets)
        fits = placed.arena <= args.capacity and bad == 0
        solved += fits
        st = placed.stats
        print(f"{f.stem:<16} {len(buffers):>7} {layout.peak_live(buffers):>11,} {placed.arena:>11,} "
              f"{'yes' if fits else 'no':>5} {secs:>8.1f}  {st.get('solver_status', ''):<12} "
              f"{st.get('search_nodes', 0):>9}" + (f"  OVERLAPS: {bad}" if bad else ""), flush=True)
    print("-" * len(head))
    print(f"fits: {solved} of {len(files)}; total {total_s:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
