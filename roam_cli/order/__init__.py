"""Ordering strategies: a topological order of all nodes, chosen to minimise peak live bytes.

Every strategy takes a `MemoryModel` and returns node indices plus plain statistics:
- `roam` (the default): reduction rules, the best heuristic, tree-divided exact refinement
  (`roam.py`); never worse than the baselines it is given;
- `original`: the model's node order (an eager framework: forward, whole backward, optimizer);
- `ort`: ONNX Runtime's default execution order (`ort.py`);
- `greedy`: the best of XLA's list and DFS memory schedulers (`greedy.py`);
- `ilp-global`: one ILP over the whole graph, the MODeL/OLLA formulation (`ilp.py`).

`baselines()` measures the cheap baselines in one run; `solve()` reuses their orders. Every order
returned is one ONNX Runtime runs as it is (`runs()`): Shape and Size right after their input's
producer, where its priority-based order runs them."""

import time

from roam_cli.core import memory
from roam_cli.core.graph import smallest_first_order
from roam_cli.core.memory import MemoryModel
from roam_cli.order import greedy as greedy_mod, ilp, ort as ort_mod, roam as roam_mod
from roam_cli.order.problem import from_memory_model, kahn
from roam_cli.solvers import milp

STRATEGIES = ("roam", "original", "ort", "greedy", "ilp-global")
BASELINES = ("original", "ort", "greedy")
DEFAULT_SECONDS = 60.0  # the search stops earlier when it proves its order optimal


def runs(mm: MemoryModel, order: list[int]) -> list[int]:
    """`order` as ONNX Runtime runs it when a plan gives it (PRIORITY_BASED): Shape and Size
    nodes moved to right after their input's producer. The peak is the order's own: the ordering
    problem counts their bytes with that producer (`problem.from_memory_model`)."""
    return ort_mod.priority_based(order, mm.eager)


def original(mm: MemoryModel) -> list[int]:
    """The model's node order: file order, with the fewest moves that honour in-place rules."""
    return runs(mm, kahn(from_memory_model(mm)))


def nearest(mm: MemoryModel, order: list[int]) -> list[int]:
    """The topological order of mm's edges nearest `order`: its nodes, each run as soon as the
    edges let it, earliest in `order` first (`order` itself where it keeps them all)."""
    rank = {v: k for k, v in enumerate(order)}
    succs: list[list[int]] = [[] for _ in mm.preds]
    for v, ps in enumerate(mm.preds):
        for u in ps:
            succs[u].append(v)
    by_rank = smallest_first_order([len(mm.preds[v]) for v in order], [[rank[w] for w in succs[v]] for v in order])
    return [order[k] for k in by_rank]


def peak_of(mm: MemoryModel, order: list[int]) -> int:
    return memory.peak_live(mm, memory.lifetimes(mm, order))[0]


def baseline(mm: MemoryModel, strategy: str, op_types: list[str]) -> tuple[list[int], dict]:
    if strategy == "original":
        return original(mm), {}
    if strategy == "ort":  # ORT's default order, run as the plan's order (the joins' edges kept)
        return runs(mm, nearest(mm, ort_mod.ort_default(list(mm.run_preds), op_types))), {}
    if strategy == "greedy":
        found, scheduler = greedy_mod.greedy(from_memory_model(mm))
        return runs(mm, found), {"scheduler": scheduler}
    raise ValueError(f"unknown baseline {strategy!r}")


def baselines(mm: MemoryModel, op_types: list[str]) -> dict[str, dict]:
    """Every cheap baseline: strategy -> {order, peak_live_bytes, seconds}."""
    out = {}
    for strategy in BASELINES:
        start = time.perf_counter()
        found, _ = baseline(mm, strategy, op_types)
        out[strategy] = {"order": found, "peak_live_bytes": peak_of(mm, found),
                         "seconds": time.perf_counter() - start}
    return out


def solve(mm: MemoryModel, strategy: str = "roam", *, op_types: list[str] | None = None,
          time_limit: float | None = None, jobs: int = 1, solver: str = "cbc",
          measured: dict[str, dict] | None = None, progress=None, gap: float = 0.0,
          target: int | None = None, leaf_states: int | None = None) -> tuple[list[int], dict]:
    """(order, stats) for `strategy`. `measured` are baselines already computed in this run
    (`baselines()`): roam starts from them and never returns a worse order. roam stops searching
    once its order is within `gap` (a fraction) of its lower bound, or its peak at most `target`
    bytes (stats' `target_bytes`, and `stopped_at_target` when that is what stopped it).
    `leaf_states`: the down-sets each leaf's exact search may visit (None: roam's default)."""
    op_types = op_types if op_types is not None else [""] * mm.num_nodes
    seconds = time_limit if time_limit is not None else DEFAULT_SECONDS
    if strategy in BASELINES:
        return baseline(mm, strategy, op_types)
    problem = from_memory_model(mm)
    if strategy == "ilp-global":
        start = original(mm)
        sol = ilp.solve(problem, start, time.perf_counter() + seconds, solver)
        stats = {"solver": solver, "status": sol.status, "variables": sol.variables}
        if milp.failed(sol.status):
            stats["fallback"] = f"{sol.status}; kept the original order"
        return runs(mm, sol.order), stats
    if strategy == "roam":
        measured = measured if measured is not None else baselines(mm, op_types)
        deadline = time.perf_counter() + seconds
        found, stats = roam_mod.order(problem, {k: v["order"] for k, v in measured.items()}, deadline, jobs,
                                      progress, gap, target, leaf_states or roam_mod.LEAF_STATES)
        found = runs(mm, found)
        best_baseline = min(measured, key=lambda k: measured[k]["peak_live_bytes"])
        if peak_of(mm, found) > measured[best_baseline]["peak_live_bytes"]:  # never worse than a baseline
            found = measured[best_baseline]["order"]
        out = {"reduced_nodes": stats.reduced_nodes, "removed_by_rule": stats.removed,
               "reference": stats.reference, "lower_bound_bytes": stats.lower_bound,
               # an order at the proven bound is optimal, whichever of roam's or a baseline's it is
               "proven_optimal": stats.proven_optimal or peak_of(mm, found) <= stats.lower_bound, "gap": gap,
               "repairs": stats.repairs, "tree_passes": stats.passes, "restarts": stats.restarts,
               "tree_levels": stats.levels, "leaves_solved": stats.leaves_solved,
               "leaf_states": leaf_states or roam_mod.LEAF_STATES,
               "shapes_solved": stats.shapes_solved, "shapes_reused": stats.shapes_reused}
        if target is not None:
            out |= {"target_bytes": target, "stopped_at_target": stats.at_target and not out["proven_optimal"]}
        return found, out
    raise ValueError(f"unknown order strategy {strategy!r}")
