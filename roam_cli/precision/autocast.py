"""A float32 forward rewritten to compute where the precision policy says (`policy`).

The nodes are taken in order. Each op's operands that must share a type get the type the policy
gives them, through a Cast where they have another; each result then has the type its schema
binds it to. A Linear's bias, which exporters write as an Add after its MatMul, is added in the
low type as torch's `F.linear` adds it. A value a low-precision op reads through a move
(Transpose, Reshape) read by nothing else is cast before the move: a Linear's weight, which
exporters transpose before the MatMul, is cast and then transposed in the low type, as torch
casts the weight and the product reads it transposed. A tensor is cast to a type once, however many nodes read the copy: a weight's
low-precision copy is one Cast from its float32 master, read by the forward and, through the
backward built afterwards, by the backward too (the recompute stage may cast it again instead of
keeping it)."""

from __future__ import annotations

import functools
from collections import Counter

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from roam_cli.core.errors import RoamError
from roam_cli.core.graph import type_name
from roam_cli.lower import at_opset_18
from roam_cli.precision import LOW_TYPES, unique
from roam_cli.precision.policy import FLOAT32, FLOATS, LOW, rule, widest

STANDARD = ("", "ai.onnx")
# Ops that only move their input's elements: a low-precision copy of their result is their result of a
# low-precision copy of their input (cast before the move, it moves half the bytes).
MOVES = {"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"}


def autocast(model: onnx.ModelProto, low: int, types: dict[str, tuple[int, tuple]], highest_opset: int) -> None:
    """Rewrite `model` in place to compute in `low` where the policy says. `types`: name ->
    (element type, shape) of every tensor of the float32 forward, whose parameters are graph
    inputs (not constants). The declared types of the graph's values follow. An op ONNX defines
    for the low type only from a later opset than the model's (bf16 Conv and pooling: 22) raises
    the model's opset to it; one ONNX defines for it in no opset up to `highest_opset` (the
    highest the installed ONNX Runtime loads) computes in float32."""
    g = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in STANDARD), 21)
    needed = opset
    now = {name: dtype for name, (dtype, _) in types.items()}
    constant = {t.name for t in g.initializer}
    embedded = {t.name: t for t in g.initializer if t.data_location != TensorProto.EXTERNAL}
    taken = {x for n in g.node for x in (*n.input, *n.output, n.name)} | set(now)
    casts: dict[tuple[str, int], str] = {}  # (tensor, type) -> its copy of that type
    nodes: list[onnx.NodeProto] = []
    made: dict[str, onnx.NodeProto] = {}  # tensor -> the node (in `nodes`) that makes it
    readers = Counter(x for n in g.node for x in n.input)

    def cast(x: str, to: int, before: onnx.NodeProto | None = None) -> str:
        if now.get(x) == to:
            return x
        mover = made.get(x)
        if to == low and mover is not None and mover.op_type in MOVES and readers[x] == 1:
            # cast what the move reads, and move the low copy: a transposed weight's copy is half the bytes
            mover.input[0] = cast(mover.input[0], to, before=mover)
            now[x] = to
            return x
        key = (x, to)
        if key in casts and before is not None:
            place_before(casts[key], before)
        if key not in casts:
            name = unique(f"{x}.{LOW_TYPES.get(to, 'fp32')}", taken)
            if x in embedded:  # a constant is cast once, here
                g.initializer.append(cast_value(embedded[x], to, name))
            else:
                node = helper.make_node("Cast", [x], [name], name=name, to=to)
                nodes.insert(nodes.index(before) if before is not None else len(nodes), node)
            now[name] = to
            if x in constant:
                constant.add(name)
            casts[key] = name
        return casts[key]

    products: set[str] = set()  # the results of the low-precision ops
    sources = {i.name for i in g.input} | constant  # what no node makes: parameters, data, constants
    def place_before(copy: str, node: onnx.NodeProto) -> None:
        """The Cast making `copy` (made for a later reader) moved before `node`, which reads it now."""
        made_at = next((k for k, m in enumerate(nodes) if m.op_type == "Cast" and m.output[0] == copy), None)
        if made_at is not None and made_at > nodes.index(node):
            nodes.insert(nodes.index(node), nodes.pop(made_at))

    for n in list(g.node):
        schema = find_schema(n, opset)
        groups = operand_groups(n, schema)
        kind = rule(n.op_type) if schema is not None else FLOAT32  # an op without a schema: float32
        if linear_bias(n, products, sources, types):
            kind = LOW
        targets: dict[str, int] = {}
        for param, members in groups.items():
            floats = [x for x in members if now.get(x) in FLOATS]
            if not floats:
                continue
            if kind == LOW:
                targets[param] = low if any(now[x] in (TensorProto.FLOAT, low) for x in floats) else now[floats[0]]
            elif kind == FLOAT32:
                targets[param] = widest([TensorProto.FLOAT, *(now[x] for x in floats)])
            else:
                weighed = [x for x in floats if x not in constant] or floats
                targets[param] = widest(now[x] for x in weighed)
            if targets[param] == low:
                since = low_since(n.op_type, param, low, opset, highest_opset)
                targets[param] = low if since is not None else TensorProto.FLOAT
                needed = max(needed, since or opset)
            for k, x in enumerate(n.input):
                if x and x in members and now.get(x) in FLOATS and now[x] != targets[param]:
                    n.input[k] = cast(x, targets[param])
        results = [o.type_str for o in schema.outputs] if schema is not None else []
        for j, out in enumerate(n.output):
            if out:
                param = results[min(j, len(results) - 1)] if results else None
                now[out] = targets.get(param, now.get(out)) if now.get(out) in FLOATS else now.get(out)
        if n.input and all(x in constant for x in n.input if x):
            constant.update(o for o in n.output if o)
        if kind == LOW:
            products.update(o for o in n.output if o)
        made.update((o, n) for o in n.output if o)
        nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    for vi in (*g.value_info, *g.output):
        if now.get(vi.name) is not None and vi.type.HasField("tensor_type"):  # an unknown type stays as declared
            vi.type.tensor_type.elem_type = now[vi.name]
    if needed > opset:  # after the declared types are the new ones: ONNX's converter keeps them
        raise_opset(model, needed)


