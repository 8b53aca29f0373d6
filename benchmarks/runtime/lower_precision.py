"""Where a lowered graph's numbers differ from the fused graph's: the rules, or float32?

    python -m benchmarks run runtime/lower_precision benchmarks/.cache/suite/resnet50/training_model.onnx [--float64 resnet50]

Inputs as runtime/lower_check draws them (random weights and inputs, Dropout ratios 0). Two tests:

- **Each op on the same inputs.** The fused graph runs once in onnxruntime-training with every input
  and output of its fused nodes kept; then each fused node runs alone, and so does its lowering, on
  exactly those inputs: per op type, the largest difference of any output relative to that output's
  largest value. What a rule itself costs, without the rest of the graph amplifying it.
- **--float64 MODEL** (a suite model; needs torch and transformers): PyTorch runs the same model in
  float64 on the same parameters, buffers, inputs and labels, and each gradient of the fused and the
  lowered float32 graphs is compared with it (‖x − ref‖ / ‖ref‖). If the lowered graph is no farther
  from the exact gradients than the fused one, the two float32 graphs differ by rounding, amplified by
  the graph, not by a rule.

Needs onnxruntime-training; a few minutes for ResNet-50 (with --float64, torch as well)."""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from benchmarks import harness
from benchmarks.runtime.lower_check import feeds_for, session, with_weights
from roam_cli.lower import lower_model, nonstandard

TAKES = "a few minutes (ResNet-50); needs onnxruntime-training, and torch with transformers for --float64"


GRAD = "_grad.accumulation.buffer"


def relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30))


def per_op(fused: onnx.ModelProto) -> dict[str, tuple[int, float]]:
    """op type -> (nodes, largest relative difference of lowered against fused on the same inputs)."""
    typed = {v.name: v for v in (*shape_inference.infer_shapes(fused).graph.value_info, *fused.graph.input,
                                 *fused.graph.output)}
    consts = {t.name: t for t in fused.graph.initializer}
    targets = [n for n in fused.graph.node if nonstandard(n)]
    kept = dict.fromkeys(x for n in targets for x in (*n.input, *n.output) if x and x not in consts)
    probe = onnx.ModelProto()
    probe.CopyFrom(fused)
    # a graph input is not made an output: ORT would hand back a view of the (freed) feed's copy
    skip = {o.name for o in (*probe.graph.output, *probe.graph.input)}
    probe.graph.output.extend(typed.get(x) or helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, None)
                              for x in kept if x not in skip)
    run = session(probe)
    values = feeds_for(run)
    values = dict(zip([o.name for o in run.get_outputs()], run.run(None, {k: v.copy() for k, v in values.items()}))) | values
    del run, probe

    def info(name):
        v = values[name]
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))

    found: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for n in targets:
        ins = [x for x in n.input if x]
        alone = helper.make_model(
            helper.make_graph([n], n.name, [info(x) for x in ins if x not in consts],
                              [info(o) for o in n.output if o], [consts[x] for x in ins if x in consts]),
            opset_imports=list(fused.opset_import), ir_version=fused.ir_version)
        feeds = {x: values[x] for x in ins if x not in consts}
        want = session(alone).run(None, {k: v.copy() for k, v in feeds.items()})
        low = session(lower_model(alone))
        got = dict(zip([o.name for o in low.get_outputs()], low.run(None, {k: v.copy() for k, v in feeds.items()})))
        key = n.op_type + (" (training)" if n.op_type == "BatchNormalization" else "")
        found[key][0] += 1
        for name, w in zip([o for o in n.output if o], want):
            if w.dtype != np.bool_ and w.size:
                found[key][1] = max(found[key][1], relative(got[name], w))
    return {k: tuple(v) for k, v in sorted(found.items())}


