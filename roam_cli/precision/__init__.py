"""Mixed precision: the element types a training step computes in (DESIGN.md, "Mixed precision").

A mixed-precision step keeps float32 master parameters and optimizer state and computes in
bfloat16 or float16 where the precision policy says (`policy`). The stage rewrites ONNX protos
only, before the backward is built, so that the backward differentiates what the step computes:
- `masters`: an export already in low precision (`.half()`, `.to(torch.bfloat16)`, an autocast
  export) brought back to float32, its weights float32 masters made from the rounded values;
- `autocast`: a float32 forward rewritten to compute in the low type where the policy says, each
  weight's low-precision copy one Cast from its master (kept to the backward or cast again: the
  recompute stage decides);
- `emulate`: a bfloat16 graph made runnable on a runtime without bfloat16 kernels (ONNX Runtime's
  CPU provider): each such node computes in float32 between Casts to and from bfloat16.
fp16's loss scaling lives with the optimizer's update (`frontend.optimizer_graph.GradScaler`)."""

import onnx
from onnx import TensorProto

from roam_cli.core.errors import RoamError

# --precision -> the element type the low-precision ops compute in (fp32: no low type)
PRECISIONS = {"fp32": TensorProto.FLOAT, "bf16": TensorProto.BFLOAT16, "fp16": TensorProto.FLOAT16}
LOW_TYPES = {TensorProto.BFLOAT16: "bf16", TensorProto.FLOAT16: "fp16"}


def low_type(precision: str) -> int | None:
    """The low element type of `precision` (None for fp32); a one-line refusal for an unknown one."""
    if precision not in PRECISIONS:
        raise RoamError(f"--precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    dtype = PRECISIONS[precision]
    return dtype if dtype in LOW_TYPES else None


def unique(name: str, taken: set[str]) -> str:
    """`name`, or `name_1`, `name_2`, ...: the first not in `taken`, which it joins."""
    k, candidate = 0, name
    while candidate in taken:
        k += 1
        candidate = f"{name}_{k}"
    taken.add(candidate)
    return candidate


def declared_types(model: onnx.ModelProto) -> set[int]:
    """Every element type the model names: its initializers', graph inputs', outputs' and
    value_info's, its tensor attributes' and the `to` and `dtype` of its nodes (no inference)."""
    g = model.graph
    found = {t.data_type for t in g.initializer}
    found |= {vi.type.tensor_type.elem_type for vi in (*g.input, *g.output, *g.value_info)}
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                found.add(a.t.data_type)
            elif a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT:
                found.add(a.i)
    return found
