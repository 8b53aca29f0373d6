"""ROAM ordering: reduction rules, the best heuristic, then tree-divided exact refinement.

1. `rules.reduce` removes every node an exchange rule places (views, in-place updates, nodes
   that only allocate), which keeps an optimum and shrinks the problem.
2. The heuristics run on the reduced problem; the baselines' orders are projected onto it. Each
   is repaired (`repair`: the peak step gets the least live bytes any order can give it, when
   that lowers the peak) and the best is the reference order. Its tails (weight gradients and
   their updates: `tails.py`) are then placed where their peaks fit. `bounds.Bound` bounds every
   order from below: reaching it ends the search with a proof.
3. The reference order is cut into a division tree (`divide.split`). Leaves whose steps reach
   the current peak are solved exactly, identical shapes once (`blocks.canonical`), in parallel
   (`jobs` processes), by the down-set search (`ideals.py`, in C), which proves narrow leaves
   optimal in milliseconds and improves wide ones within its budget of visited sets. (An ILP
   warm-started from its best, run on leaves the search did not prove, improved none of them on
   the corpus and the suite and took each leaf's full seconds: `git show 5fad6a8:BENCHMARKS.md`, issue 33.)
   Stitching a leaf's order back changes only its own steps. When every leaf at the peak is
   optimal within its borders (or out of time), the next level of the tree merges neighbours in
   pairs, so nodes can cross the old cuts; this repeats up to the root, the bound, or the
   deadline.
4. The order is expanded back through the removed nodes."""

import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field

from roam_cli.order import blocks, bounds, divide, ideals, rules, sink, tails
from roam_cli.order.greedy import SCHEDULERS
from roam_cli.order.problem import Buffer, Problem, peak, profile, reachability

LEAF_SIZE = 32
# A leaf's work is budgeted in visited down-sets, not seconds, so a run gives the same order every
# time; the seconds only cap a leaf that would overrun the deadline (or the Python reference's
# slower search, where the C extension did not build).
LEAF_STATES = 250_000  # down-sets the exhaustive search may visit (about a second in C)
# ... and at most this many bytes of them (a down-set of n nodes is n bits): a leaf's work grows with
# its states times its width, so a 20,000-node leaf visits 13,000 states (at 256 MiB: 107,000 and its
# 10 s, improving nothing on the 70B-class rank step); leaves up to 1,000 nodes keep LEAF_STATES. The
# suite's nine free plans and three 70B-class steps planned the same (`git show 5fad6a8:BENCHMARKS.md`, issue 40)
LEAF_SEEN_BYTES = 32 * 2**20
LEAF_SECONDS = 10.0
# The whole problem, once the tree has merged up to it, where it is small: the exact search may
# prove it where the bounds are one step at a time (a tiny model's step, weights outweighing
# activations: 352 reduced nodes proven at 352,745 down-sets, 7.2 % above its bound)
WHOLE_NODES = 2048
WHOLE_STATES_FACTOR = 4  # times a leaf's states
WHOLE_SEEN_BYTES = 256 * 2**20
WHOLE_SECONDS = 10.0
SEQUENCE_SECONDS = 10.0  # at most, for the sequence bound (`bounds.sequenced`) where the gap stays open
RESTARTS = 3  # searches started again from the order found, where the gap stays open


@dataclass(frozen=True)
class Leaf:
    """One shape to solve: its canonical problem and the best order known for it."""
    problem: Problem
    warm: list[int]
    seconds: float
    states: int = LEAF_STATES
    seen_bytes: int = LEAF_SEEN_BYTES


@dataclass
class Stats:
    reduced_nodes: int = 0
    removed: dict = field(default_factory=dict)
    reference: str = ""
    lower_bound: int = 0
    levels: int = 0
    passes: int = 1
    repairs: int = 0
    leaves_solved: int = 0
    shapes_solved: int = 0
    shapes_reused: int = 0
    proven_optimal: bool = False
    at_target: bool = False  # the search stopped because the peak reached the caller's target
    restarts: int = 0  # searches started again from the order found


