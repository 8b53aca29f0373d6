"""Gradients of roam's backward against central finite differences, run in ONNX Runtime."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from roam_cli.backward.graph import gradient_model
from roam_cli.lower import lower_model, nonstandard_nodes


def session(m: onnx.ModelProto) -> ort.InferenceSession:
    """m (in standard ONNX: BatchNormalization's training mode lowered) in ONNX Runtime."""
    m = lower_model(m) if nonstandard_nodes(m) else m
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # fusions lack float64 kernels
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def forward_model(nodes, feeds, inits, outputs, opset) -> onnx.ModelProto:
    def vi(name, v):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)

    graph = helper.make_graph(nodes, "g", [vi(k, v) for k, v in feeds.items()], outputs,
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def weighted_loss(nodes, feeds, inits, opset, seed=0):
    """The forward with loss = sum(y * r) for a fixed random r of y's shape (so that every
    element of dy differs), y the last node's first output."""
    y = nodes[-1].output[0]
    probe = forward_model(nodes, feeds, inits, [helper.make_empty_tensor_value_info(y)], opset)
    value = session(probe).run(None, feeds)[0]
    r = np.random.default_rng(seed).standard_normal(value.shape).astype(value.dtype)
    loss_nodes = [helper.make_node("Mul", [y, "loss.r"], ["loss.yr"], name="loss_mul"),
                  helper.make_node("ReduceSum", ["loss.yr"], ["loss"], keepdims=0, name="loss_sum")]
    dtype = helper.np_dtype_to_tensor_dtype(value.dtype)
    return forward_model(nodes + loss_nodes, feeds, {**inits, "loss.r": r},
                         [helper.make_tensor_value_info("loss", dtype, [])], opset)


def finite_differences(m: onnx.ModelProto, feeds: dict, name: str, eps: float, run=None) -> np.ndarray:
    """Central differences of m's `loss` wrt feed `name`; `run(outputs, feeds)`: what evaluates m
    (an ONNX Runtime session by default)."""
    run = run or session(m).run
    x = feeds[name]
    out = np.zeros(x.shape, np.float64)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + eps
        plus = float(run(["loss"], feeds)[0])
        x[idx] = old - eps
        minus = float(run(["loss"], feeds)[0])
        x[idx] = old
        out[idx] = (plus - minus) / (2 * eps)
    return out


def check(nodes, feeds, wrt, inits=None, opset=20, rtol=None):
    """roam's gradient of sum(y * r) wrt each name in `wrt` (graph inputs) equals finite differences:
    the largest difference relative to the largest gradient element, below 1e-6 in float64 and
    2e-2 in float32. Returns the gradient model."""
    inits = dict(inits or {})
    feeds = {k: np.array(v) for k, v in feeds.items()}
    m = weighted_loss(nodes, feeds, inits, opset)
    grad_model, grads = gradient_model(m, wrt, "loss")
    grad_model = lower_model(grad_model) if nonstandard_nodes(grad_model) else grad_model
    onnx.checker.check_model(grad_model)
    reached = [p for p in wrt if p in grads]
    got = dict(zip(reached, session(grad_model).run([grads[p] for p in reached], feeds)))
    loss = abs(float(session(m).run(["loss"], feeds)[0]))
    for p in wrt:
        value = got.get(p, np.zeros_like(feeds[p]))  # the loss does not depend on p
        double = feeds[p].dtype == np.float64
        step = 1e-6 if double else 1e-2
        expected = finite_differences(m, feeds, p, step)
        assert value.shape == feeds[p].shape, p
        # a difference quotient carries the loss's rounding over the step: where the gradient is 0
        # in exact arithmetic (an input that cancels), that noise is all there is to compare
        noise = 64 * np.finfo(feeds[p].dtype).eps * max(loss, 1.0) / step
        scale = max(np.abs(expected).max(), 1e-3)
        err = max(np.abs(value - expected).max() - noise, 0.0) / scale
        assert err < (rtol or (1e-6 if double else 2e-2)), f"{p}: relative error {err:.3g}"
    return grad_model
