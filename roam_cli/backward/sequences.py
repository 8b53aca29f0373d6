"""Sequence ops lowered to the tensor ops they stand for, where every size is static.

torch.onnx's dynamo exporter with optimize=False writes torch.split and torch.chunk as a
SplitToSequence read by SequenceAt at constant positions (GPT-2's and GPT-NeoX's query, key and
value). A sequence has no tensor type: shape inference, the backward and the planner see
tensors only, and refused the whole export. With its sizes known, a sequence is the tensors it
holds, one rule per op:
- SplitToSequence: one Split (sizes from its `split` input, a 1-D constant or a constant chunk
  size, the last chunk smaller; without it, one element per index, Squeezed when keepdims=0);
- SequenceConstruct, SequenceEmpty, SequenceInsert at a constant position: the tensors listed;
- SequenceAt at a constant position (negative too): that element;
- ConcatFromSequence: Concat (each element Unsqueezed first for new_axis=1);
- SequenceLength: a constant.
Sequence ops left unread go, and the constants only they read. What cannot be lowered (a position
computed at run time, a sequence a Loop reads) stays, and shape inference refuses it in one line
as before. Opset 13 and later: where Split, Squeeze and Unsqueeze take their sizes and axes as
inputs."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from roam_cli.lower.emit import Emit, Lowering


class Sequences(Lowering):
    """The model's types and constants (Lowering's), and what each known sequence holds."""

    def __init__(self, model: onnx.ModelProto):
        super().__init__(model)
        self.held: dict[str, list[str]] = {}

    def position(self, seq: str, name: str | None, default: int) -> int | None:
        """A constant position in `seq` (ONNX's negative form counted from the end), None if not."""
        value = self.constant_value(name) if name else np.array(default)
        return None if value is None else int(value) + (len(self.held[seq]) if int(value) < 0 else 0)


def split_to_sequence(s: Sequences, e: Emit) -> bool:
    x, split, axis = e.input(0), e.input(1), e.attr("axis", 0)
    sizes = s.constant_value(split) if split else np.array(1)  # without `split`: one element per index
    if sizes is not None and sizes.ndim == 0:  # a chunk size: the last chunk takes what is left
        shape = s.shape(x) or []
        length = shape[axis] if -len(shape) <= axis < len(shape) else None
        if not isinstance(length, int):
            return False
        whole, rest = divmod(length, int(sizes))
        sizes = np.array([int(sizes)] * whole + [rest] * (rest > 0), np.int64)
    if sizes is None:
        return False
    parts = e.op("Split", x, e.const(sizes, dtype=TensorProto.INT64), axis=axis,
                 out=[e.fresh(f"{e.output(0)}.{k}") for k in range(len(sizes))])
    if not split and not e.attr("keepdims", 1):
        parts = [e.op("Squeeze", p, e.axes(axis)) for p in parts]
    s.held[e.output(0)] = parts
    e.nodes.insert(0, e.node)  # kept while an op not lowered reads the sequence
    return True


def construct(s: Sequences, e: Emit) -> bool:
    s.held[e.output(0)] = list(e.node.input)
    e.nodes.append(e.node)
    return True


def empty(s: Sequences, e: Emit) -> bool:
    s.held[e.output(0)] = []
    e.nodes.append(e.node)
    return True


def insert(s: Sequences, e: Emit) -> bool:
    seq = e.input(0)
    k = s.position(seq, e.input(2), len(s.held[seq]))
    if k is None or not 0 <= k <= len(s.held[seq]):
        return False
    s.held[e.output(0)] = s.held[seq][:k] + [e.input(1)] + s.held[seq][k:]
    e.nodes.append(e.node)
    return True


def at(s: Sequences, e: Emit) -> bool:
    seq = e.input(0)
    k = s.position(seq, e.input(1), 0)
    if k is None or not 0 <= k < len(s.held[seq]):
        return False
    e.op("Identity", s.held[seq][k], out=e.output(0))  # the element's producer writes it (`collapse`)
    return True


def concat(s: Sequences, e: Emit) -> bool:
    parts, axis = s.held[e.input(0)], e.attr("axis")
    if not parts:
        return False
    if e.attr("new_axis", 0):
        parts = [e.op("Unsqueeze", p, e.axes(axis)) for p in parts]
    e.op("Concat", *parts, axis=axis, out=e.output(0))
    return True


def length(s: Sequences, e: Emit) -> bool:
    e.op("Constant", out=e.output(0), value=numpy_helper.from_array(np.array(len(s.held[e.input(0)]), np.int64)))
    return True


READ_A_SEQUENCE = {"SequenceInsert", "SequenceAt", "ConcatFromSequence", "SequenceLength"}
# op -> rule: the rule writes the node's replacement into its Emit, or answers False (left as it is)
RULES = {"SplitToSequence": split_to_sequence, "SequenceConstruct": construct, "SequenceEmpty": empty,
         "SequenceInsert": insert, "SequenceAt": at, "ConcatFromSequence": concat, "SequenceLength": length}


def lower_sequences(model: onnx.ModelProto) -> int:
    """Lower the sequence ops of `model` in place; how many were lowered."""
    g = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 13 or not any(n.op_type in RULES and n.domain in ("", "ai.onnx") for n in g.node):
        return 0
    s = Sequences(model)
    nodes, made, lowered = [], set(), 0
    for n in g.node:
        rule = RULES.get(n.op_type) if n.domain in ("", "ai.onnx") else None
        e = Emit(n, s)
        if rule is None or (n.op_type in READ_A_SEQUENCE and n.input[0] not in s.held) or not rule(s, e):
            nodes.append(n)
            continue
        lowered += 1
        nodes.extend(e.nodes)
        made.update(id(m) for m in e.nodes if m is not n)
    nodes = unread_dropped(g, nodes, {id(n) for n in nodes if n.op_type in RULES or n.op_type == "Constant"} | made)
    nodes = collapse(g, nodes, made)
    produced = {o for n in nodes for o in n.output} | {i.name for i in g.input} | {t.name for t in g.initializer}
    info = [vi for vi in g.value_info if vi.name in produced]  # a sequence's type goes with it
    del g.node[:]
    g.node.extend(nodes)
    del g.value_info[:]
    g.value_info.extend(info)
    g.initializer.extend(s.constants.values())
    return lowered


def unread_dropped(g: onnx.GraphProto, nodes: list, droppable: set[int]) -> list:
    """`nodes` without the droppable ones whose outputs nothing reads: the sequences lowered, and the
    constant positions and sizes only they read."""
    readers = Counter(x for n in nodes for x in n.input)
    readers.update(o.name for o in g.output)
    kept = []
    for n in reversed(nodes):
        if id(n) in droppable and not any(readers[o] for o in n.output):
            readers.subtract(n.input)
        else:
            kept.append(n)
    return kept[::-1]


def collapse(g: onnx.GraphProto, nodes: list, made: set[int]) -> list:
    """A SequenceAt's Identity of an element made here and read by it alone: the element's producer
    (Split, Squeeze) writes the SequenceAt's output itself."""
    readers = Counter(x for n in nodes for x in n.input)
    readers.update(o.name for o in g.output)
    producer = {o: n for n in nodes if id(n) in made for o in n.output}
    renamed = set()
    for n in nodes:
        source = producer.get(n.input[0]) if id(n) in made and n.op_type == "Identity" else None
        if source is not None and readers[n.input[0]] == 1 and source.op_type != "Identity":
            source.output[list(source.output).index(n.input[0])] = n.output[0]
            renamed.add(id(n))
    return [n for n in nodes if id(n) not in renamed]
