"""The forward with its backward as one model: inputs the forward's, outputs the loss and each
`<name>_grad`. ORT's training forms a rule used (BatchNormalization in training mode) are
written in standard ONNX by the `lower` package on the way out."""

from __future__ import annotations

import onnx
from onnx import helper

from roam_cli.backward.engine import differentiate
from roam_cli.lower import lower_model, nonstandard_nodes


def gradient_model(model: onnx.ModelProto, wrt: list[str], loss: str) -> tuple[onnx.ModelProto, dict[str, str]]:
    """A copy of `model` whose outputs are `loss` and the gradients of the names in `wrt` that the
    loss depends on (name -> gradient name)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    backward, tape, grads = differentiate(out, wrt, loss)
    g = out.graph
    g.node.extend(backward)
    g.initializer.extend(tape.constants.values())
    del g.output[:]
    g.output.append(helper.make_tensor_value_info(loss, tape.dtype(loss), tape.shape(loss)))
    g.output.extend(helper.make_tensor_value_info(grads[p], tape.dtype(p), tape.shape(p)) for p in wrt if p in grads)
    return (lower_model(out) if nonstandard_nodes(out) else out), grads

