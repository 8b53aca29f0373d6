"""Reverse-mode differentiation of an ONNX graph: the forward walked backwards from the loss.

Only the nodes between a trainable input and the loss are differentiated (`on_path`); a node's
rule runs once every reader of its outputs has passed its gradient back, and a tensor read several
times gets the `Sum` of its readers' parts. Integer tensors and an op's non-differentiable
operands (shapes, indices, labels) carry no gradient; an op that stops gradients by nature
(`NONDIFFERENTIABLE`) passes nothing back. Everything else refuses in one line naming the node:
an op without a rule, an integer tensor between a parameter and the loss, a shape that is not
static."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from roam_cli.backward.emit import FLOAT_TYPES, Grad, Tape
from roam_cli.backward.rules import NONDIFFERENTIABLE, RULES
from roam_cli.core.errors import RoamError
from roam_cli.frontend import shapes
from roam_cli.lower import name_nodes


def differentiable_inputs(node: onnx.NodeProto) -> range | tuple[int, ...]:
    entry = RULES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    if entry is None:
        return range(len(node.input))
    return range(len(node.input)) if entry[1] is None else entry[1]


def on_path(g: onnx.GraphProto, wrt: set[str], loss: str, tape: Tape) -> tuple[set[str], list[onnx.NodeProto]]:
    """The float tensors a trainable input reaches through differentiable operands, and the nodes
    between the trainable inputs and the loss, in forward order; refusals for what cannot pass."""
    def stops(n: onnx.NodeProto) -> bool:
        return (n.domain or "ai.onnx") == "ai.onnx" and n.op_type in NONDIFFERENTIABLE

    active = set(wrt)
    for n in g.node:
        if stops(n):
            continue
        if any(n.input[k] in active for k in differentiable_inputs(n) if k < len(n.input)):
            active.update(o for o in n.output if o and tape.dtype(o) in FLOAT_TYPES)
            if not any(tape.dtype(o) in FLOAT_TYPES for o in n.output if o):
                active.update(o for o in n.output if o)  # an integer result of a parameter: refused if needed
    needed = {loss}
    path = []
    for n in reversed(g.node):  # what the loss depends on differentiably: not through shapes or indices
        if stops(n) or not any(o in needed for o in n.output if o):
            continue
        needed.update(n.input[k] for k in differentiable_inputs(n) if k < len(n.input) and n.input[k])
        if any(o in active for o in n.output if o):
            path.append(n)
    for n in path:
        known = (n.domain or "ai.onnx") == "ai.onnx" and n.op_type in RULES
        if not known:
            raise RoamError(f"cannot differentiate {n.op_type} node {n.name!r} (domain {n.domain or 'ai.onnx'!r}): "
                            "no gradient rule for this op")
        if all(tape.dtype(o) is None for o in n.output if o):
            raise RoamError(f"cannot differentiate {n.op_type} node {n.name!r}: the type of its output "
                            f"{n.output[0]!r} is unknown (ONNX shape inference could not determine it)")
        if not any(tape.dtype(o) in FLOAT_TYPES for o in n.output if o):
            raise RoamError(f"cannot differentiate {n.op_type} node {n.name!r}: its output {n.output[0]!r} is of an "
                            "integer type, yet a trainable parameter reaches the loss through it")
    return active, path[::-1]


def static_types(model: onnx.ModelProto) -> dict:
    """name -> (dtype, shape) of every tensor whose shape is known; a symbolic input is refused
    (make-training-graph's --dim binds it first)."""
    try:
        return shapes.infer(model, {}, None)
    except RoamError as e:  # an unbound symbolic dimension: its name, its input and the --dim that binds it
        raise RoamError(f"the backward needs static shapes: {e}") from None


def differentiate(model: onnx.ModelProto, wrt: list[str], loss: str, seed: str | None = None
                  ) -> tuple[list[onnx.NodeProto], Tape, dict]:
    """The backward nodes of `model` (its nodes named, optional outputs added where a rule reads
    them): the gradient of `loss` with respect to every name in `wrt`, as `<name>_grad`, the
    backward starting from `seed` (a graph input of the loss's shape and type; default 1)."""
    g = model.graph
    name_nodes(g)
    tape = Tape(model, static_types(model))
    if tape.dtype(loss) not in FLOAT_TYPES:
        raise RoamError(f"the loss {loss!r} is not a floating-point tensor")
    active, path = on_path(g, set(wrt), loss, tape)
    parts: dict[str, list[str]] = {loss: [seed or tape.const(np.ones(tape.shape(loss)), tape.dtype(loss))]}
    nodes: list[onnx.NodeProto] = []

    def total(x: str, out: str | None = None) -> str:
        got = parts[x]
        if len(got) > 1 or out:
            name = tape.register(tape.claim(out) if out else unique(tape, f"{x}_grad"), x)
            nodes.append(helper.make_node("Sum" if len(got) > 1 else "Identity", got, [name], name=name))
            parts[x] = [name]
        return parts[x][0]

    for n in reversed(path):
        dys = [total(o) if o in parts else None for o in n.output]
        if not any(dys):
            continue
        needs = [k in differentiable_inputs(n) and x in active for k, x in enumerate(n.input)]
        if not any(needs):
            continue
        grad = Grad(n, tape, dys, needs)
        RULES[n.op_type][0](grad)
        nodes.extend(grad.nodes)
        for k, part in grad.given:
            parts.setdefault(n.input[k], []).append(tape.register(part, n.input[k]) if part not in tape.static else part)
    grads = {}
    for p in wrt:
        if p in parts:
            grads[p] = total(p, out=f"{p}_grad")
    return read_by_a_gradient(rename_single_parts(nodes), set(grads.values())), tape, grads


def read_by_a_gradient(nodes: list[onnx.NodeProto], grads: set[str]) -> list[onnx.NodeProto]:
    """The nodes some gradient depends on. A rule may make a part that no trainable input takes
    (Add's unbroadcast of the operand that needs none; a part reaching a tensor no rule passes on):
    left in the graph it would be computed, held to the step's end by ONNX Runtime, and planned."""
    wanted, kept = set(grads), []
    for n in reversed(nodes):
        if any(o in wanted for o in n.output):
            kept.append(n)
            wanted.update(n.input)
    return kept[::-1]


def rename_single_parts(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """An `Identity` that only names a gradient made by a backward node: that node writes the name."""
    made = {o: n for n in nodes for o in n.output}
    renames = {}
    for n in nodes:
        if n.op_type == "Identity" and n.input[0] in made and made[n.input[0]].op_type != "Identity":
            renames[n.input[0]] = n.output[0]
    kept = [n for n in nodes if not (n.op_type == "Identity" and n.input[0] in renames)]
    for n in kept:
        n.input[:] = [renames.get(x, x) for x in n.input]
        n.output[:] = [renames.get(x, x) for x in n.output]
    return kept


def unique(tape: Tape, name: str) -> str:
    k, candidate = 0, name
    while candidate in tape.taken:
        k += 1
        candidate = f"{name}_{k}"
    tape.taken.add(candidate)
    return candidate
