"""Hypothesis strategies for the property tests and benchmarks/order_layout/fuzz.py: random training-like DAGs
as real ONNX models, and random buffer sets for the layout strategies.

The DAGs use ops with simple shape semantics so that import and shape inference run for real:
Relu, Add, Mul (same-shape operands), Split (several outputs, some unused), Reshape, Unsqueeze and
Identity (views), ReduceSum (a scalar loss), Constant, InPlaceAccumulatorV2 (com.microsoft, in
place by op contract) and declared update pairs (graph output `<state>.out` replaces input
`<state>`). Tensors may have zero elements; nodes may be unnamed or share a name."""

import math

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

DTYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE)
DIMS = (0, 1, 2, 3, 5, 8, 16, 64, 100)


@st.composite
def shapes(draw):
    dims = draw(st.lists(st.sampled_from(DIMS), min_size=1, max_size=3))
    while math.prod(dims) > 40_000:
        dims.pop()
    return tuple(dims)


class Builder:
    """Accumulates nodes and keeps the pool of tensors later nodes may read, with their types."""

    def __init__(self):
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.types: dict[str, tuple[int, tuple[int, ...]]] = {}
        self.pool: list[str] = []  # readable tensors, in creation order
        self.outputs: list[str] = []
        self.count = 0

    def fresh(self, prefix="t") -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def add_input(self, name, dtype, shape):
        self.inputs.append(helper.make_tensor_value_info(name, dtype, shape))
        self.types[name] = (dtype, shape)
        self.pool.append(name)

    def int64_constant(self, values) -> str:
        name = self.fresh("c")
        self.initializers.append(numpy_helper.from_array(np.array(values, dtype=np.int64), name))
        return name

    def add(self, op, inputs, out_types, name, domain="", **attrs) -> list[str]:
        outs = [self.fresh() for _ in out_types]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, domain=domain, **attrs))
        for o, t in zip(outs, out_types):
            self.types[o] = t
            self.pool.append(o)
        return outs

    def model(self) -> onnx.ModelProto:
        outputs = [helper.make_tensor_value_info(o, *self.types[o]) for o in dict.fromkeys(self.outputs)]
        graph = helper.make_graph(self.nodes, "random", self.inputs, outputs, self.initializers)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
        m.ir_version = 10
        return m


OPS = ("Relu", "Add", "Mul", "Split", "Reshape", "Unsqueeze", "Identity", "ReduceSum", "Constant", "update",
       "accumulate")


