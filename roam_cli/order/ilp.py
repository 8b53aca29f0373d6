"""The exact ordering ILP (the MODeL/OLLA time-indexed formulation), solved with PuLP.

One step per node. Node v can only run inside its window [ASAP, ALAP] = [#ancestors,
n - 1 - #descendants]. The variables are cumulative: D(v,t) = 1 when v has run by step t
(binary for t in [ASAP, ALAP - 1]; 0 before the window, 1 from ALAP on), so that every
constraint has a handful of terms (with "x[v,t] = v runs at t" and D as sums of x, a liveness
constraint holds whole windows: the model of a 317-node graph was 1.3 GB of MPS):
- D(v,t-1) <= D(v,t), and sum_v D(v,t) = t + 1: every step runs exactly one node;
- precedence: D(v,t) <= D(u,t-1) for every edge u -> v;
- a buffer is live at t when one of its allocators has run by t and one of its readers has not
  run before t: L(b,t) >= D(a,t) - D(r,t-1) for every allocator a and reader r (a buffer with
  no allocator entered live; one living to the end needs only D(a,t); one nobody reads is live at
  its allocator's step only);
- base + sum_b bytes_b * L(b,t) <= M at every step; minimise M.
Byte counts are divided by their common divisor so the solver sees small integers. `solve()`
starts from a warm start (the solver's first incumbent), so it never returns a worse order;
`reach()` starts cold and stops at the first order whose peak is at most a target, which is how
the benchmark times the global ILP against ROAM. PuLP builds the model; `milp.solve` runs CBC
or HiGHS on it. A solver failure, or an answer that is not a valid order as good as the solver
claims, leaves the warm start in place and is named in the status."""

import math
import time
from dataclasses import dataclass

import pulp

from roam_cli.order.problem import Problem, is_topological, peak, positions, reachability, spans
from roam_cli.solvers import milp

MAX_VARIABLES = 500_000  # beyond this the model alone takes gigabytes: report it as too large


@dataclass(frozen=True)
class Solution:
    order: list[int]
    peak: int
    # optimal | improved | not improved | too large | out of time building the model, or the
    # solver's failure ("cbc failed: ...", "... failed verification"): the warm start is kept
    status: str
    variables: int

    @property
    def optimal(self) -> bool:
        return self.status == "optimal"


class OutOfTime(Exception):
    pass


