#!/usr/bin/env python3
"""Every ordering strategy on every graph, side by side in one run: peak live bytes and seconds.

    python benchmarks/order.py                                  # the sample model
    python benchmarks/order.py /work/suite_cache --time-limit 60 --jobs 2
    python benchmarks/order.py model.onnx --reach 600           # + time for ilp-global to reach roam's peak

A folder is searched for training graphs (`training_model.onnx`, `full_step*.onnx`). Per graph:
the baselines (`original`, `ort`, `greedy`), `ilp-global` (one ILP over the whole graph, warm
started from `original`, given the same --time-limit as roam) and `roam`. With --reach S the
global ILP also runs cold (no warm start) until it finds an order as good as roam's, for at
most S seconds: that time over roam's is the speed-up the ROAM paper reports (53.7x there).

Prints a markdown table and writes it with the raw numbers to --out (.md and .json)."""

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from roam_cli import order
from roam_cli.core import memory
from roam_cli.frontend.onnx_import import import_model
from roam_cli.order import ilp
from roam_cli.order.problem import from_memory_model, peak
from roam_cli.solvers import milp

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_models" / "gpt2_tiny" / "training_model.onnx"
PATTERNS = ("training_model.onnx", "full_step*.onnx")
MIB = 2**20


def graphs(paths: list[Path]) -> list[Path]:
    found = []
    for p in paths:
        if p.is_dir():
            found += sorted(f for pattern in PATTERNS for f in p.rglob(pattern))
        else:
            found.append(p)
    return found


def label(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def measure(path: Path, time_limit: float, jobs: int, solver: str, reach: float | None) -> dict:
    graph = import_model(path).graph
    mm = memory.build(graph)
    ops = [n.op_type for n in graph.nodes]
    row = {"graph": label(path), "nodes": len(graph.nodes), "peak": {}, "seconds": {}}
    measured = order.baselines(mm, ops)
    for name, b in measured.items():
        row["peak"][name], row["seconds"][name] = b["peak_live_bytes"], b["seconds"]
    for strategy in ("ilp-global", "roam"):
        start = time.perf_counter()
        found, stats = order.solve(mm, strategy, op_types=ops, time_limit=time_limit, jobs=jobs, solver=solver,
                                   measured=measured)
        row["seconds"][strategy] = time.perf_counter() - start
        row["peak"][strategy] = order.peak_of(mm, found)
        row[strategy] = stats
    if reach is not None:
        start = time.perf_counter()
        found = ilp.reach(from_memory_model(mm), row["peak"]["roam"], start + reach, solver)
        row["reach_seconds"] = time.perf_counter() - start if found is not None else None
        if found is not None:
            assert peak(from_memory_model(mm), found) <= row["peak"]["roam"]
    return row


def table(rows: list[dict], reach: float | None) -> str:
    strategies = ("original", "ort", "greedy", "ilp-global", "roam")
    head = (["graph", "nodes", "reduced"] + [f"{s} MiB" for s in strategies]
            + ["roam vs original", "lower bound MiB", "roam proven", "ilp-global status"]
            + [f"{s} s" for s in strategies])
    if reach is not None:
        head += ["ilp-global cold to roam's peak s", "speed-up"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        roam = r["roam"]
        cells = [r["graph"], str(r["nodes"]), str(roam["reduced_nodes"])]
        cells += [f"{r['peak'][s] / MIB:.3f}" for s in strategies]
        cells += [f"{1 - r['peak']['roam'] / r['peak']['original']:.1%}" if r["peak"]["original"] else "0.0%",
                  f"{roam['lower_bound_bytes'] / MIB:.3f}", "yes" if roam["proven_optimal"] else "no",
                  r["ilp-global"]["status"]]
        cells += [f"{r['seconds'][s]:.2f}" for s in strategies]
        if reach is not None:
            t = r.get("reach_seconds")
            cells += [f"{t:.1f}" if t is not None else f"> {reach:.0f}",
                      f"{t / r['seconds']['roam']:.0f}x" if t is not None else f"> {reach / r['seconds']['roam']:.0f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="*", type=Path, default=[SAMPLE], help="ONNX graphs or folders of them")
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds for roam and for ilp-global, per graph")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--solver", choices=milp.SOLVERS, default="cbc")
    p.add_argument("--reach", type=float, default=None, metavar="SECONDS",
                   help="also time the cold global ILP until it matches roam's peak, at most this long")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "order",
                   help="write OUT.md and OUT.json")
    args = p.parse_args()
    paths = graphs(args.paths)
    if not paths:
        sys.exit("no graphs found")
    rows = []
    for path in paths:
        print(f"{label(path)} ...", file=sys.stderr, flush=True)
        rows.append(measure(path, args.time_limit, args.jobs, args.solver, args.reach))
    text = (f"Ordering strategies, peak live transient bytes (MiB) and seconds; --time-limit {args.time_limit:g} s "
            f"for roam and ilp-global, --jobs {args.jobs}, solver {args.solver}. Machine: {machine()}.\n"
            "ilp-global starts from original: 'not improved' keeps it; 'too large' is a model over "
            f"{ilp.MAX_VARIABLES:,} variables, refused at once.\n\n"
            + table(rows, args.reach) + "\n")
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps({"machine": machine(), "args": {
        "time_limit": args.time_limit, "jobs": args.jobs, "solver": args.solver, "reach": args.reach},
        "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
