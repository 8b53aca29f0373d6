"""16-bit floats on a runtime without their kernels: ONNX Runtime's CPU provider.

It has Cast to and from bfloat16 and the data-movement kernels (Reshape, Transpose, Gather, ...),
but no bfloat16 arithmetic (MatMul, Add, ... are NOT_IMPLEMENTED). float16 graphs it runs, by
inserting Casts around the kernels it lacks, then removing each Cast to float16 it finds followed
by one back to float32 as if the pair were free: a product of two weights cast to float16
computes on the float32 weights, unrounded. Neither gives a GPU's numbers.

`emulate` rewrites each node that reads or writes bfloat16 or float16 and has no kernel for that
type: its 16-bit inputs are widened to float32 by a Cast, it computes in float32, and each 16-bit
result is rounded through a Cast to its type — what a GPU's kernel gives (float32 accumulation,
one rounding of the result) — keeping its name, type and size. The nodes with a kernel stay as
they are. Each emulated node widens its own inputs: the float32 copies live around that node
alone, as a kernel's scratch would, so the 16-bit tensors are what is kept between nodes, as on
a GPU, and no Cast pair is left for ONNX Runtime to remove. The rewritten graph is the one that
runs on the CPU: plan that one (its float32 temporaries are tensors like any other)."""

from __future__ import annotations

import functools

import onnx
from onnx import TensorProto, helper

from roam_cli.core.errors import RoamError, first_line
from roam_cli.core.graph import type_name
from roam_cli.precision import LOW_TYPES, declared_types, unique

BF16, FP16 = TensorProto.BFLOAT16, TensorProto.FLOAT16
# metadata_props key of an emulated graph: the number of nodes emulated
EMULATED_KEY = "roam.emulated"


def element_types(model: onnx.ModelProto) -> dict[str, int]:
    """Every tensor's element type: declared, else ONNX's inference."""
    g = model.graph
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    types = {vi.name: vi.type.tensor_type.elem_type for vi in (*inferred.value_info, *g.value_info, *g.input, *g.output)
             if vi.type.HasField("tensor_type")}
    types.update({t.name: t.data_type for t in g.initializer})
    return types


def check_types(model: onnx.ModelProto, path) -> None:
    """RoamError when a node's types are not ones ONNX allows it at the model's opset (a bfloat16
    MatMul before opset 13): what is rewritten from it would be as invalid as it is."""
    try:
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as e:
        raise RoamError(f"{path} is not a valid ONNX model: {first_line(e)}") from None


@functools.cache
def kernels(provider: str, dtype: int) -> dict[tuple[str, str], tuple[tuple[int, int], ...]]:
    """(domain, op) -> the opset version ranges in which `provider` has a kernel of `dtype` for it,
    from ONNX Runtime's registry (Pad has a bfloat16 kernel from opset 21 on, not at 19). A build
    without the registry (onnxruntime-training 1.19) is taken to have Cast alone: every other 16-bit
    node is emulated, data movement exactly."""
    from onnxruntime.capi import _pybind_state

    if not hasattr(_pybind_state, "get_all_opkernel_def"):
        return {("", "Cast"): ((1, 2**31 - 1),)}
    wanted = f"tensor({type_name(dtype)})"
    found: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for k in _pybind_state.get_all_opkernel_def():
        if k.provider == provider and any(wanted in types for types in k.type_constraints.values()):
            found.setdefault(("" if k.domain == "ai.onnx" else k.domain, k.op_name), []).append(tuple(k.version_range))
    return {op: tuple(ranges) for op, ranges in found.items()}


def since_version(n: onnx.NodeProto, opsets: dict[str, int]) -> int:
    """The version of n's op that the model's opset imports: what a kernel is registered for."""
    domain = "" if n.domain == "ai.onnx" else n.domain
    opset = opsets.get(domain, 1)
    try:
        return onnx.defs.get_schema(n.op_type, opset, domain).since_version
    except onnx.defs.SchemaError:
        return opset


def lacking(model: onnx.ModelProto, provider: str = "CPUExecutionProvider", dtypes: tuple[int, ...] = (BF16,),
            types: dict[str, int] | None = None) -> list[onnx.NodeProto]:
    """The nodes that read or write one of `dtypes` and have no kernel of it on `provider`."""
    held = sorted(set(dtypes) & declared_types(model))
    if not held:
        return []
    types = types if types is not None else element_types(model)
    have = {t: kernels(provider, t) for t in held}
    opsets = opsets_of(model)
    return [n for n in model.graph.node if without_kernel(n, types, have, opsets)]


def opsets_of(model: onnx.ModelProto) -> dict[str, int]:
    return {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}


def without_kernel(n: onnx.NodeProto, types: dict[str, int], have: dict[int, dict], opsets: dict[str, int]) -> bool:
    """Whether n reads or writes a type of `have` for which no kernel of its op's version is registered."""
    if n.op_type == "Constant":
        return False
    low = {types[x] for x in (*n.input, *n.output) if x and types.get(x) in have}
    if not low:
        return False
    version = since_version(n, opsets)
    ranges = [have[t].get(("" if n.domain == "ai.onnx" else n.domain, n.op_type), ()) for t in low]
    return not all(any(start <= version <= end for start, end in r) for r in ranges)


def emulate(model: onnx.ModelProto, provider: str = "CPUExecutionProvider") -> int:
    """Rewrite `model` in place so that `provider` computes its 16-bit nodes as a GPU does (see the
    module's docstring); returns the number of nodes emulated."""
    g = model.graph
    held = sorted(set(LOW_TYPES) & declared_types(model))
    if not held:
        return 0
    types = element_types(model)
    have = {t: kernels(provider, t) for t in held}
    opsets = opsets_of(model)
    taken = {x for n in g.node for x in (*n.input, *n.output, n.name)} | set(types)
    nodes: list[onnx.NodeProto] = []

    count = 0
    for n in g.node:
        if not without_kernel(n, types, have, opsets):
            nodes.append(n)
            continue
        count += 1
        wide: dict[str, str] = {}  # this node's 16-bit inputs -> their float32 copies
        for k, x in enumerate(n.input):
            if x and types.get(x) in LOW_TYPES:
                if x not in wide:
                    wide[x] = unique(f"{x}.fp32", taken)
                    nodes.append(helper.make_node("Cast", [x], [wide[x]], name=wide[x], to=TensorProto.FLOAT))
                n.input[k] = wide[x]
        rounded = []
        for j, y in enumerate(n.output):
            if y and types.get(y) in LOW_TYPES:
                n.output[j] = unique(f"{y}.fp32", taken)
                rounded.append(helper.make_node("Cast", [n.output[j]], [y], name=unique(f"{y}.round", taken),
                                                to=types[y]))
        for a in n.attribute:  # a 16-bit result a node makes from an attribute: made in float32
            if a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT and a.i in LOW_TYPES:
                a.i = TensorProto.FLOAT
        nodes.extend([n, *rounded])
    if count:
        del g.node[:]
        g.node.extend(nodes)
        model.metadata_props.add(key=EMULATED_KEY, value=str(count))
    return count