@st.composite
def training_graphs(draw, max_nodes: int = 20) -> onnx.ModelProto:
    b = Builder()
    for k, shape in enumerate(draw(st.lists(shapes(), min_size=1, max_size=3))):
        b.add_input(f"x{k}", draw(st.sampled_from(DTYPES)), shape)
    states: list[str] = []  # inputs with a pending in-place writer (not yet overwritten)
    for k in range(draw(st.integers(0, 2))):
        dtype, shape = b.types[draw(st.sampled_from(b.pool))]
        b.add_input(f"s{k}", dtype, shape)
        states.append(f"s{k}")
    buffers: list[str] = []
    base: dict[str, str] = {}  # view -> the tensor whose storage it shares
    for k in range(draw(st.integers(0, 2))):
        dtype, shape = b.types[draw(st.sampled_from(b.pool))]
        b.add_input(f"b{k}.accumulation.buffer", dtype, shape)
        buffers.append(f"b{k}.accumulation.buffer")

    for i in range(draw(st.integers(1, max_nodes))):
        op = draw(st.sampled_from(OPS))
        name = draw(st.sampled_from([f"n{i}"] * 8 + ["", "dup"]))  # unnamed and duplicate names too
        x = draw(st.sampled_from(b.pool))
        dtype, shape = b.types[x]
        same = [t for t in b.pool if b.types[t] == (dtype, shape)]
        if op == "Split" and not shape:  # a scalar has no axis to split
            op = "Relu"
        if op == "Relu":
            b.add("Relu", [x], [(dtype, shape)], name)
        elif op in ("Add", "Mul"):
            b.add(op, [x, draw(st.sampled_from(same))], [(dtype, shape)], name)
        elif op == "Split":
            first = draw(st.integers(0, shape[0]))
            sizes = [first, shape[0] - first]
            b.add("Split", [x, b.int64_constant(sizes)], [(dtype, (s,) + shape[1:]) for s in sizes], name, axis=0)
        elif op == "Reshape":
            (view,) = b.add("Reshape", [x, b.int64_constant([math.prod(shape)])], [(dtype, (math.prod(shape),))],
                            name, allowzero=1)
            base[view] = base.get(x, x)
        elif op == "Unsqueeze":
            (view,) = b.add("Unsqueeze", [x, b.int64_constant([0])], [(dtype, (1,) + shape)], name)
            base[view] = base.get(x, x)
        elif op == "Identity":
            (view,) = b.add("Identity", [x], [(dtype, shape)], name)
            base[view] = base.get(x, x)
        elif op == "ReduceSum":
            b.add("ReduceSum", [x], [(dtype, ())], name, keepdims=0)
        elif op == "Constant":
            value = numpy_helper.from_array(np.zeros(shape, dtype=helper.tensor_dtype_to_np_dtype(dtype)))
            b.add("Constant", [], [(dtype, shape)], name, value=value)
        elif op == "update" and states:
            # state <- state + x (same type), optionally through a view; readers of the old value
            # were all created earlier, so the in-place rule can always be honoured
            state = states.pop(draw(st.integers(0, len(states) - 1)))
            b.pool = [t for t in b.pool if base.get(t, t) != state]  # the old value, under any name
            operand = draw(st.sampled_from([t for t in b.pool if b.types[t] == b.types[state]] or [state]))
            (new,) = b.add(draw(st.sampled_from(["Add", "Mul"])), [state, operand], [b.types[state]], name)
            if draw(st.booleans()):
                (new,) = b.add("Identity", [new], [b.types[state]], f"{name}_view" if name else "")
            b.nodes[-1].output[0] = f"{state}.out"
            b.pool[-1] = f"{state}.out"
            b.types[f"{state}.out"] = b.types[state]
            b.outputs.append(f"{state}.out")
        elif op == "accumulate" and buffers:
            buf = buffers.pop(draw(st.integers(0, len(buffers) - 1)))
            b.pool = [t for t in b.pool if base.get(t, t) != buf]
            same_type = [t for t in b.pool if b.types[t] == b.types[buf]]
            if not same_type:
                continue
            operand = draw(st.sampled_from(same_type))
            flag, _ = b.add("InPlaceAccumulatorV2", [buf, operand], [(TensorProto.BOOL, (1,)), b.types[buf]], name,
                            domain="com.microsoft")
            b.pool.remove(flag)  # a bool: the float ops above cannot read it
            if draw(st.booleans()):
                b.outputs.append(flag)
    if not b.nodes:  # roam refuses a graph without nodes
        b.add("Relu", [b.pool[0]], [b.types[b.pool[0]]], "only")
    produced = [o for n in b.nodes for o in n.output]
    b.outputs += draw(st.lists(st.sampled_from(produced), max_size=4))
    if not b.outputs:
        b.outputs.append(b.pool[-1])
    return b.model()


@st.composite
def buffer_sets(draw, max_buffers: int = 40, max_step: int = 30) -> list[tuple[int, int, int]]:
    """Layout inputs: (lower, upper, size) with half-open lifetimes [lower, upper), sizes possibly 0."""
    out = []
    for _ in range(draw(st.integers(0, max_buffers))):
        lower = draw(st.integers(0, max_step - 1))
        upper = draw(st.integers(lower + 1, max_step))
        size = draw(st.one_of(st.just(0), st.integers(1, 64).map(lambda k: k * 256), st.integers(1, 100_000)))
        out.append((lower, upper, size))
    return out
