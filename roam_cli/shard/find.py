"""What of a full step a rank holds whole and what in shards: parameters, their optimizer state and
gradients, the replicated inputs, and the data inputs whose rows the ranks split.

A state is a graph input its step replaces in place (metadata `roam.inplace`, or a `<state>.out`
output). Its update is the chain of element-wise update nodes (the memory model's `update` class)
that makes its new value; walking back from the new value along that chain ends at what the update
reads: states, scalars (the learning rate, the step count) and the gradients, values of the
state's shape made after the forward. A state whose update reads a gradient is a parameter when a
node of the forward or backward reads it, and else optimizer state (a moment) of the parameter of
its shape with the same gradient; every other state (the step count, running statistics) is
replicated, and so is a scalar input the forward reads; the other inputs the forward reads are the
data inputs. An update that reads anything else, or a gradient read by an update node that is not
element-wise (a clipping norm, an overflow check: they need the whole gradient), cannot run on a
shard, and the step is refused with the node that needs more."""

from dataclasses import dataclass, field

import numpy as np

from roam_cli.core import memory
from roam_cli.core.errors import RoamError
from roam_cli.core.graph import Graph
from roam_cli.recompute.ops import ELEMENTWISE


@dataclass
class Parameter:
    name: str
    shape: tuple[int, ...]
    gradients: list[str]  # the values of its shape its update reads from the backward (one, but for
    # a step that sums a tie's gradients in the update)
    state: list[str] = field(default_factory=list)  # its optimizer state (moments), sharded with it

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass
class Survey:
    parameters: list[Parameter]
    update_nodes: set[int]  # the element-wise update nodes that run on shards (and the scalars they read)
    shard_of: dict[str, str]  # every value a rank holds a shard of (state, new values, update
    # temporaries) -> its parameter; gradients map to theirs too, as their reduce-scatter's output
    replicated: list[str]  # graph inputs every rank holds whole
    data_inputs: list[str]  # graph inputs whose first dimension the ranks split


