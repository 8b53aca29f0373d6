"""Memory-aware list scheduling: the heuristics production compilers use (XLA's list and DFS
schedulers), on a `Problem`. `greedy()` runs each and keeps the order with the lowest peak, as
XLA's default memory scheduler does."""

import heapq

from roam_cli.order.problem import Problem, kahn, peak


class Simulation:
    """Live bytes while an order is built node by node."""

    def __init__(self, problem: Problem):
        self.p = problem
        self.allocated = [not b.alloc for b in problem.buffers]
        self.remaining = [len(set(b.readers)) for b in problem.buffers]
        self.live = problem.base + sum(b.bytes for b in problem.buffers if not b.alloc)
        self.done = [False] * problem.n

    def effect(self, v: int) -> tuple[int, int]:
        """(bytes v allocates, bytes freed after it) if v ran next."""
        bufs = self.p.buffers
        new = [b for b in self.p.allocs[v] if not self.allocated[b]]
        grown = sum(bufs[b].bytes for b in new)
        reads = set(self.p.reads[v])
        freed = 0
        for b in set(new) | reads:
            left = self.remaining[b] - (b in reads)
            if left == 0 and not bufs[b].to_end:
                freed += bufs[b].bytes
        return grown, freed

    def run(self, v: int) -> None:
        grown, freed = self.effect(v)
        for b in self.p.allocs[v]:
            self.allocated[b] = True
        for b in set(self.p.reads[v]):
            self.remaining[b] -= 1
        self.done[v] = True
        self.live += grown - freed


def list_schedule(problem: Problem) -> list[int]:
    """XLA's list scheduler: among ready nodes, run the one that frees the most bytes net of what
    it allocates; ties go to the smaller step, then to the lower node index (file order)."""
    sim = Simulation(problem)
    indegree = [len(set(p)) for p in problem.preds]
    version = [0] * problem.n
    heap: list[tuple[int, int, int, int, int]] = []
    # A ready node's price changes when a buffer it allocates is allocated, or one it reads is down
    # to its last read (at most twice per buffer): it is repriced then. It changes too when a buffer
    # it allocates is read before any allocator ran (a reduced problem's reader may run first); such
    # a `stale` node is repriced when a buffer it reads is next read, which is where repricing every
    # reader of each buffer read (quadratic in a buffer's readers) repriced it: the same orders.
    stale: set[int] = set()
    waiting: dict[int, list[int]] = {}  # buffer -> stale nodes reading it

    def push(v: int) -> None:
        grown, freed = sim.effect(v)
        version[v] += 1
        stale.discard(v)
        heapq.heappush(heap, (grown - freed, grown, v, version[v], v))

    for v in range(problem.n):
        if indegree[v] == 0:
            push(v)
    order = []
    while heap:
        *_, ver, v = heapq.heappop(heap)
        if ver != version[v] or sim.done[v]:
            continue
        order.append(v)
        sim.run(v)
        for b in problem.reads[v]:
            if not sim.allocated[b]:
                for u in problem.buffers[b].alloc:
                    if indegree[u] == 0 and not sim.done[u] and u not in stale:
                        stale.add(u)
                        for c in problem.reads[u]:
                            waiting.setdefault(c, []).append(u)
        touched = set()
        for b in problem.reads[v]:
            stale_readers = waiting.pop(b, ())
            touched.update(problem.buffers[b].readers if sim.remaining[b] <= 1
                           else (u for u in stale_readers if u in stale))
        touched.update(u for b in problem.allocs[v] for u in problem.buffers[b].alloc)
        for w in set(problem.succs[v]):
            indegree[w] -= 1
            if indegree[w] == 0:
                touched.add(w)
        for u in touched:
            if not sim.done[u] and indegree[u] == 0:
                push(u)
    return order


def dfs_schedule(problem: Problem) -> list[int]:
    """XLA's DFS scheduler: a post-order walk from the sinks that visits the predecessor whose
    cone holds the most bytes first (Sethi-Ullman): big intermediate results are consumed before
    the next cone starts."""
    cone = [0] * problem.n  # bytes allocated by a node and its predecessors, counted once per path
    for v in kahn(problem):
        cone[v] = sum(problem.buffers[b].bytes for b in problem.allocs[v]) + sum(cone[u] for u in problem.preds[v])
    sinks = sorted((v for v in range(problem.n) if not problem.succs[v]), key=lambda v: (-cone[v], v))
    visited = [False] * problem.n
    order = []
    for root in sinks:
        stack = [(root, False)]
        while stack:
            v, leaving = stack.pop()
            if leaving:
                order.append(v)
                continue
            if visited[v]:
                continue
            visited[v] = True
            stack.append((v, True))
            # pushed smallest cone first, so the biggest cone is walked first
            stack.extend((u, False) for u in sorted(problem.preds[v], key=lambda u: (cone[u], -u)) if not visited[u])
    return order


SCHEDULERS = {"list": list_schedule, "dfs": dfs_schedule}


def greedy(problem: Problem) -> tuple[list[int], str]:
    """The best of the schedulers: (order, name of the scheduler that produced it)."""
    best = None
    for name, scheduler in SCHEDULERS.items():
        order = scheduler(problem)
        cost = peak(problem, order)
        if best is None or cost < best[0]:
            best = (cost, order, name)
    return best[1], best[2]
