"""Lowering ONNX Runtime's fused training ops to standard ONNX: every rule against the fused op,
run side by side in onnxruntime-training on random shapes; the lowered sample graph; `roam lower`."""

import hashlib
import json
import os
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import SAMPLE, TODAYS_ONNXRUNTIME, needs_ort_training, needs_todays_onnxruntime, roam
from onnx_builder import fed_in_float32
from roam_cli.core.errors import RoamError
from roam_cli.lower import lower_model, nonstandard_nodes

MS = "com.microsoft"
rng = np.random.default_rng(0)
NP_TO_ONNX = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
              np.dtype(np.float16): TensorProto.FLOAT16,
              np.dtype(helper.tensor_dtype_to_np_dtype(TensorProto.BFLOAT16)): TensorProto.BFLOAT16,
              np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32,
              np.dtype(np.bool_): TensorProto.BOOL}


def single(op, feeds: dict, outputs: list[str], domain=MS, constants: dict | None = None, **attrs) -> onnx.ModelProto:
    """A model of one node: `feeds` are graph inputs, `constants` initializers. Outputs are float
    of the first input's shape unless `out_types` says {name: (elem type, shape)}."""
    names = list(feeds) + list(constants or {})
    order = attrs.pop("order", names)
    out_types = attrs.pop("out_types", {})
    node = helper.make_node(op, order, outputs, name="fused", domain=domain, **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(k, NP_TO_ONNX[v.dtype], v.shape) for k, v in feeds.items()],
        [helper.make_tensor_value_info(o, *out_types.get(o, (TensorProto.FLOAT, next(iter(feeds.values())).shape)))
         for o in outputs if o],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (constants or {}).items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)])
    m.ir_version = 10
    return m


def run(model: onnx.ModelProto, feeds: dict) -> dict:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    copies = {k: [x.copy() for x in v] if isinstance(v, list) else v.copy() for k, v in feeds.items()}
    return dict(zip(names, sess.run(None, copies)))  # (the fused ops write into their inputs)


def check(model: onnx.ModelProto, feeds: dict, rtol=1e-5, atol=1e-6) -> onnx.ModelProto:
    """Lower, check, run both, compare every output of the fused node."""
    lowered = lower_model(model)
    assert nonstandard_nodes(lowered) == []
    onnx.checker.check_model(lowered, full_check=True)
    fused, ours = run(model, feeds), run(lowered, feeds)
    for name, want in fused.items():
        np.testing.assert_allclose(ours[name], want, rtol=rtol, atol=atol, err_msg=name)
    return lowered


def f32(*shape, scale=1.0):
    return np.asarray(rng.standard_normal(shape) * scale, dtype=np.float32)



# --- activations -------------------------------------------------------------------------------

@needs_ort_training
@pytest.mark.parametrize("shape", [(3, 7), (2, 3, 5)])
@pytest.mark.parametrize("op,inputs", [
    ("FastGelu", "x"), ("FastGelu", "xb"), ("Gelu", "x"), ("BiasGelu", "xb"), ("QuickGelu", "x"),
    ("FastGeluGrad", "dx"), ("GeluGrad", "dx"), ("BiasGeluGrad_dX", "dxb"), ("BiasFastGeluGrad_dX", "dxb"),
    ("QuickGeluGrad", "dx"), ("ReluGrad", "dx"), ("SigmoidGrad", "dy"), ("TanhGrad", "dy")])
def test_activation_rules_match_the_fused_op(op, inputs, shape):
    feeds = {"dY": f32(*shape)} if inputs.startswith("d") else {}
    if "x" in inputs:
        feeds["X"] = f32(*shape, scale=2.0)
    if inputs.endswith("b"):
        feeds["B"] = f32(shape[-1])  # broadcast over the leading axes
    if inputs == "dy":  # SigmoidGrad, TanhGrad take the activation's output
        feeds["Y"] = np.tanh(f32(*shape)) if op == "TanhGrad" else 1 / (1 + np.exp(-f32(*shape)))
    check(single(op, feeds, ["out"]), feeds)


@needs_ort_training
@pytest.mark.parametrize("op", ["QuickGelu", "QuickGeluGrad"])
def test_quick_gelu_alpha(op):
    feeds = {"dY": f32(4, 6), "X": f32(4, 6)} if op.endswith("Grad") else {"X": f32(4, 6)}
    check(single(op, feeds, ["out"], alpha=1.3), feeds)


@needs_ort_training
@pytest.mark.parametrize("op", ["SoftmaxGrad_13", "LogSoftmaxGrad_13", "SoftmaxGrad", "LogSoftmaxGrad"])
@pytest.mark.parametrize("axis", [-1, 1, 0, None])
def test_softmax_grads(op, axis):
    """Y is the forward's output; the pre-13 ops normalise over every axis from `axis` on."""
    x = f32(3, 4, 5)
    coerced = not op.endswith("_13")
    a = (1 if coerced else -1) if axis is None else axis
    axes = tuple(range(a % 3, 3)) if coerced else a
    y = x - np.log(np.exp(x).sum(axis=axes, keepdims=True))
    feeds = {"dY": f32(3, 4, 5), "Y": (y if op.startswith("Log") else np.exp(y)).astype(np.float32)}
    check(single(op, feeds, ["out"], **({} if axis is None else {"axis": axis})), feeds)


