"""The least-energy schedule of a POET problem: what each stage recomputes, keeps in RAM, pages out
to storage and pages in, under POET's exact accounting (docs/poet.md), within the RAM and the
runtime budget.

1. `floor`: no schedule fits when a stage's own working set (node t and its inputs, less what
   POET's double-counted frees of duplicated edges could give back) exceeds the RAM budget, when
   computing every node once already exceeds the runtime budget, or when nothing can leave RAM
   (paging off, and no recomputation fits the runtime budget) and keeping every value to its
   last read, then the only schedule, is over the RAM budget.
2. `greedy`: from keeping every value from its computation to its last use, while a stage is over
   the budget, a value held there but not read there leaves RAM for that gap, paged out and in or
   recomputed where it is next read, whichever costs the least energy per byte of excess it
   removes; each step is measured exactly (`measure`) and undone if it did not help. Then every
   page-in, recomputation and page-out that the budget allows is taken back. When it finds
   none, the repair search: the same greedy taking the page-outs first (they take no runtime, so
   they cannot spend the runtime budget a later stage needs), then any recomputation.
3. `milp`: POET's MILP with the structural zeros fixed instead of constrained, Free_E pinned by
   tight rows instead of big-M ones (a duplicated edge is one variable with twice the bytes),
   bytes in units of the budget, the objective the energy above computing every node once scaled
   to the greedy's, warm-started from the greedy; CBC (PuLP's) or HiGHS until the time limit.
   When the greedy found no plan, the MILP runs from no start for the time left (the repair
   search's plan, if any, kept if the MILP finds nothing cheaper): it finds a schedule, proves
   that none fits, or is stopped at the limit, and `NoSchedule` says which."""

import math
import time
from dataclasses import dataclass

import pulp

from roam_cli.remat.poet import Problem, Schedule
from roam_cli.solvers import milp as milp_mod

MARGIN = 2.5  # seconds kept from the time limit for the solver's grace and writing the file
OBJECTIVE_SCALE = 100.0  # the greedy's extra energy, in the MILP's objective units
RUNTIME_SLACK = 1e-9  # relative, as the checker allows
# building the PuLP model and writing its MPS cannot be interrupted: measured up to 0.3 ms per
# variable (T = 133: 66,000 variables, 15 s on a busy machine); the MILP runs only when the time
# left is at least three times that
SECONDS_PER_VARIABLE = 3e-4


@dataclass
class Plan:
    """A schedule as per-stage sets: comp[t] (R), held[t] (SRam), disk[t] (SSd), pin[t] (MIn),
    pout[t] (MOut)."""
    comp: list[set]
    held: list[set]
    disk: list[set]
    pin: list[set]
    pout: list[set]

    def schedule(self) -> Schedule:
        return Schedule(*(frozenset((t, i) for t, s in enumerate(m) for i in s)
                          for m in (self.comp, self.held, self.disk, self.pin, self.pout)))


@dataclass
class Cost:
    excess: list[float]  # per stage: bytes over the budget at its peak (<= 0 when it fits)
    lowest: float  # the least U of any stage (POET's U must stay >= 0)
    peak: float
    runtime: float
    compute: float  # joules
    paging: float

    @property
    def energy(self) -> float:
        return self.compute + self.paging

    def fits(self, p: Problem) -> bool:
        return max(self.excess) <= 0 and self.lowest >= 0 and self.runtime <= p.runtime_budget * (1 + RUNTIME_SLACK)


@dataclass
class Result:
    schedule: Schedule
    cost: Cost
    optimal: bool
    greedy_energy: float | None  # None: neither greedy search found a plan
    milp_status: str
    seconds: float

    found_by: str = "greedy"  # the search whose plan the MILP started from (or the MILP, from no start)

    def summary(self, p: Problem) -> dict:
        return {"energy_joules": self.cost.energy, "compute_joules": self.cost.compute,
                "paging_joules": self.cost.paging, "peak_ram_bytes": self.cost.peak, "ram_budget_bytes": p.ram_budget,
                "runtime": self.cost.runtime, "runtime_budget": p.runtime_budget,
                "status": "optimal" if self.optimal else "feasible", "greedy_energy_joules": self.greedy_energy,
                "found_by": self.found_by, "milp": self.milp_status, "seconds": round(self.seconds, 3)}


