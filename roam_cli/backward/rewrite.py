"""Forward rewrites before differentiating that shrink what the backward keeps, without changing
what the forward computes.

`fuse_gelu`: GELU written out by exporters, fused back into ONNX's Gelu (opset 20): the backward
of the written-out form keeps three activation-sized tensors per layer (x, 0.5 x, 1 + tanh/erf),
Gelu's keeps x alone. The forms recognised are PyTorch's two:
  erf:  x * 0.5 * (1 + erf(x / sqrt 2))                                       (BERT, ViT)
  tanh: x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))               (GPT-2)
with the factors of each product in any order. Intermediate tensors read elsewhere stop a match.

`inactive_dropouts_to_identity`: a Dropout with a constant ratio of 0 or training_mode false is the
identity, a view that keeps no copy and no mask.

`fold_constants`: every value that depends on no graph input is computed once. Exports without
constant folding (torch.onnx's optimize=False) write constants as arithmetic: RMSNorm's axes as
Reshape(Constant, Constant), a Slice's ends from Shape -> Gather -> Div -> Unsqueeze -> Concat; the
rules need them as constants. A result becomes an initializer where that keeps no more bytes, or is
small: GPT-2's causal mask buffers (1024 x 1024 per layer) sliced to the sequence length are kept as
the slices alone, and the masks combined from them (`And` of two 512 x 512 comparisons, reshaped) as
their one result, as ONNX Runtime's constant folding keeps them (12 MiB less in GPT-2 small's step;
0.25 MiB in GPT-2 medium's). Only embedded constants and static shapes are read (never a parameter:
those are graph inputs by then), and never a random op or one with a subgraph.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

SQRT_2, SQRT_2_OVER_PI, CUBIC = math.sqrt(2), math.sqrt(2 / math.pi), 0.044715


class Graph:
    def __init__(self, g: onnx.GraphProto):
        self.producer = {o: n for n in g.node for o in n.output}
        self.readers = Counter(x for n in g.node for x in n.input)
        self.readers.update(o.name for o in g.output)
        self.values = {t.name: numpy_helper.to_array(t) for t in g.initializer
                       if not t.external_data and np.prod(t.dims) == 1}
        for n in g.node:
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
                value = numpy_helper.to_array(n.attribute[0].t)
                if value.size == 1:
                    self.values[n.output[0]] = value

    def scalar(self, x: str, expected: float) -> bool:
        """x holds `expected`, to the rounding of a 16-bit float: an export in bf16 or fp16 writes
        GELU's coefficients (Python scalars in the model, kept in float32 by PyTorch's kernels)
        rounded to its type."""
        return x in self.values and abs(float(self.values[x].ravel()[0]) - expected) <= 2**-8 * abs(expected)

    def made_by(self, x: str, op: str, used: list) -> onnx.NodeProto | None:
        """x's producer if it is `op` and x has no other reader (it disappears with the fusion)."""
        n = self.producer.get(x)
        if n is None or n.op_type != op or self.readers[x] != 1:
            return None
        used.append(n)
        return n

    def factors(self, x: str, used: list) -> list[str]:
        """The factors of the product tree ending at x (Mul nodes read once, flattened)."""
        n = self.made_by(x, "Mul", used)
        return [f for y in n.input for f in self.factors(y, used)] if n is not None else [x]


