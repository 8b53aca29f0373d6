#!/usr/bin/env python3
"""ONNX Runtime's memory for real training steps, with its own arena and with roam's, side by side.

    python benchmarks/allocator.py                                 # the sample's full step
    python benchmarks/allocator.py step.onnx other.onnx --steps 8
    python benchmarks/allocator.py /work/suite_cache --compare 20
    python benchmarks/allocator.py tiny/ --workspace calibrate     # plans that place ORT's workspace

Each graph is a full training step whose state is updated in place (`roam make-training-graph
--in-graph-optimizer`; a folder is searched for `full_step*.onnx`). The sample's full step,
made from the bundled artifacts graph, is always the first row. Per graph, `roam optimize` plans it, then `roam train`'s
loop (`roam_cli.runtime.train.train`) runs --steps steps three times, each in a fresh process:

- ORT default arena: ORT's BFC arena (next power of two), the plan's order;
- ORT same as requested: ORT's BFC arena grown by exactly what is asked (kSameAsRequested);
- ORT + roam allocator: ORT's session allocating from roam's arena (first step recorded).

ORT's arena bytes come from its INFO log, which slows its steps. Step times come from two more
processes, one session each (ORT's arena, roam's; logs off), stepped in turn so that both see
the same load on the machine; their thread pools do not spin between steps (an idle pool
spinning would take the cores from the one at work).

Bytes are device memory for everything but the state (parameters, moments: buffers the loop
owns and ORT updates in place, the same in every run): for ORT's arenas, what they grew to from
the session's start (their INFO log; the graph's constants are in there); for roam's, its arena,
whatever fell back, and the constants (ORT allocates those at the session's start, outside the
arena); for the plan, its arena and its constants. Step times are medians over the steps after the first. With --compare N the roam run
goes on for N steps and is checked against a plain ORT session (ORT's default order and arena,
the same optimisation level): largest relative difference of the loss per step and of the final state.
Serving the plan: of step 1's requests, how many are the plan's tensors (matched by node and
size), how many of those a later step served at their plan offset, how many were moved (ORT kept
them past the plan's lifetimes) and how many were workspace the plan does not place. Inputs come
from `inputs.npz` beside the graph when present (`roam train --inputs`), else are synthesised. Prints a markdown table and writes it with the raw figures to --out (.md, .json)."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SAMPLE = ROOT / "sample_models" / "gpt2_tiny" / "training_model.onnx"
MIB = 2**20
TIMING_SECONDS = 20  # steps of both sessions in turn: at least --steps, and more while under this
VARIANTS = (("ort", "ORT default arena"), ("ort-same-as-requested", "ORT same as requested"),
            ("roam", "ORT + roam allocator"))


def graphs(paths: list[Path]) -> list[Path]:
    found = []
    for p in paths:
        found += sorted(p.rglob("full_step*.onnx")) if p.is_dir() else [p]
    return found


def roam(*args) -> None:
    subprocess.run([sys.executable, "-m", "roam_cli", "-q", *map(str, args)], check=True)


def one_run(model: str, plan_path: str, steps: int, allocator: str, inputs: str | None, compare: bool,
            log_arena: bool = True) -> dict:
    """In a fresh process: ORT's kSameAsRequested arena is registered process-wide."""
    from roam_cli.core import plan as plan_io
    from roam_cli.runtime.train import train

    return train(Path(model), plan_io.read(plan_path), steps, allocator=allocator,
                 inputs_path=Path(inputs) if inputs else None, compare=compare, log_arena=log_arena)


def stepper(conn, model: str, plan_path: str, allocator: str, inputs: str | None) -> None:
    """A process holding one session: steps it each time it is told to, answers with the seconds.
    One process per allocator: ONNX Runtime gives every session of a process the CPU allocator of
    the first one, so ORT's arena and roam's cannot share a process."""
    from roam_cli.core import plan as plan_io
    from roam_cli.runtime.train import PlannedSession, batch_for, read_batches, starting_values

    plan = plan_io.read(plan_path)
    session = PlannedSession(Path(model), plan, allocator=allocator, log_arena=False,
                             config={"session.intra_op.allow_spinning": "0"})  # idle, it leaves the cores alone
    arrays = read_batches(Path(inputs) if inputs else None, session)
    start, _ = starting_values(session, arrays, 0, 1e-3, {t["name"]: t["kind"] for t in plan["tensors"]})
    session.set_state(start)
    conn.send("ready")
    while (k := conn.recv()) is not None:
        conn.send(session.step(batch_for(k, start, arrays, session)).seconds)
    session.close()


def paired_times(model: str, plan_path: str, steps: int, inputs: str | None) -> dict:
    """Median ms per step after the first, of ORT's arena and roam's, stepped in turn in two
    processes, so that both see the same load on the machine; fast graphs get more steps."""
    ctx = multiprocessing.get_context("spawn")
    workers = {}
    for allocator in ("ort", "roam"):
        conn, theirs = ctx.Pipe()
        process = ctx.Process(target=stepper, args=(theirs, model, plan_path, allocator, inputs))
        process.start()
        workers[allocator] = (process, conn)
    for _, conn in workers.values():
        assert conn.recv() == "ready"
    seconds = {allocator: [] for allocator in workers}
    began, k = time.perf_counter(), 0
    while k < steps or (time.perf_counter() - began < TIMING_SECONDS and k < 1000):  # fast steps: more of them
        k += 1
        for allocator, (_, conn) in workers.items():
            conn.send(k)
            seconds[allocator].append(conn.recv())
    for process, conn in workers.values():
        conn.send(None)
        process.join()
    return {a: statistics.median(v[1:] or v) * 1e3 for a, v in seconds.items()}