def linear_bias(n: onnx.NodeProto, products: set[str], sources: set[str], types: dict) -> bool:
    """An Add of a low-precision product and a vector no node makes: a Linear's bias, which exporters
    write apart from its MatMul and torch's autocast adds in the low type with the product (one
    `F.linear`, its bias cast down like its weight)."""
    if n.op_type != "Add" or n.domain not in STANDARD or len(n.input) != 2:
        return False
    for product, bias in (n.input, n.input[::-1]):
        if product in products and bias in sources and len(types.get(bias, (None, ()))[1]) == 1:
            return True
    return False


@functools.cache
def low_since(op_type: str, param: str, low: int, opset: int, last: int) -> int | None:
    """The first opset from `opset` to `last` whose schema of `op_type` lets type parameter `param`
    be `low`; None when none does."""
    wanted = f"tensor({type_name(low)})"
    for version in range(opset, min(last, onnx.defs.onnx_opset_version()) + 1):
        try:
            schema = onnx.defs.get_schema(op_type, version)
        except onnx.defs.SchemaError:
            continue
        if any(c.type_param_str == param and wanted in c.allowed_type_strs for c in schema.type_constraints):
            return version
    return None


# Ops whose meaning an opset after 18 changed, not only their types: raising the opset over them
# would change what the graph computes.
CHANGED_AFTER_18 = {"GroupNormalization": 21, "GridSample": 20, "DFT": 20}


def raise_opset(model: onnx.ModelProto, version: int) -> None:
    """The model's default opset raised to `version`: a model below 18 converted to 18 first (ONNX's
    converter: Reduce* axes become inputs, ...); from 18 to 22 ONNX adds types to ops, and changes
    only what CHANGED_AFTER_18 lists, which is refused."""
    model.CopyFrom(at_opset_18(model))
    current = next(o.version for o in model.opset_import if o.domain in STANDARD)
    for n in model.graph.node:
        if n.domain in STANDARD and current < CHANGED_AFTER_18.get(n.op_type, 0) <= version:
            raise RoamError(f"mixed precision needs ONNX opset {version} for its 16-bit ops, which changes what "
                            f"{n.op_type} node {n.name!r} computes; export the model at opset {version} or higher")
    for o in model.opset_import:
        if o.domain in STANDARD:
            o.version = version


def cast_value(t: onnx.TensorProto, to: int, name: str) -> onnx.TensorProto:
    """A constant in type `to`, its values clamped to the type's finite range: the exporter wrote a
    float32 model's `torch.finfo(dtype).min` (an attention mask's fill), which the low type's own
    most negative value stands for, as the model computing in that type would have written it."""
    value = numpy_helper.to_array(t)
    target = helper.tensor_dtype_to_np_dtype(to)
    largest = float(ml_dtypes.finfo(target).max)
    return numpy_helper.from_array(np.clip(value, -largest, largest).astype(target), name)


def operand_groups(n: onnx.NodeProto, schema) -> dict[str, list[str]]:
    """The node's inputs by the schema's type parameter binding them (`T`: [x, scale, bias]);
    inputs of a fixed type (`tensor(int64)`) are left out. Without a schema: one group of all its
    inputs (cast up to float32 where low, its results' types unchanged)."""
    if schema is None:
        return {"": [x for x in n.input if x]}
    params = {c.type_param_str for c in schema.type_constraints}
    groups: dict[str, list[str]] = {}
    for k, x in enumerate(n.input):
        formal = schema.inputs[min(k, len(schema.inputs) - 1)].type_str if schema.inputs else ""
        if x and formal in params:
            groups.setdefault(formal, []).append(x)
    return groups


def find_schema(n: onnx.NodeProto, opset: int):
    """The ONNX schema of n at the model's opset (or the newest, for an op newer than the model's
    opset that a rewrite wrote, such as Gelu at 20); None outside the standard domain."""
    if n.domain not in STANDARD or not onnx.defs.has(n.op_type):
        return None
    try:
        return onnx.defs.get_schema(n.op_type, opset)
    except onnx.defs.SchemaError:
        return onnx.defs.get_schema(n.op_type)