def match(graph: Graph, out: str) -> tuple[str, str, list[onnx.NodeProto]] | None:
    """(x, approximate, nodes) when the tensor `out` is a written-out GELU of x."""
    root = graph.producer.get(out)
    if root is None or root.op_type != "Mul":
        return None
    used = [root]
    factors = [f for y in root.input for f in graph.factors(y, used)]
    half = [f for f in factors if graph.scalar(f, 0.5)]
    shifted = [f for f in factors if f not in half and (n := graph.producer.get(f)) is not None and n.op_type == "Add"
               and any(graph.scalar(y, 1.0) for y in n.input)]
    if len(factors) != 3 or len(half) != 1 or len(shifted) != 1:
        return None
    x = next(f for f in factors if f not in half and f not in shifted)
    add = graph.made_by(shifted[0], "Add", used)
    if add is None:
        return None
    inner = next(y for y in add.input if not graph.scalar(y, 1.0))
    if (erf := graph.made_by(inner, "Erf", used)) is not None:
        scaled = graph.producer.get(erf.input[0])
        ok = scaled is not None and graph.readers[erf.input[0]] == 1 and (
            (scaled.op_type == "Div" and scaled.input[0] == x and graph.scalar(scaled.input[1], SQRT_2)) or
            (scaled.op_type == "Mul" and x in scaled.input and any(graph.scalar(y, 1 / SQRT_2) for y in scaled.input)))
        return (x, "none", used + [scaled]) if ok else None
    if (tanh := graph.made_by(inner, "Tanh", used)) is not None:
        outer = graph.factors(tanh.input[0], used)
        if len(outer) != 2 or not any(graph.scalar(f, SQRT_2_OVER_PI) for f in outer):
            return None
        poly = graph.made_by(next(f for f in outer if not graph.scalar(f, SQRT_2_OVER_PI)), "Add", used)
        if poly is None or list(poly.input).count(x) != 1:
            return None
        cubic = graph.factors(next(y for y in poly.input if y != x), used)
        pows = [f for f in cubic if not graph.scalar(f, CUBIC)]
        if len(cubic) != 2 or len(pows) != 1:
            return None
        power = graph.made_by(pows[0], "Pow", used)
        if power is None or power.input[0] != x or not graph.scalar(power.input[1], 3.0):
            return None
        return x, "tanh", used
    return None


def fuse_gelu(model: onnx.ModelProto) -> int:
    """Replace every written-out GELU by one Gelu node, in place; how many were fused."""
    g = model.graph
    default = next((o for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if default is None or default.version < 18:
        return 0
    default.version = max(default.version, 20)  # Gelu's opset; 18 to 20 changes no other op's meaning
    graph = Graph(g)
    fused, dropped = {}, set()
    for n in g.node:
        if n.op_type == "Mul" and id(n) not in dropped:
            found = match(graph, n.output[0])
            if found is not None:
                x, approximate, nodes = found
                dropped.update(id(m) for m in nodes)
                fused[id(n)] = helper.make_node("Gelu", [x], [n.output[0]], name=f"{n.name}/gelu", approximate=approximate)
    kept = [fused.get(id(n), n) for n in g.node if id(n) in fused or id(n) not in dropped]
    del g.node[:]
    g.node.extend(kept)
    return len(fused)


def inactive_dropouts_to_identity(model: onnx.ModelProto) -> int:
    """Every Dropout that drops nothing becomes an Identity, in place; how many."""
    graph = Graph(model.graph)
    values = graph.values
    count = 0
    for n in model.graph.node:
        if n.op_type != "Dropout" or any(graph.readers[o] for o in n.output[1:] if o):
            continue  # a mask something reads
        ratio = values.get(n.input[1]) if len(n.input) > 1 and n.input[1] else np.array(0.5)
        mode = values.get(n.input[2]) if len(n.input) > 2 and n.input[2] else np.array(False)
        if (mode is not None and not bool(mode.ravel()[0])) or (ratio is not None and float(ratio.ravel()[0]) == 0.0):
            n.CopyFrom(helper.make_node("Identity", [n.input[0]], [n.output[0]], name=n.name))
            count += 1
    return count


# a constant result is not the op's result every run
NOT_FOLDED = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli", "Multinomial",
              "Dropout"}
SMALL_BYTES = 4096  # shapes, axes, starts, positions: always folded, since the rules read them as constants
LARGEST_EVALUATED = 1 << 28  # bytes; a larger result (a mask at a long sequence) is not computed at all


def fold_constants(model: onnx.ModelProto, types: dict) -> int:
    """Every standard node whose value depends on no graph input is computed once, in one pass in
    the graph's order: its inputs are embedded constants or values computed before it, or it is a
    Shape or Size of a tensor whose shape is static (`types`: name -> (dtype, shape)). Parameters
    are graph inputs by then, so their values are never read.

    The node becomes an initializer when that does not grow what is kept: a Constant node, a result
    of at most SMALL_BYTES, one smaller than the largest constant it reads, or one no larger than the
    constants it was the last reader of. A larger result stays a node, yet later nodes still fold
    from its value; constant nodes left unread (a big mask only sliced) and unread initializers go.
    Returns the count of nodes folded."""
    g = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 21)
    embedded = {t.name: t for t in g.initializer if not t.external_data}
    values: dict[str, np.ndarray] = {}
    readers = Counter(x for n in g.node for x in n.input)
    readers.update(o.name for o in g.output)
    kept, folded, count = [], [], 0
    for n in g.node:
        ins = [x for x in n.input if x]
        results = evaluate(n, ins, embedded, values, types, opset)
        if results is None:
            kept.append(n)
            continue
        values.update(zip(n.output, results))
        made = sum(r.nbytes for r in results)
        read = {x: values[x].nbytes for x in ins if x in values}
        freed = sum(size for x, size in read.items() if readers[x] == ins.count(x))
        if n.op_type == "Constant" or made <= max(SMALL_BYTES, freed) or made < max(read.values(), default=0):
            folded.extend(n.output)
            count += 1
            for x in ins:
                readers[x] -= 1
        else:
            kept.append(n)
    live = []
    for n in reversed(kept):  # constant nodes nothing reads any more go, and what only they read
        if all(o in values and not readers[o] for o in n.output):
            for x in n.input:
                readers[x] -= 1
        else:
            live.append(n)
    read = {x for n in live for x in n.input} | {o.name for o in g.output}
    inits = [t for t in g.initializer if t.name in read] + [numpy_helper.from_array(values[x], x) for x in folded
                                                              if x in read]
    del g.node[:]
    g.node.extend(reversed(live))
    del g.initializer[:]
    g.initializer.extend(inits)
    return count