def in_child(function, *args) -> dict:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args).result()


def measure(model: Path, work: Path, steps: int, inputs: Path | None, compare: int, workspace: str) -> dict:
    plan_path = work / (model.parent.name + "_" + model.stem + ".plan.json")
    t = time.perf_counter()
    roam("optimize", model, "-o", plan_path, "--workspace", workspace)
    plan_seconds = time.perf_counter() - t
    plan = json.loads(plan_path.read_text())
    constants = sum(t["bytes"] for t in plan["tensors"] if t["kind"] == "constant")
    row = {"graph": f"{model.parent.name}/{model.name}", "nodes": len(plan["order"]), "plan_seconds": plan_seconds,
           "plan_arena_bytes": plan["arena_bytes"], "plan_peak_live_bytes": plan["peak_live_bytes"],
           "constant_bytes": constants, "state_bytes": plan["persistent_bytes"] - constants, "steps": steps,
           "plan_workspace_buffers": len(plan.get("workspace", ())),
           "runs": {}}
    for allocator, _ in VARIANTS:
        n = max(steps, compare) if allocator == "roam" else steps
        result = in_child(one_run, str(model), str(plan_path), n, allocator, str(inputs) if inputs else None,
                          bool(compare) and allocator == "roam")
        later = result["per_step"][1:]
        held = max(s["memory"].get("bytes") or 0 for s in result["per_step"])
        row["runs"][allocator] = {
            "bytes": held + (constants if allocator == "roam" else 0),
            "unplanned_after_first": sum(s["memory"].get("unplanned", 0) for s in later),
            "served_at_plan_offset": min((s["memory"].get("served_at_plan_offset", 0) for s in later), default=0),
            "loss": [s["outputs"].get("loss") for s in result["per_step"]],
            "arena": result["arena"], "compare": result.get("compare"),
        }
    row["median_step_ms"] = paired_times(str(model), str(plan_path), steps, str(inputs) if inputs else None)
    return row


def render(rows: list[dict], header: str) -> str:
    def mib(n):
        return f"{n / MIB:,.2f}"

    lines = [header, "",
             "| graph | nodes | ORT default arena | ORT same as requested | ORT + roam allocator | plan arena + constants "
             "| roam / plan | state (all runs) | unplanned after step 1 | ORT step ms | roam step ms | time ratio |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    served = ["", "| graph | requests per step | plan's tensors | served at plan offset | moved | workspace not in the plan "
              "| plan workspace buffers |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        runs = r["runs"]
        ours, ort_ = runs["roam"], runs["ort"]
        planned = r["plan_arena_bytes"] + r["constant_bytes"]
        t = r["median_step_ms"]
        lines.append(f"| {r['graph']} | {r['nodes']:,} | {mib(ort_['bytes'])} | {mib(runs['ort-same-as-requested']['bytes'])} "
                     f"| {mib(ours['bytes'])} | {mib(planned)} | {ours['bytes'] / planned - 1:+.2%} | "
                     f"{mib(r['state_bytes'])} | "
                     f"{ours['unplanned_after_first']} | {t['ort']:,.1f} | {t['roam']:,.1f} | {t['roam'] / t['ort']:.3f} |")
        a = ours["arena"]
        served.append(f"| {r['graph']} | {a['requests']:,} | {a['planned_requests']:,} | {ours['served_at_plan_offset']:,} "
                      f"| {a['planned_moved']:,} | {a['workspace_requests']:,} | {r['plan_workspace_buffers']:,} |")
    lines += served
    compared = [r for r in rows if r["runs"]["roam"]["compare"]]
    if compared:
        lines += ["", "| graph | steps | loss: max relative difference per step | final state: max relative "
                  "difference | plain ORT step ms |", "|---|---:|---:|---:|---:|"]
        for r in compared:
            c = r["runs"]["roam"]["compare"]
            plain = statistics.median(c["plain_seconds"][1:] or c["plain_seconds"]) * 1e3
            lines.append(f"| {r['graph']} | {len(c['outputs_max_rel_per_step'])} | {c['outputs_max_rel']:.2g} | "
                         f"{c['state_max_rel']:.2g} ({c['state_tensors']} tensors) | {plain:,.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", type=Path)
    ap.add_argument("--steps", type=int, default=6, help="steps per allocator (the first is recorded)")
    ap.add_argument("--compare", type=int, default=0, metavar="N",
                    help="also run N steps with roam's allocator against a plain ORT session")
    ap.add_argument("--workspace", choices=("none", "calibrate"), default="none",
                    help="roam optimize --workspace: calibrate places ORT's kernel scratch in the plan")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "allocator")
    args = ap.parse_args(argv)
    header = (f"roam allocator benchmark, {time.strftime('%Y-%m-%d')}: {platform.machine()} x{os.cpu_count()} CPUs, "
              f"Python {platform.python_version()}, onnxruntime {__import__('onnxruntime').__version__}; "
              f"MiB; {args.steps} steps per allocator; optimize --workspace {args.workspace}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sample = work / "gpt2_tiny" / "full_step.onnx"
        sample.parent.mkdir()
        roam("make-training-graph", SAMPLE, "-o", sample, "--in-graph-optimizer")
        for model in [sample] + graphs(args.paths):
            inputs = model.parent / "inputs.npz"
            print(f"# {model}", file=sys.stderr, flush=True)
            rows.append(measure(model, work, args.steps, inputs if inputs.is_file() else None, args.compare,
                                args.workspace))
    table = render(rows, header)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(table)
    args.out.with_suffix(".json").write_text(json.dumps({"header": header, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
