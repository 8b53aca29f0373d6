"""The recompute problem as plain values, and what a choice of saved values implies.

The forward pass (the loss's ancestors) computes values; the nodes after it (backward, gradient
accumulation, optimizer) read some of them (`needed`). A needed value is either kept live from
the forward into the backward (saved), or recomputed there by a copy of its producer, whose own
inputs are in turn saved, recomputed, or persistent (`free`: parameters and data inputs are live
anyway). A Dropout's output has one more way back: its replay (rewrite.py: ONNX Runtime's DropoutGrad,
or in a standard graph its standard form)
applied to the Dropout's input with the saved mask (the very kernel the backward uses, which
computes input x mask x scale as the forward did); the random op itself is never copied.
Solvers choose the saved set; `recomputed()` derives the copies and replays it implies.

What a copy costs the solvers (`price`) is its FLOPs, but for a rank step's all-gather, which
counts none: gathering a parameter again takes its ring's time on the interconnect, priced as the
FLOPs the device could run meanwhile (`GatherPrice`). So a budget with memory to spare keeps a
gathered parameter rather than pay for it twice, and gives up first the ones that free the most
bytes per second of communication."""

from dataclasses import dataclass

from roam_cli.core.graph import Graph
from roam_cli.core.memory import MemoryModel
from roam_cli.recompute import flops as flops_mod, ops


@dataclass(frozen=True)
class GatherPrice:
    """A parameter gathered again, in FLOPs: per_byte x its gathered bytes + each (a ring's
    (N - 1)/N of the bytes over the link's bandwidth plus N - 1 hops of latency, at the device's
    product rate)."""
    per_byte: float
    each: int

    def of(self, nbytes: int) -> int:
        return round(self.per_byte * nbytes) + self.each


@dataclass(frozen=True)
class Problem:
    nodes: tuple[int, ...]  # the forward nodes' graph indices, in graph order
    inputs: tuple[tuple[str, ...], ...]  # per forward node
    outputs: tuple[tuple[str, ...], ...]
    copyable: tuple[bool, ...]  # may be recomputed in this mode
    flops: tuple[int, ...]  # the FLOPs of recomputing it once
    price: tuple[int, ...]  # what recomputing it once costs the solvers: its FLOPs, a gather's communication
    cost: dict[str, int | None]  # forward value -> bytes kept live if saved (0: live anyway; None: a view, never saved itself)
    base: dict[str, str]  # forward value -> the value owning its storage (itself, a view's base, or what it is written over)
    free: frozenset[str]  # available after the forward at no cost (persistent storage)
    needed: frozenset[str]  # forward values read after the forward
    replays: dict[str, tuple[tuple[str, ...], int]]  # Dropout output -> (its replay's inputs, FLOPs)

    def producer(self) -> dict[str, int]:
        """forward value -> position of its node in `nodes`"""
        return {v: k for k, outs in enumerate(self.outputs) for v in outs}


def build(graph: Graph, mm: MemoryModel, mode: str, gather: GatherPrice | None = None) -> Problem:
    """The problem of `graph`; `gather` prices its all-gathers (None: a step without them)."""
    forward = [i for i, c in enumerate(mm.node_class) if c == "forward"]
    in_forward = set(forward)
    free = frozenset(name for name in graph.values if mm.storage_of[name] in mm.persistent)
    to_end = {s.root for s in mm.storages if s.to_end}
    cost: dict[str, int | None] = {}
    base: dict[str, str] = {}
    needed = set()
    for i in forward:
        for v in graph.nodes[i].outputs:
            if v in free:
                continue
            root = base[v] = mm.storage_of[v]
            # a view is its base's bytes; a kernel's output written over its input is a value of its
            # own, in the input's storage
            cost[v] = None if mm.alias.get(v) == "view" else 0 if root in to_end else mm.tensor_bytes[v]
            if any(u not in in_forward for u in graph.consumers.get(v, ())):
                needed.add(v)
    replays = {}
    for i in forward:
        n = graph.nodes[i]
        inputs = ops.replay_inputs(n)
        if inputs is not None and n.outputs[0] in cost:
            replays[n.outputs[0]] = (inputs, flops_mod.elements(graph.values[n.outputs[0]].shape))
    held = gathered_parameters(graph, mm, forward)
    flops = tuple(flops_mod.node_flops(graph, graph.nodes[i]) for i in forward)
    price = tuple(gather.of(mm.tensor_bytes[graph.nodes[i].outputs[0]])
                  if gather and ops.op_class(graph.nodes[i]) == ops.COLLECTIVE else f for i, f in zip(forward, flops))
    return Problem(tuple(forward), tuple(graph.nodes[i].inputs for i in forward),
                   tuple(graph.nodes[i].outputs for i in forward),
                   tuple(ops.copyable(graph.nodes[i], mode) and not shrinks_a_gather(graph, mm, i, held) for i in forward),
                   flops, price, cost, base, free, frozenset(needed), replays)


def gathered_parameters(graph: Graph, mm: MemoryModel, forward: list[int]) -> dict[str, int]:
    """A rank step's forward values that hold a gathered parameter -> its gathered bytes: each
    all-gather's output, and what shape ops make of it at half its bytes or more (unpadded, reshaped,
    transposed, cast to 16 bits)."""
    held: dict[str, int] = {}
    for i in forward:
        n = graph.nodes[i]
        if ops.op_class(n) == ops.COLLECTIVE:
            held[n.outputs[0]] = mm.tensor_bytes[n.outputs[0]]
        elif (ops.op_class(n) == "shape" or n.op_type == "Cast") and n.inputs and n.inputs[0] in held:
            if 2 * mm.tensor_bytes[n.outputs[0]] >= held[n.inputs[0]]:
                held[n.outputs[0]] = held[n.inputs[0]]
    return held


def shrinks_a_gather(graph: Graph, mm: MemoryModel, i: int, held: dict[str, int]) -> bool:
    """Whether node i reads a gathered parameter to make less than half of its bytes (an embedding
    lookup reads a whole table to make a batch's rows): a copy of it would gather the parameter
    again to save less than the gather brings in and moves, so no recompute copies it."""
    n = graph.nodes[i]
    return ops.op_class(n) != ops.COLLECTIVE and any(
        x in held and 2 * sum(mm.tensor_bytes[o] for o in n.outputs) < held[x] for x in n.inputs)


def recomputed(problem: Problem, saved: set[str]) -> tuple[list[int], list[str]]:
    """What makes every needed value not in `saved` after the forward: positions (in
    problem.nodes) of the nodes to copy, ascending, and the Dropout outputs to replay, sorted.
    Raises ValueError when that needs a node that may not be copied (a solver's bug, never a
    user's error)."""
    producer = problem.producer()
    copied: set[int] = set()
    replayed: set[str] = set()
    stack = [v for v in problem.needed if v not in saved]
    seen = set(stack)
    while stack:
        v = stack.pop()
        if v in problem.replays:
            replayed.add(v)
            inputs = problem.replays[v][0]
        else:
            k = producer[v]
            if not problem.copyable[k]:
                raise ValueError(f"value {v!r} is neither saved nor recomputable")
            copied.add(k)
            inputs = problem.inputs[k]
        for x in inputs:
            if x in producer and x not in saved and x not in problem.free and x not in seen:
                seen.add(x)
                stack.append(x)
    return sorted(copied), sorted(replayed)


def kept_storages(problem: Problem, saved: set[str]) -> set[str]:
    """The storages that saving `saved` keeps live across the boundary (a view keeps its base)."""
    return {problem.base[v] for v in saved if v in problem.base and problem.cost.get(problem.base[v])}
