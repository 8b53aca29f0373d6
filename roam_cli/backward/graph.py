"""The forward with its backward as one model: inputs the forward's, outputs the loss and each
`<name>_grad`. BatchNormalization keeps its training form (with the saved statistics as outputs
3 and 4) until the step is assembled: `lower_model` then writes it in standard ONNX."""

from __future__ import annotations

import onnx
from onnx import helper

from roam_cli.backward.engine import differentiate


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
    return out, grads

