"""Every layout strategy on every instance, side by side: each one's arena over the peak of live bytes.

For each instance: buffers, peak live bytes (the lower bound), then for each strategy of
`roam_cli.layout.STRATEGIES` its arena as a multiple of the peak (1.000 = zero fragmentation), and
roam's seconds and status. For `pytorch` and `bfc` the arena is the replayed allocator's own figure
(peak reserved for PyTorch's caching allocator, peak allocated chunk bytes for ORT's BFC arena);
their layouts' `max(offset + size)` are checked like the others. Every layout is checked for
overlaps (a layout that overlaps counts as null).

    python -m benchmarks run order_layout/layout_strategies            # minimalloc's challenging CSVs
    python -m benchmarks run order_layout/layout_strategies DIR_OR_CSV ...   # any minimalloc-format CSVs
    python -m benchmarks run order_layout/layout_strategies.random --random 20   # random instances (seeded)
    python -m benchmarks run order_layout/layout_strategies.models --model M.onnx   # a training graph's
                                                 # transient tensors, in its original order

By default the instances of a clone of google/minimalloc in benchmarks/.cache/minimalloc (see
layout_csv). `python -m benchmarks.order_layout.layout_strategies --write-csv DIR [same inputs]`
saves the instances as minimalloc CSVs instead. Needs only roam; under a minute on the challenging
instances."""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

from benchmarks import harness
from benchmarks.order_layout.layout_csv import CLONE, MINIMALLOC, overlaps
from roam_cli import layout
from roam_cli.layout.csv_io import read_csv, write_csv

TAKES = "under a minute on minimalloc's challenging instances (a clone in benchmarks/.cache/minimalloc)"


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


def model_instance(path: Path) -> list[tuple[int, int, int]]:
    """Transient tensors of a training graph in its original node order."""
    from roam_cli import order
    from roam_cli.core import memory
    from roam_cli.frontend.onnx_import import import_model
    from roam_cli.pipeline import layout_buffers
    imported = import_model(path, {}, False)
    mm = memory.build(imported.graph, 256, {}, None)
    chosen, _ = order.baseline(mm, "original", [n.op_type for n in imported.graph.nodes])
    return layout_buffers(mm, chosen)


def parser(prog: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="*", type=Path, help="CSV files or folders of CSV files")
    ap.add_argument("--random", type=int, default=0, help="also run N random instances")
    ap.add_argument("--model", type=Path, action="append", default=[], help="ONNX training graph (repeatable)")
    ap.add_argument("--time-limit", type=float, default=30.0, help="seconds for roam per instance")
    ap.add_argument("--jobs", type=int, default=1)
    return ap


def instances(args) -> list[tuple[str, list]]:
    found: list[tuple[str, list]] = []
    inputs = args.inputs or ([] if (args.random or args.model)
                             else [harness.needs(MINIMALLOC / "benchmarks" / "challenging", CLONE)])
    for p in inputs:
        for f in (sorted(p.glob("*.csv")) if p.is_dir() else [p]):
            found.append((f.stem, read_csv(f)[1]))
    for m in args.model:
        found.append((m.parent.name + "/" + m.stem, model_instance(m)))
    for k in range(args.random):
        found.append((f"random-{k}", random_instance(k)))
    return found


def main(argv: list[str]) -> dict:
    args = parser("python -m benchmarks run order_layout/layout_strategies").parse_args(argv)
    strategies = list(layout.STRATEGIES)
    rows = []
    for name, bufs in instances(args):
        peak = layout.peak_live(bufs)
        row = {"instance": name, "buffers": len(bufs), "peak_live": peak, "ratio": {}}
        for s in strategies:
            t = time.perf_counter()
            placed = layout.place(bufs, s, time_limit=args.time_limit, jobs=args.jobs)
            if s == "roam":
                row["roam_s"] = round(time.perf_counter() - t, 3)
                row["status"] = placed.stats.get("solver_status", "")
            figure = placed.stats.get("allocator_bytes", placed.arena)
            row["ratio"][s] = None if overlaps(bufs, placed.offsets) else (figure / peak if peak else 1.0)
        rows.append(row)
        print(f"{name}: roam {row['roam_s']:.1f} s {row['status']}", file=sys.stderr, flush=True)
    return {"time_limit": args.time_limit, "jobs": args.jobs, "strategies": strategies, "rows": rows}


def table(results: dict) -> str:
    strategies, rows = results["strategies"], results["rows"]
    lines = [[r["instance"], f"{r['buffers']:,}", f"{r['peak_live']:,}"]
             + ["OVERLAP" if r["ratio"][s] is None else f"{r['ratio'][s]:.4f}" for s in strategies]
             + [f"{r['roam_s']:.1f}", r["status"]] for r in rows]
    if rows:
        lines.append(["mean", "", ""] + [f"{sum(r['ratio'][s] or 0 for r in rows) / len(rows):.4f}"
                                         for s in strategies] + ["", ""])
    return (harness.markdown_table(["instance", "buffers", "peak live B", *strategies, "roam s", "roam status"],
                                   lines, "lrr" + "r" * len(strategies) + "rl")
            + f"\nArena (for pytorch and bfc: the replayed allocator's own figure) over the peak of live bytes: "
            f"1.0000 is no fragmentation. roam's time limit {results['time_limit']:g} s per instance, --jobs "
            f"{results['jobs']}.\n")


if __name__ == "__main__":  # only --write-csv: the instances saved as minimalloc CSVs
    ap = parser("python -m benchmarks.order_layout.layout_strategies")
    ap.add_argument("--write-csv", type=Path, required=True, help="save every instance as CSV into this folder")
    a = ap.parse_args()
    a.write_csv.mkdir(parents=True, exist_ok=True)
    for name, bufs in instances(a):
        write_csv(a.write_csv / (name.replace("/", "_") + ".csv"), [str(i) for i in range(len(bufs))], bufs,
                  [0] * len(bufs))
