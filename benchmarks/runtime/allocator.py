"""ONNX Runtime's memory on real training steps with its own arena and with roam's plan, side by side.

    python -m benchmarks run runtime/allocator                      # the sample's full step
    python -m benchmarks run runtime/allocator STEP.onnx FOLDER ... [--steps 6] [--compare 6] [--workspace calibrate]
    python -m benchmarks run runtime/allocator tests/fixtures --make standard   # full steps made from forward.onnx

Each graph is a full training step whose state is updated in place (`roam make-training-graph
--in-graph-optimizer`): a file, or every `full_step*.onnx` under a folder; with --make, every
`forward.onnx` under a folder made into one first (`standard`: roam's backward; `fused`: ONNX
Runtime's training artifacts with its fused ops, `--backend ort-artifacts --fused`, which needs
onnxruntime-training and torch; the suite's loss). The sample's full step, made from the bundled
artifacts graph, is always the first row. Per graph, `roam optimize` plans it, then `roam train`'s
loop runs --steps steps three times, each in a fresh process:

- ORT default arena: ORT's BFC arena (next power of two), the plan's order;
- ORT same as requested: ORT's BFC arena grown by exactly what is asked (kSameAsRequested);
- ORT + roam allocator: ORT's session allocating from roam's arena (first step recorded).

Bytes are device memory for everything but the state (parameters, moments: buffers the loop owns
and ORT updates in place, the same in every run): for ORT's arenas, what they grew to from the
session's start (their INFO log; the graph's constants are in there); for roam's, its arena,
whatever fell back, and the constants; for the plan, its arena and its constants. Step times come
from two more processes, one session each (ORT's arena, roam's; logs off, thread pools not
spinning), stepped in turn so that both see the same load: medians over the steps after the first.
With --compare N the roam run goes on for N steps and is checked against a plain ORT session (ORT's
default order and arena): largest relative difference of the loss per step and of the final state.
Serving the plan: of step 1's requests, how many are the plan's tensors, how many of those a later
step served at their plan offset, how many were moved (ORT kept them past the plan's lifetimes) and
how many were workspace the plan does not place. Inputs come from `inputs.npz` beside the graph when
present, else are synthesised. Seconds for the tiny graphs, about 10 min a suite graph."""

from __future__ import annotations

import json
import multiprocessing
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from benchmarks import harness

TAKES = "under a minute (the sample); about 10 min a suite graph; --make fused needs onnxruntime-training and torch"
SAMPLE = harness.ROOT / "sample_models" / "gpt2_tiny" / "training_model.onnx"
TIMING_SECONDS = 20  # steps of both sessions in turn: at least --steps, and more while under this
VARIANTS = (("ort", "ORT default arena"), ("ort-same-as-requested", "ORT same as requested"),
            ("roam", "ORT + roam allocator"))


def roam(*args) -> None:
    subprocess.run([sys.executable, "-m", "roam_cli", "-q", *map(str, args)], check=True)


def steps_of(paths: list[Path], make: str | None, work: Path) -> list[Path]:
    """The full steps the paths stand for: files as given, folders searched for `full_step*.onnx`; with
    `make` ("standard" or "fused"), every forward.onnx found made into `work/<its folder>/full_step.onnx`."""
    found = []
    for p in paths:
        if make is None:
            found += sorted(p.rglob("full_step*.onnx")) if p.is_dir() else [p]
            continue
        from benchmarks.exporters.backward import suite_loss

        for forward in sorted(p.rglob("forward.onnx")) if p.is_dir() else [p]:
            step = work / forward.parent.name / "full_step.onnx"
            step.parent.mkdir(parents=True, exist_ok=True)
            backend = ["--backend", "ort-artifacts", "--fused"] if make == "fused" else []
            roam("make-training-graph", forward, "-o", step, "--in-graph-optimizer", "--loss", suite_loss(forward),
                 *backend)
            if (forward.parent / "inputs.npz").is_file():
                (step.parent / "inputs.npz").symlink_to((forward.parent / "inputs.npz").resolve())
            found.append(step)
    return found


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
    from roam_cli.runtime.train import (
        PlannedSession,
        batch_for,
        read_batches,
        starting_values,
    )

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
    """One graph: planned, run with each allocator (fresh processes), then the paired step times."""
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
        # roam's: what the steps it served held (step 1 records the requests: its figure is the layout's)
        served = (later or result["per_step"]) if allocator == "roam" else result["per_step"]
        held = max(s["memory"].get("bytes") or 0 for s in served)
        row["runs"][allocator] = {
            "bytes": held + (constants if allocator == "roam" else 0),
            "unplanned_after_first": sum(s["memory"].get("unplanned", 0) for s in later),
            "served_at_plan_offset": min((s["memory"].get("served_at_plan_offset", 0) for s in later), default=0),
            "loss": [s["outputs"].get("loss") for s in result["per_step"]],
            "arena": result["arena"], "compare": result.get("compare"),
        }
    row["median_step_ms"] = paired_times(str(model), str(plan_path), steps, str(inputs) if inputs else None)
    return row


