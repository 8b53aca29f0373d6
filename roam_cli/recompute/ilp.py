"""`--recompute budget`: the cheapest recomputation (problem.price) such that at most `limit` bytes are kept
live across the forward/backward boundary (a Checkmate-style 0/1 program, solved by CBC or HiGHS).

Variables: save[v] per forward value that can be kept (views cannot: their base is), copy[k]
per node that may be copied, replay[v] per Dropout output that can be replayed. A needed value
is saved, or its node copied (a Dropout's output: replayed); a copy's or replay's inputs are
saved, copied, replayed or persistent; the saved bytes fit `limit`; minimise the price of the
copies and replays (FLOPs; a parameter gathered again, its communication: problem.py)."""

import pulp

from roam_cli.recompute.problem import Problem, recomputed
from roam_cli.solvers import milp


def solve(problem: Problem, limit: int, deadline: float, solver: str, start: set[str]) -> set[str] | None:
    """The saved values; None when the solver found none by the deadline. `start` is a saved
    set that fits `limit` (the warm start), or empty."""
    producer = problem.producer()
    lp = pulp.LpProblem("recompute", pulp.LpMinimize)
    save = {v: pulp.LpVariable(f"s{i}", cat=pulp.LpBinary)
            for i, (v, c) in enumerate(problem.cost.items()) if c is not None}
    copy = {k: pulp.LpVariable(f"r{k}", cat=pulp.LpBinary) for k, ok in enumerate(problem.copyable) if ok}
    replay = {v: pulp.LpVariable(f"d{i}", cat=pulp.LpBinary) for i, v in enumerate(problem.replays)}

    def available(v: str):
        """1 when v can be read after the forward: saved, or its node copied, or replayed"""
        made = replay.get(v) if v in problem.replays else copy.get(producer[v])
        return pulp.lpSum(x for x in (save.get(v), made) if x is not None)

    lp += (pulp.lpSum(problem.price[k] * x for k, x in copy.items())
           + pulp.lpSum(problem.replays[v][1] * x for v, x in replay.items()))
    for v in sorted(problem.needed):
        lp += available(v) >= 1
    for inputs, x in [(problem.inputs[k], x) for k, x in copy.items()] + \
                     [(problem.replays[v][0], x) for v, x in replay.items()]:
        for v in inputs:
            if v in producer and v not in problem.free:
                lp += available(v) >= x
    lp += pulp.lpSum(problem.cost[v] * x for v, x in save.items()) <= limit
    if start:
        copied, replayed = recomputed(problem, start)
        copied = set(copied)
        for v, x in save.items():
            x.setInitialValue(1 if v in start else 0)
        for k, x in copy.items():
            x.setInitialValue(1 if k in copied else 0)
        for v, x in replay.items():
            x.setInitialValue(1 if v in replayed else 0)
    status = milp.solve(lp, solver, deadline, warm=bool(start))
    if status not in milp.FOUND:
        return None
    return {v for v, x in save.items() if x.value() is not None and x.value() > 0.5}

