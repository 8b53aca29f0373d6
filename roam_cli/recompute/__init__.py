"""Recomputation: keep fewer bytes live from the forward into the backward by computing some
values again where the backward needs them (`roam optimize --recompute free|budget`).

problem.build (graph + memory model -> Problem) -> a solver picks the values to keep (mincut
for `free`, ilp for `budget`) -> problem.recomputed (the nodes to copy) -> rewrite (the graph and
model with the copies), which roam then orders and lays out like any other graph."""

from collections import Counter
from dataclasses import dataclass

from roam_cli.errors import RoamError
from roam_cli.graph import Graph
from roam_cli.memory import MemoryModel
from roam_cli.onnx_import import Imported
from roam_cli.recompute import ilp, mincut, ops, problem as problem_mod, rewrite as rewrite_mod
from roam_cli.recompute.flops import graph_flops
from roam_cli.recompute.problem import Problem

MODES = ("off", "free", "budget")


@dataclass(frozen=True)
class Choice:
    problem: Problem
    saved: frozenset[str]  # forward values kept live into the backward
    copied: tuple[int, ...]  # positions in problem.nodes of the nodes recomputed

    @property
    def kept(self) -> set[str]:
        """The storages kept live across the boundary."""
        return problem_mod.kept_storages(self.problem, set(self.saved))

    @property
    def kept_bytes(self) -> int:
        return sum(self.problem.cost[r] for r in self.kept)

    @property
    def flops(self) -> int:
        return sum(self.problem.flops[k] for k in self.copied)


def chosen(problem: Problem, saved: set[str]) -> Choice:
    return Choice(problem, frozenset(saved), tuple(problem_mod.recomputed(problem, saved)))


def keep_all(graph: Graph, mm: MemoryModel) -> Choice:
    """Every needed value kept: the graph as it is."""
    problem = problem_mod.build(graph, mm, "free")
    return chosen(problem, set(problem.needed))


def free(graph: Graph, mm: MemoryModel) -> Choice:
    problem = problem_mod.build(graph, mm, "free")
    return chosen(problem, mincut.solve(problem))


def fewest_bytes(graph: Graph, mm: MemoryModel) -> Choice:
    """The least any budget can keep: every op but random and in-place ones may be copied."""
    problem = problem_mod.build(graph, mm, "budget")
    return chosen(problem, mincut.solve(problem))


def within(fewest: Choice, limit: int, deadline: float, solver: str) -> Choice | None:
    """The fewest FLOPs that keep at most `limit` bytes (limit >= fewest.kept_bytes, whose choice
    starts the solver); None when the solver found nothing in time."""
    saved, _ = ilp.solve(fewest.problem, limit, deadline, solver, set(fewest.saved))
    return None if saved is None else chosen(fewest.problem, saved)


def apply(imported: Imported, mm: MemoryModel, choice: Choice, mode: str) -> tuple[Imported, dict]:
    """The model with the chosen copies, and the plan's `recompute` record of them: each copy
    and its FLOPs, each recomputed tensor, and the bytes no longer kept across the boundary."""
    p = choice.problem
    graph = imported.graph
    rewritten, originals, renamed = rewrite_mod.rewrite(imported, set(p.nodes), [p.nodes[k] for k in choice.copied],
                                                        set(choice.saved))
    position = {p.nodes[k]: k for k in range(len(p.nodes))}
    index = graph.node_index()
    copies = []
    flops_by_class: Counter = Counter()
    for copy, original in sorted(originals.items()):
        node = graph.nodes[index[original]]
        flops = p.flops[position[index[original]]]
        flops_by_class[ops.op_class(node)] += flops
        copies.append({"node": copy, "of": original, "op_type": node.op_type, "class": ops.op_class(node),
                       "flops": flops})
    copy_names = set(originals)
    tensors = [{"name": new, "of": old, "bytes": mm.tensor_bytes[old],
                "readers": [rewritten.graph.nodes[u].name for u in rewritten.graph.consumers.get(new, ())
                            if rewritten.graph.nodes[u].name not in copy_names]}
               for old, new in sorted(renamed.items())]
    before = keep_all(graph, mm)
    dropped = before.kept - choice.kept
    bytes_by_class: Counter = Counter()
    for r in dropped:
        bytes_by_class[ops.op_class(graph.nodes[graph.producer[r]]) or graph.nodes[graph.producer[r]].op_type] += p.cost[r]
    record = {"mode": mode, "nodes": copies, "tensors": tensors, "extra_flops": choice.flops,
              "step_flops": graph_flops(graph),
              "kept_bytes": {"before": before.kept_bytes, "after": choice.kept_bytes},
              "by_class": {c: {"flops": flops_by_class.get(c, 0), "bytes_not_kept": bytes_by_class.get(c, 0)}
                           for c in sorted(set(flops_by_class) | set(bytes_by_class))}}
    return rewritten, record


def reapply(imported: Imported, record: dict) -> Imported:
    """The source model rewritten as a plan's `recompute` record says: the same copies, under the
    same names, read by the same nodes, as `apply` made them."""
    index = imported.graph.node_index()
    missing = next((n["of"] for n in record["nodes"] if n["of"] not in index), None)
    if missing is not None:
        raise RoamError(f"the plan recomputes node {missing!r}, which the model does not have")
    copied = sorted(index[n["of"]] for n in record["nodes"])
    replaced = {t["of"] for t in record["tensors"]}
    saved = {o for i in copied for o in imported.graph.nodes[i].outputs if o not in replaced}
    readers = {index[r] for t in record["tensors"] for r in t.get("readers", ()) if r in index}
    rewritten, _, _ = rewrite_mod.rewrite(imported, set(range(len(imported.graph.nodes))) - readers, copied, saved)
    return rewritten