# --- losses ------------------------------------------------------------------------------------

@needs_ort_training
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore", [None, 2])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("shape", [(6, 5), (3, 5, 4)])
def test_softmax_cross_entropy_loss_grad(reduction, ignore, weighted, shape):
    logits = f32(*shape)
    log_prob = (logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))).astype(np.float32)
    label = rng.integers(0, shape[1], (shape[0], *shape[2:])).astype(np.int64)
    label.flat[0] = 2  # at least one ignored label where ignore_index is 2
    dy = f32(*label.shape) if reduction == "none" else f32()
    feeds = {"dY": dy, "log_prob": log_prob, "label": label}
    if weighted:
        feeds["weight"] = np.abs(f32(shape[1])) + 0.1
    attrs = {"reduction": reduction} if ignore is None else {"reduction": reduction, "ignore_index": ignore}
    check(single("SoftmaxCrossEntropyLossGrad", feeds, ["d_logits"],
                 out_types={"d_logits": (TensorProto.FLOAT, shape)}, **attrs), feeds)


# --- standard function ops without a kernel in onnxruntime ------------------------------------

@pytest.mark.parametrize("dtype", [TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.INT64])
def test_cast_like_is_a_cast_to_the_second_inputs_type(dtype):
    feeds = {"x": f32(3, 4, scale=3.0), "like": np.zeros(2, helper.tensor_dtype_to_np_dtype(dtype))}
    lowered = check(single("CastLike", feeds, ["out"], domain="", out_types={"out": (dtype, [3, 4])}), feeds)
    assert [(n.op_type, helper.get_attribute_value(n.attribute[0])) for n in lowered.graph.node] == [("Cast", dtype)]


def test_hard_swish_is_x_times_hard_sigmoid():
    feeds = {"x": f32(3, 8, scale=4.0)}
    lowered = check(single("HardSwish", feeds, ["out"], domain=""), feeds)
    assert [n.op_type for n in lowered.graph.node] == ["HardSigmoid", "Mul"]


@pytest.mark.parametrize("op", ["SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore", [None, 2, -100])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("shape", [(6, 5), (3, 5, 4), (2, 4, 3, 2)])
def test_loss_functions_as_kernel_ops(op, reduction, ignore, weighted, shape):
    """Against onnxruntime's expansion of ONNX's function; the loss and, for the softmax form, the
    optional log_prob output."""
    label = rng.integers(0, shape[1], (shape[0], *shape[2:])).astype(np.int64)
    label.flat[0] = 2 if ignore == 2 else -100 if ignore == -100 else label.flat[0]  # one ignored label
    label.flat[-1] = 1  # and one that counts
    feeds = {"x": f32(*shape), "label": label}
    if weighted:
        feeds["weight"] = np.abs(f32(shape[1])) + 0.1
    attrs = {"reduction": reduction} if ignore is None else {"reduction": reduction, "ignore_index": ignore}
    loss_shape = list(label.shape) if reduction == "none" else []
    outputs = ["loss", "log_prob"] if op == "SoftmaxCrossEntropyLoss" else ["loss"]
    lowered = check(single(op, feeds, outputs, domain="", out_types={"loss": (TensorProto.FLOAT, loss_shape)},
                           **attrs), feeds)
    ops = {n.op_type for n in lowered.graph.node}
    assert not ops & {op, "NegativeLogLikelihoodLoss", "CastLike", "OneHot"}
    assert all(n.name.startswith("fused/") for n in lowered.graph.node)


def test_softmax_cross_entropy_loss_without_log_prob_output():
    feeds = {"x": f32(4, 3), "label": np.array([0, 2, 1, 1], np.int64)}
    check(single("SoftmaxCrossEntropyLoss", feeds, ["loss"], domain="", out_types={"loss": (TensorProto.FLOAT, [])}),
          feeds)


# --- normalisations ----------------------------------------------------------------------------

@needs_ort_training
@pytest.mark.parametrize("shape,axis", [((4, 6), -1), ((2, 3, 8), -1), ((2, 3, 4), 1)])
def test_layer_normalization_grad(shape, axis):
    x, axis_ = f32(*shape), axis % len(shape)
    axes = tuple(range(axis_, len(shape)))
    mean = x.mean(axis=axes, keepdims=True)
    inv = 1 / np.sqrt(x.var(axis=axes, keepdims=True) + 1e-5)
    feeds = {"dY": f32(*shape), "X": x, "scale": f32(*shape[axis_:]), "mean": mean.astype(np.float32),
             "inv": inv.astype(np.float32)}
    pshape = shape[axis_:]
    check(single("LayerNormalizationGrad", feeds, ["dX", "dscale", "dbias"], axis=axis, epsilon=1e-5,
                 out_types={"dscale": (TensorProto.FLOAT, pshape), "dbias": (TensorProto.FLOAT, pshape)}), feeds,
          rtol=1e-4, atol=1e-5)


@needs_ort_training
@pytest.mark.parametrize("shape", [(4, 6), (2, 3, 8)])
def test_simplified_layer_normalization_and_grad(shape):
    x = f32(*shape)
    feeds = {"X": x, "scale": f32(shape[-1])}
    check(single("SimplifiedLayerNormalization", feeds, ["Y", "inv"], domain="", axis=-1, epsilon=1e-5,
                 out_types={"inv": (TensorProto.FLOAT, (*shape[:-1], 1))}), feeds)
    inv = (1 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-5)).astype(np.float32)
    feeds = {"dY": f32(*shape), "X": x, "scale": f32(shape[-1]), "inv": inv}
    check(single("SimplifiedLayerNormalizationGrad", feeds, ["dX", "dscale"], axis=-1, epsilon=1e-5,
                 out_types={"dscale": (TensorProto.FLOAT, shape[-1:])}), feeds, rtol=1e-4, atol=1e-5)


