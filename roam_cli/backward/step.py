"""The training graph roam's backward builds, in the layout of ONNX Runtime's artifacts training
graph so that `optimizer_graph.full_step`, plans, checkpoints and `roam train` see the same names:
parameters (trainable and frozen) are graph inputs, each gradient `<param>_grad` is added into
`<param>_grad.accumulation.buffer` by an InPlaceAccumulatorV2 reset by `lazy_reset_grad`, and
the outputs are the loss and `<param>_grad.accumulation.out`. `training_graph.make` lowers either
form (this graph, or the full step made from it) to standard ONNX before writing it."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from roam_cli.backward.engine import static_types
from roam_cli.backward.graph import gradient_model
from roam_cli.backward.loss import add_loss
from roam_cli.backward.rewrite import fold_constants, fuse_gelu, inactive_dropouts_to_identity
from roam_cli.backward.sequences import lower_sequences
from roam_cli.core.errors import RoamError
from roam_cli.frontend import providers
from roam_cli.frontend.training_graph import Artifacts, Survey
from roam_cli.precision.autocast import autocast

LAZY_RESET = "lazy_reset_grad"


def training_model(model: onnx.ModelProto, trainable: list[str], frozen: list[str], loss: str,
                   low: int | None = None, loss_scale: str | None = None) -> tuple[onnx.ModelProto, list[str]]:
    """The artifacts-layout training graph of a repaired inference export, and the trainable
    parameters the loss does not depend on (they get no gradient and stay as they are). `low`: the
    forward computes in that type where the precision policy says (`precision.autocast`), its
    parameters float32 masters. `loss_scale`: the gradients are of the loss times this graph input
    (fp16's loss scaling), which the backward starts from; the loss output stays unscaled."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    lower_sequences(out)  # before shape inference, which sees tensors only
    types = static_types(out)
    loss_name = add_loss(out, loss, types)
    fuse_gelu(out)
    inactive_dropouts_to_identity(out)
    as_inputs(out.graph, [*trainable, *frozen])
    fold_constants(out, types)  # after as_inputs: no parameter is read
    if low is not None or loss_scale is not None:  # the forward's types as they are now, the loss's included
        types = static_types(out)
    if low is not None:
        autocast(out, low, types, providers.highest_opset())
        fold_constants(out, types)  # the casts of constants
    if loss_scale is not None:  # the loss as the model has it, then after the autocast (16 bits cannot be scaled)
        shape = scalar_loss(loss_name, types)
        scalar_loss(loss_name, static_types(out), " after the autocast")
        out.graph.input.append(helper.make_tensor_value_info(loss_scale, TensorProto.FLOAT, shape))
    training, grads = gradient_model(out, trainable, loss_name, seed=loss_scale)
    g = training.graph
    read = {x for n in g.node for x in n.input}
    kept = [t for t in g.initializer if t.name in read]  # constants of fused-away nodes go
    del g.initializer[:]
    g.initializer.extend(kept)
    outputs = [g.output[0]]
    for p in trainable:
        if p not in grads:
            continue
        grad_vi = next(o for o in g.output if o.name == grads[p])
        buffer = helper.make_tensor_value_info(f"{p}_grad.accumulation.buffer", grad_vi.type.tensor_type.elem_type,
                                               [d.dim_value for d in grad_vi.type.tensor_type.shape.dim])
        g.input.append(buffer)
        flag = f"{p}_grad.accumulation.out"
        g.node.append(helper.make_node("InPlaceAccumulatorV2", [buffer.name, grads[p], LAZY_RESET], [flag],
                                       name=f"GradientAccumulator.{p}", domain="com.microsoft"))
        outputs.append(helper.make_tensor_value_info(flag, TensorProto.BOOL, [1]))
    g.input.append(helper.make_tensor_value_info(LAZY_RESET, TensorProto.BOOL, [1]))
    del g.output[:]
    g.output.extend(outputs)
    if not any(o.domain == "com.microsoft" for o in training.opset_import):
        training.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return training, [p for p in trainable if p not in grads]


def scalar_loss(loss: str, types: dict, when: str = "") -> list[int]:
    """The loss's shape; loss scaling multiplies one number, so the loss must be a float32 scalar."""
    dtype, shape = types[loss]
    if dtype != TensorProto.FLOAT or int(np.prod(shape)) != 1:
        raise RoamError(f"fp16 loss scaling needs a loss: the first output {loss!r} is "
                        f"{TensorProto.DataType.Name(dtype).lower()}{list(shape)}{when}, not a float32 scalar; give "
                        "--loss to add one, or --grad-scaler enabled=false")
    return list(shape)


def as_inputs(g: onnx.GraphProto, names: list[str]) -> None:
    """Initializers `names` become graph inputs (no weight is copied: only their types move)."""
    chosen = set(names)
    moved = [t for t in g.initializer if t.name in chosen]
    kept = [t for t in g.initializer if t.name not in chosen]
    del g.initializer[:]
    g.initializer.extend(kept)
    g.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in moved)


def build(model: onnx.ModelProto, chosen: Survey, loss: str, optimizer: str | None, low: int | None = None,
          loss_scale: str | None = None) -> Artifacts:
    """`training_graph.build`'s counterpart with roam's backward: no torch, no onnxruntime-training.
    No optimizer graph (ONNX Runtime's is made of its training ops); parameters the loss does not
    depend on move from `chosen.trainable` to `chosen.unreached` and keep their values. `low` and
    `loss_scale`: mixed precision (`training_model`)."""
    inits = {t.name: t for t in model.graph.initializer}
    training, unreached = training_model(model, chosen.trainable, chosen.frozen, loss, low, loss_scale)
    chosen.unreached = unreached
    chosen.trainable = [p for p in chosen.trainable if p not in unreached]
    parameters = ([inits[p] for p in chosen.trainable if p in inits],
                  [inits[p] for p in [*chosen.frozen, *unreached] if p in inits])
    return Artifacts(training, None, None, parameters)
