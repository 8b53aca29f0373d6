"""Where a training graph's float32 gradients leave float64's: its arithmetic, or its branches?

    python -m benchmarks run exporters/branch_case --case DIR

DIR holds an export (one *.onnx, weights beside it) and `pytorch.npz` as the shared cases write it:
the batch (`input:NAME`, `labels`), PyTorch's loss and every parameter's gradient in float32 and
float64 (`loss32`, `loss64`, `grad32:NAME`, `grad64:NAME`). roam's training graph of the export
(`make-training-graph --loss cross-entropy`) runs three ways on the export's weights: in float32 on
ONNX Runtime, in float64 on onnx's reference evaluator, and in float64 with every branch decision
(each boolean value: a ReLU's or Clip's mask, a comparison) taken from the float32 run. Where the
last agrees with the float32 run and not with float64, the float32 gradients are exact arithmetic
on the other side of a kink: float32's rounding moved an input across an edge of a piecewise
function, and no rule is wrong. Each gradient's distance is ‖a − b‖ over the larger of ‖b‖ and
1e-4 of the largest gradient's norm (the floor the case's own PyTorch figures are stated with).

Whether float32 can decide such a kink at all is the input's conditioning, measured last
(`--draws`): float64 runs again with the batch and every weight moved by one float32 unit in the
last place each (a random sign per element: the resolution at which the export stores them), and
counts the draws whose gradients leave the unmoved float64 ones by more than `--tolerance`. Where
exact arithmetic on data one rounding apart lands on either side, so can any float32 computation,
PyTorch's included."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from benchmarks import harness
from roam_cli import gradcheck
from roam_cli.frontend.onnx_import import import_model

TAKES = "about a minute; needs a case folder (an export and PyTorch's figures, e.g. the shared mobilenet_v2_noopt)"
GRADIENT = "_grad.accumulation.buffer.out"  # a training graph's gradient of a parameter, accumulated


def main(argv: list[str]) -> dict:
    ap = harness.options(__name__, __doc__)
    ap.add_argument("--case", type=Path, required=True, help="the case folder: one *.onnx and pytorch.npz")
    ap.add_argument("--draws", type=int, default=20, help="float64 runs on data one float32 ulp apart (0: none)")
    ap.add_argument("--tolerance", type=float, default=7.2e-3,
                    help="a draw whose gradients leave float64's by more than this has crossed a kink")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    export = next(iter(sorted(args.case.glob("*.onnx"))), None)
    harness.needs(args.case / "pytorch.npz", "the case folder holds pytorch.npz beside its export")
    reference = dict(np.load(args.case / "pytorch.npz"))
    with tempfile.TemporaryDirectory() as tmp:
        step = Path(tmp) / "train.onnx"
        subprocess.run([sys.executable, "-m", "roam_cli", "-q", "make-training-graph", str(export), "-o", str(step),
                        "--loss", "cross-entropy"], check=True)
        model, graph = onnx.load(step), import_model(step).graph
    weights = {t.name: numpy_helper.to_array(t, base_dir=str(args.case)) for t in onnx.load(export).graph.initializer}
    branches = [o for n in model.graph.node for o in n.output if o in graph.values
                and graph.values[o].dtype == TensorProto.BOOL]
    wanted = ["loss", *[o.name for o in model.graph.output if o.name.endswith(GRADIENT)]]
    single = dict(zip(wanted + branches, gradcheck.session(gradcheck.with_outputs(model, wanted + branches, graph))(
        feeds(model, weights, reference, np.float32))))
    wide = gradcheck.widened(model)
    wide_feeds = feeds(wide, weights, reference, np.float64)
    exact = run_reference(wide, wanted, wide_feeds)
    taken = {b: single[b] for b in branches}
    steered = run_reference(without_producers(wide, taken), wanted, wide_feeds | taken)
    exact_branches = run_reference(wide, branches, wide_feeds)
    flipped = {b: int((single[b] != exact_branches[b]).sum()) for b in branches}
    largest = max(np.linalg.norm(v) for k, v in reference.items() if k.startswith("grad64:"))
    rows = []
    for name in wanted[1:]:
        p = name[: -len(GRADIENT)]
        rows.append({"parameter": p, **{label: distance(a, reference[f"grad64:{p}"], largest) for label, a in
                     (("float32", single[name]), ("float64", exact[name]), ("float64_float32_branches", steered[name]),
                      ("pytorch_float32", reference[f"grad32:{p}"]))},
                     "float32_to_steered": distance(single[name], steered[name], largest)})
    rows.sort(key=lambda r: -r["float32"])
    rng = np.random.default_rng(args.seed)
    draws = []
    for _ in range(args.draws):
        moved = run_reference(wide, wanted, {k: one_ulp_apart(v, rng) for k, v in wide_feeds.items()})
        worst = max(((distance(moved[n], exact[n], largest), n[: -len(GRADIENT)]) for n in wanted[1:]))
        draws.append({"worst": worst[0], "parameter": worst[1]})
    loss64 = float(reference["loss64"])
    return {"case": args.case.name, "loss": {"float32": rel(single["loss"], loss64), "float64": rel(exact["loss"], loss64),
                                             "pytorch_float32": rel(reference["loss32"], loss64)},
            "draws": draws, "tolerance": args.tolerance,
            "branches_flipped": {b: n for b, n in flipped.items() if n}, "branch_elements": int(sum(
                single[b].size for b in branches)), "parameters": rows}


def feeds(model: onnx.ModelProto, weights: dict, reference: dict, dtype) -> dict:
    """The batch, the export's weights, zero gradient buffers (reset by lazy_reset_grad)."""
    out = {}
    for i in model.graph.input:
        shape = [d.dim_value if d.HasField("dim_value") else 1 for d in i.type.tensor_type.shape.dim]
        if f"input:{i.name}" in reference:
            out[i.name] = reference[f"input:{i.name}"].astype(dtype)
        elif i.name == "labels":
            out[i.name] = reference["labels"].astype(np.int64)
        elif i.type.tensor_type.elem_type == TensorProto.BOOL:
            out[i.name] = np.ones(shape, np.bool_)
        elif i.name in weights:
            w = weights[i.name]
            out[i.name] = w.astype(dtype) if w.dtype.kind == "f" else w
        else:
            out[i.name] = np.zeros(shape, dtype)
    return out