@needs_ort_training
@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (2, 3, 6)])
def test_batch_norm_training_forms_and_grad(shape):
    c = shape[1]
    x = f32(*shape)
    feeds = {"X": x, "scale": f32(c), "B": f32(c), "mean": f32(c), "var": np.abs(f32(c)) + 0.5}
    vec = (TensorProto.FLOAT, (c,))
    check(single("BatchNormInternal", feeds, ["Y", "rm", "rv", "sm", "sinv"], epsilon=1e-5, momentum=0.9,
                 out_types={"rm": vec, "rv": vec, "sm": vec, "sinv": vec}), feeds, rtol=1e-4, atol=1e-5)
    check(single("BatchNormalization", feeds, ["Y", "rm", "rv"], domain="", epsilon=1e-5, momentum=0.9,
                 training_mode=1, out_types={"rm": vec, "rv": vec}), feeds, rtol=1e-4, atol=1e-5)
    axes = (0, *range(2, len(shape)))
    mean = x.mean(axis=axes)
    inv = (1 / np.sqrt(x.var(axis=axes) + 1e-5)).astype(np.float32)
    feeds = {"dY": f32(*shape), "X": x, "scale": f32(c), "mean": mean.astype(np.float32), "inv": inv}
    check(single("BatchNormalizationGrad", feeds, ["dX", "dscale", "dbias"], epsilon=1e-5,
                 out_types={"dscale": vec, "dbias": vec}), feeds, rtol=1e-4, atol=1e-5)


# --- products and the gradients of Gather, Conv, MaxPool --------------------------------------

@needs_ort_training
@pytest.mark.parametrize("a,b,attrs", [
    ((5, 4), (4, 3), {}), ((4, 5), (4, 3), {"transA": 1}), ((5, 4), (3, 4), {"transB": 1, "alpha": 0.5}),
    ((4, 5), (3, 4), {"transA": 1, "transB": 1}), ((2, 5, 4), (3, 4), {"transB": 1}),
    ((2, 4, 5), (4, 3), {"transA": 1, "alpha": 2.0}), ((2, 3, 5, 4), (2, 3, 4, 6), {}),
    ((2, 3, 4, 5), (3, 6, 4), {"transA": 1, "transB": 1}), ((5, 2, 4), (2, 4, 3), {"transBatchA": 1}),
    ((2, 5, 4), (4, 2, 3), {"transBatchB": 1}), ((4, 2, 5), (3, 2, 4), {"transBatchA": 1, "transA": 1,
                                                                          "transBatchB": 1, "transB": 1})])
def test_fused_matmul(a, b, attrs):
    feeds = {"A": f32(*a), "B": f32(*b)}

    def layout(x, batch, last_two):
        if batch:
            x = np.moveaxis(x, 0, -2)
        return np.swapaxes(x, -1, -2) if last_two else x

    want = attrs.get("alpha", 1.0) * (layout(feeds["A"], attrs.get("transBatchA"), attrs.get("transA"))
                                      @ layout(feeds["B"], attrs.get("transBatchB"), attrs.get("transB")))
    m = single("FusedMatMul", feeds, ["Y"], out_types={"Y": (TensorProto.FLOAT, want.shape)}, **attrs)
    check(m, feeds)
    np.testing.assert_allclose(run(lower_model(m), feeds)["Y"], want, rtol=1e-5, atol=1e-6)


@needs_ort_training
@pytest.mark.parametrize("axis,data,idx", [(0, (7, 4), (2, 3)), (0, (6,), (5,)), (1, (3, 6, 2), (4,)), (2, (2, 3, 5), (2, 2))])
def test_gather_grad(axis, data, idx):
    indices = rng.integers(0, data[axis], idx).astype(np.int64)
    indices.flat[-1] = indices.flat[0]  # a repeated index adds up
    dy_shape = (*data[:axis], *idx, *data[axis + 1:])
    feeds = {"shape": np.array(data, dtype=np.int64), "indices": indices, "dY": f32(*dy_shape)}
    check(single("GatherGrad", feeds, ["dX"], axis=axis, out_types={"dX": (TensorProto.FLOAT, data)}), feeds)


