"""roam's backward against ONNX Runtime's artifacts route on the same inference exports: gradients
and planned memory, one row per model.

Both full steps (AdamW in the graph) of the export as it is (Dropout on) are planned by
`roam optimize --recompute off`: persistent bytes, arena, and roam's total as a multiple of
ORT's (the target: at most 1). For the gradients, both training graphs are built again
with Dropout's ratio set to 0, run on the same random parameters and batch, and each
parameter's gradient compared (largest difference over the largest magnitude; the target:
1e-4). The ORT route needs onnxruntime-training and torch; without them only roam's
columns are given.

`--suite [DIR]`: memory only, for each DIR/<model>/ of `python -m benchmarks.suite` (default
benchmarks/.cache/suite; forward.onnx with its weights never written, and full_step.onnx: ONNX
Runtime's artifacts step, fused ops kept): roam's full step is built from forward.onnx by
`roam make-training-graph --in-graph-optimizer` (the loss the suite used: the model's own where
forward.onnx's output is `loss`, else cross-entropy), and both steps are planned with
`roam optimize --recompute off`; also the seconds roam's step took to build.

    python -m benchmarks run exporters/backward                      # tests/fixtures/{tiny_gpt2,tiny_bert,tiny_resnet}
    python -m benchmarks run exporters/backward model.onnx:cross-entropy other.onnx:none
    python -m benchmarks run exporters/backward.suite --suite        # the suite's models, about 10 min
    python -m benchmarks run exporters/backward.suite --suite --only gpt2_small,resnet50

The fixtures: seconds, with onnxruntime-training and torch for ORT's route. The suite: roam alone."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from benchmarks import harness
from roam_cli.backward.step import training_model
from roam_cli.core.errors import RoamError
from roam_cli.frontend import training_graph
from roam_cli.frontend.onnx_import import load_model
from roam_cli.frontend.optimizer_graph import full_step
from roam_cli.lower import lower_model

TAKES = "seconds on the test fixtures (ORT's route: onnxruntime-training, torch); --suite: about 10 min, roam alone"
FIXTURES = [("tiny_gpt2", "none"), ("tiny_bert", "none"), ("tiny_resnet", "cross-entropy")]


def without_dropout(model: onnx.ModelProto) -> None:
    """Every Dropout's ratio 0: both routes then compute the same function."""
    zero = "benchmark_dropout_ratio"
    model.graph.initializer.append(numpy_helper.from_array(np.array(0.0, np.float32), zero))
    for n in model.graph.node:
        if n.op_type == "Dropout":
            while len(n.input) < 2:
                n.input.append("")
            n.input[1] = zero


def gradients(model: onnx.ModelProto, params: list[str], feeds: dict) -> dict[str, np.ndarray]:
    import onnxruntime as ort
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.graph.output.extend(helper.make_empty_tensor_value_info(f"{p}_grad") for p in params)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in s.get_inputs()}
    out = s.run([f"{p}_grad" for p in params], {k: v for k, v in feeds.items() if k in wanted})
    return dict(zip(params, out))


