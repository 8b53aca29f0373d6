"""Lower bounds on the peak of every order of a problem: they turn a good order into a proven one.

- `surely_live()`: at v's step a buffer is live in every order when one of its allocators is v
  or an ancestor and one of its readers is v or a descendant (or it lives to the end); every
  buffer that entered live is live at the first step, every one living to the end at the last.
- `step_minimum(v)`: the least live bytes v's step can have in any order, exactly, as a
  minimum cut. The nodes run before v form a down-set D with anc(v) in D and desc(v) outside;
  a buffer costs its bytes when an allocator is in D + {v} and a reader outside D (or it lives
  to the end). In the flow network a node on the source side is in D; edge w -> u (infinite)
  for every predecessor u of w keeps D down-closed; per buffer, allocators -> y (infinite),
  y -> z (its bytes), z -> readers (infinite): the bytes are cut exactly when an allocator is
  before or at v and a reader at or after it. Buffers nobody reads are left out (a bound may
  undercount). Both bound the peak from below, so peak == bound proves an order optimal."""

from roam_cli.order.problem import Problem, profile, reachability
from roam_cli.solvers.maxflow import INF, Network

PEAK_STEPS = 8  # how many of an order's highest steps get the exact step bound


def lower_bound(problem: Problem, order: list[int] | None = None) -> int:
    """The surely-live bound, raised by the exact step minimum of the nodes at `order`'s
    highest steps (where a proof that the order is optimal must come from)."""
    anc, desc = reachability(problem)
    bound = surely_live(problem, anc, desc)
    if order:
        steps = profile(problem, order)
        for step in sorted(range(len(order)), key=lambda s: -steps[s])[:PEAK_STEPS]:
            if steps[step] <= bound:
                break
            bound = max(bound, step_minimum(problem, order[step], anc, desc))
    return bound


def surely_live(problem: Problem, anc: list[int], desc: list[int]) -> int:
    n = problem.n
    total = [problem.base] * n
    everyone = (1 << n) - 1
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
        while surely:
            low = surely & -surely
            total[low.bit_length() - 1] += buf.bytes
            surely ^= low
    entered = sum(b.bytes for b in problem.buffers if not b.alloc)
    staying = sum(b.bytes for b in problem.buffers if b.to_end)
    return max(max(total, default=0), problem.base + max(entered, staying))


def step_minimum(problem: Problem, v: int, anc: list[int], desc: list[int]) -> int:
    return best_prefix(problem, v, anc, desc)[0]


def best_prefix(problem: Problem, v: int, anc: list[int], desc: list[int]) -> tuple[int, list[int]]:
    """(the least live bytes of v's step in any order, the nodes that run before v there)."""
    n = problem.n
    source, sink, v_alloc = n, n + 1, n + 2
    net = Network(n + 3 + 2 * len(problem.buffers))
    for w in range(n):
        for u in problem.preds[w]:
            net.add(w, u, INF)
        if anc[v] >> w & 1:
            net.add(source, w, INF)
        elif w == v or desc[v] >> w & 1:
            net.add(w, sink, INF)
    net.add(source, v_alloc, INF)
    for b, buf in enumerate(problem.buffers):
        if not buf.readers and not buf.to_end:
            continue
        y, z = n + 3 + 2 * b, n + 4 + 2 * b
        for a in buf.alloc or (source,):
            net.add(v_alloc if a == v else a, y, INF)
        net.add(y, z, buf.bytes)
        if buf.to_end:
            net.add(z, sink, INF)
        for r in buf.readers:
            net.add(z, r, INF)
    flow = net.max_flow(source, sink)
    before = net.reachable(source)
    return problem.base + flow, [w for w in range(n) if before[w]]
