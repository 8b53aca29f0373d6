"""Every ordering strategy on every graph, side by side in one run: peak live bytes and seconds.

Per graph: the baselines (`original`, `ort`, `greedy`), `ilp-global` (one ILP over the whole graph,
warm started from `original`, given the same --time-limit as roam) and `roam`, with roam's lower
bound on the peak and whether it proved its order optimal. With --reach S the global ILP also runs
cold (no warm start) until it finds an order as good as roam's, for at most S seconds: that time
over roam's is the speed-up the ROAM paper reports (53.7x there).

    python -m benchmarks run order_layout/order --time-limit 60 --jobs 2     # the suite and the sample
    python -m benchmarks run order_layout/order.reach GRAPH... --time-limit 30 --jobs 2 --reach 300

A folder is searched for training graphs (`training_model.onnx`, `full_step*.onnx`); by default the
suite (benchmarks/.cache/suite: `python -m benchmarks.suite`, and `--tiny` for its tiny models;
needs torch) and the bundled sample. Needs only roam; about 15 minutes on two cores with --time-limit 60 (the
ILP runs to its limit on the graphs small enough for it)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from benchmarks import harness
from roam_cli import order
from roam_cli.core import memory
from roam_cli.frontend.onnx_import import import_model
from roam_cli.order import ilp
from roam_cli.order.problem import from_memory_model, peak
from roam_cli.solvers import milp

TAKES = "about 15 min (the suite at --time-limit 60); needs the suite (python -m benchmarks.suite, torch)"
SAMPLE = harness.ROOT / "sample_models" / "gpt2_tiny" / "training_model.onnx"
PATTERNS = ("training_model.onnx", "full_step*.onnx")
STRATEGIES = ("original", "ort", "greedy", "ilp-global", "roam")


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


def main(argv: list[str]) -> dict:
    p = harness.options(__name__, __doc__)
    p.add_argument("paths", nargs="*", type=Path, help="ONNX graphs or folders of them (default: the suite and "
                   "the sample)")
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds for roam and for ilp-global, per graph")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--solver", choices=milp.SOLVERS, default="cbc")
    p.add_argument("--reach", type=float, default=None, metavar="SECONDS",
                   help="also time the cold global ILP until it matches roam's peak, at most this long")
    args = p.parse_args(argv)
    paths = graphs(args.paths or [harness.needs(harness.CACHE / "suite", "make it with `python -m benchmarks.suite` "
                                                "(needs torch)"), SAMPLE])
    if not paths:
        sys.exit("no graphs found")
    rows = []
    for path in paths:
        print(f"{label(path)} ...", file=sys.stderr, flush=True)
        rows.append(measure(path, args.time_limit, args.jobs, args.solver, args.reach))
    return {"time_limit": args.time_limit, "jobs": args.jobs, "solver": args.solver, "reach": args.reach,
            "rows": rows}


def gap(r: dict) -> str:
    """roam's order against its lower bound: proven, or how far above the bound it may be."""
    roam = r["roam"]
    if roam.get("proven_optimal"):
        return "proven optimal"
    bound = roam.get("lower_bound_bytes")
    return f"within {100 * (r['peak']['roam'] / bound - 1):.2f} %" if bound else "–"


def table(results: dict) -> str:
    rows, reach = results["rows"], results.get("reach")
    head = (["graph", "nodes"] + [f"{s} MiB" for s in STRATEGIES]
            + ["roam vs original", "roam's order", "roam s", "ilp-global"])
    if reach is not None:
        head += ["ilp-global cold to roam's peak s", "speed-up"]
    lines = []
    for r in rows:
        base = r["peak"]["original"]
        cells = [r["graph"], f"{r['nodes']:,}"] + [harness.mib(r["peak"][s], 2) for s in STRATEGIES]
        cells += [f"{r['peak']['roam'] / base - 1:+.1%}" if base else "+0.0%", gap(r), f"{r['seconds']['roam']:.2f}",
                  f"{r['ilp-global']['status']}, {r['seconds']['ilp-global']:.1f} s"]
        if reach is not None:
            t, roam_s = r.get("reach_seconds"), r["seconds"]["roam"]
            cells += [f"{t:.1f}" if t is not None else f"> {reach:.0f}",
                      f"{t / roam_s:,.0f}x" if t is not None else f"> {reach / roam_s:,.0f}x"]
        lines.append(cells)
    proven = sum(bool(r["roam"].get("proven_optimal")) for r in rows)
    best = sum(r["peak"]["roam"] <= min(r["peak"].values()) for r in rows)
    align = "lr" + "r" * len(STRATEGIES) + "rlrl" + ("rr" if reach is not None else "")
    return (harness.markdown_table(head, lines, align) + f"\nroam's order is at most every other strategy's peak on {best} "
            f"of {len(rows)} graphs and proven optimal on {proven}; --time-limit {results['time_limit']:g} s for roam "
            f"and ilp-global, --jobs {results['jobs']}, solver {results['solver']}. ilp-global starts from "
            f"original: 'not improved' keeps it; 'too large' is a model over {ilp.MAX_VARIABLES:,} variables, "
            "refused at once.\n")
