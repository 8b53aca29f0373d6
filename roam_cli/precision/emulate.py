"""bfloat16 on a runtime without bfloat16 kernels: ONNX Runtime's CPU provider has Cast to and from
bfloat16, and the data-movement kernels (Reshape, Transpose, Gather, Concat, ...), but no
arithmetic in it (MatMul, Add, ... are NOT_IMPLEMENTED).

`emulate` rewrites each node that reads or writes bfloat16 and has no kernel for it: its bfloat16
inputs are widened to float32 by a Cast, it computes in float32, and each bfloat16 result is
rounded through a Cast to bfloat16 — what a GPU's bfloat16 kernel gives (float32 accumulation, one
rounding of the result) — and keeps its name, type and size. The nodes with a kernel stay as they
are. A widened input is one Cast per tensor, however many emulated nodes read it. The rewritten
graph is the one that runs on the CPU: plan that one (its float32 temporaries are tensors like
any other)."""

from __future__ import annotations

import functools

import onnx
from onnx import TensorProto, helper

BF16 = TensorProto.BFLOAT16
# metadata_props key of an emulated graph: the number of nodes emulated
EMULATED_KEY = "roam.emulated_bf16"


def holds(model: onnx.ModelProto, dtype: int) -> bool:
    """Whether any declared tensor or cast of the model is of `dtype` (cheap: no inference)."""
    g = model.graph
    if any(t.data_type == dtype for t in g.initializer):
        return True
    if any(vi.type.tensor_type.elem_type == dtype for vi in (*g.input, *g.output, *g.value_info)):
        return True
    return any(a.name == "to" and a.i == dtype for n in g.node for a in n.attribute)


def element_types(model: onnx.ModelProto) -> dict[str, int]:
    """Every tensor's element type: declared, else ONNX's inference."""
    g = model.graph
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    types = {vi.name: vi.type.tensor_type.elem_type for vi in (*inferred.value_info, *g.value_info, *g.input, *g.output)
             if vi.type.HasField("tensor_type")}
    types.update({t.name: t.data_type for t in g.initializer})
    return types


@functools.cache
def kernels(provider: str, dtype: int) -> frozenset[tuple[str, str]]:
    """(domain, op) that `provider` has a kernel of `dtype` for, from ONNX Runtime's registry."""
    from onnxruntime.capi import _pybind_state

    wanted = f"tensor({onnx.helper.tensor_dtype_to_string(dtype).removeprefix('TensorProto.').lower()})"
    found = set()
    for k in _pybind_state.get_all_opkernel_def():
        if k.provider == provider and any(wanted in types for types in k.type_constraints.values()):
            found.add(("" if k.domain == "ai.onnx" else k.domain, k.op_name))
    return frozenset(found)


def lacking(model: onnx.ModelProto, provider: str = "CPUExecutionProvider", dtype: int = BF16,
            types: dict[str, int] | None = None) -> list[onnx.NodeProto]:
    """The nodes that read or write `dtype` and have no kernel of it on `provider`."""
    if not holds(model, dtype):
        return []
    types = types if types is not None else element_types(model)
    have = kernels(provider, dtype)
    return [n for n in model.graph.node if without_kernel(n, dtype, types, have)]


def without_kernel(n: onnx.NodeProto, dtype: int, types: dict[str, int], have: frozenset) -> bool:
    return (any(types.get(x) == dtype for x in (*n.input, *n.output) if x) and n.op_type != "Constant"
            and ("" if n.domain == "ai.onnx" else n.domain, n.op_type) not in have)


def emulate(model: onnx.ModelProto, provider: str = "CPUExecutionProvider") -> int:
    """Rewrite `model` in place so that `provider` runs it (see the module's docstring); returns the
    number of nodes emulated."""
    g = model.graph
    if not holds(model, BF16):
        return 0
    types = element_types(model)
    have = kernels(provider, BF16)
    taken = {x for n in g.node for x in (*n.input, *n.output, n.name)} | set(types)
    wide: dict[str, str] = {}  # a bfloat16 tensor -> its float32 copy
    nodes: list[onnx.NodeProto] = []

    def fresh(name: str) -> str:
        k, candidate = 0, name
        while candidate in taken:
            k += 1
            candidate = f"{name}_{k}"
        taken.add(candidate)
        return candidate

    count = 0
    for n in g.node:
        if not without_kernel(n, BF16, types, have):
            nodes.append(n)
            continue
        count += 1
        for k, x in enumerate(n.input):
            if x and types.get(x) == BF16:
                if x not in wide:
                    wide[x] = fresh(f"{x}.fp32")
                    nodes.append(helper.make_node("Cast", [x], [wide[x]], name=wide[x], to=TensorProto.FLOAT))
                n.input[k] = wide[x]
        rounded = []
        for j, y in enumerate(n.output):
            if y and types.get(y) == BF16:
                n.output[j] = fresh(f"{y}.fp32")
                rounded.append(helper.make_node("Cast", [n.output[j]], [y], name=fresh(f"{y}.round"), to=BF16))
        for a in n.attribute:  # a bfloat16 result a node makes from an attribute: made in float32
            if a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT and a.i == BF16:
                a.i = TensorProto.FLOAT
        nodes.extend([n, *rounded])
    if count:
        del g.node[:]
        g.node.extend(nodes)
        model.metadata_props.add(key=EMULATED_KEY, value=str(count))
    return count
