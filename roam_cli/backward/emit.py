"""What a gradient rule writes through: `Tape`, the model-wide facts (static types of forward
tensors and of their gradients, constants), and `Grad`, one forward node's backward: its output
gradients in, its input gradients out. Both extend the `lower` package's helpers, so a rule can
hand a fused gradient node to a `lower` rule and get the same standard-ONNX subgraph."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import helper, numpy_helper

from roam_cli.core.errors import RoamError
from roam_cli.frontend.training_graph import FLOAT_TYPES  # noqa: F401 (the types a gradient flows through)
from roam_cli.lower.emit import Emit, Lowering


class Tape(Lowering):
    """Lowering's view of the model, with roam's static shapes (frontend.shapes) taking precedence
    and every tensor the backward makes registered with its type as it is made."""

    def __init__(self, model: onnx.ModelProto, static: dict[str, tuple[int, tuple[int, ...]]]):
        super().__init__(model)
        self.static = dict(static)
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        self.readers = Counter(x for n in model.graph.node for x in n.input)
        self.readers.update(o.name for o in model.graph.output)
        # the forward's small constants, reused by value: each initializer costs an aligned block
        self.existing = {}
        for t in model.graph.initializer:
            if not t.external_data and int(np.prod(t.dims)) <= 64:
                array = numpy_helper.to_array(t)
                self.existing.setdefault((t.data_type, array.shape, array.tobytes()), t.name)

    @staticmethod
    def attr_of(node: onnx.NodeProto, name: str):
        return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), None)

    def register(self, name: str, like: str) -> str:
        """`name` has the type of `like` (a gradient has its tensor's type)."""
        self.static[name] = (self.dtype(like), tuple(self.shape(like)))
        return name

    def dtype(self, name: str) -> int | None:
        return self.static[name][0] if name in self.static else super().dtype(name)

    def shape(self, name: str) -> list[int | str] | None:
        return list(self.static[name][1]) if name in self.static else super().shape(name)

    def const(self, value, dtype: int) -> str:
        array = np.asarray(value, dtype=helper.tensor_dtype_to_np_dtype(dtype))
        name = self.existing.get((dtype, array.shape, array.tobytes())) or super().const(value, dtype)
        self.static[name] = (dtype, np.shape(value))
        return name


class Grad(Emit):
    """The backward of one forward node. `dy(k)`: the gradient of output k (None: none flows);
    `needs(k)`: whether input k wants one; `give(k, g)`: g is (a part of) input k's gradient."""

    def __init__(self, node: onnx.NodeProto, tape: Tape, dys: list[str | None], needs: list[bool]):
        super().__init__(node, tape)
        self.dys, self.wanted = dys, needs
        self.given: list[tuple[int, str]] = []

    def fresh(self, hint: str) -> str:
        k = len(self.nodes)
        while (name := f"{self.node.name}/grad/{hint}_{k}") in self.ctx.taken:
            k += 1
        self.ctx.taken.add(name)
        return name

    def dy(self, k: int = 0) -> str | None:
        return self.dys[k] if k < len(self.dys) else None

    def needs(self, k: int) -> bool:
        return k < len(self.wanted) and self.wanted[k]

    def give(self, k: int, g: str) -> None:
        if self.needs(k):
            self.given.append((k, g))

    def shape(self, name: str) -> list[int]:
        """A static shape; a refusal naming the node when the forward's shape is not static."""
        shape = self.ctx.shape(name)
        if shape is None or not all(isinstance(d, int) for d in shape):
            raise RoamError(f"cannot differentiate {self.node.op_type} node {self.node.name!r}: the shape of "
                            f"{name!r} is not static ({shape or 'unknown'}); export with fixed input shapes")
        return shape

    def refuse(self, why: str):
        raise RoamError(f"cannot differentiate {self.node.op_type} node {self.node.name!r}: {why}")

    def unbroadcast(self, g: str, k: int, out_shape: list[int] | None = None) -> str:
        """g, of the broadcast result's shape, summed back to input k's shape: every elementwise
        rule's last step."""
        return self.sum_to(g, out_shape or self.shape(self.output(0)), self.shape(self.input(k)))

    def sum_to(self, g: str, source: list[int], target: list[int]) -> str:
        """g of shape `source` summed over the axes broadcasting added to `target`: the leading
        axes `target` lacks, and its size-1 axes that `source` widened."""
        if list(source) == list(target):
            return g
        lead = len(source) - len(target)
        axes = [*range(lead), *(lead + i for i, d in enumerate(target) if d == 1 and source[lead + i] != 1)]
        if axes:
            g = self.op("ReduceSum", g, self.axes(*axes), keepdims=1)
        return self.op("Reshape", g, self.axes(*target)) if lead else g

    def reshaped(self, g: str, k: int, shape: list[int] | None = None) -> str:
        """g (of `shape`, when known) laid out with input k's shape: a view."""
        target = self.shape(self.input(k))
        return g if shape is not None and list(shape) == target else self.op("Reshape", g, self.axes(*target))

    def zeros_like(self, like: str) -> str:
        """Zeros of `like`'s shape and type, made at run time from the output gradient (`zeros`)."""
        return self.zeros(self.axes(*self.shape(like)), next(filter(None, self.dys), like))

    def forward_output(self, k: int, suffix: str, dtype: int, shape: list[int]) -> str:
        """The forward node's optional output k, added (`<output 0>.<suffix>`) when the export left it
        out: the statistics and masks a gradient reads are saved, not recomputed."""
        outs = self.node.output
        if k < len(outs) and outs[k]:
            return outs[k]
        while len(outs) <= k:
            outs.append("")
        outs[k] = self.ctx.claim(f"{outs[0]}.{suffix}")
        self.ctx.static[outs[k]] = (dtype, tuple(shape))
        return outs[k]

    def fused(self, rule, op_type: str, inputs: list[str | None], outputs: list[int | None], **attrs) -> None:
        """Write the gradient through a `lower` rule: a fused gradient node `op_type` over `inputs`
        (with this node's attributes, `attrs` added), whose output j is the gradient of forward input
        outputs[j]; only the gradients needed are made."""
        names = []
        for k in outputs:
            names.append(self.ctx.register(self.fresh(f"d{k}"), self.input(k)) if k is not None and self.needs(k) else "")
        kept = {a.name: helper.get_attribute_value(a) for a in self.node.attribute}
        node = helper.make_node(op_type, [x or "" for x in inputs], names, name=f"{self.node.name}/grad",
                                **{**kept, **attrs})
        emit = Emit(node, self.ctx)
        emit.fresh = self.fresh
        rule(emit)
        self.nodes.extend(emit.nodes)
        for k, name in zip(outputs, names):
            if name:
                self.give(k, name)
