"""The forward with its backward as one model: inputs the forward's, outputs the loss and each
`<name>_grad`. BatchNormalization keeps its training form (with the saved statistics as outputs
3 and 4) until the step is assembled: `lower_model` then writes it in standard ONNX."""

from __future__ import annotations

import onnx
from onnx import helper

from roam_cli.backward.engine import differentiate


def gradient_model(model: onnx.ModelProto, wrt: list[str], loss: str, seed: str | None = None
                   ) -> tuple[onnx.ModelProto, dict[str, str]]:
    """A copy of `model` whose outputs are `loss` and the gradients of the names in `wrt` that the
    loss depends on (name -> gradient name); `seed`: the gradient of the loss itself (a scale),
    1 by default."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    backward, tape, grads = differentiate(out, wrt, loss, seed)
    g = out.graph
    g.node.extend(backward)
    g.initializer.extend(tape.constants.values())
    del g.output[:]
    g.output.append(helper.make_tensor_value_info(loss, tape.dtype(loss), tape.shape(loss)))
    g.output.extend(helper.make_tensor_value_info(grads[p], tape.dtype(p), tape.shape(p)) for p in wrt if p in grads)
    # roam's static types, kept for lowering: ONNX's inference stops at a BatchNormalization in
    # training mode with its saved statistics (5 outputs where opsets <= 17 allow 3), and an export
    # without value_info (TorchScript's) would leave every tensor after it without a rank
    declared = {vi.name for vi in (*g.input, *g.output, *g.value_info)} | {t.name for t in g.initializer}
    g.value_info.extend(helper.make_tensor_value_info(name, dtype, list(shape)) for name, (dtype, shape) in tape.static.items()
                        if name not in declared and dtype)
    return out, grads

