"""Lowering ONNX Runtime's fused training ops to standard ONNX: every rule against the fused op,
run side by side in onnxruntime-training on random shapes; the lowered sample graph; `roam lower`."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import ORT131, SAMPLE, needs_ort_training, roam
from roam_cli.core.errors import RoamError
from roam_cli.lower import lower_model, nonstandard_nodes

MS = "com.microsoft"
rng = np.random.default_rng(0)
NP_TO_ONNX = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
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
    return dict(zip(names, sess.run(None, {k: v.copy() for k, v in feeds.items()})))


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
    return (rng.standard_normal(shape) * scale).astype(np.float32)



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
@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_softmax_grad_13(axis):
    x = f32(3, 4, 5)
    y = np.exp(x) / np.exp(x).sum(axis=axis, keepdims=True)
    feeds = {"dY": f32(3, 4, 5), "Y": y.astype(np.float32)}
    check(single("SoftmaxGrad_13", feeds, ["out"], axis=axis), feeds)
