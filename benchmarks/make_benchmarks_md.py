#!/usr/bin/env python3
"""Write BENCHMARKS.md: every suite graph planned with every order and layout strategy, one run.

    python benchmarks/suite.py                      # the graphs (once; needs the bench extra)
    python benchmarks/make_benchmarks_md.py         # -> BENCHMARKS.md (needs only roam)

For each graph in <suite>/<model>/{training_model.onnx, full_step.onnx} and each order strategy
(`roam_cli.order.STRATEGIES`), a worker process imports the graph, builds the memory model,
measures the baselines, solves the order, places it with every layout strategy
(`roam_cli.layout.STRATEGIES`) and checks the plan of the first layout with `roam verify`'s
checker. One process per (graph, order) so a strategy that runs out of time or memory costs its
own cell only. Then `roam optimize` and `roam verify` run as commands on the end-to-end graphs
(GPT2-XL's full step), timed. Strategies are picked up from the code when they land."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GRAPHS = {"training_model.onnx": "artifacts training graph", "full_step.onnx": "full step (in-graph AdamW)"}
END_TO_END = ["gpt2_xl/full_step.onnx"]


def measure(graph: Path, order_strategy: str, time_limit: float | None) -> dict:
    """One graph, one order strategy, every layout strategy (the worker's job)."""
    from roam_cli import layout, order, pipeline
    from roam_cli.core import memory, plan as plan_mod
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
    layouts = {}
    verified = None
    for strategy in layout.STRATEGIES:
        t = time.perf_counter()
        placed = layout.place(buffers, strategy, time_limit=time_limit)
        layouts[strategy] = {"arena": placed.arena, "seconds": time.perf_counter() - t}
        if verified is None:
            built = plan_mod.build(imported.graph, mm, chosen, placed.offsets, model_path=graph,
                                   model_sha256=imported.sha256, plan_path=graph.with_suffix(".plan.json"),
                                   dims={}, stats={})
            verify(imported.graph, imported.sha256, built)  # raises on any violation
            verified = strategy
    return {"nodes": len(imported.graph.nodes), "persistent": mm.persistent_bytes, "import_s": import_s,
            "baselines_s": baselines_s, "order_s": order_s, "peak": peak, "layouts": layouts,
            "verified_with": verified, "proven_optimal": stats.get("proven_optimal")}


def run_worker(graph: Path, strategy: str, time_limit: float | None, memory_gib: float, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--worker", str(graph), strategy]
    if time_limit is not None:
        cmd += ["--time-limit", str(time_limit)]

    def limit_memory():
        size = int(memory_gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (size, size))

    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, preexec_fn=limit_memory)
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


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown CPU")
    mem = next((int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), 0)
    import onnx
    import onnxruntime

    from roam_cli import __version__
    return (f"{cpu}, {os.cpu_count()} cores, {mem / 2**30:.0f} GiB memory; {platform.system()} "
            f"{platform.release()}; Python {platform.python_version()}, onnx {onnx.__version__}, "
            f"onnxruntime {onnxruntime.__version__}, roam {__version__}")


def gib(n: int) -> str:
    from roam_cli.core.units import format_bytes

    return format_bytes(n)


def render(graphs: list[tuple[str, str, Path]], results: dict, end_to_end: list, models: dict, args,
           seconds: float) -> str:
    from roam_cli import layout, order

    lines = ["# Benchmarks", "",
             "Every graph of the suite planned with every order strategy and every layout strategy, "
             "side by side, in one run. Produced by:", "",
             "```", "python benchmarks/suite.py          # the graphs, without weights (bench extra)",
             f"python benchmarks/make_benchmarks_md.py{args.command_flags}", "```", "",
             f"Machine: {machine()}.", "",
             f"Run: {datetime.date.today().isoformat()}, {seconds / 60:.0f} min in all; time limit per order "
             f"solve and per layout: {f'{args.time_limit:g} s' if args.time_limit else 'each strategy’s default'}; "
             f"each (graph, order) in its own process (memory cap {args.memory_gib:g} GiB, timeout "
             f"{args.timeout:.0f} s).", "",
             f"Order strategies: {', '.join(order.STRATEGIES)}. Layout strategies: {', '.join(layout.STRATEGIES)}.",
             "", "- *peak live*: the most transient bytes live at one step under that order (a lower bound for "
             "any layout); *arena*: the layout's size; persistent bytes (parameters, optimizer state, gradient "
             "buffers, constants, data inputs) are outside the arena and the same for every strategy.",
             "- *order s*: the ordering solve alone (the baselines original/ort/greedy are measured once per graph, "
             "`base s`; roam starts from them); *import s*: reading the graph and building the memory model.",
             "- *verified*: the plan of that order with the first layout passed `roam verify`'s checker.", ""]
    lines += ["## The suite", "", "| model | size | parameter tensors | parameters | training nodes | full-step nodes |",
              "|---|---|---:|---:|---:|---:|"]
    for name, row in models.items():
        lines.append(f"| {name} | {row['size']} | {row['params']} | {row['elements']:,} | {row['training']:,} | "
                     f"{row['full_step']:,} |")
    lines += ["", "## Plans", ""]
    layouts = list(layout.STRATEGIES)
    for model, kind, path in graphs:
        cells = results[path]
        first = next((c for c in cells.values() if "error" not in c), None)
        head = f"### {model}: {GRAPHS[kind]}"
        if first:
            head += (f" — {first['nodes']:,} nodes, persistent {gib(first['persistent'])}, "
                     f"import {first['import_s']:.1f} s, base {first['baselines_s']:.1f} s")
        lines += [head, "", "| order | peak live | vs original | " + " | ".join(f"arena {s}" for s in layouts)
                  + " | order s | layout s | verified |", "|---|---:|---:|" + "---:|" * len(layouts) + "---:|---:|---|"]
        base = cells.get("original", {}).get("peak")
        for strategy, c in cells.items():
            if "error" in c:
                lines.append(f"| {strategy} | — ({c['error']}) |" + " |" * (len(layouts) + 4))
                continue
            saved = f"{c['peak'] / base - 1:+.1%}" if base else "–"
            arenas = " | ".join(gib(c["layouts"][s]["arena"]) for s in layouts)
            lay_s = sum(v["seconds"] for v in c["layouts"].values())
            mark = "yes" + (" (optimal)" if c.get("proven_optimal") else "")
            lines.append(f"| {strategy} | {gib(c['peak'])} | {saved} | {arenas} | {c['order_s']:.1f} | "
                         f"{lay_s:.1f} | {mark} |")
        lines.append("")
    if end_to_end:
        lines += ["## End to end", "", "The commands as a user runs them (default strategies), each in a fresh "
                  "process on this machine:", "", "| graph | command | wall s | exit | peak RSS |",
                  "|---|---|---:|---:|---:|"]
        for graph, command, wall, code, rss in end_to_end:
            lines.append(f"| {graph} | `{command}` | {wall:.1f} | {code} | {rss:.1f} GiB |")
        lines.append("")
    lines += running_the_plan()
    lines += recomputation()
    return "\n".join(lines)


def running_the_plan() -> list[str]:
    """The latest tables of benchmarks/allocator.py (its own run; it needs real training steps)."""
    tables = [ROOT / "benchmarks" / "results" / f"{name}.md"
              for name in ("allocator", "allocator_suite", "allocator_standard", "allocator_standard_suite")]
    found = [t for t in tables if t.is_file()]
    if not found:
        return []
    lines = ["## Running the plan on ONNX Runtime", "",
             "Training steps in ONNX Runtime's own session with ORT's arenas and with roam's allocator "
             "(`docs/runtime.md`), from `python benchmarks/allocator.py` (`" + "`, `".join(
                 str(t.relative_to(ROOT)) for t in found) + "`):", ""]
    for t in found:
        lines += [t.read_text().rstrip(), ""]
    return lines


def recomputation() -> list[str]:
    """The latest table of benchmarks/recompute.py (its own run: it needs PyTorch's figures, from
    benchmarks/pytorch_memory.py)."""
    table = ROOT / "benchmarks" / "results" / "recompute.md"
    if not table.is_file():
        return []
    return ["## Recomputation against PyTorch", "",
            "`--recompute off | free | budget` (`docs/recompute.md`) against PyTorch eager and with whole-layer "
            "checkpointing, measured by PyTorch's own MemTracker (`python benchmarks/pytorch_memory.py`, "
            "`benchmarks/results/pytorch_memory.md`), from `python benchmarks/recompute.py` "
            f"(`{table.relative_to(ROOT)}`):", "", table.read_text().rstrip(), ""]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--suite", type=Path, default=Path("/work/suite_cache"), help="the suite's folder")
    p.add_argument("--models", help="comma-separated model folders (default: all, smallest graph first)")
    p.add_argument("--time-limit", type=float, default=None, help="seconds per order solve and per layout")
    p.add_argument("--memory-gib", type=float, default=8.0, help="memory cap of each worker process")
    p.add_argument("--timeout", type=float, default=1800.0, help="wall seconds per (graph, order) worker")
    p.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    p.add_argument("--worker", nargs=2, metavar=("GRAPH", "ORDER"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        print(json.dumps(measure(Path(a.worker[0]), a.worker[1], a.time_limit)))
        return 0
    from roam_cli import order

    start = time.perf_counter()
    wanted = a.models.split(",") if a.models else None
    folders = [f for f in sorted(a.suite.iterdir())  # the suite's models: suite.py wrote their model.json
               if (f / "model.json").is_file() and (wanted is None or f.name in wanted)]
    models = {f.name: json.loads((f / "model.json").read_text()) for f in folders}
    graphs = [(f.name, kind, f / kind) for f in folders for kind in GRAPHS if (f / kind).exists()]
    graphs.sort(key=lambda g: (models[g[0]]["full_step"], g[0], list(GRAPHS).index(g[1])))
    models = dict(sorted(models.items(), key=lambda kv: kv[1]["full_step"]))
    results = {}
    for model, kind, path in graphs:
        results[path] = {}
        for strategy in order.STRATEGIES:
            r = run_worker(path, strategy, a.time_limit, a.memory_gib, a.timeout)
            results[path][strategy] = r
            shown = r.get("error") or f"peak {gib(r['peak'])}, order {r['order_s']:.1f} s"
            print(f"{model}/{kind} {strategy}: {shown}", flush=True)
    end_to_end = []
    for rel in END_TO_END:
        graph = a.suite / rel
        if not graph.exists() or (wanted is not None and rel.split("/")[0] not in wanted):
            continue
        plan = a.out.parent / ".benchmarks-plan.json"
        for args in (["optimize", str(graph), "-o", str(plan)], ["verify", str(graph), str(plan)]):
            wall, code, rss = timed_command(args)
            end_to_end.append((rel, "roam " + " ".join(args).replace(str(a.suite) + "/", "").replace(
                str(plan), "plan.json"), wall, code, rss))
            print(f"end to end: roam {args[0]} {rel}: {wall:.1f} s, exit {code}", flush=True)
        plan.unlink(missing_ok=True)
        for extra in plan.parent.glob(".benchmarks-plan.annotated.onnx"):
            extra.unlink()
    flags = "".join(f" --{k.replace('_', '-')} {v}" for k, v in (("time_limit", a.time_limit),) if v is not None)
    a.command_flags = flags
    text = render(graphs, results, end_to_end, models, a, time.perf_counter() - start)
    from roam_cli.core.fileio import write_atomic

    write_atomic(a.out, text + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
