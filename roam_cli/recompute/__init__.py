"""Recomputation: keep fewer bytes live from the forward into the backward by computing some
values again where the backward needs them (`roam optimize --recompute free|budget`).

problem.build (graph + memory model -> Problem) -> a solver picks the values to keep (mincut
for `free`, ilp for `budget`) -> problem.recomputed (the nodes to copy, the Dropout outputs to
replay) -> rewrite (the graph and model with them), which roam then orders and lays out like any
other graph."""

from collections import Counter
from dataclasses import dataclass

from roam_cli.core.collectives import sharding
from roam_cli.core.errors import RoamError
from roam_cli.core.graph import Graph
from roam_cli.core.memory import MemoryModel
from roam_cli.cost import profile as profile_mod
from roam_cli.frontend.onnx_import import Imported
from roam_cli.recompute import ilp, mincut, ops, problem as problem_mod, rewrite as rewrite_mod
from roam_cli.recompute.flops import graph_flops
from roam_cli.recompute.problem import GatherPrice, Problem

MODES = ("off", "free", "budget")


@dataclass(frozen=True)
class Choice:
    problem: Problem
    saved: frozenset[str]  # forward values kept live into the backward
    copied: tuple[int, ...]  # positions in problem.nodes of the nodes recomputed
    replayed: tuple[str, ...]  # Dropout outputs recomputed from their saved masks

    @property
    def kept(self) -> set[str]:
        """The storages kept live across the boundary."""
        return problem_mod.kept_storages(self.problem, set(self.saved))

    @property
    def kept_bytes(self) -> int:
        return sum(self.problem.cost[r] for r in self.kept)

    @property
    def flops(self) -> int:
        return (sum(self.problem.flops[k] for k in self.copied)
                + sum(self.problem.replays[v][1] for v in self.replayed))

    @property
    def price(self) -> int:
        """What the solvers weigh: the FLOPs, a parameter gathered again at its communication's."""
        return (sum(self.problem.price[k] for k in self.copied)
                + sum(self.problem.replays[v][1] for v in self.replayed))


def chosen(problem: Problem, saved: set[str]) -> Choice:
    copied, replayed = problem_mod.recomputed(problem, saved)
    return Choice(problem, frozenset(saved), tuple(copied), tuple(replayed))


def gather_price(graph: Graph, device: str | None) -> GatherPrice | None:
    """What gathering one of a rank step's parameters again costs, on profile `device`'s
    interconnect (None: the default for rank steps), in the FLOPs its device runs meanwhile at
    the product rate; None for a step without collectives."""
    meta = sharding(graph.metadata)
    if meta is None:
        return None
    profile = profile_mod.for_step(device, sharded=True)
    ranks, link, rate = meta["ranks"], profile.interconnect, profile.device_flops["matmul"]
    hops = link.ring_seconds(0, ranks)  # a ring's time is linear in its bytes: its latency, and a rate per byte
    return GatherPrice(rate * (link.ring_seconds(1, ranks) - hops), round(rate * hops))


def keep_all(graph: Graph, mm: MemoryModel, device: str | None = None) -> Choice:
    """Every needed value kept: the graph as it is."""
    problem = problem_mod.build(graph, mm, "free", gather_price(graph, device))
    return chosen(problem, set(problem.needed))


def free(graph: Graph, mm: MemoryModel, device: str | None = None) -> Choice:
    problem = problem_mod.build(graph, mm, "free", gather_price(graph, device))
    return chosen(problem, mincut.solve(problem))


def fewest_bytes(graph: Graph, mm: MemoryModel, device: str | None = None) -> Choice:
    """The least any budget can keep: every op but random and in-place ones may be copied."""
    problem = problem_mod.build(graph, mm, "budget", gather_price(graph, device))
    return chosen(problem, mincut.solve(problem))


def within(fewest: Choice, limit: int, deadline: float, solver: str) -> Choice | None:
    """The cheapest choice (Choice.price) that keeps at most `limit` bytes (limit >=
    fewest.kept_bytes, whose choice starts the solver); None when the solver found nothing in time."""
    saved = ilp.solve(fewest.problem, limit, deadline, solver, set(fewest.saved))
    return None if saved is None else chosen(fewest.problem, saved)