def test_gather_grad_of_a_batch_repeating_one_token_is_exact_with_onnx_runtimes_threads():
    """Every one of 4,096 rows added at index 0, on 4 threads, 10 times: ScatterND's add lost
    updates to a repeated index when ONNX Runtime split it over threads (off by 20 to 50 here on
    1.19.2 and 1.32.0); the lowering adds them all, on any onnxruntime."""
    import onnxruntime as ort

    data, tokens = (16, 768), 4096
    feeds = {"shape": np.array(data, dtype=np.int64), "indices": np.zeros(tokens, np.int64),
             "dY": f32(tokens, data[1])}
    lowered = lower_model(single("GatherGrad", feeds, ["dX"], out_types={"dX": (TensorProto.FLOAT, data)}))
    want = np.zeros(data)
    np.add.at(want, feeds["indices"], feeds["dY"].astype(np.float64))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 4
    sess = ort.InferenceSession(lowered.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    for _ in range(10):
        np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-4, atol=1e-3)


@needs_ort_training
@pytest.mark.parametrize("x,w,attrs", [
    ((2, 3, 7, 7), (4, 3, 3, 3), {}),
    ((2, 4, 8, 8), (6, 4, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 4, 9, 8), (4, 2, 3, 2), {"group": 2, "strides": [2, 1], "pads": [1, 0, 0, 1], "dilations": [1, 2]}),
    ((1, 3, 6, 6), (5, 3, 1, 1), {"strides": [2, 2]}),
    ((2, 3, 10), (4, 3, 3), {"strides": [3], "pads": [1, 1]})])
def test_conv_grad(x, w, attrs):
    spatial = len(x) - 2
    s, d = attrs.get("strides", [1] * spatial), attrs.get("dilations", [1] * spatial)
    p = attrs.get("pads", [0] * 2 * spatial)
    out = [(x[2 + k] + p[k] + p[k + spatial] - d[k] * (w[2 + k] - 1) - 1) // s[k] + 1 for k in range(spatial)]
    feeds = {"dY": f32(x[0], w[0], *out), "X": f32(*x), "W": f32(*w)}
    check(single("ConvGrad", feeds, ["dX", "dW", "dB"], kernel_shape=list(w[2:]), **attrs,
                 out_types={"dX": (TensorProto.FLOAT, x), "dW": (TensorProto.FLOAT, w),
                            "dB": (TensorProto.FLOAT, w[:1])}), feeds, rtol=1e-4, atol=1e-5)


@needs_ort_training
@pytest.mark.parametrize("attrs", [{"kernel_shape": [2, 2], "strides": [2, 2]},
                                   {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}])
def test_max_pool_grad(attrs):
    """MaxPoolGrad of a real MaxPool's indices: the model runs MaxPool, then the gradient."""
    x = f32(2, 3, 8, 8)
    pool = helper.make_node("MaxPool", ["X"], ["Y", "I"], name="pool", **attrs)
    grad = helper.make_node("MaxPoolGrad", ["dY", "I"], ["dX"], name="fused", **attrs)  # ORT: default domain
    out = (8 + sum(attrs.get("pads", [0, 0, 0, 0])[::2]) - attrs["kernel_shape"][0]) // 2 + 1
    graph = helper.make_graph([pool, grad], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, x.shape),
                                                  helper.make_tensor_value_info("dY", TensorProto.FLOAT, (2, 3, out, out))],
                              [helper.make_tensor_value_info("dX", TensorProto.FLOAT, x.shape)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)])
    m.ir_version = 10
    feeds = {"X": x, "dY": f32(2, 3, out, out)}
    check(m, feeds)


# --- training utilities ------------------------------------------------------------------------

@needs_ort_training
@pytest.mark.parametrize("overwrite", [None, False, True])
@pytest.mark.parametrize("buffer_out", [False, True])
def test_in_place_accumulator_v2(overwrite, buffer_out):
    """The fused op writes into its input; the lowered one returns the new buffer as graph output
    `<buffer>.out` (or its own buffer_out), declared in place over the buffer."""
    feeds = {"buffer": f32(3, 4), "value": f32(3, 4)}
    if overwrite is not None:
        feeds["overwrite"] = np.array([overwrite])
    outputs = ["flag", "buffer_new"] if buffer_out else ["flag"]
    m = single("InPlaceAccumulatorV2", feeds, outputs,
               out_types={"flag": (TensorProto.BOOL, [1]), "buffer_new": (TensorProto.FLOAT, [3, 4])})
    lowered = check(m, feeds)
    new = "buffer_new" if buffer_out else "buffer.out"
    assert [o.name for o in lowered.graph.output] == outputs + ([] if buffer_out else ["buffer.out"])
    meta = {p.key: p.value for p in lowered.metadata_props}
    assert json.loads(meta["roam.inplace"]) == {new: "buffer"}
    want = feeds["value"] if overwrite else feeds["buffer"] + feeds["value"]
    np.testing.assert_allclose(run(lowered, feeds)[new], want, rtol=1e-6)