@dataclass
class NoSchedule:
    """No schedule: `proved` when `reason` shows that none fits; else `reason` says what ran, for
    how long, and how each search ended."""
    proved: bool
    reason: str

    def message(self) -> str:
        return f"infeasible: {self.reason}" if self.proved else f"no schedule found: {self.reason}"


class Graph:
    """The edges as POET's accounting reads them."""

    def __init__(self, p: Problem):
        self.preds = [sorted({u for u, v in p.edges if v == k}) for k in range(p.T)]
        self.succs = [sorted({v for u, v in p.edges if u == i}) for i in range(p.T)]
        self.into = [[u for u, v in p.edges if v == k] for k in range(p.T)]  # duplicates kept


def measure(p: Problem, g: Graph, plan: Plan) -> Cost:
    """POET's U recurrence per stage, walking only the computed nodes (U changes nowhere else)."""
    T = p.T
    excess, lowest = [], math.inf
    for t in range(T):
        comp = sorted(plan.comp[t])
        after = plan.held[t + 1] if t + 1 < T else set()
        last_reader = {}
        for k in comp:
            for i in g.preds[k]:
                last_reader[i] = k
        U = sum(p.ram[i] for i in plan.held[t])
        top = U
        for k in comp:
            U += p.ram[k]
            top = max(top, U)
            if k < T - 1:
                U -= sum(p.ram[i] for i in g.into[k] if last_reader[i] == k and i not in after)
                lowest = min(lowest, U)
        excess.append(top - p.ram_budget)
    runtime = sum(p.cpu[i] for s in plan.comp for i in s)
    compute = sum(p.compute[i] for s in plan.comp for i in s)
    paging = sum(p.pagein[i] for s in plan.pin for i in s) + sum(p.pageout[i] for s in plan.pout for i in s)
    return Cost(excess, lowest, max(e + p.ram_budget for e in excess), runtime, compute, paging)


def floor(p: Problem, g: Graph) -> str | None:
    """Why no schedule fits, when a stage's unavoidable bytes or the runtime show it; else None."""
    extra_frees = [0] * p.T  # bytes POET frees twice through a duplicated edge into k
    seen = set()
    for u, v in p.edges:
        if (u, v) in seen:
            extra_frees[v] += p.ram[u]
        seen.add((u, v))
    for t in range(p.T):
        need = p.ram[t] + sum(p.ram[u] for u in g.preds[t]) - sum(extra_frees[:t])
        if need > p.ram_budget:
            return (f"stage {t} needs {need:g} bytes (node {t} and its {len(g.preds[t])} inputs), over the "
                    f"RAM budget {p.ram_budget:g}")
    if sum(p.cpu) > p.runtime_budget * (1 + RUNTIME_SLACK):
        return f"computing each node once takes {sum(p.cpu):.6g}, over the runtime budget {p.runtime_budget:.6g}"
    slack = p.runtime_budget * (1 + RUNTIME_SLACK) - sum(p.cpu)
    if not p.paging and (not p.remat or min(p.cpu) > slack):
        # nothing can leave RAM: a value is held from its computation to its last read in every
        # schedule (holding one longer only adds bytes), so keeping every value is the least peak
        cost = measure(p, g, Greedy(p, g).plan()[0])
        worst = max(range(p.T), key=cost.excess.__getitem__)
        if cost.excess[worst] > 0:
            why = ("the problem disables recomputation" if not p.remat else
                   f"the cheapest recomputation takes {min(p.cpu):.6g}, over the {slack:.6g} of runtime left")
            return (f"paging is off and {why}, so every schedule holds each value from its computation to its "
                    f"last read: stage {worst} then needs {cost.excess[worst] + p.ram_budget:g} bytes, over the "
                    f"RAM budget {p.ram_budget:g}")
    return None