class Model:
    """The ILP of one problem; raises OutOfTime when building it passes `deadline`."""

    def __init__(self, problem: Problem, deadline: float, ceiling: int | None = None):
        self.problem = problem
        n = problem.n
        anc, desc = reachability(problem)
        self.asap = asap = [a.bit_count() for a in anc]
        self.alap = alap = [n - 1 - d.bit_count() for d in desc]
        self.size = sum(alap[v] - asap[v] for v in range(n))
        self.unit = unit = math.gcd(problem.base, *(b.bytes for b in problem.buffers)) or 1
        self.lp = lp = pulp.LpProblem("order", pulp.LpMinimize)
        if self.size > MAX_VARIABLES:
            return
        self.d = d = {(v, t): lp.add_variable(f"D_{v}_{t}", cat="Binary")
                      for v in range(n) for t in range(asap[v], alap[v])}

        def done(v: int, t: int):
            """D(v,t): 0, 1, or its variable."""
            return 0 if t < asap[v] else 1 if t >= alap[v] else d[v, t]

        by_step: list[list] = [[] for _ in range(n)]
        ran = [0] * n  # nodes surely run by each step
        for v in range(n):
            for t in range(asap[v] + 1, alap[v]):
                lp += d[v, t - 1] <= d[v, t]
            for t in range(asap[v], alap[v]):
                by_step[t].append(d[v, t])
            for t in range(alap[v], n):
                ran[t] += 1
        for t in range(n):
            if by_step[t]:
                lp += pulp.lpSum(by_step[t]) == t + 1 - ran[t]
        for v, ps in enumerate(problem.preds):
            if time.perf_counter() > deadline:
                raise OutOfTime
            for u in ps:
                for t in range(asap[v], alap[u] + 1):
                    after, before = done(v, t), done(u, t - 1)
                    if not isinstance(after, int) or not isinstance(before, int):
                        lp += after <= before

        live_terms: list[list] = [[] for _ in range(n)]
        self.live = {}
        fixed = [problem.base // unit] * n
        for b, buf in enumerate(problem.buffers):
            if time.perf_counter() > deadline:
                raise OutOfTime
            lo = min((asap[a] for a in buf.alloc), default=0)
            hi = n - 1 if buf.to_end else max(alap[r] for r in buf.readers or buf.alloc)
            for t in range(lo, hi + 1):
                # each condition is (allocated-by-t, [terms not yet run before t]): L >= alloc - sum
                conditions = []
                for a in buf.alloc or (None,):
                    allocated = done(a, t) if a is not None else 1
                    if buf.to_end:
                        conditions.append((allocated, []))
                    elif buf.readers:
                        conditions += [(allocated, [done(r, t - 1)]) for r in buf.readers]
                    else:  # nobody reads it: live only at the step where the first allocator runs
                        conditions.append((allocated, [done(a2, t - 1) for a2 in buf.alloc]))
                # drop the conditions that cannot hold (not allocated, or a reader surely done)
                # and the terms that are surely 0 (a reader surely still to run)
                conditions = [(a, [m for m in minus if not constant(m, 0)]) for a, minus in conditions
                              if not constant(a, 0) and not any(constant(m, 1) for m in minus)]
                if any(constant(a, 1) and not minus for a, minus in conditions):
                    fixed[t] += buf.bytes // unit  # surely live at t
                    continue
                if not conditions:
                    continue
                live = self.live[b, t] = lp.add_variable(f"L_{b}_{t}", lowBound=0)
                for allocated, minus in conditions:
                    lp += live >= allocated - pulp.lpSum(minus)
                live_terms[t].append(buf.bytes // unit * live)
        self.m = lp.add_variable("M", lowBound=0,
                                 upBound=ceiling // unit if ceiling is not None else None)
        # under a ceiling any feasible order will do: a constant objective stops at the first one
        lp.setObjective(self.m if ceiling is None else pulp.LpAffineExpression())
        for t in range(n):
            lp += pulp.lpSum(live_terms[t]) + fixed[t] <= self.m

    def warm_start(self, order: list[int]) -> None:
        pos = positions(order)
        for (v, t), var in self.d.items():
            var.setInitialValue(1 if pos[v] <= t else 0)
        warm_spans = spans(self.problem, order)
        for (b, t), var in self.live.items():
            first, last = warm_spans[b]
            var.setInitialValue(1 if first <= t <= last else 0)
        self.m.setInitialValue(peak(self.problem, order) // self.unit)

    def run(self, deadline: float, solver: str, warm: bool) -> tuple[list[int] | None, str]:
        """Solve until `deadline`: (the order found or None, `milp.solve`'s status, or a
        verification failure)."""
        status = milp.solve(self.lp, solver, deadline, warm)
        if status not in milp.FOUND:
            return None, status
        n = self.problem.n
        step = [next((t for t in range(self.asap[v], self.alap[v]) if (self.d[v, t].value() or 0) > 0.5),
                     self.alap[v]) for v in range(n)]
        order = sorted(range(n), key=step.__getitem__)
        # the solution must be an order, and its peak what the solver says it is
        claimed = self.m.value()
        if not is_topological(self.problem, order) or (
                claimed is not None and peak(self.problem, order) // self.unit > math.ceil(claimed - 1e-6)):
            return None, f"{solver} failed: its solution failed verification"
        return order, status


def constant(term, value: int) -> bool:
    """Whether a D term is the constant `value` (a PuLP variable overloads ==)."""
    return isinstance(term, int) and term == value


def solve(problem: Problem, warm_start: list[int], deadline: float, solver: str = "cbc") -> Solution:
    """Minimise the peak of `problem` until `deadline` (time.perf_counter()); never returns an
    order worse than `warm_start`."""
    start_peak = peak(problem, warm_start)
    if problem.n <= 1:
        return Solution(list(warm_start), start_peak, "optimal", 0)
    try:
        model = Model(problem, deadline)
    except OutOfTime:
        return Solution(list(warm_start), start_peak, "out of time building the model", 0)
    if model.size > MAX_VARIABLES:
        return Solution(list(warm_start), start_peak, "too large", model.size)
    if deadline - time.perf_counter() < 1:
        return Solution(list(warm_start), start_peak, "out of time building the model", model.size)
    model.warm_start(warm_start)
    order, status = model.run(deadline, solver, warm=True)
    if milp.failed(status):
        return Solution(list(warm_start), start_peak, status, model.size)
    if order is None or peak(problem, order) > start_peak:
        return Solution(list(warm_start), start_peak, "not improved", model.size)
    found = peak(problem, order)
    if status == "optimal":
        return Solution(order, found, "optimal", model.size)
    return Solution(order, found, "improved" if found < start_peak else "not improved", model.size)


def reach(problem: Problem, target: int, deadline: float, solver: str = "cbc") -> list[int] | None:
    """From no start at all, the first order the solver finds whose peak is at most `target`."""
    try:
        model = Model(problem, deadline, ceiling=target)
    except OutOfTime:
        return None
    if model.size > MAX_VARIABLES:
        return None
    return model.run(deadline, solver, warm=False)[0]
