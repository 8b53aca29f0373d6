"""Every suite graph planned with every order strategy and every layout strategy: peak live bytes,
each layout's arena, seconds, and whether the plan verifies.

For each graph in <suite>/<model>/{training_model.onnx, full_step.onnx} and each order strategy
(`roam_cli.order.STRATEGIES`), a worker process (`python -m benchmarks.order_layout.suite_plans
--worker GRAPH ORDER`) imports the graph, builds the memory model, measures the baselines, solves
the order, places it with every layout strategy (`roam_cli.layout.STRATEGIES`) and checks the plan
of the first layout with `roam verify`'s checker. One process per (graph, order), under a memory cap
and a timeout, so a strategy that runs out of time or memory costs its own cell only. Then `roam
optimize` and `roam verify` run as commands on the end-to-end graph (GPT2-XL's full step), timed.
Strategies are picked up from the code when they land.

    python -m benchmarks.suite                          # the graphs, once (needs torch)
    python -m benchmarks run order_layout/suite_plans   # needs only roam; about 10 minutes on two cores
    python -m benchmarks run order_layout/suite_plans.small --models gpt2_small,resnet50 --time-limit 10

- *peak live*: the most transient bytes live at one step under that order (a lower bound for any
  layout); *arena*: the layout's size; persistent bytes (parameters, optimizer state, gradient
  buffers, constants, data inputs) are outside the arena and the same for every strategy.
- *order s*: the ordering solve alone (the baselines original/ort/greedy are measured once per
  graph, *base s*; roam starts from them); *import s*: reading the graph and building the memory
  model; *layout s*: every layout strategy together."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness

TAKES = "about 10 min; needs the suite (python -m benchmarks.suite, torch)"
GRAPHS = {"training_model.onnx": "artifacts training graph", "full_step.onnx": "full step (in-graph AdamW)"}
END_TO_END = ["gpt2_xl/full_step.onnx"]


def measure(graph: Path, order_strategy: str, time_limit: float | None) -> dict:
    """One graph, one order strategy, every layout strategy (the worker's job)."""
    from roam_cli import layout, order, pipeline
    from roam_cli.core import memory
    from roam_cli.core import plan as plan_mod
    from roam_cli.frontend.onnx_import import import_model
    from roam_cli.verify import verify

    t = time.perf_counter()
    imported = import_model(graph)
    mm = memory.build(imported.graph)
    import_s = time.perf_counter() - t
    op_types = [n.op_type for n in imported.graph.nodes]
    t = time.perf_counter()
    measured = order.baselines(mm, op_types)
    baselines_s = time.perf_counter() - t
    t = time.perf_counter()
    chosen, stats = order.solve(mm, order_strategy, op_types=op_types, time_limit=time_limit, measured=measured)
    order_s = time.perf_counter() - t
    peak = memory.peak_live(mm, memory.lifetimes(mm, chosen))[0]
    buffers = pipeline.layout_buffers(mm, chosen)
    arenas, layout_s = {}, 0.0
    verified = None
    for strategy in layout.STRATEGIES:
        t = time.perf_counter()
        placed = layout.place(buffers, strategy, time_limit=time_limit)
        layout_s += time.perf_counter() - t
        arenas[strategy] = placed.arena
        if verified is None:  # the plan is built in memory only (its path sets the model's relative path)
            built = plan_mod.build(imported.graph, mm, chosen, placed.offsets, model_path=graph,
                                   model_sha256=imported.sha256, plan_path=graph.with_suffix(".plan.json"),
                                   dims={}, stats={})
            verify(imported.graph, imported.sha256, built)  # raises on any violation
            verified = strategy
    return {"nodes": len(imported.graph.nodes), "persistent": mm.persistent_bytes, "import_s": round(import_s, 2),
            "baselines_s": round(baselines_s, 2), "order_s": round(order_s, 2), "peak": peak, "arenas": arenas,
            "layout_s": round(layout_s, 2), "verified_with": verified, "proven_optimal": stats.get("proven_optimal"),
            "bound": stats.get("lower_bound_bytes")}


def run_worker(graph: Path, strategy: str, time_limit: float | None, memory_gib: float, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.order_layout.suite_plans", "--worker", str(graph), strategy]
    if time_limit is not None:
        cmd += ["--time-limit", str(time_limit)]

    def limit_memory():
        size = int(memory_gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (size, size))

    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, preexec_fn=limit_memory,
                              cwd=harness.ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s"}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["exit " + str(proc.returncode)])[-1]
        return {"error": "out of memory" if "MemoryError" in proc.stderr else last[:120]}
    return json.loads(proc.stdout)


def timed_command(args: list[str]) -> tuple[float, int, float]:
    """(wall seconds, exit code, peak RSS GiB) of a roam command in a fresh process."""
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "roam_cli", "-q", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own resource usage
    proc.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - t, proc.returncode, usage.ru_maxrss / 2**20


def main(argv: list[str]) -> dict:
    from roam_cli import layout, order

    p = harness.options(__name__, __doc__)
    p.add_argument("--suite", type=Path, default=harness.CACHE / "suite", help="the suite's folder")
    p.add_argument("--models", help="comma-separated model folders (default: all, smallest graph first)")
    p.add_argument("--time-limit", type=float, default=None, help="seconds per order solve and per layout "
                   "(default: each strategy's own)")
    p.add_argument("--memory-gib", type=float, default=8.0, help="memory cap of each worker process")
    p.add_argument("--timeout", type=float, default=1800.0, help="wall seconds per (graph, order) worker")
    a = p.parse_args(argv)
    harness.needs(a.suite, "make it with `python -m benchmarks.suite` (needs torch)")
    wanted = a.models.split(",") if a.models else None
    folders = [f for f in sorted(a.suite.iterdir())  # the suite's models: suite.py wrote their model.json
               if (f / "model.json").is_file() and (wanted is None or f.name in wanted)]
    models = {f.name: json.loads((f / "model.json").read_text()) for f in folders}
    graphs = [(f.name, kind, f / kind) for f in folders for kind in GRAPHS if (f / kind).exists()]
    graphs.sort(key=lambda g: (models[g[0]]["full_step"], g[0], list(GRAPHS).index(g[1])))
    planned = []
    for model, kind, path in graphs:
        cells = {}
        for strategy in order.STRATEGIES:
            cells[strategy] = run_worker(path, strategy, a.time_limit, a.memory_gib, a.timeout)
            r = cells[strategy]
            shown = r.get("error") or f"peak {harness.mib(r['peak'], 2)} MiB, order {r['order_s']:.1f} s"
            print(f"{model}/{kind} {strategy}: {shown}", file=sys.stderr, flush=True)
        first = next((c for c in cells.values() if "error" not in c), {})
        graph = {"model": model, "kind": kind, **{k: first.get(k) for k in ("nodes", "persistent", "import_s",
                                                                            "baselines_s")}}
        planned.append(graph | {"cells": {s: {k: v for k, v in c.items() if k not in graph} for s, c in cells.items()}})
    end_to_end = []
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "plan.json"
        for rel in END_TO_END:
            graph = a.suite / rel
            if not graph.exists() or (wanted is not None and rel.split("/")[0] not in wanted):
                continue
            for args in (["optimize", str(graph), "-o", str(plan)], ["verify", str(graph), str(plan)]):
                wall, code, rss = timed_command(args)
                command = "roam " + " ".join(args).replace(str(a.suite) + "/", "").replace(str(plan), "plan.json")
                end_to_end.append({"graph": rel, "command": command, "wall_s": round(wall, 1), "exit": code,
                                   "rss_gib": round(rss, 2)})
                print(f"end to end: {command}: {wall:.1f} s, exit {code}", file=sys.stderr, flush=True)
    return {"time_limit": a.time_limit, "memory_gib": a.memory_gib, "timeout": a.timeout,
            "order_strategies": list(order.STRATEGIES), "layout_strategies": list(layout.STRATEGIES),
            "models": dict(sorted(models.items(), key=lambda kv: kv[1]["full_step"])), "graphs": planned,
            "end_to_end": end_to_end}


def size(n: float | None) -> str:
    if n is None:
        return "–"
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.2f} MiB"


def order_line(cell: dict) -> str:
    if cell.get("proven_optimal"):
        return "proven optimal"
    return f"within {100 * (cell['peak'] / cell['bound'] - 1):.2f} %" if cell.get("bound") else "not proven"


def table(results: dict) -> str:
    """One row per graph under roam's order: its peak, the proof, each layout's fragmentation; then
    each order strategy over all graphs."""
    layouts, orders = results["layout_strategies"], results["order_strategies"]
    rows = []
    for g in results["graphs"]:
        cells = g["cells"]
        roam, base = cells.get("roam", {}), cells.get("original", {}).get("peak")
        name = f"{g['model']} {'full step' if g['kind'] == 'full_step.onnx' else 'training graph'}"
        if "peak" not in roam:
            rows.append([name, f"{g['nodes'] or 0:,}", f"roam failed: {roam.get('error', '?')}"] + [""] * (len(layouts) + 4))
            continue
        rows.append([name, f"{g['nodes']:,}", size(roam["peak"]),
                     f"{roam['peak'] / base - 1:+.1%}" if base else "–", order_line(roam)]
                    + [f"{100 * (roam['arenas'][s] / roam['peak'] - 1):.1f} %" for s in layouts]
                    + [f"{roam['order_s']:.1f}", f"{roam['layout_s']:.1f}"])
    text = harness.markdown_table(["graph", "nodes", "peak live (roam's order)", "vs original", "roam's order"]
                                  + [f"{s} fragmentation" for s in layouts] + ["order s", "layout s"],
                                  rows, "lrrrl" + "r" * (len(layouts) + 2))
    summary = []
    for s in orders:
        ok = [g["cells"][s] | {"base": g["cells"].get("original", {}).get("peak")} for g in results["graphs"]
              if "peak" in g["cells"].get(s, {})]
        lowest = sum(c["peak"] <= min(o["peak"] for o in g["cells"].values() if "peak" in o)
                     for g in results["graphs"] for c in [g["cells"].get(s, {})] if "peak" in c)
        changes = [c["peak"] / c["base"] - 1 for c in ok if c["base"]]
        summary.append([s, f"{len(ok)} of {len(results['graphs'])}", lowest,
                        f"{sum(changes) / len(changes):+.2%}" if changes else "–",
                        f"{min(changes):+.1%}" if changes else "–", sum(bool(c.get("proven_optimal")) for c in ok),
                        sum(c.get("verified_with") is not None for c in ok),
                        f"{sum(c['order_s'] for c in ok):.1f}"])
    text += "\n" + harness.markdown_table(["order", "planned", "lowest peak", "mean vs original", "best vs original",
                                           "proven optimal", "verified", "order s (all graphs)"], summary)
    limit = f"{results['time_limit']:g} s" if results["time_limit"] else "each strategy's default"
    text += (f"\nFragmentation: arena / peak live − 1 under roam's order (pytorch, bfc: the replayed allocator's "
             f"layout). Time limit per order solve and per layout: {limit}; each (graph, order) in its own process "
             f"(memory cap {results['memory_gib']:g} GiB, timeout {results['timeout']:.0f} s).\n")
    if results["end_to_end"]:
        text += "\n" + harness.markdown_table(["graph", "command (default strategies, a fresh process)", "wall s",
                                               "exit", "peak RSS GiB"],
                                              [[e["graph"], f"`{e['command']}`", f"{e['wall_s']:.1f}", e["exit"],
                                                f"{e['rss_gib']:.1f}"] for e in results["end_to_end"]], "llrrr")
    return text


def plans(results: dict) -> str:
    """Every (graph, order) cell, each layout's arena: the full tables (for the details page)."""
    layouts = results["layout_strategies"]
    out = []
    for g in results["graphs"]:
        out.append(f"**{g['model']}: {GRAPHS[g['kind']]}** — {g['nodes']:,} nodes, persistent {size(g['persistent'])}, "
                   f"import {g['import_s']:.1f} s, base {g['baselines_s']:.1f} s\n")
        base = g["cells"].get("original", {}).get("peak")
        rows = []
        for s, c in g["cells"].items():
            if "error" in c:
                rows.append([s, f"— ({c['error']})"] + [""] * (len(layouts) + 4))
                continue
            rows.append([s, size(c["peak"]), f"{c['peak'] / base - 1:+.1%}" if base else "–"]
                        + [size(c["arenas"][x]) for x in layouts]
                        + [f"{c['order_s']:.1f}", f"{c['layout_s']:.1f}",
                           "yes" + (" (optimal)" if c.get("proven_optimal") else "") if c.get("verified_with") else "no"])
        out.append(harness.markdown_table(["order", "peak live", "vs original", *[f"arena {x}" for x in layouts],
                                           "order s", "layout s", "verified"], rows,
                                          "lrr" + "r" * (len(layouts) + 2) + "l"))
    return "\n".join(out)


if __name__ == "__main__":  # only the worker: one graph, one order strategy
    w = argparse.ArgumentParser(prog="python -m benchmarks.order_layout.suite_plans --worker")
    w.add_argument("--worker", nargs=2, metavar=("GRAPH", "ORDER"), required=True)
    w.add_argument("--time-limit", type=float, default=None)
    a = w.parse_args()
    print(json.dumps(measure(Path(a.worker[0]), a.worker[1], a.time_limit)))