@needs_ort_training
@pytest.mark.parametrize("ratio", [None, 0.0, 0.25, "input"])
@pytest.mark.parametrize("training", [None, True, False])
def test_dropout_grad(ratio, training):
    mask = rng.random((4, 5)) > 0.3
    feeds = {"dY": f32(4, 5), "mask": mask}
    constants = {}
    if ratio == "input":
        feeds["ratio"] = np.array(0.3, dtype=np.float32)
    elif ratio is not None or training is not None:
        constants["ratio"] = np.array(0.5 if ratio is None else ratio, dtype=np.float32)
    if training is not None:
        constants["training_mode"] = np.array(training)
    check(single("DropoutGrad", feeds, ["dX"], constants=constants), feeds)


@needs_ort_training
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_training(axis):
    feeds = {"a": f32(2, 3, 4), "b": f32(2, 3, 4), "c": f32(2, 3, 4)}
    feeds["b"] = f32(*[5 if k == axis % 3 else n for k, n in enumerate((2, 3, 4))])
    shape = [sum(v.shape[axis] for v in feeds.values()) if k == axis % 3 else n for k, n in enumerate((2, 3, 4))]
    check(single("ConcatTraining", feeds, ["y", "lengths"], axis=axis,
                 out_types={"y": (TensorProto.FLOAT, shape), "lengths": (TensorProto.INT64, [3])}), feeds)


@needs_ort_training
@pytest.mark.parametrize("sizes", [[1, 4, 1], [2, 2, 2]])
def test_split_training(sizes):
    feeds = {"x": f32(3, 6)}
    constants = {"split": np.array(sizes, dtype=np.int64)}
    parts = sizes
    check(single("SplitTraining", feeds, ["a", "b", "c"], constants=constants, axis=1,
                 out_types={k: (TensorProto.FLOAT, [3, n]) for k, n in zip("abc", parts)}), feeds)


@needs_ort_training
@pytest.mark.parametrize("down", [0, 1])
def test_scale(down):
    feeds = {"x": f32(3, 4), "s": np.array(4.0, dtype=np.float32)}
    check(single("Scale", feeds, ["y"], scale_down=down), feeds)


# --- the sample graph, end to end --------------------------------------------------------------

def sample_without_dropout() -> onnx.ModelProto:
    """The sample with every Dropout ratio 0, so both forms compute the same numbers."""
    m = onnx.load(str(SAMPLE))
    ratios = {n.input[1] for n in m.graph.node if n.op_type == "Dropout" and len(n.input) > 1}
    for t in m.graph.initializer:
        if t.name in ratios:
            t.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(t)), t.name))
    return m


def sample_feeds(m: onnx.ModelProto, reset: bool) -> dict:
    feeds = {}
    for vi in m.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.name in ("input_ids", "labels"):
            feeds[vi.name] = rng.integers(0, 50, shape).astype(np.int64)
        elif vi.name == "lazy_reset_grad":
            feeds[vi.name] = np.array([reset])
        else:
            feeds[vi.name] = f32(*shape, scale=0.1)
    feeds["labels"][0, :3] = -100  # ignored positions
    return feeds


def test_lowered_sample_is_standard_onnx():
    lowered = lower_model(onnx.load(str(SAMPLE)))
    assert nonstandard_nodes(onnx.load(str(SAMPLE))) and nonstandard_nodes(lowered) == []
    onnx.checker.check_model(lowered, full_check=True)
    fused = onnx.load(str(SAMPLE))
    kept = [o.name for o in fused.graph.output]
    assert [i.name for i in lowered.graph.input] == [i.name for i in fused.graph.input]
    assert [o.name for o in lowered.graph.output][: len(kept)] == kept
    buffers = [i.name for i in fused.graph.input if i.name.endswith(".accumulation.buffer")]
    assert [o.name for o in lowered.graph.output][len(kept):] == [f"{b}.out" for b in buffers]


@needs_ort_training
@pytest.mark.parametrize("reset", [False, True])
def test_lowered_sample_computes_what_the_fused_one_does(reset):
    """Loss and every accumulated gradient; the fused graph's accumulators write into their
    buffers, exposed here as the same `<buffer>.out` outputs."""
    fused = sample_without_dropout()
    lowered = lower_model(fused)
    for n in fused.graph.node:
        if n.op_type == "InPlaceAccumulatorV2":
            n.output.append(f"{n.input[0]}.out")
    fused.graph.output.extend(o for o in lowered.graph.output if o.name.endswith(".buffer.out"))
    feeds = sample_feeds(fused, reset)
    want, got = run(fused, feeds), run(lowered, feeds)
    assert set(want) == set(got) and len(got) == 57
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


