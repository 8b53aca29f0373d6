"""Spine and tails: where the many small side computations of a training step run.

A node with fewer than `TAIL_DESCENDANTS` descendants is a tail node: nothing of the spine (the
forward, the loss, the backward's chain through the layers) waits for it. Tail nodes joined by
edges form a tail: a weight gradient with its optimizer update, and the recomputed values only
they read. Running a tail early puts its peak (a gradient and the update's temporaries, 2.6 GiB
for one MLP weight of a 70B-class model) on top of every activation the backward still holds;
running it late keeps its inputs live meanwhile. A reference order that does either everywhere
is far from the best: the best runs each tail at the first point where its peak fits.

`schedule(target)` keeps the spine in the reference order and places the tails: a ready tail
node that frees at least what it allocates runs at once (it never raises a later step: a
recomputed product that lets two kept activations go); the rest of a tail runs as one piece at
the first point after the spine node just run where all its steps stay within `target`, tails
with the smallest rise tried first. A tail that never fits runs after the spine, smallest rise
first. Too low a target defers every tail and their inputs pile up; too high runs them at the
top of the profile: `improve()` bisects the target between a lower bound and the reference's
peak and keeps the best order it saw."""

import heapq

from roam_cli.order.bounds import within_gap
from roam_cli.order.problem import Problem

TAIL_DESCENDANTS = 64  # fewer descendants than this: a tail node (an update chain has about 12)
# With `scalars_first`, a spine node that allocates at most this many bytes and whose predecessors
# are such nodes too (the optimizer's step counter, bias corrections, learning rates: scalars every
# update reads) runs first: where a reference puts it late, every tail that reads it waits for it
# there and the backward's inputs to the tails pile up (a 70B-class rank step: 25.1 -> 23.3 GiB).
SCALAR_BYTES = 1024
TARGET_TRIES = 12  # schedules tried by improve()


class Tails:
    """The tails of a problem under a reference order, and its schedules."""

    def __init__(self, problem: Problem, reference: list[int], desc: list[int],
                 tail_descendants: int = TAIL_DESCENDANTS, scalars_first: bool = False):
        self.problem = problem
        n = problem.n
        self.rank = [0] * n
        for i, v in enumerate(reference):
            self.rank[v] = i
        self.part = [-1] * n  # node -> its tail, -1 on the spine
        self.tails: list[list[int]] = []  # each in reference order
        scalar = [False] * n  # made of scalars alone (the step counter, bias corrections)
        for v in reference:  # its predecessors were seen
            scalar[v] = (sum(problem.buffers[b].bytes for b in problem.allocs[v]) <= SCALAR_BYTES
                         and all(scalar[u] for u in problem.preds[v]))
        # A scalar every update reads is no tail's: on a small step it has few descendants, and
        # would join every update into one tail, to be placed whole
        tail = [desc[v].bit_count() < tail_descendants and not scalar[v] for v in range(n)]
        for v in range(n):
            if tail[v] and self.part[v] < 0:
                self.part[v], stack, members = len(self.tails), [v], []
                while stack:
                    x = stack.pop()
                    members.append(x)
                    for y in problem.preds[x] + problem.succs[x]:
                        if tail[y] and self.part[y] < 0:
                            self.part[y] = len(self.tails)
                            stack.append(y)
                self.tails.append(sorted(members, key=self.rank.__getitem__))
        spine = [v for v in reference if self.part[v] < 0]
        first = scalar if scalars_first else [False] * n
        self.spine = [v for v in spine if first[v]] + [v for v in spine if not first[v]]
        self.outside_preds = [0] * len(self.tails)  # edges into each tail from the spine
        for v in range(n):
            if self.part[v] >= 0:
                self.outside_preds[self.part[v]] += sum(1 for u in problem.preds[v] if self.part[u] != self.part[v])

    def schedule(self, target: int, cutoff: int | None = None) -> tuple[list[int] | None, int]:
        """(order, its peak) with the tails placed under `target`; (None, a peak above `cutoff`)
        as soon as a step exceeds `cutoff` (the tails piled up: no need to finish)."""
        p, part = self.problem, self.part
        run = Simulation(p)
        order: list[int] = []
        left = [list(t) for t in self.tails]  # each tail's nodes not run yet
        waiting = list(self.outside_preds)
        waiting_tails: list[tuple[int, int, int]] = []  # (rise last seen, release rank, tail): heap
        check: list[int] = []  # tail nodes that may now free at least what they allocate

        def consider(w: int) -> None:
            if part[w] >= 0 and not run.done[w] and not run.npred[w]:
                check.append(w)

        def execute(v: int) -> None:
            run.step(v)
            order.append(v)
            for w in p.succs[v]:
                consider(w)
                t = part[w]
                if t >= 0 and t != part[v]:
                    waiting[t] -= 1
                    if not waiting[t]:
                        heapq.heappush(waiting_tails, (0, len(order), t))
            for b in p.reads[v]:
                if run.left[b] == 1:  # its last reader may now free it
                    for r in p.buffers[b].readers:
                        consider(r)

        def free_eagerly() -> None:
            while check:
                w = check.pop()
                if run.done[w] or run.npred[w]:
                    continue
                at, after = run.cost(w)
                if after <= run.live and at <= target:
                    execute(w)
                    left[part[w]].remove(w)

        def place(t: int, force: bool) -> int:
            """Run tail t whole when its steps fit (or `force`); else leave it and return its rise."""
            base, top, ran = run.live, 0, 0
            for x in left[t]:
                top = max(top, run.step(x))
                ran += 1
            if top > target and not force:
                for _ in range(ran):
                    run.undo()
                return top - base
            for _ in range(ran):
                run.undo()
            for x in list(left[t]):
                execute(x)
            left[t] = []
            return -1

        for t, w in enumerate(waiting):
            if not w:
                heapq.heappush(waiting_tails, (0, -1, t))
        for v in self.spine:
            execute(v)
            if cutoff is not None and run.peak > cutoff:
                return None, run.peak
            free_eagerly()
            tried = []
            while waiting_tails and run.live + waiting_tails[0][0] <= target:
                _, released, t = heapq.heappop(waiting_tails)
                if left[t]:
                    rise = place(t, force=False)
                    if rise < 0:
                        free_eagerly()
                    else:
                        tried.append((rise, released, t))
            for item in tried:
                heapq.heappush(waiting_tails, item)
        while waiting_tails:  # after the spine: the smallest rise first, forced when nothing fits
            _, released, t = heapq.heappop(waiting_tails)
            if not left[t]:
                continue
            rise = place(t, force=False)
            if rise >= 0 and waiting_tails and rise > waiting_tails[0][0]:
                heapq.heappush(waiting_tails, (rise, released, t))
                continue
            if rise >= 0:
                place(t, force=True)
            free_eagerly()
        return order, run.peak


