#!/usr/bin/env python3
"""Every layout strategy on every instance, side by side: arena per strategy and fragmentation.

    python benchmarks/layout_strategies.py                    # the minimalloc challenging CSVs
    python benchmarks/layout_strategies.py DIR_OR_CSV ...     # any minimalloc-format CSVs
    python benchmarks/layout_strategies.py --random 20        # random instances (seeded)
    python benchmarks/layout_strategies.py --model M.onnx     # a training graph's transient
                                                              # tensors, in its original order
    python benchmarks/layout_strategies.py --write-csv DIR --model M.onnx   # save instances

For each instance: buffers, peak live bytes (lower bound), then for each strategy its arena as a
multiple of the peak live bytes (1.000 = zero fragmentation), then roam's seconds and status.
For `pytorch` and `bfc` the arena is the replayed allocator's own figure (peak reserved for
PyTorch's caching allocator, peak allocated chunk bytes for ORT's BFC arena); their layouts'
`max(offset + size)` are checked like the others.  Every layout is checked for overlaps.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from layout_csv import overlaps  # noqa: E402

from roam_cli import layout  # noqa: E402
from roam_cli.layout.csv_io import read_csv, write_csv  # noqa: E402

DEFAULT_DIR = ROOT.parent / "shared" / "bench" / "minimalloc-challenging"


def random_instance(seed: int, n: int = 200, steps: int = 100) -> list[tuple[int, int, int]]:
    """Mixed short/long lifetimes, sizes aligned to 256 B."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        lo = rng.randrange(steps)
        length = rng.choice([1, 1, 2, 3, 5, 8, rng.randint(1, steps)])
        hi = min(steps, lo + length)
        size = 256 * rng.choice([1, 2, 4, 8, 16, 64, rng.randint(1, 4096)])
        out.append((lo, max(hi, lo + 1), size))
    return out


def model_instance(path: str) -> list[tuple[int, int, int]]:
    """Transient tensors of a training graph in its original node order (needs the core)."""
    from roam_cli import order
    from roam_cli.core import memory
    from roam_cli.frontend.onnx_import import import_model
    from roam_cli.pipeline import layout_buffers
    imported = import_model(Path(path), {}, False)
    mm = memory.build(imported.graph, 256, {}, None)
    chosen, _ = order.baseline(mm, "original", [n.op_type for n in imported.graph.nodes])
    return layout_buffers(mm, chosen)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="*", help="CSV files or folders of CSV files")
    ap.add_argument("--random", type=int, default=0, help="also run N random instances")
    ap.add_argument("--model", action="append", default=[], help="ONNX training graph (repeatable)")
    ap.add_argument("--time-limit", type=float, default=30.0, help="seconds for roam per instance")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--write-csv", default="", help="save every instance as CSV into this folder")
    args = ap.parse_args(argv)

    instances: list[tuple[str, list]] = []
    inputs = args.inputs or ([] if (args.random or args.model) else [str(DEFAULT_DIR)])
    for item in inputs:
        p = Path(item)
        for f in (sorted(p.glob("*.csv")) if p.is_dir() else [p]):
            instances.append((f.stem, read_csv(f)[1]))
    for m in args.model:
        instances.append((Path(m).parent.name + "/" + Path(m).stem, model_instance(m)))
    for k in range(args.random):
        instances.append((f"random-{k}", random_instance(k)))
    if args.write_csv:
        os.makedirs(args.write_csv, exist_ok=True)
        for name, bufs in instances:
            write_csv(Path(args.write_csv) / (name.replace("/", "_") + ".csv"),
                      [str(i) for i in range(len(bufs))], bufs, [0] * len(bufs))

    strategies = list(layout.STRATEGIES)
    print(f"# layout strategies: arena / peak live (1.000 = no fragmentation); roam time limit "
          f"{args.time_limit:g} s, jobs {args.jobs}; {platform.machine()} x{os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}")
    head = f"{'instance':<28} {'buffers':>7} {'peak live':>15} " + " ".join(f"{s:>11}" for s in strategies) \
        + f" {'roam s':>7}  status"
    print(head)
    print("-" * len(head))
    sums = {s: 0.0 for s in strategies}
    for name, bufs in instances:
        peak = layout.peak_live(bufs)
        cells = []
        secs = 0.0
        status = ""
        for s in strategies:
            t = time.perf_counter()
            placed = layout.place(bufs, s, time_limit=args.time_limit, jobs=args.jobs)
            if s == "roam":
                secs = time.perf_counter() - t
                status = placed.stats.get("solver_status", "")
            if overlaps(bufs, placed.offsets):
                cells.append(f"{'OVERLAP':>11}")
                continue
            figure = placed.stats.get("allocator_bytes", placed.arena)
            ratio = figure / peak if peak else 1.0
            sums[s] += ratio
            cells.append(f"{ratio:>11.4f}")
        print(f"{name[:28]:<28} {len(bufs):>7} {peak:>15,} " + " ".join(cells) + f" {secs:>7.1f}  {status}",
              flush=True)
    if instances:
        print("-" * len(head))
        print(f"{'mean':<28} {'':>7} {'':>15} " + " ".join(f"{sums[s] / len(instances):>11.4f}" for s in strategies))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