def run_reference(model: onnx.ModelProto, names: list[str], given: dict) -> dict:
    """`names` computed by onnx's reference evaluator (ONNX Runtime lacks float64 Conv)."""
    from onnx.reference import ReferenceEvaluator

    del model.graph.output[:]
    model.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in names)
    inputs = {i.name for i in model.graph.input}
    return dict(zip(names, ReferenceEvaluator(model).run(None, {k: v for k, v in given.items() if k in inputs})))


def one_ulp_apart(value: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A float64 input stored in float32 (the batch, a weight) moved by one float32 unit in the
    last place per element, up or down at random; other values as they are."""
    if value.dtype != np.float64:
        return value
    ulp = np.spacing(np.abs(value).astype(np.float32)).astype(np.float64)
    return value + rng.choice([-1.0, 1.0], value.shape) * ulp


def without_producers(model: onnx.ModelProto, values: dict) -> onnx.ModelProto:
    """A copy of `model` whose `values` are graph inputs instead of computed."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = [n for n in out.graph.node if not set(n.output) & set(values)]
    del out.graph.node[:]
    out.graph.node.extend(kept)
    out.graph.input.extend(helper.make_tensor_value_info(k, TensorProto.BOOL, v.shape) for k, v in values.items())
    return out


def distance(a, b, largest: float) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / max(np.linalg.norm(b), 1e-4 * largest))


def rel(a, b: float) -> float:
    return float(abs(float(a) - b) / abs(b))


def table(results: dict) -> str:
    loss = results["loss"]
    flips = ", ".join(f"{n} in {b}" for b, n in results["branches_flipped"].items()) or "none"
    head = (f"{results['case']}: loss from PyTorch's float64 {loss['float32']:.1e} (roam float32), {loss['float64']:.1e} "
            f"(roam float64), {loss['pytorch_float32']:.1e} (PyTorch float32); branch elements float32 decides "
            f"otherwise than float64: {flips} (of {results['branch_elements']:,})\n\n")
    rows = [[r["parameter"], f"{r['float32']:.1e}", f"{r['float64']:.1e}", f"{r['float64_float32_branches']:.1e}",
             f"{r['pytorch_float32']:.1e}", f"{r['float32_to_steered']:.1e}"] for r in results["parameters"][:8]]
    draws = results.get("draws", [])
    if draws:
        crossed = [d for d in draws if d["worst"] > results["tolerance"]]
        head += (f"Conditioning: float64 on the batch and weights one float32 ulp apart, {len(draws)} draws: "
                 f"{len(crossed)} leave the unmoved float64 gradients by more than {results['tolerance']:.1e}"
                 + (f" (up to {max(d['worst'] for d in crossed):.2f}, on {crossed[0]['parameter']})" if crossed else "")
                 + f"; the others within {max((d['worst'] for d in draws if d not in crossed), default=0):.1e}\n\n")
    return head + harness.markdown_table(
        ["parameter (worst 8 in float32)", "roam float32", "roam float64", "float64, float32's branches",
         "PyTorch float32", "float32 to float64 with its branches"], rows)