def improve(problem: Problem, reference: list[int], desc: list[int], lower: int, reference_peak: int,
            tail_descendants: int = TAIL_DESCENDANTS, gap: float = 0.0) -> tuple[list[int], int]:
    """The best of the reference and the tail schedules for targets bisected in [lower,
    reference_peak], with the spine as the reference orders it and with its scalars first: a
    schedule above the bracket's top means the target let the tails pile up. A peak within `gap`
    (a fraction) of `lower` ends the bisection."""
    best, best_peak = reference, reference_peak
    for scalars_first in (False, True):
        tails = Tails(problem, reference, desc, tail_descendants, scalars_first)
        if not tails.tails:
            return best, best_peak
        low, high = lower, reference_peak
        for _ in range(TARGET_TRIES):
            if high - low <= high // 1000 or best_peak <= within_gap(lower, gap):
                break
            target = (low + high) // 2
            found, found_peak = tails.schedule(target, cutoff=high)
            if found is not None and found_peak < best_peak:
                best, best_peak = found, found_peak
            if found_peak > high:
                low = target
            else:
                high = min(target, found_peak)
    return best, best_peak


class Simulation:
    """Live bytes of a problem as nodes run, one step at a time, with undo."""

    def __init__(self, problem: Problem):
        self.p = problem
        buffers = problem.buffers
        self.live = problem.base + sum(b.bytes for b in buffers if not b.alloc)
        self.peak = self.live
        self.allocated = [not b.alloc for b in buffers]
        self.left = [len(b.readers) for b in buffers]  # readers not run yet
        self.freed = [False] * len(buffers)
        self.npred = [len(ps) for ps in problem.preds]
        self.done = [False] * problem.n
        self.touches = [sorted(set(problem.allocs[v]) | set(problem.reads[v])) for v in range(problem.n)]
        self.log: list[tuple[int, int, int, list[tuple[int, int]]]] = []

    def cost(self, v: int) -> tuple[int, int]:
        """(live bytes at v's step, live bytes after it) if v ran now."""
        buffers, grow, free = self.p.buffers, 0, 0
        for b in self.touches[v]:
            buf = buffers[b]
            fresh = not self.allocated[b] and v in buf.alloc
            grow += buf.bytes if fresh else 0
            if buf.to_end or self.freed[b] or not (self.allocated[b] or fresh):
                continue
            if self.left[b] - (v in buf.readers) == 0:
                free += buf.bytes
        return self.live + grow, self.live + grow - free

    def step(self, v: int) -> int:
        """Run v; the live bytes at its step."""
        at, after = self.cost(v)
        buffers, changes = self.p.buffers, []
        for b in self.touches[v]:
            buf = buffers[b]
            if not self.allocated[b] and v in buf.alloc:
                self.allocated[b] = True
                changes.append((0, b))
            if v in buf.readers:
                self.left[b] -= 1
                changes.append((1, b))
            if not buf.to_end and not self.freed[b] and self.allocated[b] and not self.left[b]:
                self.freed[b] = True
                changes.append((2, b))
        for w in self.p.succs[v]:
            self.npred[w] -= 1
        self.done[v] = True
        self.log.append((v, self.live, self.peak, changes))
        self.live = after
        self.peak = max(self.peak, at)
        return at

    def undo(self) -> None:
        v, self.live, self.peak, changes = self.log.pop()
        for kind, b in reversed(changes):
            if kind == 0:
                self.allocated[b] = False
            elif kind == 1:
                self.left[b] += 1
            else:
                self.freed[b] = False
        for w in self.p.succs[v]:
            self.npred[w] += 1
        self.done[v] = False
