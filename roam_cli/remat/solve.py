"""The least-compute schedule that fits a budget: orders from roam's ordering, then eviction with
recomputation, searched until the time limit.

1. Without recomputation the best a schedule can do is the least peak of any topological order:
   roam's ordering (`order.roam`) finds it (or bounds it) with the graph's nodes as buffers. If
   it fits, the schedule computes every node once: optimal, as no schedule computes less.
2. Otherwise each candidate order is replayed under the budget (`replay`): a value stays held
   after its last reader of the order too, as a cache for recomputations; when a step would
   overflow, held values the step does not read are dropped, the cache first, then the one whose
   loss costs least (its recomputation with every dropped value it needs, per byte, per step
   until its next read); a read of a dropped value recomputes it, and recursively what it reads.
   Dropping is retroactive under Moccasin's accounting: a dropped value's lifetime simply ends at
   its last read so far, so no earlier step grows. Each replay is then trimmed (`trim`).
3. The best replay is run again with each of its recomputed values dropped last (`protect`);
   then replays vary the eviction weights and break ties at random (seeded) until the time
   limit, or until the best stops improving (`stale_at`). The least total compute wins; it is
   proven optimal only when it is the baseline (every node once)."""

import random
import sys
import time
from dataclasses import dataclass

from roam_cli.order import roam as roam_order
from roam_cli.order.greedy import SCHEDULERS
from roam_cli.order.problem import Buffer, Problem, peak as order_peak
from roam_cli.remat.graph import Graph, cost

ORDER_SHARE = 0.3  # of the time limit, for the ordering without recomputation
WEIGHTS = [(3.0, 1.0, 0.0), (4.0, 1.0, 0.0), (2.0, 1.0, 0.0), (3.0, 0.5, 0.0), (6.0, 1.0, 0.0), (1.0, 1.0, 0.0)]
STEP_CAP = 4  # a replay longer than this many times the node count is thrashing: given up
NOISE = 0.3  # relative random perturbation of the eviction score in the random replays
REDO_REACH = 100  # a recomputation needing more dropped values than this counts as unaffordable
STALE_SECONDS = 5.0


@dataclass
class Result:
    schedule: list[int]  # node indices, a repeat is a recomputation
    peak: int
    compute: int
    optimal: bool
    min_peak_order: int  # the least peak found without recomputation
    replays: int


class Overflow(Exception):
    """The replay reached a step that cannot fit (everything it could drop is already dropped),
    spent more compute than `limit` (a better schedule is known, or it thrashes), or ran out of
    time."""


def problem_of(graph: Graph) -> Problem:
    succs = graph.succs
    return Problem(graph.preds, tuple(Buffer(graph.ram[v], (v,), succs[v]) for v in range(graph.n)))


def replay(graph: Graph, order: list[int], budget: int, weights: tuple[float, float, float],
           rng: random.Random | None, limit: int, deadline: float, protected: frozenset = frozenset()) -> list[int]:
    """The schedule of `order` under `budget`, recomputing dropped values where read; Overflow if
    a step cannot fit, the compute reaches `limit` or the time `deadline`. weights = (exponent of the value's recompute
    time, of the distance to its next read, noise). `protected` values are dropped last."""
    succs, preds, ram, cpu = graph.succs, graph.preds, graph.ram, graph.cpu
    pos = {v: i for i, v in enumerate(order)}
    readers = [sorted(s, key=pos.__getitem__) for s in succs]  # first-computation order
    nxt = [0] * graph.n  # index into readers[u] of u's next unrun reader
    left = [len(s) for s in succs]
    live: set[int] = set()
    live_bytes = 0
    schedule: list[int] = []
    spent = 0
    now = 0
    a, b, noise = weights

    def redo(x: int, cap: float) -> float:
        """Compute to get x back at its next read: x and, recursively, every input that will not
        be held by then (dropped already, or read last before that step); DTR's evicted
        neighbourhood (Kirisame et al. 2021) looked at from the read. Past REDO_REACH values, or
        past `cap`, it counts as unaffordable."""
        then = pos[readers[x][nxt[x]]]
        seen, todo, total = {x}, [x], 1
        while todo:
            y = todo.pop()
            total += cpu[y]
            if total > cap:
                return float("inf")
            for p in preds[y]:
                if p in seen or (p in live and left[p] and pos[readers[p][-1]] >= then):
                    continue
                if len(seen) >= REDO_REACH:
                    return float("inf")
                seen.add(p)
                todo.append(p)
        return total

    def victim(candidates: list[int]) -> int:
        """The value to drop: one no later node of the order reads (a cache for recomputations,
        free to drop), the largest; else the cheapest loss, redo^a / bytes / distance^b, among
        the unprotected values if any. Candidates are tried by a lower bound of their score
        (redo >= their own time), and a redo stops once it cannot win."""
        cached = [x for x in candidates if left[x] == 0]
        if cached:
            return max(cached, key=ram.__getitem__)
        pool = [x for x in candidates if x not in protected] or candidates
        weight = {x: (1 + noise * rng.random() if rng else 1) / (ram[x] + 1) / (pos[readers[x][nxt[x]]] - now) ** b
                  for x in pool}
        best, least = pool[0], float("inf")
        for x in sorted(pool, key=lambda x: (cpu[x] + 1) ** a * weight[x]):
            if (cpu[x] + 1) ** a * weight[x] >= least:
                break
            s = redo(x, (least / weight[x]) ** (1 / a) if a else float("inf")) ** a * weight[x]
            if s < least:
                best, least = x, s
        return best

    def drop(x: int) -> None:
        nonlocal live_bytes
        live.discard(x)
        live_bytes -= ram[x]

    def compute(v: int, pinned: frozenset) -> None:
        nonlocal live_bytes, spent
        keep = pinned | set(preds[v])
        for u in sorted(preds[v], key=pos.__getitem__):
            if u not in live:
                compute(u, keep)
        while live_bytes + ram[v] > budget:
            victims = [x for x in live if x not in keep]
            if not victims:
                raise Overflow
            drop(victim(victims))
        spent += cpu[v]
        if spent >= limit or len(schedule) > STEP_CAP * graph.n or time.perf_counter() > deadline:
            raise Overflow
        schedule.append(v)
        live.add(v)
        live_bytes += ram[v]

    depth = sys.getrecursionlimit()
    sys.setrecursionlimit(max(depth, 4 * graph.n + 100))
    try:
        for now, v in enumerate(order):
            compute(v, frozenset())
            for u in preds[v]:
                left[u] -= 1
                nxt[u] += 1
    finally:
        sys.setrecursionlimit(depth)
    return schedule