class Greedy:
    """The greedy's decisions: extra[t] (nodes recomputed in stage t), paged (values paged out in
    the stage after their computation), kept[i] (the reads of a paged value i whose gap before
    them it stays in RAM instead of being paged in)."""

    def __init__(self, p: Problem, g: Graph):
        self.p, self.g = p, g
        self.extra: list[set] = [set() for _ in range(p.T)]
        self.paged: set = set()
        self.kept: dict[int, set] = {}

    def plan(self) -> tuple[Plan, dict]:
        """The plan of the decisions, and each value's gaps {i: [(first stage held, read stage)]}."""
        g, T = self.g, self.p.T
        comp = [{t} | self.extra[t] for t in range(T)]
        held, disk, pin, pout = ([set() for _ in range(T)] for _ in range(4))
        computed: list[list[int]] = [[] for _ in range(T)]
        reads: list[list[int]] = [[] for _ in range(T)]
        for t in range(T):
            for k in comp[t]:
                computed[k].append(t)
            for i in {u for k in comp[t] for u in g.preds[k]} - comp[t]:
                reads[i].append(t)
        gaps: dict[int, list] = {}
        for i in range(T):
            made = sorted(computed[i])
            paged = i in self.paged
            last, j, pins = -1, 0, []
            for n in sorted(reads[i]):
                while j < len(made) and made[j] < n:
                    last, j = max(last, made[j]), j + 1
                if last < n - 1:
                    gaps.setdefault(i, []).append((last + 1, n))
                if last < n - 1 and paged and n - 1 >= i + 2 and n not in self.kept[i]:
                    pins.append(n - 1)
                    held[n].add(i)
                else:
                    for s in range(last + 1, n + 1):
                        held[s].add(i)
                last = n
            if pins:
                held[i + 1].add(i)
                pout[i + 1].add(i)
                for s in range(i + 2, max(pins) + 1):
                    disk[s].add(i)
                for s in pins:
                    pin[s].add(i)
        return Plan(comp, held, disk, pin, pout), gaps

    def moves(self, plan: Plan, gaps: dict, cost: Cost, banned: set, paging_first: bool = False) -> list[tuple]:
        """(energy per byte of excess removed, move) for each value held over the worst stage, the
        least first (`paging_first`: every page-out before any recomputation)."""
        p = self.p
        worst = max(range(p.T), key=cost.excess.__getitem__)
        found = []
        for i in plan.held[worst]:
            for a, n in gaps.get(i, []):
                if not a <= worst < n:
                    continue
                options = []
                if p.paging and n - 1 >= i + 2 and worst >= i + 2:
                    options.append((p.pagein[i] + (0 if i in self.paged else p.pageout[i]), ("page", i, n),
                                    max(a, i + 2)))
                if p.remat and cost.runtime + p.cpu[i] <= p.runtime_budget:
                    options.append((p.compute[i], ("recompute", i, n), a))
                for energy, move, first in options:
                    if move in banned:
                        continue
                    gain = sum(min(p.ram[i], cost.excess[s]) for s in range(first, n) if cost.excess[s] > 0)
                    if gain > 0:
                        found.append((energy / gain, move))
        # a recomputation in the worst stage holds its inputs there: paging the value in instead
        # can free them (tried last, kept when it does not make the excess worse)
        found.sort(key=lambda x: (paging_first and x[1][0] != "page", x))
        found += [(math.inf, ("hold", x, worst)) for x in sorted(self.extra[worst]) if ("hold", x, worst) not in banned]
        return found

    def apply(self, move: tuple) -> None:
        kind, i, n = move
        if kind == "recompute":
            self.extra[n].add(i)
            return
        if kind == "hold":  # a recomputation taken back: i paged in for the read at n where it can be, else held
            self.extra[n].discard(i)
            if not (self.p.paging and n - 1 >= i + 2):
                return
        if i in self.paged:
            self.kept[i].discard(n)
        else:
            self.paged.add(i)
            self.kept[i] = set(range(self.p.T)) - {n}

    def snapshot(self) -> tuple:
        return [set(x) for x in self.extra], set(self.paged), {i: set(k) for i, k in self.kept.items()}

    def restore(self, snap: tuple) -> None:
        self.extra, self.paged, self.kept = snap