def main(argv: list[str]) -> dict:
    ap = harness.options(__name__, __doc__)
    ap.add_argument("paths", nargs="*", type=Path, help="full steps, or folders of them (the sample is always first)")
    ap.add_argument("--make", choices=("standard", "fused"),
                    help="the paths hold forward.onnx: make each a full step first (roam's backward, or ORT's fused)")
    ap.add_argument("--steps", type=int, default=6, help="steps per allocator (the first is recorded)")
    ap.add_argument("--compare", type=int, default=0, metavar="N",
                    help="also run N steps with roam's allocator against a plain ORT session")
    ap.add_argument("--workspace", choices=("none", "calibrate"), default="none",
                    help="roam optimize --workspace: calibrate places ORT's kernel scratch in the plan")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sample = work / "gpt2_tiny" / "full_step.onnx"
        sample.parent.mkdir()
        roam("make-training-graph", SAMPLE, "-o", sample, "--in-graph-optimizer")
        for model in [sample] + steps_of(args.paths, args.make, work / "made"):
            inputs = model.parent / "inputs.npz"
            print(f"# {model}", file=sys.stderr, flush=True)
            rows.append(measure(model, work, args.steps, inputs if inputs.is_file() else None, args.compare,
                                args.workspace))
    return {"workspace": args.workspace, "rows": rows}


def table(results: dict) -> str:
    """The bytes of each allocator (MiB) and the step times; how the plan was served; with --compare,
    roam's run against a plain ORT session."""
    def mib(n):
        return harness.mib(n, 2)

    rows = results["rows"]
    bytes_rows, served = [], []
    for r in rows:
        runs = r["runs"]
        ours, ort_ = runs["roam"], runs["ort"]
        planned = r["plan_arena_bytes"] + r["constant_bytes"]
        t = r["median_step_ms"]
        bytes_rows.append([r["graph"], f"{r['nodes']:,}", mib(ort_["bytes"]), mib(runs["ort-same-as-requested"]["bytes"]),
                           mib(ours["bytes"]), mib(planned), f"{ours['bytes'] / planned - 1:+.2%}", mib(r["state_bytes"]),
                           ours["unplanned_after_first"], f"{t['ort']:,.1f}", f"{t['roam']:,.1f}",
                           f"{t['roam'] / t['ort']:.3f}"])
        a = ours["arena"]
        served.append([r["graph"], f"{a['requests']:,}", f"{a['planned_requests']:,}",
                       f"{ours['served_at_plan_offset']:,}", f"{a['planned_moved']:,}", f"{a['workspace_requests']:,}",
                       f"{r['plan_workspace_buffers']:,}"])
    text = harness.markdown_table(
        ["graph", "nodes", "ORT default arena MiB", "ORT same as requested MiB", "ORT + roam allocator MiB",
         "plan arena + constants MiB", "roam / plan", "state (all runs) MiB", "unplanned after step 1", "ORT step ms",
         "roam step ms", "time ratio"], bytes_rows)
    text += "\n" + harness.markdown_table(
        ["graph", "requests per step", "plan's tensors", "served at plan offset", "moved", "workspace not in the plan",
         "plan workspace buffers"], served)
    compared = [r for r in rows if r["runs"]["roam"]["compare"]]
    if compared:
        lines = []
        for r in compared:
            c = r["runs"]["roam"]["compare"]
            plain = statistics.median(c["plain_seconds"][1:] or c["plain_seconds"]) * 1e3
            lines.append([r["graph"], len(c["outputs_max_rel_per_step"]), f"{c['outputs_max_rel']:.2g}",
                          f"{c['state_max_rel']:.2g} ({c['state_tensors']} tensors)", f"{plain:,.1f}"])
        text += "\n" + harness.markdown_table(
            ["graph", "steps", "loss: max relative difference per step", "final state: max relative difference",
             "plain ORT step ms"], lines)
    return text


if __name__ == "__main__":
    sys.exit("run it as: python -m benchmarks run runtime/allocator [options]")
