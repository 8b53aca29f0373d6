"""The one helper every rule writes through: standard nodes whose names derive from the fused
node's name, and constants shared across the model."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from roam_cli.core.errors import RoamError

# ops whose output's element type is not their first input's (and not a tensor's, for sequences)
UNTYPED = {"Loop", "If", "Scan", "ConstantOfShape", "SequenceAt", "SequenceEmpty", "SequenceInsert", "SequenceLength"}
BOOLEAN = {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "Xor", "IsNaN", "IsInf"}


class Lowering:
    """What the rules need to know of the whole model while it is rewritten: tensor types, the
    constants made so far, and the graph outputs and in-place pairs a rule adds."""

    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
        self.types = {vi.name: vi.type.tensor_type for vi in (*g.value_info, *inferred.value_info, *g.input, *g.output)
                      if vi.type.HasField("tensor_type")}
        self.initializers = {t.name: t for t in g.initializer}
        self.graph_outputs = {o.name for o in g.output}
        self.input_types = {vi.name: vi.type for vi in g.input}
        self.producer = {o: n for n in g.node for o in n.output}
        self.taken = {x for n in g.node for x in (*n.input, *n.output, n.name)} | set(self.types) | set(self.initializers)
        self.constants: dict[tuple, onnx.TensorProto] = {}
        self.outputs: list[onnx.ValueInfoProto] = []  # graph outputs to append (updated state)
        self.inplace: dict[str, str] = {}  # new graph output -> the state input it replaces in place
        self.made: dict[str, int] = {}  # element types of the tensors the rules make, as they are made

    def claim(self, name: str) -> str:
        if name in self.taken:
            raise RoamError(f"the model already has a tensor named {name!r}; lowering needs it for an updated state")
        self.taken.add(name)
        return name

    def add_inplace_output(self, new: str, state: str) -> None:
        """`new` replaces graph input `state` in place: a graph output with the state's type."""
        if new not in self.graph_outputs:
            if state in self.input_types:
                self.outputs.append(helper.make_value_info(new, self.input_types[state]))
            else:
                self.outputs.append(helper.make_tensor_value_info(new, self.dtype(state), self.shape(state)))
        self.inplace[new] = state

    def dtype(self, name: str) -> int | None:
        t = self.types.get(name)
        if t is not None and t.elem_type:
            return t.elem_type
        if name in self.initializers:
            return self.initializers[name].data_type
        return self.made.get(name)

    def shape(self, name: str) -> list[int | str] | None:
        """Static dims as ints, symbolic ones as their names (None when the rank is unknown)."""
        if name in self.initializers:
            return list(self.initializers[name].dims)
        t = self.types.get(name)
        if t is None or not t.HasField("shape"):
            return None
        return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.shape.dim]

    def constant_value(self, name: str) -> np.ndarray | None:
        """The value of an initializer or a Constant node's output (weights on disk: None)."""
        if name in self.initializers and not self.initializers[name].external_data:
            return numpy_helper.to_array(self.initializers[name])
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            return numpy_helper.to_array(node.attribute[0].t)
        return None

    def const(self, value, dtype: int) -> str:
        """A constant initializer, one per (dtype, value), named after its value (every digit, and
        brackets for a vector: two values never share a name)."""
        array = np.asarray(value, dtype=helper.tensor_dtype_to_np_dtype(dtype))
        key = (dtype, array.shape, array.tobytes())
        if key not in self.constants:
            text = repr(array.tolist()).replace(" ", "")
            name = f"roam.lower/{onnx.TensorProto.DataType.Name(dtype).lower()}/{text}"
            if array.ndim != 1:  # a scalar 0 and the axes [0] are two constants
                name += "/shape=" + "x".join(map(str, array.shape))
            if name in self.initializers:  # made by an earlier pass over this model: the same value
                return name
            self.constants[key] = numpy_helper.from_array(array, name)
            self.made[name] = dtype
        return self.constants[key].name