def greedy(p: Problem, g: Graph, deadline: float, paging_first: bool = False) -> tuple[Plan, Cost] | None:
    """A plan that fits, or None when the greedy finds none (not a proof). `paging_first`: the
    repair search, which takes every page-out it can before any recomputation."""
    state = Greedy(p, g)
    plan, gaps = state.plan()
    cost = measure(p, g, plan)
    banned: set = set()
    over = sum(e for e in cost.excess if e > 0)
    while over > 0 and time.perf_counter() < deadline:
        moves = state.moves(plan, gaps, cost, banned, paging_first)
        if not moves:
            return None
        move = moves[0][1]
        snap = state.snapshot()
        state.apply(move)
        trial, trial_gaps = state.plan()
        trial_cost = measure(p, g, trial)
        trial_over = sum(e for e in trial_cost.excess if e > 0)
        banned.add(move)
        if (trial_over < over or move[0] == "hold" and trial_over <= over) and \
                trial_cost.runtime <= p.runtime_budget * (1 + RUNTIME_SLACK):
            plan, gaps, cost, over = trial, trial_gaps, trial_cost, trial_over
            if move[0] == "hold":
                banned.add(("recompute", move[1], move[2]))
        else:
            state.restore(snap)
    if not cost.fits(p):
        return None
    return take_back(state, plan, cost, deadline)


def take_back(state: Greedy, plan: Plan, cost: Cost, deadline: float) -> tuple[Plan, Cost]:
    """Undo, the costliest first, each recomputation, paged value and page-in the budget allows
    without them (a later step can make an earlier one needless)."""
    p = state.p
    undos = [(p.compute[i], ("extra", t, i)) for t in range(p.T) for i in state.extra[t]]
    undos += [(p.pageout[i], ("unpage", i, None)) for i in state.paged]
    undos += [(p.pagein[i], ("keep", i, n)) for i in state.paged for n in range(p.T) if n not in state.kept[i]]
    for _, (kind, a, b) in sorted(undos, key=lambda x: -x[0]):
        if time.perf_counter() > deadline:
            break
        snap = state.snapshot()
        if kind == "extra":
            state.extra[a].discard(b)
        elif kind == "unpage" and a in state.paged:
            state.paged.discard(a)
            del state.kept[a]
        elif kind == "keep" and a in state.paged:
            state.kept[a].add(b)
        else:
            continue
        trial, _ = state.plan()
        trial_cost = measure(p, state.g, trial)
        if trial_cost.fits(p) and trial_cost.energy < cost.energy:
            plan, cost = trial, trial_cost
        else:
            state.restore(snap)
    return plan, cost


