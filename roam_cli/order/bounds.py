"""Lower bounds on the peak of every order of a problem: they turn a good order into a proven one.

- `surely_live_at()`: at v's step a buffer is live in every order when one of its allocators is v
  or an ancestor and one of its readers is v or a descendant (or it lives to the end); every
  buffer that entered live is live at the first step, every one living to the end at the last.
- `step_minimum(v)`: the least live bytes v's step can have in any order, exactly, as a
  minimum cut. The nodes run before v form a down-set D with anc(v) in D and desc(v) outside;
  a buffer costs its bytes when an allocator is in D + {v} and a reader outside D (or it lives
  to the end). In the flow network a node on the source side is in D; edge w -> u (infinite)
  for every predecessor u of w keeps D down-closed; per buffer, allocators -> y (infinite),
  y -> z (its bytes), z -> readers (infinite): the bytes are cut exactly when an allocator is
  before or at v and a reader at or after it (y is the allocator itself when there is one, z the
  reader: most buffers are one edge). Buffers nobody reads are left out (a bound may
  undercount). Both bound the peak from below, so peak == bound proves an order optimal.
  `Bound` takes the step minimum where the most bytes are surely live and at each order's
  highest steps.
- `pair(v, u)`: in every order u runs before v or v before u, so the peak is at least the smaller
  of the step minimum of v with u forced before it and that of u with v forced before it. A node
  whose step is cheap only early (a weight copy recomputed for the backward: alone at the start of
  the step it costs nothing, but its output then lives through the forward's peak) gets its price
  from the nodes its output's readers wait for: run before them, it is live at their steps.
- `sequenced(members)`: every order runs a set of nodes in some sequence (one its edges allow),
  and at each member's step the members before it have run and those after it have not. The least,
  over all sequences, of the highest such step minimum bounds the peak: a bottleneck shortest
  path over the subsets run so far (Dijkstra; anytime: the least open subset's value bounds it
  when the budget ends first). It grows with the set, and catches what one step or one pair
  cannot: a weight-dominated step's updates, each cheap alone, competing for the few places
  where little else is live (a tiny Qwen2's bf16 free step: 85,248 -> 99,584 B)."""

import heapq
import time

import numpy as np

from roam_cli.order.problem import Problem, profile, reachability
from roam_cli.solvers.maxflow import min_cut

PEAK_STEPS = 8  # how many of an order's highest steps get the exact step bound
# ... on a problem of at most SMALL nodes, where a cut costs little: a step bound can be high at a
# node whose step is not among the order's highest (fp16's check that every gradient is finite,
# which every update waits for, one step below the updates that peak)
SMALL, SMALL_PEAK_STEPS = 2048, 64
PAIR_STEPS = 4  # ... and of those, how many get pair bounds where they stay below them,
PARTNERS = 4  # each with at most this many partners
# The sequence bound's members are drawn from the nodes at an order's SEQUENCE_CANDIDATES highest
# steps; its work is budgeted in minimum cuts, so a run bounds the same every time
SEQUENCE_CANDIDATES = 60
SEQUENCE_CUTS = 20_000


def lower_bound(problem: Problem, order: list[int] | None = None) -> int:
    """The surely-live bound, raised by the exact step minimum where the most bytes are surely
    live and at `order`'s highest steps (where a proof that the order is optimal must come from)."""
    return Bound(problem, *reachability(problem)).raised(order or [])