def solve_leaf(leaf: Leaf) -> tuple[list[int], bool]:
    """(order, proven optimal) for one canonical leaf."""
    bound = bounds.lower_bound(leaf.problem, leaf.warm)
    states = min(leaf.states, leaf.seen_bytes // (8 * (leaf.problem.n // 64 + 1)))
    found = ideals.solve(leaf.problem, leaf.warm, states, time.perf_counter() + leaf.seconds, bound)
    return found.order, found.optimal


def repair(rp: Problem, order_: list[int], bound: bounds.Bound) -> tuple[list[int], int]:
    """Give the peak step the least live bytes it can have: its node runs right after the
    smallest set of nodes that achieves the step minimum (`bounds.best_prefix`), in their current
    order, and everything else after it; repeated while the whole peak drops. Returns the order
    and how many moves were kept."""
    moves = 0
    while order_:
        steps = profile(rp, order_)
        if max(steps) <= bound.value:  # nothing below the bound to gain
            break
        v = order_[steps.index(max(steps))]
        first = set(bound.prefix(v)[1])
        candidate = [w for w in order_ if w in first] + [v] + [w for w in order_ if w not in first and w != v]
        if peak(rp, candidate) >= max(steps):
            break
        order_, moves = candidate, moves + 1
    return order_, moves


def order(problem: Problem, references: dict[str, list[int]], deadline: float, jobs: int = 1,
          progress=None, gap: float = 0.0, target: int | None = None,
          leaf_states: int = LEAF_STATES) -> tuple[list[int], Stats]:
    """The ROAM order of `problem`, never worse than any of `references` (orders of `problem`).
    The search stops at the deadline, once the peak is within `gap` (a fraction) of the bound, or
    once it is at most `target` bytes (what a caller needs, such as a budget; None: no target).
    `leaf_states`: the down-sets each leaf's exact search may visit.

    Where the search ends outside the gap, the bound is raised on the whole problem, and the search
    starts again from its own order (at most RESTARTS times, while that lowers the peak): its
    reference orders, tails and division tree are then those of an order already interleaved."""
    say = progress or (lambda message: None)
    say("roam: applying the reduction rules")
    red = rules.reduce(problem)
    found, stats = searched(problem, red, references, deadline, jobs, say, gap, target, leaf_states)
    whole = None
    while not stats.proven_optimal and not stats.at_target:
        top = peak(problem, found)
        if top <= bounds.within_gap(stats.lower_bound, gap):
            break
        # the reduction keeps the optimum, not each step's: a removed node's step (an update's first
        # temporary, where its gradient is live) can have a higher minimum than any step left
        say("roam: raising the bound on the whole problem")
        whole = whole or bounds.Bound(problem, *reachability(problem))
        stats.lower_bound = max(stats.lower_bound, whole.raised(found))
        if top > bounds.within_gap(stats.lower_bound, gap):
            say("roam: bounding the sequences the highest steps can run in")
            stats.lower_bound = max(stats.lower_bound, whole.sequenced(found, deadline=time.perf_counter()
                                                                      + SEQUENCE_SECONDS))
        stats.proven_optimal = top <= stats.lower_bound
        if (top <= bounds.within_gap(stats.lower_bound, gap) or stats.restarts == RESTARTS
                or time.perf_counter() >= deadline):
            break
        say("roam: searching again from its own order")
        again, again_stats = searched(problem, red, {"roam": found}, deadline, jobs, say, gap, target, leaf_states)
        stats.restarts += 1
        if peak(problem, again) >= top:
            break
        again_stats.lower_bound = max(again_stats.lower_bound, stats.lower_bound)
        again_stats.restarts, again_stats.reference = stats.restarts, f"{stats.reference}; again: {again_stats.reference}"
        found, stats = again, again_stats
    return found, stats


def searched(problem: Problem, red: rules.Reduction, references: dict[str, list[int]], deadline: float, jobs: int,
             say, gap: float, target: int | None, leaf_states: int) -> tuple[list[int], Stats]:
    """One search of the reduced problem `red` from the best of `references` and the heuristics."""
    stats = Stats()
    rp = red.problem
    stats.reduced_nodes = rp.n
    for _, rule, _ in red.removed:
        stats.removed[rule] = stats.removed.get(rule, 0) + 1

    index = {v: i for i, v in enumerate(red.kept)}
    candidates = {name: [index[v] for v in ref if v in index] for name, ref in references.items()}
    for name, scheduler in SCHEDULERS.items():
        candidates[f"{name} (reduced)"] = scheduler(rp)
    anc, desc = reachability(rp)
    bound = bounds.Bound(rp, anc, desc)
    repaired = {name: repair(rp, c, bound) for name, c in candidates.items()}
    stats.reference = min(repaired, key=lambda name: (peak(rp, repaired[name][0]), name))
    start, stats.repairs = repaired[stats.reference]
    stats.lower_bound = bound.raised(start)
    placed, placed_peak = tails.improve(rp, start, desc, stats.lower_bound, peak(rp, start), gap=gap)
    if placed_peak < peak(rp, start):
        start, stats.reference = placed, f"{stats.reference}, tails placed"
        stats.lower_bound = bound.raised(start)
    # also at the bound: sinking lowers the steps off the peak too, where a layout at the peak finds
    # its room (BERT-large's free step: 0.161 % fragmentation after 21 s of layout search, 0.099 % in 0.5 s)
    sunk = sink.sink(rp, start)
    if sunk != start:
        start, stats.reference = sunk, f"{stats.reference}, sunk"
        stats.lower_bound = bound.raised(start)
    with ProcessPoolExecutor(jobs) if jobs > 1 else nullcontext() as pool:
        search = Search(rp, bound, start, deadline, jobs, pool, stats, say, gap, target, leaf_states)
        best = search.run()
    return red.expand(best), stats


class Search:
    """The division tree walked bottom up, refining the segments that hold the peak."""

    def __init__(self, rp: Problem, bound: bounds.Bound, start: list[int], deadline: float,
                 jobs: int, pool, stats: Stats, say, gap: float = 0.0, target: int | None = None,
                 leaf_states: int = LEAF_STATES):
        self.rp, self.bound, self.current, self.deadline, self.gap = rp, bound, start, deadline, gap
        self.target, self.leaf_states = target, leaf_states
        self.jobs, self.pool, self.stats, self.say = jobs, pool, stats, say
        self.cache: dict[tuple, tuple[list[int], bool]] = {}  # canonical shape -> (order, proven optimal)
        self.cut()

    def cut(self) -> None:
        """A new division tree, cut where the current order's short-lived buffers cross least."""
        self.segments = divide.split(self.rp.n, divide.crossing_scores(self.rp, self.current, LEAF_SIZE), LEAF_SIZE)
        self.proven: set[divide.Segment] = set()

    def run(self) -> list[int]:
        rp, stats = self.rp, self.stats
        whole = divide.Segment(0, rp.n)
        pass_peak = peak(rp, self.current)
        while time.perf_counter() < self.deadline:
            steps = profile(rp, self.current)
            top = max(steps, default=0)
            if top <= bounds.within_gap(stats.lower_bound, self.gap):
                break
            if self.target is not None and top <= self.target:
                stats.at_target = True
                break
            if self.repair():
                continue
            todo = [s for s in self.segments if s not in self.proven and max(steps[s.start:s.stop]) >= top]
            if todo:
                self.solve(todo)
                if peak(rp, self.current) < top:
                    stats.lower_bound = self.bound.raised(self.current)
                    continue
            # every segment at the peak is optimal within its borders or out of budget: merge
            # neighbours so nodes can cross the cuts
            if len(self.segments) > 1:
                self.segments = divide.parents(self.segments)
                stats.levels += 1
                continue
            # past the root: if this pass lowered the peak, the changed order is cut elsewhere
            if whole in self.proven or peak(rp, self.current) >= pass_peak:
                break
            pass_peak = peak(rp, self.current)
            self.cut()
            stats.passes += 1
        stats.proven_optimal = peak(rp, self.current) <= stats.lower_bound or whole in self.proven
        if whole in self.proven:  # the exact search over the whole problem is itself the bound
            stats.lower_bound = max(stats.lower_bound, peak(rp, self.current))
        return self.current

    def repair(self) -> bool:
        improved, moves = repair(self.rp, self.current, self.bound)
        if not moves:
            return False
        self.current = improved
        self.stats.repairs += moves
        self.stats.lower_bound = self.bound.raised(self.current)
        self.cut()  # the order moved across the old cuts
        return True

    def solve(self, todo: list[divide.Segment]) -> None:
        """Solve the segments' shapes not solved yet (in parallel), then stitch every segment's
        best order in, left to right, keeping a stitch only when the whole peak does not rise."""
        placed = []  # (segment, canonical numbering, key)
        fresh: dict[tuple, list[int]] = {}  # key -> best warm start among the segments of that shape
        for seg in todo:
            sub = divide.subproblem(self.rp, self.current, seg)
            key, numbering = blocks.canonical(sub)
            placed.append((seg, numbering, key))
            if key in self.cache:
                continue
            renumber = {v: i for i, v in enumerate(numbering)}
            warm = [renumber[v] for v in range(sub.n)]  # the segment's current order
            canon = Problem(key[0], tuple(Buffer(*b) for b in key[1]))
            if key not in fresh or peak(canon, warm) < peak(canon, fresh[key]):
                fresh[key] = warm
        self.stats.shapes_reused += len(placed) - len(fresh)
        left = max(1.0, self.deadline - time.perf_counter())
        keys = list(fresh)
        tasks = [self.leaf(Problem(k[0], tuple(Buffer(*b) for b in k[1])), fresh[k], left) for k in keys]
        parallel = self.pool is not None and len(tasks) > 1
        for done, (key, (local, optimal)) in enumerate(
                zip(keys, self.pool.map(solve_leaf, tasks) if parallel else map(solve_leaf, tasks)), 1):
            self.cache[key] = (local, optimal)
            self.stats.shapes_solved += 1
            self.report(f"shape {done}/{len(tasks)}")
        for seg, numbering, key in placed:
            local, optimal = self.cache[key]
            candidate = divide.stitch(self.current, seg, [numbering[i] for i in local])
            if peak(self.rp, candidate) <= peak(self.rp, self.current):
                self.current = candidate
            if optimal:
                self.proven.add(seg)
            self.stats.leaves_solved += 1
        self.report("stitched")

    def leaf(self, problem: Problem, warm: list[int], left: float) -> Leaf:
        """A segment's task: a leaf's budget, or the whole problem's where it is small."""
        if problem.n == self.rp.n and problem.n <= WHOLE_NODES:
            return Leaf(problem, warm, min(WHOLE_SECONDS, left), self.leaf_states * WHOLE_STATES_FACTOR,
                        WHOLE_SEEN_BYTES)
        return Leaf(problem, warm, min(LEAF_SECONDS, left), self.leaf_states)

    def report(self, doing: str) -> None:
        s = self.stats
        left = max(0.0, self.deadline - time.perf_counter())
        self.say(f"roam: tree level {s.levels} ({len(self.segments)} segments), {doing}; peak "
                 f"{peak(self.rp, self.current) / 2**20:.2f} MiB, bound {s.lower_bound / 2**20:.2f} MiB; "
                 f"{s.shapes_solved} shapes solved, {s.shapes_reused} reused; {left:.0f} s left")