def milp(p: Problem, g: Graph, start: Plan | None, start_cost: Cost | None, deadline: float,
         solver: str) -> tuple[Plan | None, str]:
    """POET's MILP, tightened (module docstring), warm-started from `start` when there is one.
    (plan, solver status): the plan only when the solver found one; with no start, the status
    can be milp_mod.INFEASIBLE, the solver's proof that no schedule fits."""
    T, B = p.T, p.ram_budget
    # the last stage at which a value can still be of use: read by a node first computed then, or
    # read by a recomputation of a node of use then
    useful = list(range(T))
    for i in reversed(range(T)):
        useful[i] = max([i] + [max(v, useful[v]) for v in g.succs[i]])
    edges = len(set(p.edges))
    if time.perf_counter() + 3 * SECONDS_PER_VARIABLE * (3 * T * T + edges * T / 2) > deadline:
        return None, "not run: too large for the time left"
    baseline = sum(p.compute)
    # with no start, 1 % of the energy of computing every node once counts as OBJECTIVE_SCALE
    extra = start_cost.energy - baseline if start_cost is not None else 0.01 * baseline
    scale = OBJECTIVE_SCALE / max(extra, 1e-12 * max(baseline, 1e-30))
    lp = pulp.LpProblem("poet", pulp.LpMinimize)

    def binaries(name: str, pairs) -> dict:
        return {(t, i): lp.add_variable(f"{name}_{t}_{i}", cat=pulp.LpBinary) for t, i in pairs}

    R = binaries("R", [(t, i) for t in range(T) for i in range(t) if p.remat and t <= useful[i]])
    S = binaries("S", [(t, i) for t in range(1, T) for i in range(t) if t <= useful[i]])
    D = binaries("D", [(t, i) for t in range(2, T) for i in range(t - 1) if p.paging and t <= useful[i]])
    MI = binaries("MI", [(t, i) for t, i in D if t + 1 <= useful[i] and t < T - 1])
    MO = binaries("MO", [(t, i) for t, i in S if p.paging and t + 2 <= useful[i] and t < T - 2])

    def r(t: int, i: int):
        return 1 if i == t else R.get((t, i), 0)

    lp += scale * (pulp.lpSum(p.compute[i] * x for (t, i), x in R.items())
                   + pulp.lpSum(p.pagein[i] * x for (t, i), x in MI.items())
                   + pulp.lpSum(p.pageout[i] * x for (t, i), x in MO.items()))
    lp += pulp.lpSum(p.cpu[i] * x for (t, i), x in R.items()) <= p.runtime_budget - sum(p.cpu)
    for u, v in sorted(set(p.edges)):
        for t in range(v, T):
            if (t, v) in R or t == v:
                lp += r(t, v) <= r(t, u) + S.get((t, u), 0)
    for (t, i), x in S.items():
        lp += x <= S.get((t - 1, i), 0) + r(t - 1, i) + MI.get((t - 1, i), 0)
    for (t, i), x in D.items():
        lp += x <= D.get((t - 1, i), 0) + MO.get((t - 1, i), 0)
    for (t, i), x in MI.items():
        lp += x <= D[t, i]
    for (t, i), x in MO.items():
        lp += x <= S[t, i]
    F, U = {}, {}
    copies: dict = {}
    for u, v in p.edges:
        copies[u, v] = copies.get((u, v), 0) + 1
    held_at: list[list] = [[] for _ in range(T)]
    for (t, i), x in S.items():
        held_at[t].append(p.ram[i] / B * x)
    for t in range(T):
        freed: list[list] = [[] for _ in range(T)]  # by k: the bytes freed after node k, in budgets
        for (i, k) in copies:
            if k > t or k == T - 1 or not (k == t or (t, k) in R):
                continue
            if t in g.succs[i] and k < t:  # node t itself reads i later in the stage: never freed here
                continue
            later = [R[t, j] for j in g.succs[i] if k < j < t and (t, j) in R]
            f = F[t, i, k] = lp.add_variable(f"F_{t}_{i}_{k}", cat=pulp.LpBinary)
            keep = S.get((t + 1, i), 0)
            lp += f <= r(t, k)
            lp += f <= 1 - keep
            for x in later:
                lp += f <= 1 - x
            lp += f >= r(t, k) - keep - pulp.lpSum(later)
            freed[k].append(copies[i, k] * p.ram[i] / B * f)
        level = pulp.lpSum(held_at[t])
        for k in range(min(t + 2, T)):
            level = level + r(t, k) * p.ram[k] / B - (pulp.lpSum(freed[k - 1]) if k else 0)
            U[t, k] = lp.add_variable(f"U_{t}_{k}", 0, 1)
            lp += U[t, k] == level
            level = U[t, k]
    if start is not None:
        warm(start, R, S, D, MI, MO, F, U, p, g)
    status = milp_mod.solve(lp, solver, deadline, warm=start is not None, proves=start is None)
    if status not in milp_mod.FOUND:
        return None, status
    value = {name: {key for key, x in m.items() if (x.value() or 0) > 0.5}
             for name, m in (("R", R), ("S", S), ("D", D), ("MI", MI), ("MO", MO))}
    plan = Plan([{t} | {i for s, i in value["R"] if s == t} for t in range(T)],
                *([{i for s, i in value[m] if s == t} for t in range(T)] for m in ("S", "D", "MI", "MO")))
    return plan, status


def warm(plan: Plan, R, S, D, MI, MO, F, U, p: Problem, g: Graph) -> None:
    """Set every variable to `plan`'s value (its Free_E and U as POET's accounting makes them)."""
    for m, sets in ((R, plan.comp), (S, plan.held), (D, plan.disk), (MI, plan.pin), (MO, plan.pout)):
        for (t, i), x in m.items():
            x.setInitialValue(int(i in sets[t]))
    for (t, i, k), f in F.items():
        after = plan.held[t + 1] if t + 1 < p.T else set()
        f.setInitialValue(int(k in plan.comp[t] and i not in after
                              and not any(j in plan.comp[t] for j in g.succs[i] if j > k)))
    for (t, k), u in U.items():
        u.setInitialValue(0)  # recomputed below from the recurrence
    for t in range(p.T):
        level = sum(p.ram[i] for i in plan.held[t])
        for k in range(min(t + 2, p.T)):
            if k:
                level -= sum(p.ram[i] * F[t, i, k - 1].value() for i in g.into[k - 1] if (t, i, k - 1) in F)
            level += p.ram[k] * (k in plan.comp[t])
            U[t, k].setInitialValue(level / p.ram_budget)


