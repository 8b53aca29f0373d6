"""The ROAM offset ILP (PuLP + CBC): exact minimum arena for buffers with fixed lifetimes.

    minimise  H
    s.t.      o_i + s_i <= H                                   for every buffer i
              o_i + s_i <= o_j + M (1 - z_ij)                  for every pair i < j whose
              o_j + s_j <= o_i + M z_ij                          lifetimes intersect
              0 <= o_i,  z_ij binary,  H >= lower bound

``z_ij = 1`` puts ``i`` below ``j``.  ``M`` is an upper bound on the arena (the best heuristic),
so an optimal solution never needs ``o_i + s_i > M``.  Offsets are continuous: once the ``z`` are
fixed the constraints form a difference system, whose vertices are integral for integral sizes.

The model grows with the number of overlapping pairs, so ``roam`` only calls it on small
subproblems -- where the combinatorial search could not reach the peak-live lower bound and a
proven optimum (or a better incumbent within the time limit) is wanted.  It is warm-started from
the best layout known so far; `milp.solve` runs CBC (the default) or HiGHS (``highspy``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import pulp

from roam_cli.solvers import milp


def solve_ilp(buffers: Sequence[tuple[int, int, int]], *, upper: int, lower: int = 0,
              warm: Sequence[int] | None = None, time_limit: float = 10.0,
              solver: str = "cbc") -> tuple[list[int] | None, dict]:
    """Minimise the arena of ``buffers`` (sizes > 0, non-empty lifetimes).

    ``upper`` must be the height of a known layout (``warm`` if given).  Returns
    ``(offsets or None, info)``; ``info["status"]`` is ``"optimal"``, ``"feasible"`` (time limit
    hit with an incumbent), or why there is no layout (`milp.solve`'s statuses, or a solution
    that failed verification).  Never raises for solver trouble.
    """
    t0 = time.perf_counter()
    info: dict = {"solver": solver, "buffers": len(buffers)}
    n = len(buffers)
    if n == 0:
        info["status"] = "optimal"
        return [], info
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)
             if buffers[i][0] < buffers[j][1] and buffers[j][0] < buffers[i][1]]
    info["pairs"] = len(pairs)
    M = int(upper)
    prob = pulp.LpProblem("roam_layout", pulp.LpMinimize)
    var = prob.add_variable
    H = var("H", lowBound=max(int(lower), max(b[2] for b in buffers)), upBound=M)
    o = [var(f"o{i}", lowBound=0, upBound=max(M - buffers[i][2], 0)) for i in range(n)]
    z = {p: var(f"z{p[0]}_{p[1]}", cat="Binary") for p in pairs}
    prob += H
    for i in range(n):
        prob += o[i] + buffers[i][2] <= H
    for (i, j), v in z.items():
        prob += o[i] + buffers[i][2] <= o[j] + M * (1 - v)
        prob += o[j] + buffers[j][2] <= o[i] + M * v
    if warm is not None:
        for i in range(n):
            o[i].setInitialValue(int(warm[i]))
        for (i, j), v in z.items():
            v.setInitialValue(1 if warm[i] < warm[j] or (warm[i] == warm[j] and i < j) else 0)
        H.setInitialValue(max(int(warm[i]) + buffers[i][2] for i in range(n)))
    status = milp.solve(prob, solver, time.perf_counter() + max(time_limit, 0.1), warm=warm is not None)
    info["seconds"] = time.perf_counter() - t0
    if status not in milp.FOUND:
        info["status"] = status
        return None, info
    values = [v.varValue for v in o]
    if any(v is None for v in values):
        info["status"] = f"{solver} failed: no value for an offset"
        return None, info
    offsets = [max(0, int(round(v))) for v in values]
    # verify (rounding, tolerances): fall back to the caller's layout on any doubt
    for i, j in pairs:
        a, b = offsets[i], offsets[j]
        if not (a + buffers[i][2] <= b or b + buffers[j][2] <= a):
            info["status"] = f"{solver} failed: its solution failed verification"
            return None, info
    height = max(offsets[i] + buffers[i][2] for i in range(n))
    info["height"] = height
    info["status"] = status
    return offsets, info