def float64_reference(model_name: str, fused: onnx.ModelProto, feeds: dict) -> tuple[float, dict[str, np.ndarray]]:
    """(loss, {parameter: gradient}) of the suite model in PyTorch float64, on the graph's values."""
    import torch

    from benchmarks import suite

    spec = next(m for m in suite.MODELS if m.name == model_name)
    wrapper, _, input_names, _, loss = suite.build(spec, meta=False)
    wrapper = wrapper.double().train()
    values = {t.name: numpy_helper.to_array(t) for t in fused.graph.initializer} | feeds
    state = wrapper.m.state_dict()
    wrapper.m.load_state_dict({k: torch.from_numpy(values[k].astype(np.float64) if v.is_floating_point() else values[k])
                               if k in values else v for k, v in state.items()})
    args = [torch.from_numpy(feeds[n].astype(np.float64) if feeds[n].dtype == np.float32 else feeds[n])
            for n in input_names]
    if loss == "cross-entropy":  # make-training-graph's loss on the logits, against the graph's label input
        labels = next(v for k, v in feeds.items() if v.dtype == np.int64 and k not in input_names)
        value = torch.nn.functional.cross_entropy(wrapper(*args), torch.from_numpy(labels))
    else:  # the model's own loss
        value = wrapper(*args)
    value.backward()
    return value.item(), {n: p.grad.numpy() for n, p in wrapper.m.named_parameters() if p.grad is not None}


def main(argv: list[str]) -> dict:
    ap = harness.options(__name__, __doc__)
    ap.add_argument("graph", type=Path, help="an ORT artifacts training graph (training_model.onnx)")
    ap.add_argument("--float64", metavar="MODEL", help="compare both with PyTorch's float64 run of this suite model")
    a = ap.parse_args(argv)
    fused = with_weights(harness.needs(a.graph, "python -m benchmarks.suite makes the suite's graphs"))
    out = {"graph": f"{a.graph.parent.name}/{a.graph.name}",
           "per_op": {op: {"nodes": count, "max_relative_difference": diff} for op, (count, diff) in per_op(fused).items()},
           "float64": None}
    if not a.float64:
        return out
    lowered = lower_model(fused)
    ours = session(lowered)
    feeds = feeds_for(ours)
    names = [o.name for o in ours.get_outputs()]
    got = dict(zip(names, ours.run(None, {k: v.copy() for k, v in feeds.items()})))
    for n in fused.graph.node:  # the fused accumulators' results, under the lowered names
        if n.op_type == "InPlaceAccumulatorV2" and len(n.output) == 1:
            n.output.append(f"{n.input[0]}.out")
    fused.graph.output.extend(o for o in lowered.graph.output if o.name not in {x.name for x in fused.graph.output})
    theirs = session(fused)
    want = dict(zip([o.name for o in theirs.get_outputs()], theirs.run(None, {k: v.copy() for k, v in feeds.items()})))
    del ours, theirs
    loss, exact = float64_reference(a.float64, fused, feeds)
    rows = []
    for name, ref in exact.items():
        o = f"{name}{GRAD}.out"
        if o not in got:
            continue
        start = feeds[f"{name}{GRAD}"].astype(np.float64)  # the accumulators add the gradient to their input
        f, g = want[o] - start, got[o] - start
        norm = np.linalg.norm(ref)
        rows.append((np.linalg.norm(f - ref) / norm, np.linalg.norm(g - ref) / norm, np.linalg.norm(g - f) / norm))
    r = np.array(rows)
    out["float64"] = {
        "model": a.float64, "loss": {"float64": loss, "fused": float(want[names[0]]), "lowered": float(got[names[0]])},
        "gradients": len(rows),
        "relative_error": {label: dict(zip(("fused", "lowered", "lowered_vs_fused"), map(float, fn(r, axis=0))))
                           for label, fn in (("median", np.median), ("largest", np.max), ("smallest", np.min))},
        "lowered_farther": int((r[:, 1] > r[:, 0]).sum())}
    return out


def table(results: dict) -> str:
    text = harness.markdown_table(
        ["fused op", "nodes", "largest relative difference, lowered vs fused, same inputs"],
        [[op, v["nodes"], f"{v['max_relative_difference']:.2e}"] for op, v in results["per_op"].items()])
    f = results["float64"]
    if f:
        loss = f["loss"]
        text += (f"\nloss: float64 {loss['float64']:.9f}, fused {loss['fused']:.9f}, lowered {loss['lowered']:.9f}; "
                 f"{f['gradients']} gradients, ‖x − float64‖ / ‖float64‖:\n\n")
        text += harness.markdown_table(
            ["", "fused vs float64", "lowered vs float64", "lowered vs fused"],
            [[label, *(f"{e[k]:.2e}" for k in ("fused", "lowered", "lowered_vs_fused"))]
             for label, e in f["relative_error"].items()])
        text += f"\nlowered farther from float64 than fused: {f['lowered_farther']} of {f['gradients']} gradients\n"
    return text


if __name__ == "__main__":
    sys.exit("run it as: python -m benchmarks run runtime/lower_precision [options]")