def survey(graph: Graph) -> Survey:
    mm = memory.build(graph)
    pairs = memory.declared_pairs(graph, {})  # new value -> state
    classes = mm.node_class
    states = set(graph.inputs) | set(graph.initializers)
    numel = {name: int(np.prod(v.shape, dtype=np.int64)) for name, v in graph.values.items()}

    def update_chain(new: str) -> tuple[set[int], set[str]]:
        """The element-wise update nodes making `new`, and the values they read from outside them."""
        nodes, read, stack, seen = set(), set(), [new], set()
        while stack:
            t = stack.pop()
            if t in seen:
                continue
            seen.add(t)
            i = graph.producer.get(t)
            n = graph.nodes[i] if i is not None else None
            if n is None or classes[i] != "update" or n.domain or n.op_type not in ELEMENTWISE:
                read.add(t)
                continue
            nodes.add(i)
            stack.extend(n.inputs)
        return nodes, read

    chains = {state: update_chain(new) for new, state in pairs.items()}
    def reduced_in_update(t: str) -> bool:
        """A reduction the update makes (fp16's check that every gradient is finite reduces each to
        a scalar): of a scalar state's shape, and no gradient of it (GradScaler's scale)."""
        n = graph.nodes[graph.producer[t]]
        return classes[graph.producer[t]] == "update" and n.op_type.startswith("Reduce")

    gradients = {}
    for state, (_, read) in chains.items():
        gradients[state] = sorted(t for t in read if t not in states and t in graph.producer
                                  and classes[graph.producer[t]] != "forward" and not reduced_in_update(t)
                                  and graph.values[t].shape == graph.values[state].shape)
    outside = {s: [u for u in graph.consumers.get(s, ()) if classes[u] != "update"] for s in pairs.values()}
    # a gradient accumulation buffer is no parameter (a training graph without its optimizer updates none)
    parameters = {s: Parameter(s, graph.values[s].shape, gradients[s]) for s in pairs.values()
                  if gradients[s] and outside[s] and not memory.accumulates(graph, s)}
    if not parameters:
        raise RoamError("the step updates no parameter from a gradient it computes: nothing to shard (roam shard "
                        "reads a full training step, the optimizer inside)")
    for name in parameters:
        if name not in graph.inputs:
            raise RoamError(f"parameter {name!r} is an initializer of the step: roam shard splits the state the "
                            "step takes as graph inputs")
    owner: dict[str, str] = {p: p for p in parameters}
    for s in pairs.values():
        if s in parameters or not gradients[s]:
            continue
        found = [p for p in parameters.values() if p.shape == graph.values[s].shape and set(p.gradients) & set(gradients[s])]
        if len(found) != 1:
            raise RoamError(f"state {s!r} is updated from gradient {gradients[s][0]!r}, which "
                            f"{'no parameter of its shape' if not found else 'more than one parameter'} is updated "
                            "from: roam shard cannot tell whose optimizer state it is")
        found[0].state.append(s)
        owner[s] = found[0].name

    update_nodes = set().union(*(chains[s][0] for s in owner))
    for s, p in owner.items():
        for t in chains[s][1]:
            if t not in owner and t not in parameters[p].gradients and numel[t] > 1:
                raise RoamError(f"the update of {s!r} reads {t!r} {list(graph.values[t].shape)}, neither a scalar nor "
                                f"its own state or gradient: roam shard cannot split it")
    shard_of = dict(owner) | {g: p.name for p in parameters.values() for g in p.gradients}
    for i in sorted(update_nodes):  # node order is topological
        n = graph.nodes[i]
        whose = {shard_of[x] for x in n.inputs if x in shard_of}
        if not whose:
            continue
        if len(whose) > 1:
            raise RoamError(f"update node {n.name!r} reads the values of parameters {', '.join(sorted(whose))} "
                            "together: their shards do not line up")
        whole = next((x for x in n.inputs if x not in shard_of and numel[x] > 1), None)
        if whole is not None:
            raise RoamError(f"update node {n.name!r} reads {whole!r} {list(graph.values[whole].shape)} beside a "
                            "shard: roam shard cannot split it")
        shard_of.update(dict.fromkeys(n.outputs, whose.pop()))
    check_readers(graph, classes, parameters, pairs, update_nodes, shard_of)

    sharded = set(owner)
    # a scalar the forward reads has no rows to split: a constant the exporter lifted into an input
    # (GPT-2's attention mask value), the same on every rank
    data = [x for x in graph.inputs if x not in sharded and x not in pairs.values() and graph.values[x].shape
            and any(classes[u] == "forward" for u in graph.consumers.get(x, ()))]
    replicated = [x for x in graph.inputs if x not in sharded and x not in data]
    return Survey(list(parameters.values()), update_nodes, shard_of, replicated, data)


def check_readers(graph: Graph, classes: list[str], parameters: dict[str, Parameter], pairs: dict[str, str],
                  update_nodes: set[int], shard_of: dict[str, str]) -> None:
    """Every value a rank holds a shard of is read by the update on shards alone: a parameter by the
    forward and backward too (they read its gathered copy), a gradient by the backward (which keeps
    the whole one); a new value leaves the step only as its state's in-place update."""
    gradients = {g for p in parameters.values() for g in p.gradients}
    outputs = set(graph.outputs)
    for t in shard_of:
        for u in graph.consumers.get(t, ()):
            if u in update_nodes or (t in parameters or t in gradients) and classes[u] != "update":
                continue
            n = graph.nodes[u]
            what = "gradient" if t in gradients else "parameter" if t in parameters else "value"
            raise RoamError(f"{what} {t!r} is read by update node {n.name!r} ({n.op_type}), which needs all of it: "
                            "roam shard writes element-wise updates on shards only (no gradient clipping, "
                            "overflow check or norm across a parameter yet)")
        if t in outputs and t not in pairs and t not in gradients:
            raise RoamError(f"{t!r}, a value of parameter {shard_of[t]!r}'s update, is a graph output that replaces "
                            "no state: a rank holds only its shard of it")
