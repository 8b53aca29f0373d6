"""Where a graph's function is not smooth: the ops that take a side per element (Relu's zero, Clip's
bounds, the larger of Max's inputs, a comparison, a rounding, an arg-max), and which side each took.

`with_sides` adds to a model one output per such test: the side each element took (a boolean, or the
op's own integer or rounded output). Two runs whose sides differ lie across an edge: a central
difference taken across one measures a jump, not a derivative, and a float32 run on the other side
of one than its float64 self follows the other branch's gradient there (both right, each on its side)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# op -> its side tests: (the input tested, its edge: an input's index or a constant)
EDGES = {
    "Relu": [(0, 0.0)], "LeakyRelu": [(0, 0.0)], "PRelu": [(0, 0.0)], "Abs": [(0, 0.0)], "Sign": [(0, 0.0)],
    "Elu": [(0, 0.0)], "Celu": [(0, 0.0)], "Selu": [(0, 0.0)],
    "Clip": [(0, 1), (0, 2)], "Max": [(0, 1)], "Min": [(0, 1)],
}
# ops whose output already is the side taken: output index read as it is
SIDES_AS_THEY_ARE = {"Greater": 0, "Less": 0, "GreaterOrEqual": 0, "LessOrEqual": 0, "Equal": 0, "Floor": 0,
                     "Ceil": 0, "Round": 0, "ArgMax": 0, "ArgMin": 0, "TopK": 1}


def with_sides(model: onnx.ModelProto, float_type: int, among: set[str] | None = None) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of `model` that also outputs each side test's result, and the node each output is of
    in words ("Relu 'name'"; in output order). `float_type` is the type tested values are cast to first (FLOAT for a graph as
    it runs, in any of its float types; DOUBLE for its float64 self: a cast to float would round).
    `among`: the nodes to test, by their first output (all when None)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    added, nodes = [], []
    for k, n in enumerate(model.graph.node):
        if among is not None and (not n.output or n.output[0] not in among):
            continue
        name = n.name or f"{n.op_type}_{k}"
        said = f"{n.op_type} {name!r}"
        if n.op_type in SIDES_AS_THEY_ARE and len(n.output) > SIDES_AS_THEY_ARE[n.op_type]:
            side = n.output[SIDES_AS_THEY_ARE[n.op_type]]
            g.output.append(helper.make_empty_tensor_value_info(side))
            nodes.append(said)
        for j, (tested, edge) in enumerate(EDGES.get(n.op_type, [])):
            edge_name = edge_of(n, edge, f"{name}.edge{j}", float_type, g)
            if edge_name is None or tested >= len(n.input) or not n.input[tested]:
                continue
            x = f"{name}.side{j}.x"
            e = f"{name}.side{j}.edge"
            added += [helper.make_node("Cast", [n.input[tested]], [x], to=float_type),
                      helper.make_node("Cast", [edge_name], [e], to=float_type),
                      helper.make_node("Greater", [x, e], [f"{name}.side{j}"])]
            g.output.append(helper.make_tensor_value_info(f"{name}.side{j}", TensorProto.BOOL, None))
            nodes.append(said)
    g.node.extend(added)
    return out, nodes


def edge_of(n: onnx.NodeProto, edge, name: str, float_type: int, g: onnx.GraphProto) -> str | None:
    """The tensor holding node `n`'s edge: its input `edge` (an index), or a constant made for it
    (a number, or Clip's bound as an attribute, before opset 11); None where it has none."""
    if isinstance(edge, int):
        if edge < len(n.input) and n.input[edge]:
            return n.input[edge]
        bound = next((a.f for a in n.attribute if a.name == ("min" if edge == 1 else "max")), None)
        if bound is None:
            return None
        edge = bound
    dtype = np.float64 if float_type == TensorProto.DOUBLE else np.float32
    g.initializer.append(numpy_helper.from_array(np.array(edge, dtype), name))
    return name


def crossed(sides: list[np.ndarray], at: list[np.ndarray], nodes: list[str]) -> list[tuple[str, int]]:
    """The nodes whose sides differ between two runs, and at how many elements."""
    return [(node, int(np.count_nonzero(np.asarray(a) != np.asarray(b))))
            for node, a, b in zip(nodes, sides, at, strict=True) if np.shape(a) != np.shape(b) or np.any(np.asarray(a) != np.asarray(b))]