class Bound:
    """One problem's lower bound, raised as orders come: the surely-live bound is computed once
    and each node's step minimum at most once (neither depends on an order)."""

    def __init__(self, problem: Problem, anc: list[int], desc: list[int]):
        self.problem, self.anc, self.desc = problem, anc, desc
        self.surely = surely_live_at(problem, anc, desc)
        self.value = max(int(self.surely.max(initial=0)), held_throughout(problem))
        self.prefixes: dict[int, tuple[int, list[int]]] = {}  # node -> best_prefix()
        self.pairs: dict[tuple[int, int], int] = {}  # (u, v), u < v -> pair()
        self.witness: list[int] = []  # the nodes whose step or pair bound is the value
        # Where the most bytes are surely live (a training step's loss, with every kept activation)
        # the step minimum is high in every order, even where a poor order peaks elsewhere.
        if problem.n:
            self.raise_to(self.prefix(int(self.surely.argmax()))[0], [int(self.surely.argmax())])

    def raise_to(self, value: int, witness: list[int]) -> None:
        if value > self.value:
            self.value, self.witness = value, witness

    def prefix(self, v: int) -> tuple[int, list[int]]:
        if v not in self.prefixes:
            self.prefixes[v] = best_prefix(self.problem, v, self.anc, self.desc)
        return self.prefixes[v]

    def raised(self, order: list[int]) -> int:
        """The bound raised by the step minima of the nodes at `order`'s highest steps, then, where
        those stay below them, by each such node's pair bounds with its partners."""
        if order:
            steps = profile(self.problem, order)
            highest = sorted(range(len(order)), key=lambda s: -steps[s])[
                :SMALL_PEAK_STEPS if self.problem.n <= SMALL else PEAK_STEPS]
            for step in highest:
                if steps[step] <= self.value:
                    break
                self.raise_to(self.prefix(order[step])[0], [order[step]])
            for step in highest[:PAIR_STEPS]:
                if steps[step] <= self.value:
                    break
                v = order[step]
                for u in self.partners(v, order, steps):
                    self.raise_to(self.pair(v, u), [v, u])
        return self.value

    def sequenced(self, order: list[int], cuts: int = SEQUENCE_CUTS, deadline: float = float("inf")) -> int:
        """The bound raised by `sequenced` on members drawn from `order`'s highest steps: first
        the nodes of the bound so far (a step's, a pair's), or the highest step minimum's, then,
        round by round, the candidate that raises the bound most, until none does or `cuts`
        minimum cuts (or the deadline) are spent."""
        steps = profile(self.problem, order)
        highest, near = [], set()  # one node of each run of neighbours (an update's chain of temporaries)
        for k in sorted(range(len(order)), key=lambda k: -steps[k]):
            v = order[k]
            if v not in near:
                highest.append(v)
                near.update(self.problem.preds[v], self.problem.succs[v])
                if len(highest) == SEQUENCE_CANDIDATES:
                    break
        members = self.witness or [max(highest, key=lambda v: self.prefix(v)[0])]
        candidates = [v for v in highest if v not in members]
        value = self.value
        budget = Budget(cuts, deadline)
        while candidates and not budget.spent():
            tried = [(sequenced(self.problem, members + [v], self.anc, self.desc, budget), v) for v in candidates]
            raised, best = max(tried, key=lambda t: t[0])
            if raised <= value:
                break
            members, value = members + [best], raised
            candidates.remove(best)
        self.raise_to(value, members)
        return self.value

    def partners(self, v: int, order: list[int], steps: list[int]) -> list[int]:
        """The nodes to pair v with: those unordered with it that its outputs' readers wait for
        (were v to run first, its outputs would be live at their steps), where `order` holds the
        most bytes, and where most bytes are surely live (the order's highest may be nodes as
        free to run early as v: the other weights' transposes)."""
        n, p = self.problem.n, self.problem
        waited = 0
        for b in p.allocs[v]:
            for r in p.buffers[b].readers:
                waited |= self.anc[r]
        candidate = np.zeros(n, dtype=bool)
        candidate[members(waited & ~(self.anc[v] | self.desc[v] | 1 << v), n)] = True
        found = np.flatnonzero(candidate)
        at = np.empty(n, dtype=np.int64)
        at[np.asarray(order, dtype=np.int64)] = np.asarray(steps, dtype=np.int64)
        by_order = found[np.argsort(-at[found], kind="stable")][:PARTNERS // 2].tolist()
        by_surely = found[np.argsort(-self.surely[found], kind="stable")][:PARTNERS].tolist()
        return list(dict.fromkeys(by_order + by_surely))[:PARTNERS]

    def pair(self, v: int, u: int) -> int:
        key = (min(u, v), max(u, v))
        if key not in self.pairs:
            self.pairs[key] = pair(self.problem, v, u, self.anc, self.desc)
        return self.pairs[key]


def pair(problem: Problem, v: int, u: int, anc: list[int], desc: list[int]) -> int:
    """The least of v's step with u run before it and of u's step with v run before it: a bound,
    since every order runs one of the two first (u and v unordered)."""
    return min(best_prefix(problem, v, anc, desc, anc[u] | 1 << u)[0],
               best_prefix(problem, u, anc, desc, anc[v] | 1 << v)[0])


class Budget:
    """Minimum cuts left to spend, and a deadline."""

    def __init__(self, cuts: int, deadline: float = float("inf")):
        self.cuts, self.deadline = cuts, deadline

    def spend(self) -> bool:
        """One cut, if any is left."""
        if self.spent():
            return False
        self.cuts -= 1
        return True

    def spent(self) -> bool:
        return self.cuts <= 0 or time.perf_counter() > self.deadline


def sequenced(problem: Problem, members: list[int], anc: list[int], desc: list[int], budget: Budget) -> int:
    """The least, over the sequences every order runs `members` in, of the highest step minimum of
    a member with those before it in the sequence run and those after it not; where the budget
    ends first, the least value still open (every sequence passes through one of those subsets,
    at that value or above)."""
    k = len(members)
    whole = (1 << k) - 1
    reached, settled, heap = {0: 0}, set(), [(0, 0)]
    while heap:
        value, ran = heapq.heappop(heap)
        if ran == whole:
            return value
        if ran in settled:
            continue
        settled.add(ran)
        first = later = 0
        for i, u in enumerate(members):
            if ran >> i & 1:
                first |= anc[u] | 1 << u
            else:
                later |= desc[u] | 1 << u
        for i, v in enumerate(members):
            if ran >> i & 1 or later & ~(desc[v] | 1 << v) & anc[v]:  # ran, or a member yet to run precedes it
                continue
            if not budget.spend():
                return value
            step = best_prefix(problem, v, anc, desc, first, later)[0]  # later holds v: it is after anyway
            bigger, grown = max(value, step), ran | 1 << i
            if bigger < reached.get(grown, bigger + 1):
                reached[grown] = bigger
                heapq.heappush(heap, (bigger, grown))
    return 0


def held_throughout(problem: Problem) -> int:
    """What the first step or the last holds in every order: the buffers that entered live, or
    those living to the end."""
    entered = sum(b.bytes for b in problem.buffers if not b.alloc)
    staying = sum(b.bytes for b in problem.buffers if b.to_end)
    return problem.base + max(entered, staying)


def surely_live_at(problem: Problem, anc: list[int], desc: list[int]) -> np.ndarray:
    """The bytes surely live at each node's step (base included)."""
    n = problem.n
    total = np.full(n, problem.base, dtype=np.int64)
    everyone = (1 << n) - 1
    width = (n + 7) // 8
    rows: list[bytes] = []  # the surely-live sets not yet added, packed, and their buffers' bytes
    weights: list[int] = []

    def add() -> None:
        """total += the bytes of each pending buffer at each of its steps: one product of the rows
        (a 405B-class step's 30,000 sets of 45,000 nodes, 256 at a time), not a call per buffer."""
        packed = np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), width)
        bits = np.unpackbits(packed, axis=1, bitorder="little")[:, :n]
        total[:] += np.asarray(weights, dtype=np.int64) @ bits
        rows.clear(), weights.clear()

    for buf in problem.buffers:
        after = everyone
        if buf.alloc:
            after = 0
            for a in buf.alloc:
                after |= desc[a] | 1 << a
        before = everyone
        if not buf.to_end:
            before = 0
            for r in buf.readers:
                before |= anc[r] | 1 << r
        surely = after & before
        if surely:
            rows.append(surely.to_bytes(width, "little"))
            weights.append(buf.bytes)
            if len(rows) == 256:
                add()
    if rows:
        add()
    return total