def gathers_kept(choice: Choice, limit: int) -> Choice:
    """`choice` (at most `limit` bytes kept) with the parameters it gathers again kept instead, the
    dearest communication per byte first, while the bytes fit: what a budget the 0/1 program ran
    out of time on (its warm start, the fewest bytes) still has room for. Keeping a gathered value
    adds at most its own bytes."""
    p = choice.problem
    gathers = [k for k in choice.copied if p.flops[k] != p.price[k]]  # a copy priced above its FLOPs: a gather
    saved, kept = set(choice.saved), choice.kept_bytes
    for k in sorted(gathers, key=lambda k: -p.price[k] / max(p.cost.get(p.outputs[k][0]) or 1, 1)):
        v = p.outputs[k][0]
        if p.cost.get(v) is not None and kept + p.cost[v] <= limit:
            saved.add(v)
            kept += p.cost[v]
    return chosen(p, saved) if len(saved) > len(choice.saved) else choice


def apply(imported: Imported, mm: MemoryModel, choice: Choice, mode: str) -> tuple[Imported, dict]:
    """The model with the chosen copies and replays, and the plan's `recompute` record of them:
    each added node and its FLOPs, each recomputed tensor and the nodes reading it, and the bytes
    no longer kept across the boundary."""
    p = choice.problem
    graph = imported.graph
    rewritten, added, renamed = rewrite_mod.rewrite(imported, set(p.nodes), [p.nodes[k] for k in choice.copied],
                                                    set(choice.saved), set(choice.replayed))
    position = {i: k for k, i in enumerate(p.nodes)}
    originals = graph.node_index()
    index = rewritten.graph.node_index()
    nodes = []
    flops_by_class: Counter = Counter()
    for name, original in sorted(added.items()):
        source = graph.nodes[originals[original]]
        if rewritten.graph.nodes[index[name]].op_type == source.op_type:
            kind, cost = ops.op_class(source), p.flops[position[originals[original]]]
        else:  # a replay's nodes: its FLOPs on the one that makes the value
            made = renamed[source.outputs[0]] in rewritten.graph.nodes[index[name]].outputs
            kind, cost = ops.REPLAY_CLASS, p.replays[source.outputs[0]][1] if made else 0
        flops_by_class[kind] += cost
        nodes.append({"node": name, "of": original, "op_type": rewritten.graph.nodes[index[name]].op_type,
                      "class": kind, "flops": cost})
    tensors = [{"name": new, "of": old, "bytes": mm.tensor_bytes[old],
                "readers": [rewritten.graph.nodes[u].name for u in rewritten.graph.consumers.get(new, ())
                            if rewritten.graph.nodes[u].name not in added]}
               for old, new in sorted(renamed.items())]
    before = chosen(p, set(p.needed))  # the graph as it is, on the same problem
    bytes_by_class: Counter = Counter()
    for r in before.kept - choice.kept:
        producer = graph.nodes[graph.producer[r]]
        kind = ops.REPLAY_CLASS if r in choice.replayed else ops.op_class(producer) or producer.op_type
        bytes_by_class[kind] += p.cost[r]
    record = {"mode": mode, "nodes": nodes, "tensors": tensors, "extra_flops": choice.flops, "price": choice.price,
              "step_flops": graph_flops(graph),
              "kept_bytes": {"before": before.kept_bytes, "after": choice.kept_bytes},
              "by_class": {c: {"flops": flops_by_class.get(c, 0), "bytes_not_kept": bytes_by_class.get(c, 0)}
                           for c in sorted(set(flops_by_class) | set(bytes_by_class))}}
    return rewritten, record


def reapply(imported: Imported, record: dict) -> Imported:
    """The source model rewritten as a plan's `recompute` record says: the same copies and
    replays, under the same names, read by the same nodes, as `apply` made them."""
    graph = imported.graph
    index = graph.node_index()
    missing = next((n["of"] for n in record["nodes"] if n["of"] not in index), None)
    if missing is not None:
        raise RoamError(f"the plan recomputes node {missing!r}, which the model does not have")
    replays = [n for n in record["nodes"] if n["op_type"] != graph.nodes[index[n["of"]]].op_type]
    copied = sorted(index[n["of"]] for n in record["nodes"] if n not in replays)
    replayed = {graph.nodes[index[n["of"]]].outputs[0] for n in replays}
    replaced = {t["of"] for t in record["tensors"]}
    saved = {o for i in copied for o in graph.nodes[i].outputs if o not in replaced}
    readers = {index[r] for t in record["tensors"] for r in t.get("readers", ()) if r in index}
    rewritten, _, _ = rewrite_mod.rewrite(imported, set(range(len(graph.nodes))) - readers, copied, saved, replayed)
    return rewritten