@needs_todays_onnxruntime
def test_lowered_sample_runs_on_todays_onnxruntime(tmp_path):
    lowered = tmp_path / "lowered.onnx"
    assert roam("lower", SAMPLE, "-o", lowered).code == 0
    script = (
        "import sys, numpy as np, onnxruntime as ort\n"
        "s = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n"
        "feeds = {}\n"
        "for i in s.get_inputs():\n"
        "    t = {'tensor(float)': np.float32, 'tensor(int64)': np.int64, 'tensor(bool)': np.bool_}[i.type]\n"
        "    feeds[i.name] = np.full(i.shape, 0.01 if t is np.float32 else 0, t)\n"
        "out = s.run(None, feeds)\n"
        "print(ort.__version__, len(out), float(out[0]))\n")
    proc = subprocess.run([TODAYS_ONNXRUNTIME, "-c", script, str(lowered)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    version, outputs, loss = proc.stdout.split()
    assert version.startswith("1.") and int(outputs) == 57 and np.isfinite(float(loss))


@needs_todays_onnxruntime
def test_the_sample_full_step_has_only_ops_todays_onnxruntime_has_kernels_for(tmp_path):
    """A function op without a kernel (CastLike, the losses) would run expanded, as unnamed nodes
    outside the plan's order."""
    step = tmp_path / "step.onnx"
    assert roam("make-training-graph", SAMPLE, "-o", step, "--in-graph-optimizer").code == 0
    script = (
        "import sys, onnx\n"
        "from onnxruntime.capi import _pybind_state as s\n"
        "kernels = {(k.domain or 'ai.onnx', k.op_name) for k in s.get_all_opkernel_def()"
        " if k.provider == 'CPUExecutionProvider'}\n"
        "def nodes(g):\n"
        "    for n in g.node:\n"
        "        yield n\n"
        "        for a in n.attribute:\n"
        "            yield from (x for sub in ([a.g] if a.HasField('g') else []) + list(a.graphs) for x in nodes(sub))\n"
        "m = onnx.load(sys.argv[1], load_external_data=False)\n"
        "print(sorted({n.op_type for n in nodes(m.graph) if (n.domain or 'ai.onnx', n.op_type) not in kernels}))\n")
    proc = subprocess.run([TODAYS_ONNXRUNTIME, "-c", script, str(step)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


# --- roam lower --------------------------------------------------------------------------------

def test_cli_lower_writes_a_standard_model_recording_its_source(tmp_path):
    out = tmp_path / "lowered.onnx"
    r = roam("lower", SAMPLE, "-o", out, "--json")
    assert r.code == 0, r.err
    summary = r.json()
    assert summary["rewritten"]["InPlaceAccumulatorV2"] == 28 and summary["nonstandard_after"] == 0
    lowered = onnx.load(str(out))
    meta = {p.key: json.loads(p.value) for p in lowered.metadata_props if p.key == "roam.lowered_from"}
    assert (tmp_path / meta["roam.lowered_from"]["path"]).resolve() == SAMPLE.resolve()
    assert meta["roam.lowered_from"]["sha256"] == hashlib.sha256(SAMPLE.read_bytes()).hexdigest()


def test_cli_lower_refuses_an_op_without_a_rule(tmp_path):
    feeds = {"x": f32(2, 3)}
    src = tmp_path / "m.onnx"
    onnx.save(single("NoSuchFusedOp", feeds, ["y"]), str(src))
    out = tmp_path / "out.onnx"
    r = roam("lower", src, "-o", out)
    assert r.code == 2 and not out.exists()
    assert len(r.err.strip().splitlines()) == 1 and "NoSuchFusedOp" in r.err and "'fused'" in r.err
    with pytest.raises(RoamError, match="NoSuchFusedOp node 'fused'"):
        lower_model(onnx.load(str(src)))


# --- optimizers --------------------------------------------------------------------------------

def optimizer_model(op: str, outputs: list[str], **attrs) -> onnx.ModelProto:
    seq = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    states = ["weights", "gradients", "m1", "m2"] if op == "AdamWOptimizer" else ["weights", "gradients"]
    scalars = [helper.make_tensor_value_info("lr", TensorProto.FLOAT, [1])]
    if op == "AdamWOptimizer":
        scalars.append(helper.make_tensor_value_info("step", TensorProto.INT64, [1]))
    node = helper.make_node(op, [v.name for v in scalars] + states, outputs, name="fused", domain=MS, **attrs)
    outs = [helper.make_tensor_value_info(outputs[0], TensorProto.BOOL, [1])]
    outs += [helper.make_value_info(o, seq) for o in outputs[1:]]
    graph = helper.make_graph([node], "g", scalars + [helper.make_value_info(s, seq) for s in states], outs)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)])
    m.ir_version = 10
    return m


@needs_ort_training
@pytest.mark.parametrize("op,attrs", [
    ("AdamWOptimizer", {"adam_mode": 1, "correct_bias": 1, "weight_decay": 0.0, "epsilon": 1e-6}),
    ("AdamWOptimizer", {"adam_mode": 1, "weight_decay": 0.1}),
    ("AdamWOptimizer", {"adam_mode": 0, "weight_decay": 0.1, "alpha": 0.8, "beta": 0.99}),
    ("AdamWOptimizer", {"adam_mode": 1, "correct_bias": 0}),
    ("SGDOptimizerV2", {})])
def test_optimizers(op, attrs):
    """With the new sequences as the node's outputs, and without (ORT's artifacts form: updated
    in place; lowered: graph outputs `<sequence>.out`, declared in place)."""
    shapes = [(3, 4), (5,), (2, 2, 3)]
    feeds = {"lr": np.array([0.01], np.float32), "weights": [f32(*s) for s in shapes],
             "gradients": [f32(*s) for s in shapes]}
    if op == "AdamWOptimizer":
        feeds.update(step=np.array([3], np.int64), m1=[f32(*s) for s in shapes],
                     m2=[np.abs(f32(*s)) for s in shapes])
    states = ["weights", "m1", "m2"] if op == "AdamWOptimizer" else ["weights"]
    named = optimizer_model(op, ["flag"] + [f"{s}.new" for s in states], **attrs)
    want = run(named, feeds)
    for model, suffix in ((named, ".new"), (optimizer_model(op, ["flag"], **attrs), ".out")):
        lowered = lower_model(model)
        assert nonstandard_nodes(lowered) == []
        onnx.checker.check_model(lowered, full_check=True)
        got = run(lowered, feeds)
        assert bool(got["flag"][0])
        for s in states:
            for a, b in zip(got[s + suffix], want[s + ".new"], strict=True):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
        if suffix == ".out":
            meta = {p.key: json.loads(p.value) for p in lowered.metadata_props}
            assert meta["roam.inplace"] == {f"{s}.out": s for s in states}


def test_plan_of_a_lowered_model_carries_the_fused_plan(tmp_path):
    """optimize plans the fused source too (when it is there, unchanged); report shows both; on
    the sample, lowering costs no memory."""
    src = tmp_path / "fused.onnx"
    src.write_bytes(SAMPLE.read_bytes())
    assert roam("lower", src, "-o", tmp_path / "lowered.onnx").code == 0
    assert roam("optimize", tmp_path / "lowered.onnx", "-o", tmp_path / "plan.json").code == 0
    r = roam("report", tmp_path / "plan.json", "--json")
    lowering = r.json()["lowering"]
    assert lowering["fused_model"]["path"] == "fused.onnx"
    assert lowering["fused"]["nodes"] == 229 and lowering["lowered"]["nodes"] > 229
    assert lowering["lowered"]["arena_bytes"] <= 1.02 * lowering["fused"]["arena_bytes"]
    assert "lowered from fused.onnx: 229 →" in roam("report", tmp_path / "plan.json").out
    src.write_bytes(SAMPLE.read_bytes() + b"\0")  # the source changed: no baseline
    assert roam("optimize", tmp_path / "lowered.onnx", "-o", tmp_path / "plan2.json").code == 0
    assert "lowering" not in json.loads((tmp_path / "plan2.json").read_text())["stats"]


def test_memory_model_updates_the_lowered_accumulators_in_place(tmp_path):
    """Each `<buffer>.out` shares its buffer's storage: the lowered accumulators add no transient
    bytes beyond the fused ones' (only the overwrite branch's one sum lives one step)."""
    from roam_cli.core import memory
    from roam_cli.frontend.onnx_import import import_model

    onnx.save(lower_model(onnx.load(str(SAMPLE))), str(tmp_path / "lowered.onnx"))
    mm = memory.build(import_model(tmp_path / "lowered.onnx", {}).graph)
    buffers = [n for n in mm.persistent if n.endswith(".accumulation.buffer")]
    assert len(buffers) == 28
    for b in buffers:
        assert mm.storage_of[f"{b}.out"] == b and mm.alias[f"{b}.out"] == "inplace"
    assert not any(s.root.endswith(".buffer.out") for s in mm.storages)
    assert {mm.persistent[b] for b in buffers} == {"gradient_buffer"}  # an Add of a gradient into it
    assert mm.node_class.count("accumulate") == 28


@needs_ort_training
def test_a_model_below_opset_18_is_converted_first():
    """Opset 17: ReduceMean's axes are an attribute there, an input from 18 on."""
    x = f32(2, 3, 4)
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], name="mean", axes=[-1], keepdims=1),
             helper.make_node("FastGelu", ["m"], ["y"], name="fused", domain=MS)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 3, 1))])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    m.ir_version = 10
    lowered = check(m, {"x": x})
    assert [(i.domain, i.version) for i in lowered.opset_import] == [("", 20)]