class Emit:
    """Nodes replacing one fused node, named `<node name>/<op type>_<k>`."""

    def __init__(self, node: onnx.NodeProto, ctx: Lowering):
        self.node, self.ctx = node, ctx
        self.nodes: list[onnx.NodeProto] = []

    def attr(self, name: str, default=None):
        for a in self.node.attribute:
            if a.name == name:
                return helper.get_attribute_value(a)
        return default

    def input(self, i: int) -> str | None:
        return self.node.input[i] if i < len(self.node.input) and self.node.input[i] else None

    def output(self, i: int) -> str | None:
        return self.node.output[i] if i < len(self.node.output) and self.node.output[i] else None

    def fresh(self, hint: str) -> str:
        k = len(self.nodes)
        name = f"{self.node.name}/{hint}_{k}"
        while name in self.ctx.taken:
            k += 1
            name = f"{self.node.name}/{hint}_{k}"
        self.ctx.taken.add(name)
        return name

    def op(self, op_type: str, *inputs: str | None, out: str | list[str] | None = None, **attrs):
        """One standard node; returns its output name (the list, when `out` is a list)."""
        name = self.fresh(op_type)
        outputs = out if isinstance(out, list) else [out or name]
        self.nodes.append(helper.make_node(op_type, [x or "" for x in inputs], outputs, name=name,
                                           **{k: v for k, v in attrs.items() if v is not None}))
        dtype = self.made_dtype(op_type, inputs, attrs)
        for o in outputs if op_type == "Split" else outputs[:1]:
            if dtype and o not in self.ctx.made:
                self.ctx.made[o] = dtype
        return outputs if isinstance(out, list) else outputs[0]

    def made_dtype(self, op_type: str, inputs, attrs) -> int | None:
        """The element type of a made node's first output, for the constants and casts that follow:
        `to` of a Cast, bool of a comparison, int64 of Shape, else the data input's type."""
        if op_type == "Cast":
            return attrs["to"]
        if op_type in BOOLEAN:
            return onnx.TensorProto.BOOL
        if op_type in ("Shape", "Size"):
            return onnx.TensorProto.INT64
        if op_type in UNTYPED:
            return None
        data = inputs[1] if op_type == "Where" else next((x for x in inputs if x), None)
        return self.ctx.dtype(data) if data else None

    def const(self, value, like: str | None = None, dtype: int | None = None) -> str:
        """A constant with `like`'s element type (or `dtype`)."""
        return self.ctx.const(value, dtype or self.dtype_of(like))

    def zero_from(self, like: str, dtype: int | None = None) -> str:
        """A one-element zero (of `like`'s element type, or `dtype`) computed at run time from
        `like`'s first element: x < x is false for every x, NaN included. What a tensor made from
        constants alone grows to, ONNX Runtime folds into an initializer of that size when the
        session starts, held for the session's life and outside the plan; a tensor that reads this
        zero is made at its step, like any other."""
        first = self.op("Slice", self.op("Reshape", like, self.axes(-1)), self.axes(0), self.axes(1))
        return self.op("Cast", self.op("Less", first, first), to=dtype or self.dtype_of(like))

    def zeros(self, shape: str, like: str) -> str:
        """Zeros of `shape` (a shape tensor) with `like`'s element type, made at run time (`zero_from`:
        an embedding table's or a ResNet input's zeros would otherwise be folded)."""
        return self.op("Expand", self.zero_from(like), shape)

    def scatter_added(self, indices: str, updates: str, axis: int = 0, *, into: str | None = None,
                      shape: str | None = None, out: str | None = None) -> str:
        """`into` (or zeros of `shape`, a shape tensor) with `updates` added at `indices` along
        `axis` (ScatterElements add), in the updates' type. 16-bit values are added in float32, as
        a GPU's kernel accumulates them (ONNX Runtime's CPU provider has no 16-bit scatter-add)."""
        dtype = self.dtype_of(updates)
        low = dtype in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
        if low:
            updates = self.op("Cast", updates, to=onnx.TensorProto.FLOAT)
            into = into and self.op("Cast", into, to=onnx.TensorProto.FLOAT)
        base = into or self.zeros(shape, updates)
        if not low:
            return self.op("ScatterElements", base, indices, updates, out=out, axis=axis, reduction="add")
        summed = self.op("ScatterElements", base, indices, updates, axis=axis, reduction="add")
        return self.op("Cast", summed, out=out, to=dtype)

    def cast_like(self, x: str, like: str, out: str | None = None, **attrs) -> str:
        """x cast to `like`'s element type: a Cast, not CastLike, which runtimes run as a function
        (onnxruntime: unnamed nodes outside the plan's order)."""
        return self.op("Cast", x, out=out, to=self.dtype_of(like), **attrs)

    def dtype_of(self, name: str) -> int:
        dtype = self.ctx.dtype(name)
        if not dtype:
            raise RoamError(f"cannot lower {self.node.op_type} node {self.node.name!r}: the element type of {name!r} "
                            "is unknown (no type information in the model)")
        return dtype

    def axes(self, *axes: int) -> str:
        return self.ctx.const(list(axes), onnx.TensorProto.INT64)

    def rank(self, name: str) -> int:
        shape = self.ctx.shape(name)
        if shape is None:
            raise RoamError(f"cannot lower {self.node.op_type} node {self.node.name!r}: the rank of {name!r} "
                            "is unknown (no shape information in the model)")
        return len(shape)
