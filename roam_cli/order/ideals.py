"""Exact search over executed sets: the leaf solver for narrow problems.

After any prefix of an order, the live bytes depend only on which nodes have run (a down-set of
the precedence order), and so do the live bytes of the step that runs node v next. An order is
a path from the empty set to the full set; its peak is the largest step on the path. "Is there
an order with peak <= T?" is therefore plain reachability over down-sets, each visited once.
`solve()` lowers T below the incumbent until that search fails, which proves the incumbent
optimal, or until its budget of visited sets or time runs out.

**Forced blocks.** From a down-set D, let S be a sequence of nodes that can run next, each step
at most T, such that the live bytes after D + S are the least of any D + I with I a down-set of
S (S "ends at its lowest point"). If some order from D stays under T, so does S followed by that
order without S: a node w of it now runs with the nodes R of S that came after w already run,
and the live bytes at its step change by at most live(D + S) - live(D + S - R) <= 0 (R is an
up-set of S: the buffers R allocates that outlive S, minus those R frees). So from D the search
takes only S, and never branches over the orders of an update chain that fits under T now. A
single node that frees at least what it allocates is the smallest such block.

The search for one limit runs in C (`_ideals.below`, the default engine): the same search, state
for state, so a budget of visited sets gives the same order with either engine; `below_python` is
its reference, which the tests compare it with and which runs where the extension did not build."""

import time
from array import array
from dataclasses import dataclass

from roam_cli.order.problem import Problem, peak

try:
    from roam_cli.order import _ideals
except ImportError:  # the C extension did not build (it is optional): the Python reference runs instead
    _ideals = None

BLOCK_NODES = 24  # the longest block tried (an AdamW chain after the rules is 9 nodes)
BLOCK_IDEALS = 256  # the most down-sets of a block compared with its end
BLOCK_CO_READERS = 4  # a block grows to the other readers of a tensor read by at most this many


@dataclass(frozen=True)
class Result:
    order: list[int]
    peak: int
    optimal: bool
    states: int  # down-sets visited


class Budget(Exception):
    """Out of visited sets or time; `visited` sets were visited."""

    def __init__(self, visited: int):
        super().__init__(visited)
        self.visited = visited


class Space:
    """The problem as bitmasks, and the live bytes of a step run after a down-set."""

    def __init__(self, problem: Problem):
        n = problem.n
        self.n = n
        self.problem = problem
        self.c_arguments: tuple | None = None  # below_c's arguments that do not change with the limit
        self.pred_mask = [sum(1 << u for u in ps) for ps in problem.preds]
        self.sizes = [b.bytes for b in problem.buffers]
        self.alloc_mask = [sum(1 << a for a in b.alloc) for b in problem.buffers]
        self.reader_mask = [sum(1 << r for r in b.readers) for b in problem.buffers]
        self.to_end = [b.to_end for b in problem.buffers]
        self.touches = [sorted(set(problem.allocs[v]) | set(problem.reads[v])) for v in range(n)]
        self.start_live = problem.base + sum(s for s, m in zip(self.sizes, self.alloc_mask) if not m)
        self.succs = problem.succs
        self.sources = sum(1 << v for v in range(n) if not self.pred_mask[v])
        # a block grows along successors and nodes reading what it reads: an update chain's
        # branches. Not along the readers of a widely read tensor (an activation every branch of
        # a layer reads, the optimizer's step count): trying them all in every state costs more
        # than the blocks they could close save
        self.near = [sum(1 << w for w in problem.succs[v]) for v in range(n)]
        for mask in self.reader_mask:
            if mask.bit_count() <= BLOCK_CO_READERS:
                for v in bits(mask):  # not a test of every node's bit: a 20,000-node leaf took 10 s
                    self.near[v] |= mask & ~(1 << v)

    def step(self, done: int, v: int, live: int) -> tuple[int, int]:
        """(live bytes at v's step, live bytes after it) when v runs after `done`."""
        after = done | 1 << v
        grown = freed = 0
        alloc_mask, reader_mask, sizes = self.alloc_mask, self.reader_mask, self.sizes
        for b in self.touches[v]:
            m = alloc_mask[b]
            fresh = m >> v & 1 and not m & done  # v allocates it now (a reader may run before it is allocated)
            if fresh:
                grown += sizes[b]
            if not self.to_end[b] and (fresh or not m or m & done) and reader_mask[b] & ~after == 0 \
                    and (reader_mask[b] >> v & 1 or fresh):
                freed += sizes[b]
        return live + grown, live + grown - freed

    def ready_after(self, ready: int, nxt: int, run: list[int]) -> int:
        for v in run:
            ready &= ~(1 << v)
        for v in run:
            for w in self.succs[v]:
                if not nxt >> w & 1 and self.pred_mask[w] & ~nxt == 0:
                    ready |= 1 << w
        return ready

    def block(self, done: int, live: int, v: int, after: int, limit: int) -> tuple[list[int], int, int] | None:
        """A forced block from `done` that starts with v: (its nodes, the down-set after it, the live
        bytes after it), or None. Grown greedily by the candidate that leaves the least live."""
        run, now, lv = [v], done | 1 << v, after
        ideals = {0: live, 1 << v: after}  # the block's own down-sets -> live bytes after done + them
        near = self.near[v]
        while lv > min(ideals.values()):
            if len(run) == BLOCK_NODES:
                return None
            best = None
            rest = near & ~now
            while rest:
                low = rest & -rest
                rest ^= low
                w = low.bit_length() - 1
                if self.pred_mask[w] & ~now == 0:
                    at, left = self.step(now, w, lv)
                    if at <= limit and (best is None or (left, at, w) < best):
                        best = (left, at, w)
            if best is None:
                return None
            lv, _, w = best
            for inner, inner_live in list(ideals.items()):
                if self.pred_mask[w] & ~(done | inner) == 0:
                    ideals[inner | 1 << w] = self.step(done | inner, w, inner_live)[1]
            if len(ideals) > BLOCK_IDEALS:
                return None
            run.append(w)
            now |= 1 << w
            near |= self.near[w]
        return run, now, lv