def evaluate(n: onnx.NodeProto, ins: list[str], embedded: dict, values: dict, types: dict, opset: int
             ) -> list[np.ndarray] | None:
    """The values of n's outputs when they depend on no graph input (None otherwise, or when the
    reference evaluator lacks the op's form, or when they would be too large to compute)."""
    if (n.domain not in ("", "ai.onnx") or n.op_type in NOT_FOLDED or not all(n.output)
            or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute)):
        return None
    if n.op_type in ("Shape", "Size"):  # of the static shape alone: the tensor itself is not read
        shape = types.get(n.input[0], (None, None))[1]
        if shape is None:
            return None
        if n.op_type == "Size":
            return [np.array(int(np.prod(shape)), np.int64)]
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        return [np.array(shape[attrs.get("start", 0):attrs.get("end", len(shape))], np.int64)]  # clamped as Shape's
    if not all(x in values or x in embedded for x in ins):
        return None
    if all(o in types for o in n.output) and sum(
            int(np.prod(types[o][1])) * helper.tensor_dtype_to_np_dtype(types[o][0]).itemsize
            for o in n.output) > LARGEST_EVALUATED:
        return None
    try:
        for x in ins:
            if x not in values:
                values[x] = numpy_helper.to_array(embedded[x])
        results = ReferenceEvaluator(n, opsets={"": opset}).run(None, {x: values[x] for x in ins})
    except Exception:  # noqa: BLE001  (an op form the reference evaluator lacks, corrupt data: left to ONNX Runtime)
        return None
    if not all(isinstance(r, (np.ndarray, np.generic)) for r in results):  # a sequence or an optional
        return None
    results = [np.asarray(r) for r in results]
    made = [(helper.np_dtype_to_tensor_dtype(r.dtype), r.shape) for r in results]
    if any(o in types and types[o] != t for o, t in zip(n.output, made)):
        return None  # not what shape inference says the node makes: left to ONNX Runtime
    return results
