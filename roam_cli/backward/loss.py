"""The loss added on an inference export's first output, with ONNX Runtime's artifacts names:
labels `labels` (int64), targets `target`. Cross-entropy finds the class axis from the labels'
shape: the last axis (language-model logits [batch, seq, vocab] with labels [batch, seq], viewed
as [batch * seq, vocab]) or axis 1 (classification [batch, classes] with [batch]; ONNX's own
[batch, classes, d...] layout). Labels roam adds take the last axis for a rank-3 output and axis 1
for a higher rank (segmentation logits [batch, classes, height, width])."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from roam_cli.core.errors import RoamError
from roam_cli.frontend.training_graph import LOSS_COMPUTED, LOSSES


def add_loss(model: onnx.ModelProto, kind: str, types: dict) -> str:
    """Append the loss nodes (and the label/target input) to `model` in place; the loss's name.
    `types`: name -> (dtype, shape) of the forward's tensors."""
    g = model.graph
    first = g.output[0].name
    if kind == "none":
        return first
    if kind not in LOSSES:
        raise RoamError(f"unknown loss {kind!r}; choose one of {', '.join(LOSSES)}")
    taken = {x for n in g.node for x in (*n.input, *n.output)} | {i.name for i in g.input} | {t.name for t in g.initializer}
    dtype, shape = types[first][0], list(types[first][1])
    loss = fresh("loss", taken)

    def node(op, inputs, out=None, **attrs):
        out = out or fresh(f"loss/{op}", taken)
        g.node.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def const(name, values):
        name = fresh(name, taken)
        g.initializer.append(numpy_helper.from_array(values, name))
        return name

    if kind == "cross-entropy" and len(shape) < 2:  # SoftmaxCrossEntropyLoss reads [batch, classes, d...]
        raise RoamError(f"--loss cross-entropy needs logits [batch, classes, ...]; the first output {first!r} is "
                        + (LOSS_COMPUTED if not shape else f"of shape {shape}"))
    if kind == "cross-entropy":  # the class axis, unless the export takes labels: last for [batch, seq, vocab], else 1
        labels = graph_input(g, "labels", TensorProto.INT64, shape[:-1] if len(shape) <= 3 else [shape[0], *shape[2:]])
        label_shape = input_shape(g, labels)
        logits = first
        if len(shape) >= 3 and label_shape == shape[:-1]:  # class axis last: a view [batch * seq, classes]
            logits = node("Reshape", [first, const("loss/logits_shape", np.array([-1, shape[-1]], np.int64))])
            labels = node("Reshape", [labels, const("loss/labels_shape", np.array([-1], np.int64))])
        elif label_shape != [shape[0], *shape[2:]]:
            raise RoamError(f"cross-entropy: logits {first!r} {shape} and labels {label_shape} do not fit: the labels "
                            "must have the logits' shape without the class axis (the last, or axis 1)")
        node("SoftmaxCrossEntropyLoss", [logits, labels], out=loss, reduction="mean")
        return loss
    target = graph_input(g, "target", dtype, shape)
    if input_shape(g, target) != shape:
        raise RoamError(f"{kind}: target {target!r} {input_shape(g, target)} does not have the output's shape {shape}")
    if kind == "mse":
        diff = node("Sub", [first, target])
        return node("ReduceMean", [node("Mul", [diff, diff])], out=loss, keepdims=0)
    if kind == "l1":
        return node("ReduceMean", [node("Abs", [node("Sub", [first, target])])], out=loss, keepdims=0)
    # bce-with-logits: -mean(t log s + (1 - t) log(1 - s)), s = sigmoid(x)
    one = const("loss/one", np.array(1.0, helper.tensor_dtype_to_np_dtype(dtype)))
    s = node("Sigmoid", [first])
    hit = node("Mul", [target, node("Log", [s])])
    miss = node("Mul", [node("Sub", [one, target]), node("Log", [node("Sub", [one, s])])])
    return node("Neg", [node("ReduceMean", [node("Add", [hit, miss])], keepdims=0)], out=loss)


def fresh(name: str, taken: set[str]) -> str:
    candidate, k = name, 0
    while candidate in taken:
        k += 1
        candidate = f"{name}_{k}"
    taken.add(candidate)
    return candidate


def graph_input(g: onnx.GraphProto, name: str, dtype: int, shape: list[int]) -> str:
    """The graph input `name` (an export that already takes labels keeps its own), added if absent."""
    if not any(i.name == name for i in g.input):
        g.input.append(helper.make_tensor_value_info(name, dtype, shape))
    return name


def input_shape(g: onnx.GraphProto, name: str) -> list:
    vi = next(i for i in g.input if i.name == name)
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in vi.type.tensor_type.shape.dim]