def trim(graph: Graph, schedule: list[int], budget: int, deadline: float) -> list[int]:
    """`schedule` without the recomputations it can do without: each repeated run, the costliest
    first, is removed when every read still finds its value and the peak stays within `budget`
    (the replay drops greedily, and a later drop can make an earlier recomputation needless).
    Passes over the repeated runs until one removes nothing."""
    removed = True
    while removed:
        removed = False
        runs: dict[int, int] = {}
        for v in schedule:
            runs[v] = runs.get(v, 0) + 1
        kept = [True] * len(schedule)
        for step in sorted((j for j, v in enumerate(schedule) if runs[v] > 1), key=lambda j: -graph.cpu[schedule[j]]):
            if time.perf_counter() > deadline:
                break
            if runs[schedule[step]] == 1:
                continue
            kept[step] = False
            try:
                fits = cost(graph, [v for j, v in enumerate(schedule) if kept[j]])[0] <= budget
            except ValueError:
                fits = False
            if fits:
                runs[schedule[step]] -= 1
                removed = True
            else:
                kept[step] = True
        schedule = [v for j, v in enumerate(schedule) if kept[j]]
    return schedule


def candidate_orders(graph: Graph, deadline: float) -> tuple[dict[str, list[int]], int]:
    """Topological orders to replay ({name: order}, the least peak among them): the given one,
    XLA's list and DFS schedulers, and roam's least-peak order."""
    problem = problem_of(graph)
    orders = {"given": list(graph.order)}
    orders.update({name: scheduler(problem) for name, scheduler in SCHEDULERS.items()})
    found, _ = roam_order.order(problem, dict(orders), deadline)
    orders["roam"] = found
    return orders, min(order_peak(problem, o) for o in orders.values())


def solve(graph: Graph, budget: int, time_limit: float, seed: int = 0) -> Result | None:
    """The least-compute schedule found within `time_limit` seconds, None when no replay fits."""
    start = time.perf_counter()
    deadline = start + time_limit
    orders, least = candidate_orders(graph, start + ORDER_SHARE * time_limit)
    baseline = sum(graph.cpu)
    best: Result | None = None
    replays = 0
    improved = start  # when the best last improved
    setting: tuple = ()  # (order, weights, protected) of the best replay

    def stale_at() -> float:
        """The random replays stop once the best has not improved for as long as it took to find
        it (and at least STALE_SECONDS)."""
        return improved + max(STALE_SECONDS, improved - start) if best is not None else deadline

    def consider(order: list[int], weights, rng, protected: frozenset = frozenset()) -> bool:
        """Replay; True when it gave a new best (kept with how it was made, in `setting`)."""
        nonlocal best, replays, improved, setting
        replays += 1
        try:
            limit = best.compute if best is not None else STEP_CAP * baseline + 1
            schedule = trim(graph, replay(graph, order, budget, weights, rng, limit, deadline, protected), budget, deadline)
        except Overflow:
            return False
        peak, compute = cost(graph, schedule)
        if peak > budget or (best is not None and (compute, peak) >= (best.compute, best.peak)):
            return False
        best = Result(schedule, peak, compute, compute == baseline, least, 0)
        improved, setting = time.perf_counter(), (order, weights, protected)
        return True

    def protect() -> None:
        """The best replay again with one of its recomputed values dropped last, the costliest
        recomputations first, while that improves it: a drop the greedy made early can force
        costlier ones later."""
        while best is not None and not best.optimal and time.perf_counter() < deadline:
            order, weights, protected = setting
            runs: dict[int, int] = {}
            for v in best.schedule:
                runs[v] = runs.get(v, 0) + 1
            redone = sorted((v for v, k in runs.items() if k > 1 and v not in protected),
                            key=lambda v: -(runs[v] - 1) * graph.cpu[v])
            if not any(time.perf_counter() < deadline and consider(order, weights, None, protected | {v})
                       for v in redone):
                return

    problem = problem_of(graph)
    for order in sorted(orders.values(), key=lambda o: order_peak(problem, o)):
        for weights in WEIGHTS:
            if (best is not None and best.optimal) or time.perf_counter() > deadline:
                break
            consider(order, weights, None)
    protect()
    rng = random.Random(seed)
    names = sorted(orders)
    while (best is None or not best.optimal) and time.perf_counter() < min(deadline, stale_at()):
        a, b, _ = rng.choice(WEIGHTS)
        consider(orders[rng.choice(names)], (a, b, NOISE), rng)
    if best is not None:
        best.replays = replays
    return best