def feeds_for(model: onnx.ModelProto, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in model.graph.input:
        tt = i.type.tensor_type
        shape = [d.dim_value for d in tt.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if i.name.endswith(".accumulation.buffer"):
            feeds[i.name] = np.zeros(shape, dtype)
        elif np.issubdtype(dtype, np.floating):
            feeds[i.name] = (rng.standard_normal(shape) * (1.0 if i.name.endswith("running_var") is False else 0)
                             ).astype(dtype) * 0.1 + (1.0 if i.name.endswith(("running_var", "var")) else 0.0)
        elif dtype == np.bool_:
            feeds[i.name] = np.ones(shape, dtype)
        else:
            feeds[i.name] = rng.integers(0, 10, shape).astype(dtype)
    return feeds


def plan(step: onnx.ModelProto, folder: Path, name: str) -> dict:
    path = folder / f"{name}.onnx"
    onnx.save(step, str(path))
    return plan_file(path, folder, name)


def plan_file(path: Path, folder: Path, name: str) -> dict:
    run = subprocess.run([sys.executable, "-m", "roam_cli", "-q", "optimize", str(path), "-o", str(folder / f"{name}.json"),
                          "--recompute", "off"], capture_output=True, text=True, cwd=harness.ROOT, check=False)
    if run.returncode != 0:
        raise SystemExit(f"roam optimize {name}: {(run.stderr or run.stdout).strip().splitlines()[-1]}")
    return json.loads((folder / f"{name}.json").read_text())


def built(path: Path, loss: str, dropout: bool, ort: bool):
    """(survey, roam's training graph, parameters it does not reach, ORT's training graph or the
    reason it could not be built) of the export, its Dropouts as exported or with ratio 0."""
    model, _ = load_model(path)
    if not dropout:
        without_dropout(model)
    training_graph.repair(model)
    chosen = training_graph.survey(model)
    ours, unreached = training_model(model, chosen.trainable, chosen.frozen, loss)
    try:
        theirs = training_graph.build(model, chosen, loss, None).training if ort else None
    except RoamError as e:
        theirs = str(e)
    return chosen, ours, unreached, theirs


def row(path: Path, loss: str, folder: Path) -> dict:
    """Plans of both steps as exported (Dropout on); gradients with Dropout's ratio 0."""
    chosen, ours, _, theirs = built(path, loss, dropout=True, ort=True)
    our_plan = plan(lower_model(full_step(ours)), folder, f"{path.parent.name}.roam")
    r = {"model": path.parent.name, "params": len(chosen.trainable),
         "roam_persistent": our_plan["persistent_bytes"], "roam_arena": our_plan["arena_bytes"]}
    if isinstance(theirs, str):
        return r | {"ort_unavailable": theirs}
    their_plan = plan(full_step(theirs), folder, f"{path.parent.name}.ort")
    chosen, ours, unreached, theirs = built(path, loss, dropout=False, ort=True)
    feeds = feeds_for(theirs)
    params = [p for p in chosen.trainable if p not in unreached]
    a, b = gradients(lower_model(ours), params, feeds), gradients(theirs, params, feeds)
    # relative to the tensor's largest element, with a floor of 1e-3 of the model's largest gradient: a
    # gradient that is zero in exact arithmetic (an attention key's bias) is float noise in both
    floor = 1e-3 * max(np.abs(b[p]).max() for p in params)
    worst = max(np.abs(a[p] - b[p]).max() / max(np.abs(b[p]).max(), floor) for p in params)
    return r | compared(our_plan, their_plan) | {"worst_gradient": float(worst)}


def compared(ours: dict, theirs: dict) -> dict:
    """ORT's plan beside roam's: its bytes, roam's total over its total and roam's less its."""
    total = lambda p: p["persistent_bytes"] + p["arena_bytes"]  # noqa: E731
    return {"ort_persistent": theirs["persistent_bytes"], "ort_arena": theirs["arena_bytes"],
            "ratio": total(ours) / total(theirs), "difference": total(ours) - total(theirs)}


def suite_loss(forward_path: Path) -> str:
    """The loss the suite trains a model with: its own where forward.onnx's output is `loss`."""
    forward = onnx.load(str(forward_path), load_external_data=False)
    return "none" if forward.graph.output[0].name == "loss" else "cross-entropy"


def suite_row(folder: Path, scratch: Path) -> dict:
    """roam's full step from the suite's weightless forward.onnx beside ORT's full step, both planned."""
    name = folder.name
    loss = suite_loss(folder / "forward.onnx")
    step = scratch / f"{name}.roam.onnx"
    t = time.time()
    run = subprocess.run([sys.executable, "-m", "roam_cli", "-q", "make-training-graph", str(folder / "forward.onnx"),
                          "-o", str(step), "--loss", loss, "--in-graph-optimizer"], capture_output=True, text=True,
                         cwd=harness.ROOT, check=False)
    seconds = time.time() - t
    if run.returncode != 0:
        return {"model": name, "error": f"roam's step fails: {(run.stderr or run.stdout).strip().splitlines()[-1]}"}
    ours = plan_file(step, scratch, f"{name}.roam")
    theirs = plan_file(folder / "full_step.onnx", scratch, f"{name}.ort")
    return {"model": name, "loss": loss, "build_s": round(seconds, 1), "roam_persistent": ours["persistent_bytes"],
            "roam_arena": ours["arena_bytes"]} | compared(ours, theirs)


def main(argv: list[str]) -> dict:
    ap = harness.options(__name__, __doc__)
    ap.add_argument("models", nargs="*", help="MODEL.onnx:LOSS (default: the three test fixtures)")
    ap.add_argument("--keep", type=Path, help="folder to keep the steps and plans in")
    ap.add_argument("--suite", type=Path, nargs="?", const=harness.CACHE / "suite",
                    help="a `python -m benchmarks.suite` folder (default benchmarks/.cache/suite): "
                         "memory of each model's steps")
    ap.add_argument("--only", help="with --suite: comma-separated models")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        if args.suite:
            harness.needs(args.suite, "python -m benchmarks.suite (needs the bench extra)")
            folders = sorted(p.parent for p in args.suite.glob("*/model.json"))
            for folder in [f for f in folders if not args.only or f.name in args.only.split(",")]:
                rows.append(suite_row(folder, args.keep or Path(scratch)))
                print(f"{folder.name}: {rows[-1].get('error') or format(rows[-1]['ratio'], '.4f')}", file=sys.stderr,
                      flush=True)
            return {"suite": True, "rows": rows}
        models = [(Path(m.rsplit(":", 1)[0]), m.rsplit(":", 1)[1]) for m in args.models] or \
            [(harness.ROOT / "tests" / "fixtures" / name / "forward.onnx", loss) for name, loss in FIXTURES]
        for path, loss in models:
            rows.append(row(path, loss, args.keep or Path(scratch)))
    return {"suite": False, "rows": rows}


def table(results: dict) -> str:
    """MiB (the suite) or KiB (small exports); roam/ORT is the ratio of the totals, persistent + arena."""
    rows = results["rows"]
    if results["suite"]:
        def mib(n):
            return harness.mib(n, 1)
        return harness.markdown_table(
            ["model", "loss", "roam step build s", "roam persistent MiB", "roam arena MiB", "ORT persistent MiB",
             "ORT arena MiB", "roam/ORT total", "roam − ORT MiB"],
            [[r["model"], r["error"], *["–"] * 7] if "error" in r else
             [r["model"], r["loss"], f"{r['build_s']:.0f}", mib(r["roam_persistent"]), mib(r["roam_arena"]),
              mib(r["ort_persistent"]), mib(r["ort_arena"]), f"{r['ratio']:.4f}", f"{r['difference'] / 2**20:+,.2f}"]
             for r in rows], "llrrrrrrr")
    kib = lambda n: f"{n / 1024:,.0f}"  # noqa: E731
    return harness.markdown_table(
        ["model", "params", "roam persistent KiB", "roam arena KiB", "ORT persistent KiB", "ORT arena KiB",
         "roam/ORT total", "worst gradient rel. diff"],
        [[r["model"], r["params"], kib(r["roam_persistent"]), kib(r["roam_arena"]),
          *([f"ORT route unavailable: {r['ort_unavailable']}", "–", "–", "–"] if "ort_unavailable" in r else
            [kib(r["ort_persistent"]), kib(r["ort_arena"]), f"{r['ratio']:.3f}", f"{r['worst_gradient']:.2e}"])]
         for r in rows])