def solve(p: Problem, time_limit: float, solver: str = "cbc") -> Result | NoSchedule:
    """The best schedule found within `time_limit` seconds, or why there is none: a proof, or what
    ran and how each search ended (never a search that did not run)."""
    start = time.perf_counter()
    deadline = start + max(time_limit - MARGIN, 0.5)
    g = Graph(p)
    reason = floor(p, g)
    if reason:
        return NoSchedule(True, reason)
    ran = []  # how each search that found nothing ended

    def search(name: str, **options) -> tuple[Plan, Cost] | None:
        began = time.perf_counter()
        found = greedy(p, g, deadline, **options)
        now = time.perf_counter()
        if found is None:
            ran.append(f"{name} found none ({now - began:.1f} s{', stopped at the time limit' if now >= deadline else ''})")
        return found

    found, found_by = search("greedy"), "greedy"
    if found is None:
        # The repair search's plan is a fallback, not the MILP's start: warm-started there, CBC stays
        # near a paging-heavy plan (VGG-16 on POET's Cortex-M4F at RAM 0.5: 3.620 J in 300 s, against
        # 3.447 J from no start), so the MILP runs from no start and the cheaper plan is kept.
        repaired = None
        if p.paging and time.perf_counter() < deadline:
            repaired = search("repair search (paging first)", paging_first=True)
        outcome = cold_milp(p, g, deadline, solver, ran, start)
        if repaired is None or (isinstance(outcome, Result) and outcome.cost.energy <= repaired[1].energy):
            return outcome
        plan, cost = repaired
        milp_outcome = outcome.reason if isinstance(outcome, NoSchedule) else (
            f"MILP ({solver.upper()}, no start): {outcome.cost.energy:.6g} J, above the repair search's")
        return Result(plan.schedule(), cost, False, None, milp_outcome, time.perf_counter() - start,
                      "repair search (paging first)")
    plan, cost = found
    greedy_energy = cost.energy
    status = "not run"
    if cost.energy > sum(p.compute) and time.perf_counter() < deadline - 1:
        better, status = milp(p, g, plan, cost, deadline, solver)
        if better is not None:
            better_cost = measure(p, g, better)
            if better_cost.fits(p) and better_cost.energy < cost.energy:
                plan, cost = better, better_cost
    optimal = cost.energy <= sum(p.compute) or status == "optimal"
    return Result(plan.schedule(), cost, optimal, greedy_energy, status, time.perf_counter() - start, found_by)


def cold_milp(p: Problem, g: Graph, deadline: float, solver: str, ran: list[str], start: float) -> Result | NoSchedule:
    """The MILP from no start, for the time left after the greedy searches found nothing (`ran`)."""
    name = f"MILP ({solver.upper()}, no start)"
    if time.perf_counter() >= deadline - 1:
        return NoSchedule(False, "; ".join(ran + [f"{name} not run: no time left"]))
    began = time.perf_counter()
    plan, status = milp(p, g, None, None, deadline, solver)
    seconds = time.perf_counter() - began
    if status == milp_mod.INFEASIBLE:
        return NoSchedule(True, f"{solver.upper()} proved that the MILP of the problem has no solution ("
                                f"{seconds:.1f} s), after " + " and ".join(ran))
    if plan is not None:
        cost = measure(p, g, plan)
        if cost.fits(p):
            return Result(plan.schedule(), cost, status == "optimal" or cost.energy <= sum(p.compute), None, status,
                          time.perf_counter() - start, name)
        ran.append(f"{name} ran {seconds:.1f} s; its schedule breaks POET's accounting (peak {cost.peak:g} bytes, "
                   f"runtime {cost.runtime:.6g}), so it is not used")
    elif status == milp_mod.NO_SOLUTION_IN_TIME:
        ran.append(f"{name} ran {seconds:.1f} s without a feasible point")
    elif status.startswith("not run"):
        ran.append(f"{name} {status}")
    else:
        ran.append(f"{name} ran {seconds:.1f} s: {status}")
    return NoSchedule(False, "; ".join(ran))
