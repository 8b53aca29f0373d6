"""Mixed precision (roam_cli/precision, the GradScaler of frontend/optimizer_graph): the policy on a
small graph, loss scaling's skip and growth, the bfloat16 emulation's rounding, an export already
in low precision, the refusals, and a small step made, planned and trained in both types. Every
expectation is computed by hand."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnxruntime.capi import _pybind_state
from onnx import TensorProto, numpy_helper
from onnx_builder import model, node, save

from conftest import roam
from roam_cli.core.errors import RoamError
from roam_cli.frontend import providers
from roam_cli.frontend.optimizer_graph import GROWTH_TRACKER, LOSS_SCALE, STEP
from roam_cli.precision import masters
from roam_cli.precision.autocast import autocast
from roam_cli.precision.emulate import emulate, lacking

F, BF16, FP16, I64 = TensorProto.FLOAT, TensorProto.BFLOAT16, TensorProto.FLOAT16, TensorProto.INT64


def types_of(m: onnx.ModelProto) -> dict[str, int]:
    g = m.graph
    out = {vi.name: vi.type.tensor_type.elem_type for vi in (*g.input, *g.output, *g.value_info)}
    return out | {t.name: t.data_type for t in g.initializer}


def casts(m: onnx.ModelProto) -> dict[str, tuple[str, int]]:
    return {n.output[0]: (n.input[0], n.attribute[0].i) for n in m.graph.node if n.op_type == "Cast"}


# --- the policy ------------------------------------------------------------------------------

def policy_graph() -> tuple[onnx.ModelProto, dict]:
    """x @ W read by two products; the product's bias a parameter; a residual sum with the batch; a
    constant scalar and mask fill; a softmax and a layer norm; every tensor float32, shapes [2, 4]
    ([4, 4] for W, [4] for b)."""
    nodes = [node("MatMul", ["x", "W"], ["h"]), node("Add", ["h", "b"], ["hb"]), node("Add", ["hb", "x"], ["hs"]),
             node("Mul", ["h", "half"], ["m"]), node("Relu", ["m"], ["r"]), node("MatMul", ["r", "W"], ["h2"]),
             node("Softmax", ["h2"], ["p"]), node("Where", ["keep", "r", "fill"], ["w"]),
             node("LayerNormalization", ["hs", "ln.w", "ln.b"], ["y"], axis=-1)]
    shapes = {"x": [2, 4], "W": [4, 4], "b": [4], "ln.w": [4], "ln.b": [4], "keep": [2, 4]}
    m = model(nodes, [("x", shapes["x"]), ("W", shapes["W"]), ("b", [4]), ("ln.w", [4]), ("ln.b", [4]),
                      ("keep", [2, 4], TensorProto.BOOL)],
              [("y", [2, 4]), ("p", [2, 4]), ("w", [2, 4])],
              {"half": np.array(0.5, np.float32), "fill": np.array(np.finfo(np.float32).min, np.float32)})
    types = {name: (F, (2, 4)) for name in ("h", "hb", "hs", "m", "r", "h2", "p", "w", "y")}
    types |= {name: (F, tuple(s)) for name, s in shapes.items()} | {"keep": (TensorProto.BOOL, (2, 4))}
    types |= {"half": (F, ()), "fill": (F, ())}
    return m, types


@pytest.mark.parametrize("low", [BF16, FP16])
def test_the_policy_on_a_small_graph(low):
    """The products compute in the low type, W cast once for both; the product's bias is added in the
    low type (torch's F.linear casts it with the weight); the residual Add of that and the float32
    batch promotes to float32, as torch does (bf16 + fp32 tensor -> fp32); a constant takes the
    other operand's type (a 0-dim tensor in torch); softmax and layer norm compute in float32; Relu
    follows its input."""
    m, types = policy_graph()
    autocast(m, low, types, onnx.defs.onnx_opset_version())
    got = types_of(onnx.shape_inference.infer_shapes(m, strict_mode=True))  # and every op's types agree
    made = casts(m)
    assert sorted(made.values()) == sorted([("x", low), ("W", low), ("b", low), ("hb", F), ("h2", F)])
    assert {got[x] for x in ("h", "hb", "m", "r", "h2", "w")} == {low}
    assert {got[x] for x in ("hs", "p", "y")} == {F}
    inits = {t.name: t for t in m.graph.initializer}
    mul = next(n for n in m.graph.node if n.op_type == "Mul")
    assert inits[mul.input[1]].data_type == low and float(numpy_helper.to_array(inits[mul.input[1]])) == 0.5
    # float32's most negative value stands for "masked": the low type's own, not -inf
    where = next(n for n in m.graph.node if n.op_type == "Where")
    fill = numpy_helper.to_array(inits[where.input[2]]).astype(np.float64)
    assert fill == {BF16: -3.3895313892515355e38, FP16: -65504.0}[low]


def test_a_weight_transposed_for_its_product_is_cast_before_the_transpose():
    """x @ W^T as exporters write nn.Linear: Transpose(W) read by the MatMul alone. Its low copy is
    W's cast, transposed in the low type (a weight copy of W's, half the bytes of a float32
    transpose); a transpose read by something else too stays float32 and is cast after."""
    m = model([node("Transpose", ["W"], ["Wt"], perm=[1, 0]), node("MatMul", ["x", "Wt"], ["y"]),
               node("Transpose", ["V"], ["Vt"], perm=[1, 0]), node("MatMul", ["x", "Vt"], ["z"]),
               node("Add", ["Vt", "Vt"], ["u"])],
              [("x", [2, 4]), ("W", [3, 4]), ("V", [4, 4])], [("y", [2, 3]), ("z", [2, 4]), ("u", [4, 4])])
    types = {"x": (F, (2, 4)), "W": (F, (3, 4)), "Wt": (F, (4, 3)), "y": (F, (2, 3)), "V": (F, (4, 4)),
             "Vt": (F, (4, 4)), "z": (F, (2, 4)), "u": (F, (4, 4))}
    autocast(m, BF16, types, onnx.defs.onnx_opset_version())
    got = types_of(onnx.shape_inference.infer_shapes(m, strict_mode=True))
    assert sorted(casts(m).values()) == [("Vt", BF16), ("W", BF16), ("x", BF16)]
    assert (got["Wt"], got["Vt"], got["u"]) == (BF16, F, F)
    assert [n.op_type for n in m.graph.node][:3] == ["Cast", "Transpose", "Cast"]  # W's cast, its move, x's cast


def test_a_weight_read_directly_and_through_a_move_is_cast_once_before_both():
    """W transposed early (the move's one reader comes last) and read directly by a product in
    between: the direct read makes W's cast after the transpose; the move's reader then needs it
    before the transpose: the one Cast moves up, and the graph stays in order (TorchScript's ALBERT
    reads a shared weight so)."""
    m = model([node("Transpose", ["W"], ["Wt"], perm=[1, 0]), node("MatMul", ["x", "W"], ["a"]),
               node("MatMul", ["a", "Wt"], ["b"])], [("x", [2, 4]), ("W", [4, 4])], [("b", [2, 4])])
    types = {"x": (F, (2, 4)), "W": (F, (4, 4)), "Wt": (F, (4, 4)), "a": (F, (2, 4)), "b": (F, (2, 4))}
    autocast(m, BF16, types, onnx.defs.onnx_opset_version())
    onnx.checker.check_model(m, full_check=True)  # in order, and every op's types agree
    assert sorted(casts(m).values()) == [("W", BF16), ("x", BF16)]
    assert [n.op_type for n in m.graph.node] == ["Cast", "Transpose", "Cast", "MatMul", "MatMul"]


def conv_at_opset_17() -> tuple[onnx.ModelProto, dict]:
    m = model([node("Conv", ["x", "w"], ["c"]), node("ReduceMean", ["c"], ["y"], axes=[2, 3], keepdims=0)],
              [("x", [1, 2, 4, 4]), ("w", [3, 2, 1, 1])], [("y", [1, 3])])
    m.opset_import[0].version = 17
    return m, {"x": (F, (1, 2, 4, 4)), "w": (F, (3, 2, 1, 1)), "c": (F, (1, 3, 4, 4)), "y": (F, (1, 3))}


def test_bf16_convolutions_raise_an_opset_17_model_through_onnxs_converter():
    """ONNX defines Conv in bfloat16 from opset 22: a TorchScript export at 17 is converted (ReduceMean's
    axes attribute becomes an input at 18) and raised, not relabelled, where ONNX Runtime loads 22."""
    m, types = conv_at_opset_17()
    autocast(m, BF16, types, 22)
    assert next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")) == 22
    onnx.checker.check_model(m, full_check=True)
    mean = next(n for n in m.graph.node if n.op_type == "ReduceMean")
    assert len(mean.input) == 2 and not any(a.name == "axes" for a in mean.attribute)


def test_bf16_convolutions_stay_float32_where_onnx_runtime_loads_no_opset_defining_them():
    """onnxruntime-training 1.19.2 loads opsets up to 21, where Conv has no bfloat16: the step it can
    run keeps its opset and convolves in float32 (it refused the raised one: an internal error)."""
    m, types = conv_at_opset_17()
    autocast(m, BF16, types, 21)
    assert next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")) == 17
    assert [n.op_type for n in m.graph.node] == ["Conv", "ReduceMean"] and types_of(m)["y"] == F  # no Cast


def test_the_highest_opset_is_one_this_onnx_runtime_loads():
    highest = providers.highest_opset()
    assert 18 <= highest <= onnx.defs.onnx_opset_version()
    if ort.__version__.startswith("1.19."):  # onnxruntime-training's last release
        assert highest == 21


# --- fp16's loss scaling ---------------------------------------------------------------------------

def linear_export(folder) -> str:
    """logits = x @ fc.weight (fc.weight [2, 2] a parameter), for a cross-entropy over 2 classes."""
    m = model([node("MatMul", ["x", "fc.weight"], ["logits"])], [("x", [1, 2])], [("logits", [1, 2])],
              {"fc.weight": np.array([[0.5, -0.25], [0.125, 1.0]], np.float32)})
    return save(m, folder / "linear.onnx")


def session(path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def test_loss_scaling_skips_the_update_on_an_overflow_and_grows_the_scale_after_clean_steps(tmp_path):
    """GradScaler's semantics, in the step: scale 65536 times a gradient of 1e4 overflows float16
    (65504 at most), so the first step changes no parameter, moment or step counter, and the scale
    halves; with growth_interval 2, two clean steps double it back. A clean first AdamW step (torch's
    maths) moves each weight by the learning rate against its gradient's sign: m / sqrt(v) = g / |g|."""
    r = roam("make-training-graph", linear_export(tmp_path), "-o", tmp_path / "step.onnx", "--loss",
             "cross-entropy", "--in-graph-optimizer", "--precision", "fp16", "--grad-scaler", "growth_interval=2",
             "--optimizer-setting", "convention=pytorch", "--optimizer-setting", "eps=0",
             "--optimizer-setting", "weight_decay=0")
    assert r.code == 0, r.err
    step = onnx.load(tmp_path / "step.onnx")
    assert json.loads(next(p.value for p in step.metadata_props if p.key == "roam.initial_state")) == {LOSS_SCALE: 65536.0}
    s = session(tmp_path / "step.onnx")
    outputs = [o.name for o in s.get_outputs()]
    w = np.array([[0.5, -0.25], [0.125, 1.0]], np.float32)
    state = {"fc.weight": w, "fc.weight.exp_avg": np.zeros_like(w), "fc.weight.exp_avg_sq": np.zeros_like(w),
             STEP: np.zeros([1], np.int64), LOSS_SCALE: np.array(65536.0, np.float32),
             GROWTH_TRACKER: np.array(0, np.int64), "learning_rate": np.array([0.01], np.float32)}

    def run(x):
        got = dict(zip(outputs, s.run(None, {**state, "x": np.array([x], np.float32), "labels": np.array([0])})))
        state.update({name.removesuffix(".out"): v for name, v in got.items() if name.endswith(".out")})
        return got

    run([1e4, 1e4])  # dlogits = scale * (softmax - onehot): d fc.weight = x^T dlogits ~ 1e4 * 65536 * 0.5 > 65504
    assert np.array_equal(state["fc.weight"], w) and not state["fc.weight.exp_avg"].any()
    assert state[STEP] == 0 and state[LOSS_SCALE] == 32768.0 and state[GROWTH_TRACKER] == 0
    run([1.0, 1.0])
    # the gradient: x^T (softmax(logits) - onehot(0)); logits = [0.625, 0.75]: class 0's part is negative
    grad_sign = np.array([[-1, 1], [-1, 1]], np.float32)
    np.testing.assert_allclose(state["fc.weight"], w - 0.01 * grad_sign, rtol=1e-6)
    assert state[STEP] == 1 and state[LOSS_SCALE] == 32768.0 and state[GROWTH_TRACKER] == 1
    run([1.0, 1.0])
    assert state[STEP] == 2 and state[LOSS_SCALE] == 65536.0 and state[GROWTH_TRACKER] == 0


# --- bfloat16 on the CPU provider ------------------------------------------------------------------

def test_the_emulation_rounds_each_result_to_bfloat16_as_a_bf16_kernel_does():
    """bf16 keeps 8 significant bits: from 1 the next value is 1 + 2^-7, from 256 it is 258. An Add
    computed in float32 and rounded to nearest, ties to even: 1 + 2^-8 -> 1, 1 + 3 * 2^-9 -> 1 + 2^-7,
    257 -> 256. The Reshape, which the CPU provider has a bfloat16 kernel for, stays as it is."""
    m = model([node("Cast", ["a"], ["a16"], to=BF16), node("Cast", ["b"], ["b16"], to=BF16),
               node("Add", ["a16", "b16"], ["s16"]), node("Reshape", ["s16", "shape"], ["r16"]),
               node("Cast", ["r16"], ["s"], to=F)], [("a", [3]), ("b", [3])], [("s", [3])],
              {"shape": np.array([3], np.int64)}, value_info=[("a16", [3], BF16), ("b16", [3], BF16),
                                                                ("s16", [3], BF16), ("r16", [3], BF16)])
    # (onnxruntime-training 1.19 lists no kernels: roam then emulates every 16-bit node but Cast)
    registry = hasattr(_pybind_state, "get_all_opkernel_def")
    assert [n.op_type for n in lacking(m)] == (["Add"] if registry else ["Add", "Reshape"])
    with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
        session_of(m)
    assert emulate(m) == (1 if registry else 2)
    if registry:
        assert [n.op_type for n in m.graph.node] == ["Cast", "Cast", "Cast", "Cast", "Add", "Cast", "Reshape", "Cast"]
    (s,) = session_of(m).run(None, {"a": np.array([1, 1, 256], np.float32),
                                     "b": np.array([2**-8, 3 * 2**-9, 1], np.float32)})
    assert s.tolist() == [1.0, 1 + 2**-7, 256.0]


def session_of(m: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


# --- exports already in low precision --------------------------------------------------------------

def test_a_half_export_becomes_float32_with_its_weights_as_masters():
    """model.half()'s export: fp16 weights, an fp16 data input, a cast to fp16 of an integer mask.
    Everything becomes float32: the embedded constant's values exactly, the weight's declared type
    (its value is read by roam train), the input (the step takes float32 data), the cast's target; a
    cast between two float32 values is dropped, its reader reads its input."""
    m = model([node("Cast", ["mask"], ["maskf"], to=FP16), node("MatMul", ["x", "fc.weight"], ["h"]),
               node("Cast", ["h"], ["h16"], to=FP16), node("Mul", ["h16", "maskf"], ["y"])],
              [("x", [2, 2], FP16), ("mask", [2, 2], I64)], [("y", [2, 2], FP16)],
              {"fc.weight": np.array([[1, 2], [3, 4]], np.float16), "third": np.array(1 / 3, np.float16)},
              value_info=[("h", [2, 2], FP16), ("h16", [2, 2], FP16), ("maskf", [2, 2], FP16)])
    assert masters.low_type_of(m) == FP16
    assert masters.to_float32(m, FP16, ["fc.weight"]) == ["fc.weight", "third"]
    assert {x: t for x, t in types_of(m).items() if t in (FP16, BF16)} == {}
    third = next(t for t in m.graph.initializer if t.name == "third")
    assert numpy_helper.to_array(third) == np.float32(np.float16(1 / 3))
    assert [n.op_type for n in m.graph.node] == ["Cast", "MatMul", "Mul"]
    assert m.graph.node[2].input[0] == "h"


def test_an_export_mixing_both_low_types_is_refused():
    m = model([node("Cast", ["x"], ["a"], to=FP16), node("Cast", ["x"], ["b"], to=BF16)], [("x", [1])],
              [("a", [1], FP16), ("b", [1], BF16)])
    with pytest.raises(RoamError, match="both bfloat16 and float16"):
        masters.low_type_of(m)


# --- a small step made, planned and trained ----------------------------------------------------------

def mlp_export(folder) -> str:
    """A two-layer MLP over 8 features, 4 classes, batch 4 (parameters named as PyTorch names them)."""
    rng = np.random.default_rng(0)
    weights = {"fc1.weight": rng.standard_normal((8, 16)) * 0.3, "fc1.bias": rng.standard_normal(16) * 0.1,
               "fc2.weight": rng.standard_normal((16, 4)) * 0.3, "fc2.bias": rng.standard_normal(4) * 0.1}
    nodes = [node("MatMul", ["x", "fc1.weight"], ["h"]), node("Add", ["h", "fc1.bias"], ["hb"]),
             node("Relu", ["hb"], ["a"]), node("MatMul", ["a", "fc2.weight"], ["o"]),
             node("Add", ["o", "fc2.bias"], ["logits"])]
    m = model(nodes, [("x", [4, 8])], [("logits", [4, 4])], {k: v.astype(np.float32) for k, v in weights.items()})
    return save(m, folder / "mlp.onnx")


@pytest.mark.parametrize("precision,runs_as", [("bf16", "emulated"), ("fp16", "emulated"), ("fp16", "ort-optimized")])
def test_an_amp_step_is_made_planned_verified_and_trained_bit_equal_to_a_plain_run(tmp_path, precision, runs_as):
    """The step's masters and moments are float32; each weight a MatMul reads has one low-precision
    copy, planned at its type: fc1.weight.<type> is 8 x 16 x 2 bytes, 256 once aligned. On the CPU
    provider the step runs emulated (`roam emulate`), or for fp16 as the provider runs it, through
    the casts it inserts and the cast pairs it then removes (planned with --ort-optimized: the
    products compute on the float32 masters, so no copy is left). 10 steps: every request at its
    offset, the loss and state equal to a plain ONNX Runtime run's, the loss lower at the end."""
    step, plan = tmp_path / "step.onnx", tmp_path / "plan.json"
    r = roam("make-training-graph", mlp_export(tmp_path), "-o", step, "--loss", "cross-entropy",
             "--in-graph-optimizer", "--precision", precision)
    assert r.code == 0 and f"mixed precision {precision}" in r.out, r.err
    runs = step
    if runs_as == "emulated":
        runs = tmp_path / "step.cpu.onnx"
        assert roam("emulate", step, "-o", runs).code == 0
    extra = ["--ort-optimized"] if runs_as == "ort-optimized" else []
    assert (r := roam("optimize", runs, "-o", plan, *extra)).code == 0, r.err
    planned = json.loads(plan.read_text())
    tensors = {t["name"]: t for t in planned["tensors"]}
    low = {"bf16": "bfloat16", "fp16": "float16"}[precision]
    if runs_as == "emulated":
        copy = tensors[f"fc1.weight.{precision}"]
        assert (copy["dtype"], copy["bytes"], copy["copy_of"]) == (low, 256, "fc1.weight")
    else:
        assert not any("copy_of" in t for t in planned["tensors"])
    assert {tensors[x]["dtype"] for x in ("fc1.weight", "fc1.weight.exp_avg", "fc1.weight.exp_avg_sq")} == {"float32"}
    model_file = tmp_path / "plan.annotated.onnx" if runs_as == "ort-optimized" else runs
    assert (r := roam("verify", model_file, plan)).code == 0, r.err
    r = roam("train", model_file, "--plan", plan, "--steps", "10", "--compare", "--json")
    assert r.code == 0, r.err
    result = r.json()
    assert result["compare"]["outputs_max_rel"] == 0 and result["compare"]["state_max_rel"] == 0
    losses = [s["outputs"]["loss"] for s in result["per_step"]]
    assert losses[-1] < losses[0]


def test_bfloat16_arithmetic_on_the_cpu_provider_is_refused_naming_the_way_out(tmp_path):
    step, plan = tmp_path / "step.onnx", tmp_path / "plan.json"
    assert roam("make-training-graph", mlp_export(tmp_path), "-o", step, "--loss", "cross-entropy",
                "--in-graph-optimizer", "--precision", "bf16").code == 0
    assert roam("optimize", step, "-o", plan).code == 0
    r = roam("train", step, "--plan", plan, "--steps", "1")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1
    assert "bfloat16" in r.err and "roam emulate" in r.err and "--provider cuda" in r.err


@pytest.mark.skipif(not hasattr(_pybind_state, "get_all_opkernel_def"),
                    reason="this ONNX Runtime (onnxruntime-training 1.19) lists no kernels: which float16 nodes it "
                           "runs between casts of its own is unknown to roam")
def test_an_fp16_plan_of_a_graph_the_cpu_provider_changes_is_refused_naming_both_ways_out(tmp_path):
    step, plan = tmp_path / "step.onnx", tmp_path / "plan.json"
    assert roam("make-training-graph", mlp_export(tmp_path), "-o", step, "--loss", "cross-entropy",
                "--in-graph-optimizer", "--precision", "fp16").code == 0
    assert roam("optimize", step, "-o", plan).code == 0
    r = roam("train", step, "--plan", plan, "--steps", "1")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1
    assert "--ort-optimized" in r.err and "roam emulate" in r.err


@pytest.mark.parametrize("args,words", [
    (["--precision", "fp16"], "--in-graph-optimizer"),  # no update in the step for the skip to skip
    (["--precision", "bf16", "--in-graph-optimizer", "--grad-scaler", "init_scale=8"], "applies to fp16 steps"),
    (["--precision", "fp16", "--in-graph-optimizer", "--grad-scaler", "growth_factor=0.5"], "growth_factor > 1"),
    (["--precision", "fp16", "--in-graph-optimizer", "--grad-scaler", "warmup=3"], "GradScaler has"),
    (["--precision", "bf16", "--backend", "ort-artifacts"], "roam's backward"),
    (["--precision", "fp8"], "'fp8'"),
])
def test_a_precision_the_step_cannot_take_is_refused_in_one_line_and_nothing_is_written(tmp_path, args, words):
    out = tmp_path / "step.onnx"
    r = roam("make-training-graph", mlp_export(tmp_path), "-o", out, "--loss", "cross-entropy", *args)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and words in r.err, r.err
    assert not out.exists()


def test_fp16_loss_scaling_on_a_graph_with_no_loss_is_refused(tmp_path):
    """--loss none takes the first output as the loss: here the logits, [4, 4], which no scale multiplies."""
    out = tmp_path / "step.onnx"
    r = roam("make-training-graph", mlp_export(tmp_path), "-o", out, "--loss", "none", "--in-graph-optimizer",
             "--precision", "fp16")
    assert r.code == 2 and "needs a loss" in r.err and "float[4, 4]" in r.err, r.err
    assert not out.exists()


def test_weight_casts_an_autocast_export_folded_are_recovered_as_float32_masters(tmp_path):
    """torch.onnx.export under torch.autocast, dynamo's default optimisation: each weight's cast is
    folded into an fp16 constant named after the call (`_to_copy_2`), read where the parameter was.
    GPT-2's Conv1D reads its weight [in, out] and bias as they are (`addmm`), a Linear its weight
    transposed (`linear`), and the tied LM head's fp16 transpose equals the kept float32 table's,
    rounded. Each becomes its parameter again: Identity or Transpose of a float32 master, under
    PyTorch's name, the tie one tensor; the masters start from the rounded values."""
    from roam_cli.frontend import parameters, recover

    rng = np.random.default_rng(0)
    table = rng.standard_normal((5, 4)).astype(np.float32)  # [vocab, hidden], kept: the embedding reads it
    w, b = rng.standard_normal((4, 4)).astype(np.float16), rng.standard_normal(4).astype(np.float16)
    fc = rng.standard_normal((4, 4)).astype(np.float16)  # a Linear's [out, in], folded as its transpose
    m = model([node("Gather", ["lm_head.weight", "ids"], ["e"], name="node_embedding"),
               node("Cast", ["e"], ["e16"], name="node__to_copy_1", to=FP16),
               node("Gemm", ["e16", "_to_copy", "_to_copy_2"], ["h"], name="node_addmm"),
               node("MatMul", ["h", "val_7"], ["g"], name="node_linear"),
               node("MatMul", ["g", "val_9"], ["logits"], name="node_linear_1")],
              [("ids", [3], I64)], [("logits", [3, 5], FP16)],
              {"lm_head.weight": table, "_to_copy": w, "_to_copy_2": b, "val_7": np.ascontiguousarray(fc.T),
               "val_9": np.ascontiguousarray(table.T).astype(np.float16)})
    m.graph.metadata_props.add(key=parameters.SIGNATURE_KEY, value=(
        "p_attn_weight: PARAMETER target='attn.weight'\np_attn_bias: PARAMETER target='attn.bias'\n"
        "p_fc_weight: PARAMETER target='fc.weight'\np_lm_head_weight: PARAMETER target='lm_head.weight'\n"))
    calls = {"node_embedding": ("embedding", "(%p_lm_head_weight, %ids)", "wte: Embedding"),
             "node_addmm": ("addmm", "(%_to_copy_2, %_to_copy_1, %_to_copy)", "attn: Conv1D"),
             "node_linear": ("linear", "(%h, %_to_copy_3)", "fc: Linear"),
             "node_linear_1": ("linear", "(%g, %_to_copy_4)", "lm_head: Linear")}
    for n in m.graph.node:
        if n.name in calls:
            target, args, module = calls[n.name]
            n.metadata_props.add(key=parameters.FX_NODE_KEY, value=f"%y = call_function[target=torch.ops.aten."
                                 f"{target}.default](args = {args}, kwargs = {{}})")
            n.metadata_props.add(key=parameters.NAMESPACE_KEY, value=f": Model/{module}/{target}: aten.{target}")
    found = parameters.find(m)
    assert found.folded == {"_to_copy": "attn.weight", "_to_copy_2": "attn.bias", "val_7": "fc.weight",
                            "val_9": "lm_head.weight"}
    got = recover.recover(m, found, tmp_path)
    assert got.derived == {"_to_copy": ("attn.weight", [0, 1]), "_to_copy_2": ("attn.bias", [0]),
                           "val_7": ("fc.weight", [1, 0]), "val_9": ("lm_head.weight", [1, 0])}
    assert got.added == ["attn.weight", "attn.bias", "fc.weight"] and found.folded == {}
    made = {n.output[0]: n.op_type for n in m.graph.node if n.name.endswith("/recovered")}
    assert made == {"_to_copy": "Identity", "_to_copy_2": "Identity", "val_7": "Transpose", "val_9": "Transpose"}
    assert masters.to_float32(m, FP16, ["attn.weight", "attn.bias", "fc.weight", "lm_head.weight"]) == [
        "attn.weight", "attn.bias", "fc.weight"]
    assert {x: t for x, t in types_of(m).items() if x in ("attn.weight", "attn.bias", "fc.weight")} == {
        "attn.weight": F, "attn.bias": F, "fc.weight": F}


def test_loss_scaling_of_a_loss_the_autocast_computes_in_16_bits_is_refused_in_one_line(tmp_path):
    # loss = ReduceMean(x . w): fp16 runs the product in 16 bits, so the mean, and the loss, are
    # float16; a float32 scale cannot seed its backward (was: internal error, the checker's
    # "elem type 1 vs 10" on the seed's Expand)
    forward = model([node("MatMul", ["x", "fc.weight"], ["y"]), node("ReduceMean", ["y"], ["loss"], keepdims=0)],
                    [("x", [2, 4])], [("loss", [])],
                    initializers={"fc.weight": np.ones([4, 4], np.float32)})
    save(forward, tmp_path / "forward.onnx")
    r = roam("make-training-graph", tmp_path / "forward.onnx", "-o", tmp_path / "step.onnx", "--in-graph-optimizer",
             "--precision", "fp16", "--loss", "none")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    assert "'loss' is float16[] after the autocast, not a float32 scalar" in r.err and "--grad-scaler enabled=false" in r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["forward.onnx"]


def test_emulating_a_graph_without_16_bit_nodes_says_there_is_nothing_to_emulate(tmp_path):
    # a float32 graph may hold ops the CPU provider lacks (a rank step's collectives, a custom op):
    # emulate says only what it knows, that it has no 16-bit node to emulate
    r = roam("emulate", mlp_export(tmp_path), "-o", tmp_path / "out.onnx")
    assert r.code == 2 and "nothing to emulate" in r.err and "runs as it is" not in r.err, r.err
    assert not (tmp_path / "out.onnx").exists()


def test_emulating_a_model_whose_16_bit_types_its_opset_does_not_allow_is_refused(tmp_path):
    # MatMul takes bfloat16 from opset 13: at 11 the model is invalid, and so would be its rewrite
    m = model([node("MatMul", ["a", "b"], ["c"])], [("a", [2, 2], TensorProto.BFLOAT16), ("b", [2, 2], TensorProto.BFLOAT16)],
              [("c", [2, 2], TensorProto.BFLOAT16)])
    m.opset_import[0].version = 11
    r = roam("emulate", save(m, tmp_path / "m.onnx"), "-o", tmp_path / "out.onnx")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    assert "is not a valid ONNX model" in r.err and "MatMul" in r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
    m.opset_import[0].version = 13  # the same graph at an opset that allows it is emulated
    assert roam("emulate", save(m, tmp_path / "m.onnx"), "-o", tmp_path / "out.onnx").code == 0