def test_a_fused_op_inside_a_subgraph_is_refused():
    inner = helper.make_graph([helper.make_node("FastGelu", ["x"], ["y"], name="inner", domain=MS)], "then", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    node = helper.make_node("If", ["c"], ["z"], name="branch", then_branch=inner, else_branch=inner)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)])
    assert [n.name for n in nonstandard_nodes(m)] == ["inner", "inner"]
    with pytest.raises(RoamError, match="FastGelu node 'inner': it is inside a subgraph"):
        lower_model(m)


def test_cli_lower_keeps_external_weights_referenced_without_reading_them(tmp_path):
    feeds = {"dY": f32(3, 4), "X": f32(3, 4)}
    m = single("FastGeluGrad", feeds, ["dX"], constants={"unused_weight": f32(64, 64)})
    m.graph.node[0].input[:] = ["dY", "X"]
    onnx.save(m, str(tmp_path / "m.onnx"), save_as_external_data=True, location="w.bin", size_threshold=0)
    (tmp_path / "w.bin").unlink()  # never read
    (tmp_path / "out").mkdir()
    r = roam("lower", tmp_path / "m.onnx", "-o", tmp_path / "out" / "lowered.onnx")
    assert r.code == 0, r.err
    lowered = onnx.load(str(tmp_path / "out" / "lowered.onnx"), load_external_data=False)
    weight = next(t for t in lowered.graph.initializer if t.name == "unused_weight")
    assert {kv.key: kv.value for kv in weight.external_data}["location"] == "../w.bin"


