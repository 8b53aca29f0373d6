"""Rematerialisation on a bare compute graph (`roam remat`): the order of a node-link graph's
nodes, a node allowed to run more than once, that fits a memory budget at the least total
compute. `graph` reads the file and measures a schedule, `solve` finds one, `check` validates
one with code of its own (it imports nothing from roam)."""

import math
import time
from pathlib import Path

from roam_cli.core.errors import CheckFailed, RoamError
from roam_cli.remat import graph as graph_mod, solve as solve_mod


def remat(path: str | Path, budget: int | None, fraction: float | None, time_limit: float) -> dict:
    """The schedule document `roam remat` writes. The budget is `budget` bytes, or `fraction` of
    the given order's peak (rounded up, as Moccasin's benchmark does). CheckFailed when no
    schedule fits: below the largest single step, or none found in time."""
    start = time.perf_counter()
    graph = graph_mod.read(path)
    given_peak, baseline = graph_mod.cost(graph, list(graph.order))
    if (budget is None) == (fraction is None):
        raise RoamError("give the budget as --budget BYTES or --budget-fraction F, one of them")
    if budget is None:
        budget = math.ceil(given_peak * fraction)
    floor, node = graph_mod.step_floor(graph)
    if budget < floor:
        raise CheckFailed(f"no schedule fits {budget} bytes: node {graph.ids[node]!r} needs {floor} bytes "
                          "(its output and its inputs live at once)")
    found = solve_mod.solve(graph, budget, time_limit)
    if found is None:
        raise CheckFailed(f"no schedule within {budget} bytes found in {time_limit:g} s")
    return {
        "graph": graph.name, "budget": budget, "budget_fraction": fraction, "given_order_peak": given_peak,
        "schedule": [graph.ids[v] for v in found.schedule], "peak": found.peak, "compute": found.compute,
        "baseline_compute": baseline,
        "overhead_percent": 100.0 * (found.compute - baseline) / baseline if baseline else 0.0,
        "recomputations": len(found.schedule) - graph.n,
        "least_peak_without_recomputation": found.min_peak_order,
        "status": "optimal" if found.optimal else "feasible",
        "replays": found.replays, "seconds": round(time.perf_counter() - start, 3),
    }
