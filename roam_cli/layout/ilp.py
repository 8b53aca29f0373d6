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
the best layout known so far; CBC is the default solver, HiGHS (``highspy``) is used when asked
for and installed.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence


def solve_ilp(buffers: Sequence[tuple[int, int, int]], *, upper: int, lower: int = 0,
              warm: Sequence[int] | None = None, time_limit: float = 10.0,
              solver: str = "cbc") -> tuple[list[int] | None, dict]:
    """Minimise the arena of ``buffers`` (sizes > 0, non-empty lifetimes).

    ``upper`` must be the height of a known layout (``warm`` if given).  Returns
    ``(offsets or None, info)``; ``info["status"]`` is ``"optimal"``, ``"feasible"`` (time limit
    hit with an incumbent), or a failure reason.  Never raises for solver trouble.
    """
    t0 = time.perf_counter()
    info: dict = {"solver": solver, "buffers": len(buffers)}
    try:
        import pulp
    except Exception as e:  # pragma: no cover - pulp is a dependency
        info["status"] = f"pulp unavailable: {e}"
        return None, info
    n = len(buffers)
    if n == 0:
        info["status"] = "optimal"
        return [], info
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)
             if buffers[i][0] < buffers[j][1] and buffers[j][0] < buffers[i][1]]
    info["pairs"] = len(pairs)
    M = int(upper)
    prob = pulp.LpProblem("roam_layout", pulp.LpMinimize)
    if hasattr(prob, "add_variable"):  # PuLP >= 3.3 attaches variables to the model
        var = prob.add_variable
    else:  # pragma: no cover - older PuLP
        def var(name, lowBound=None, upBound=None, cat="Continuous"):
            return pulp.LpVariable(name, lowBound=lowBound, upBound=upBound, cat=cat)
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
    try:
        with warnings.catch_warnings():  # PuLP 3.x deprecation notices about its 4.0 API
            warnings.simplefilter("ignore", DeprecationWarning)
            if solver == "highs":
                cmd = pulp.HiGHS(msg=False, timeLimit=max(time_limit, 0.1))
            else:
                cmd = pulp.PULP_CBC_CMD(msg=False, timeLimit=max(time_limit, 0.1),
                                        warmStart=warm is not None, threads=1)
            if not cmd.available():
                info["status"] = f"{solver} not available"
                return None, info
            prob.solve(cmd)
    except Exception as e:
        info["status"] = f"solver error: {type(e).__name__}: {e}".splitlines()[0]
        info["seconds"] = time.perf_counter() - t0
        return None, info
    info["seconds"] = time.perf_counter() - t0
    status = pulp.LpStatus.get(prob.status, str(prob.status))
    sol_status = getattr(prob, "sol_status", None)
    values = [v.varValue for v in o]
    if any(v is None for v in values):
        info["status"] = f"no solution ({status})"
        return None, info
    offsets = [max(0, int(round(v))) for v in values]
    # verify (rounding, tolerances): fall back to the caller's layout on any doubt
    for i, j in pairs:
        a, b = offsets[i], offsets[j]
        if not (a + buffers[i][2] <= b or b + buffers[j][2] <= a):
            info["status"] = "solution failed verification"
            return None, info
    height = max(offsets[i] + buffers[i][2] for i in range(n))
    info["height"] = height
    optimal = status == "Optimal" and sol_status in (None, pulp.LpSolutionOptimal)
    info["status"] = "optimal" if optimal else "feasible"
    return offsets, info