def csr(rows) -> tuple[array, array]:
    """Lists of ints as (starts, members): row r is members[starts[r]:starts[r + 1]]."""
    starts, members = array("q", [0]), array("q")
    for row in rows:
        members.extend(row)
        starts.append(len(members))
    return starts, members


def bits(mask: int) -> list[int]:
    """The set bits of mask, ascending (one step per set bit, not per bit)."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def below_c(space: Space, limit: int, budget: int, deadline: float) -> tuple[list[int] | None, int]:
    """`below_python` in C: (an order whose every step is at most `limit` or None, sets visited)."""
    p = space.problem
    if space.c_arguments is None:  # the problem's arrays, made once for every limit solve() tries
        space.c_arguments = (
            p.n, len(p.buffers), *csr(p.preds), *csr(p.succs), *csr(space.touches), *csr(bits(m) for m in space.near),
            array("q", space.sizes), *csr(b.alloc for b in p.buffers), *csr(b.readers for b in p.buffers),
            array("q", space.to_end), space.start_live)
    status, visited, found = _ideals.below(*space.c_arguments, limit, budget, max(deadline - time.perf_counter(), 0.0))
    if status < 0:
        raise Budget(visited)
    return found, visited


def below_python(space: Space, limit: int, budget: int, deadline: float) -> tuple[list[int] | None, int]:
    """(An order whose every step is at most `limit`, or None when there is none; the sets
    visited), raising Budget past `budget` visited sets or the deadline."""
    seen = {0}
    visited = 0
    full = (1 << space.n) - 1

    def moves_from(done: int, live: int, ready: int) -> list[tuple[int, list[int], int]]:
        """The moves worth trying from `done`: (live after, nodes, next down-set); popped from the end."""
        options = []
        rest = ready
        while rest:
            low = rest & -rest
            rest ^= low
            v = low.bit_length() - 1
            at, after = space.step(done, v, live)
            if at <= limit:
                options.append((after, at, v))
        for after, at, v in sorted(options):
            forced = space.block(done, live, v, after, limit)
            if forced:
                run, nxt, left = forced
                return [] if nxt in seen else [(left, run, nxt)]
        options.sort(reverse=True)  # least live after it first
        return [(after, [v], done | 1 << v) for after, _, v in options if done | 1 << v not in seen]

    path: list[list[int]] = []
    stack = [(0, space.start_live, space.sources, None)]  # (done set, live after it, ready set, next moves)
    while stack:
        done, live, ready, moves = stack[-1]
        if moves is None:
            if done == full:
                return [v for run in path for v in run], visited
            moves = moves_from(done, live, ready)
            stack[-1] = (done, live, ready, moves)
        if not moves:
            stack.pop()
            if path:
                path.pop()
            continue
        after, run, nxt = moves.pop()
        if nxt in seen:
            continue
        seen.add(nxt)
        visited += 1
        if visited > budget or time.perf_counter() > deadline:
            raise Budget(visited)
        path.append(run)
        stack.append((nxt, after, space.ready_after(ready, nxt, run), None))
    return None, visited


def solve(problem: Problem, warm_start: list[int], max_states: int, deadline: float,
          known_bound: int = 0, engine: str = "c") -> Result:
    """The least peak order found from `warm_start` within `max_states` visited sets and the
    deadline, proven optimal when a search below it failed. `engine`: "c" (the default, where the
    extension built) or "python", the reference."""
    space = Space(problem)
    below = below_c if engine == "c" and _ideals is not None else below_python
    best, best_peak = list(warm_start), peak(problem, warm_start)
    visited_total = 0
    try:
        while best_peak > known_bound:
            found, visited = below(space, best_peak - 1, max_states - visited_total, deadline)
            visited_total += visited
            if found is None:
                return Result(best, best_peak, True, visited_total)
            best, best_peak = found, peak(problem, found)
    except Budget as out:
        return Result(best, best_peak, False, visited_total + out.visited)
    return Result(best, best_peak, True, visited_total)