def members(bits: int, n: int) -> np.ndarray:
    """The positions of the set bits of `bits` (< 2**n), ascending: one pass in C, where a loop
    over the bits of a saved activation's thousands of steps costs each a big-integer operation."""
    packed = np.frombuffer(bits.to_bytes((n + 7) // 8, "little"), dtype=np.uint8)
    return np.flatnonzero(np.unpackbits(packed, bitorder="little")[:n])


def step_minimum(problem: Problem, v: int, anc: list[int], desc: list[int]) -> int:
    return best_prefix(problem, v, anc, desc)[0]


def best_prefix(problem: Problem, v: int, anc: list[int], desc: list[int], first: int = 0,
                later: int = 0) -> tuple[int, list[int]]:
    """(the least live bytes of v's step in any order, the nodes that run before v there); with
    `first` (a set of nodes closed under ancestors, none a descendant of v), in any order that runs
    them before v; with `later` (closed under descendants, no ancestor of v nor in `first`), in any
    order that runs them after it.

    Only the nodes unordered with v are free to run before or after it: v's ancestors are
    contracted into the source, v and its descendants into the sink, and a buffer whose side
    they settle costs its bytes as a constant (allocated by an ancestor or v, read by v or a
    descendant) or nothing. The network holds the rest, a fraction of a large graph."""
    n = problem.n
    before_v = np.zeros(n, dtype=bool)
    before_v[members(anc[v] | first, n)] = True
    after_v = np.zeros(n, dtype=bool)
    after_v[members(desc[v] | later, n)] = True
    after_v[v] = True
    is_free = ~before_v & ~after_v
    free = np.flatnonzero(is_free)
    index = np.full(n, -1, dtype=np.int64)
    index[free] = np.arange(len(free))
    source, sink = len(free), len(free) + 1
    # each buffer's side, settled by v's ancestors and descendants or left to the cut, for all
    # buffers at once (a 70B-class step has 100,000 of them, and a training step's peak nodes
    # need a dozen of these bounds); the network is built as arrays too, and cut in C
    t = problem.tables
    settled_before = before_v.copy()
    settled_before[v] = True

    def any_of(has: np.ndarray, nodes: np.ndarray, starts: np.ndarray, mark: np.ndarray) -> np.ndarray:
        out = np.zeros(len(has), dtype=bool)
        if len(nodes):
            out[has] = np.logical_or.reduceat(mark[nodes], starts)
        return out

    allocated = ~t.has_alloc | any_of(t.has_alloc, t.alloc_nodes, t.alloc_starts, settled_before)
    free_allocator = any_of(t.has_alloc, t.alloc_nodes, t.alloc_starts, is_free)
    read = t.to_end | any_of(t.has_readers, t.reader_nodes, t.reader_starts, after_v)
    free_reader = any_of(t.has_readers, t.reader_nodes, t.reader_starts, is_free)
    counted = (t.has_readers | t.to_end) & (allocated | free_allocator) & (read | free_reader)
    constant = int(t.sizes[counted & allocated & read].sum())
    # the buffers the cut decides: an edge y -> z of its bytes, y the source (allocated before v)
    # or its one free allocator or a vertex all its free allocators join, z likewise for readers
    decided = counted & ~(allocated & read)
    vertices = len(free) + 2
    tails, heads, caps = [], [], []

    def side(settled, nodes, owner, end):
        nonlocal vertices
        entry = decided[owner] & ~settled[owner] & is_free[nodes]  # the free ends of undecided buffers
        count = np.bincount(owner[entry], minlength=len(decided))
        vertex = np.where(settled, end, -1)
        one = entry & (count[owner] == 1)
        vertex[owner[one]] = index[nodes[one]]
        joined = np.flatnonzero(decided & ~settled & (count > 1))
        vertex[joined] = vertices + np.arange(len(joined))
        vertices += len(joined)
        many = entry & (count[owner] > 1)
        return vertex, index[nodes[many]], vertex[owner[many]]

    y, join_from, join_to = side(allocated, t.alloc_nodes, t.alloc_buffer, source)
    tails.append(join_from), heads.append(join_to), caps.append(np.full(len(join_from), -1))
    z, join_from, join_to = side(read, t.reader_nodes, t.reader_buffer, sink)
    tails.append(join_to), heads.append(join_from), caps.append(np.full(len(join_from), -1))
    cut = np.flatnonzero(decided)
    tails.append(y[cut]), heads.append(z[cut]), caps.append(t.sizes[cut])
    # w runs before v only if every predecessor u of w does: w -> u, infinite
    inside = is_free[t.pred_nodes] & is_free[t.pred_of]
    tails.append(index[t.pred_nodes[inside]]), heads.append(index[t.pred_of[inside]])
    caps.append(np.full(int(inside.sum()), -1))
    flow, reached = min_cut(vertices, np.concatenate(tails), np.concatenate(heads), np.concatenate(caps), source, sink)
    prefix = before_v.copy()
    prefix[free] = reached[: len(free)]
    return problem.base + constant + flow, np.flatnonzero(prefix).tolist()


def within_gap(bound: int, gap: float) -> int:
    """The highest peak that `--gap` (a fraction of the bound) accepts without a proof."""
    return bound + int(bound * gap)