def test_weights_outside_the_output_s_folder_are_linked_beside_it_and_the_model_runs(tmp_path):
    # ONNX Runtime refuses external data whose path leaves the model's folder ("../w.bin")
    feeds = {"dY": f32(3, 4), "X": f32(3, 4)}
    m = single("FastGeluGrad", feeds, ["dX"], constants={"scale": f32(3, 4)})
    m.graph.node[0].input[:] = ["dY", "X"]
    m.graph.node.append(helper.make_node("Mul", ["dX", "scale"], ["scaled"], name="mul"))
    m.graph.output.append(helper.make_tensor_value_info("scaled", TensorProto.FLOAT, [3, 4]))
    onnx.save(m, str(tmp_path / "m.onnx"), save_as_external_data=True, location="w.bin", size_threshold=0)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "w.bin").write_bytes(b"another file of the user's")
    for run in (1, 2):  # the second run finds its own link there
        r = roam("lower", tmp_path / "m.onnx", "-o", tmp_path / "out" / "lowered.onnx")
        assert r.code == 0, r.err
    lowered = onnx.load(str(tmp_path / "out" / "lowered.onnx"), load_external_data=False)
    weight = next(t for t in lowered.graph.initializer if t.name == "scale")
    assert {kv.key: kv.value for kv in weight.external_data}["location"] == "lowered.onnx.w.bin"
    assert os.path.samefile(tmp_path / "out" / "lowered.onnx.w.bin", tmp_path / "w.bin")
    assert (tmp_path / "out" / "w.bin").read_bytes() == b"another file of the user's"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["lowered.onnx", "lowered.onnx.w.bin", "w.bin"]
    # it runs, as the same model lowered beside its weights does
    assert roam("lower", tmp_path / "m.onnx", "-o", tmp_path / "beside.onnx").code == 0
    got, want = (ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["scaled"], feeds)[0]
                 for path in (tmp_path / "out" / "lowered.onnx", tmp_path / "beside.onnx"))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("low", [TensorProto.FLOAT16, TensorProto.BFLOAT16])
@pytest.mark.parametrize("op,outputs", [("LayerNormalizationGrad", ["dX", "dscale", "dbias"]),
                                        ("BatchNormalizationGrad", ["dX", "dscale", "dbias"]),
                                        ("BatchNormalization", ["Y", "rm", "rv"])])
def test_a_normalisation_mixing_a_low_type_with_float32_computes_in_float32(low, op, outputs):
    """A low-precision activation beside float32 scale and statistics (ONNX Runtime's and ONNX's
    mixed forms): the lowering widens the activation, computes what the float32 node computes, and
    rounds each result declared low, once. So its results are the float32 lowering's on the
    widened inputs, the low ones cast: bit for bit."""
    from roam_cli.precision.emulate import emulate

    c, shape = 4, (3, 4, 5) if op != "LayerNormalizationGrad" else (3, 4)
    low_np = helper.tensor_dtype_to_np_dtype(low)
    x, dy = f32(*shape).astype(low_np), f32(*shape).astype(low_np)
    vec = f32(c)
    if op == "BatchNormalization":
        feeds = {"X": x, "scale": vec, "B": f32(c), "mean": f32(c), "var": np.abs(f32(c)) + 0.5}
        attrs = dict(domain="", epsilon=1e-5, momentum=0.9, training_mode=1)
    else:
        stats = (3, 1) if op == "LayerNormalizationGrad" else (c,)
        feeds = {"dY": dy, "X": x, "scale": vec, "mean": f32(*stats), "inv": np.abs(f32(*stats)) + 0.5}
        attrs = dict(epsilon=1e-5, **({"axis": -1} if op == "LayerNormalizationGrad" else {}))
    wide = {k: v.astype(np.float32) for k, v in feeds.items()}
    declared = {o: (low if o in ("dX", "Y") else TensorProto.FLOAT, shape if o in ("dX", "Y") else (c,))
                for o in outputs}
    mixed = lower_model(single(op, feeds, outputs, out_types=declared, **attrs))
    reference = lower_model(single(op, wide, outputs, out_types={o: (TensorProto.FLOAT, s) for o, (_, s) in
                                                                 declared.items()}, **attrs))
    assert nonstandard_nodes(mixed) == []
    assert [n.op_type for n in mixed.graph.node if n.op_type == "Cast"], "the low values are widened"
    emulate(mixed)  # the CPU provider has no bfloat16 arithmetic
    got, want = run(fed_in_float32(mixed), wide), run(reference, wide)
    for o in outputs:
        np.testing.assert_array_equal(got[o], want[o].astype(low_np if o in ("dX", "Y") else np.float32).astype(
            np.float32), err_msg=o)
