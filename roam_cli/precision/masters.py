"""An export already in low precision, brought back to float32 for the precision policy to apply.

`model.half()`, `model.to(torch.bfloat16)` and exports made under torch.autocast (whose weight
casts the dynamo exporter folds into low-precision constants) hold low-precision weights and
compute as PyTorch's policy of the day had it. A mixed-precision step keeps float32 masters and
computes as roam's policy says, so the export is first made float32 throughout: its embedded
low-precision constants are widened (exactly), its weights become float32 masters whose values
`roam train` widens from the export's (they start from the rounded values: the warning says so),
its casts to the low type become no-ops, and a low-precision data input a float32 one. No weight
byte is read: an external weight changes its declared type only."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from roam_cli.core.errors import RoamError
from roam_cli.precision import LOW_TYPES, declared_types

FLOAT = TensorProto.FLOAT


def low_type_of(model: onnx.ModelProto) -> int | None:
    """The low-precision float type the export holds or casts to (bf16 or fp16), None for a float32
    export; an export mixing both is refused."""
    low = declared_types(model) & set(LOW_TYPES)
    if len(low) > 1:
        raise RoamError("the export computes in both bfloat16 and float16; export it in one precision")
    return next(iter(low), None)


def to_float32(model: onnx.ModelProto, low: int, weights: list[str]) -> list[str]:
    """Rewrite `model` in place to hold and compute in float32 where it held `low`; returns the
    initializers and `weights` (parameters, also as graph inputs) whose values the export rounded
    to `low` (an external weight's declared type changes, its value is widened when read)."""
    g = model.graph
    weight = set(weights)
    rounded = [vi.name for vi in g.input if vi.name in weight and vi.type.tensor_type.elem_type == low]
    for vi in g.input:
        if vi.name in weight and vi.type.tensor_type.elem_type == low:
            vi.type.tensor_type.elem_type = FLOAT
    for t in g.initializer:
        if t.data_type != low:
            continue
        rounded.append(t.name)
        if t.data_location == TensorProto.EXTERNAL:  # a weight: its type now, its value when roam train reads it
            del t.external_data[:]
            t.data_location = TensorProto.DEFAULT
            t.ClearField("raw_data")
            t.data_type = FLOAT
        else:
            t.CopyFrom(widened(t))
    for vi in (*g.output, *g.value_info):
        if vi.type.tensor_type.elem_type == low:
            vi.type.tensor_type.elem_type = FLOAT
    declared = {vi.name: vi.type.tensor_type.elem_type for vi in (*g.input, *g.value_info, *g.output)}
    declared.update({t.name: t.data_type for t in g.initializer})
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == low:
                a.t.CopyFrom(widened(a.t))
            elif a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT and a.i == low:
                a.i = FLOAT
        if n.op_type == "Constant" and n.attribute and n.attribute[0].type == onnx.AttributeProto.TENSOR:
            declared[n.output[0]] = n.attribute[0].t.data_type
    drop_noop_casts(g, declared)
    widen_inputs(g, low)
    return rounded


def widened(t: onnx.TensorProto) -> onnx.TensorProto:
    """The tensor with its values in float32 (every bf16 and fp16 value is one exactly)."""
    out = numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name)
    out.metadata_props.extend(t.metadata_props)
    return out


def drop_noop_casts(g: onnx.GraphProto, declared: dict[str, int]) -> None:
    """A Cast to float32 of a float32 value (the export narrowing what it widened, or widening what
    it narrowed) is nothing now: its readers read its input (an Identity where it is a graph output)."""
    outputs = {o.name for o in g.output}
    same: dict[str, str] = {}
    kept = []
    for n in g.node:
        n.input[:] = [same.get(x, x) for x in n.input]
        noop = (n.op_type == "Cast" and n.domain in ("", "ai.onnx") and declared.get(n.input[0]) == FLOAT
                and all(a.i == FLOAT for a in n.attribute if a.name == "to"))
        if noop and n.output[0] not in outputs:
            same[n.output[0]] = n.input[0]
            continue
        if noop:
            n.op_type = "Identity"
            del n.attribute[:]
        kept.append(n)
    del g.node[:]
    g.node.extend(kept)


def widen_inputs(g: onnx.GraphProto, low: int) -> None:
    """A low-precision data input becomes a float32 one: the mixed-precision step takes its batch in
    float32, as a training loop under torch.autocast feeds it, and computes in the low type where
    the policy says (ONNX Runtime's Python API takes no bfloat16 array)."""
    inits = {t.name for t in g.initializer}
    for vi in g.input:
        if vi.type.tensor_type.elem_type == low and vi.name not in inits:
            vi.type.tensor_type.elem_type = FLOAT
