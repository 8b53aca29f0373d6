"""Exact search over executed sets: the leaf solver for narrow problems.

After any prefix of an order, the live bytes depend only on which nodes have run (a down-set of
the precedence order), and so do the live bytes of the step that runs node v next. An order is
a path from the empty set to the full set; its peak is the largest step on the path. "Is there
an order with peak <= T?" is therefore plain reachability over down-sets, each visited once.
`solve()` lowers T below the incumbent until that search fails, which proves the incumbent
optimal, or until its budget of visited sets or time runs out."""

import time
from dataclasses import dataclass

from roam_cli.order.problem import Problem, peak


@dataclass(frozen=True)
class Result:
    order: list[int]
    peak: int
    optimal: bool
    states: int  # down-sets visited


class Budget(Exception):
    pass


def solve(problem: Problem, warm_start: list[int], max_states: int, deadline: float,
          known_bound: int = 0) -> Result:
    n = problem.n
    best, best_peak = list(warm_start), peak(problem, warm_start)
    pred_mask = [sum(1 << u for u in ps) for ps in problem.preds]
    sizes = [b.bytes for b in problem.buffers]
    alloc_mask = [sum(1 << a for a in b.alloc) for b in problem.buffers]
    reader_mask = [sum(1 << r for r in b.readers) for b in problem.buffers]
    to_end = [b.to_end for b in problem.buffers]
    touches = [sorted(set(problem.allocs[v]) | set(problem.reads[v])) for v in range(n)]
    start_live = problem.base + sum(s for s, m in zip(sizes, alloc_mask) if not m)
    full = (1 << n) - 1
    succs = problem.succs
    sources = sum(1 << v for v in range(n) if not pred_mask[v])
    visited_total = 0

    def step(done: int, v: int, live: int) -> tuple[int, int]:
        """(live bytes at v's step, live bytes after it) when v runs after `done`."""
        after = done | 1 << v
        grown = freed = 0
        for b in touches[v]:
            m = alloc_mask[b]
            fresh = m and not m & done  # v allocates it now
            if fresh:
                grown += sizes[b]
            if not to_end[b] and (fresh or not m or m & done) and reader_mask[b] & ~after == 0 \
                    and (reader_mask[b] >> v & 1 or fresh):
                freed += sizes[b]
        return live + grown, live + grown - freed

    def below(limit: int) -> list[int] | None:
        """An order whose every step is at most `limit`, or None when there is none."""
        nonlocal visited_total
        seen = {0}
        path: list[int] = []
        stack = [(0, start_live, sources, None)]  # (done set, live after it, ready set, next moves)
        while stack:
            done, live, ready, moves = stack[-1]
            if moves is None:
                if done == full:
                    return list(path)
                options = []
                rest = ready
                while rest:
                    low = rest & -rest
                    rest ^= low
                    v = low.bit_length() - 1
                    at, after = step(done, v, live)
                    if at <= limit and done | low not in seen:
                        options.append((after, at, v))
                options.sort(reverse=True)  # popped from the end: least live after it first
                stack[-1] = (done, live, ready, options)
                moves = options
            if not moves:
                stack.pop()
                if path:
                    path.pop()
                continue
            after, _, v = moves.pop()
            nxt = done | 1 << v
            if nxt in seen:
                continue
            seen.add(nxt)
            visited_total += 1
            if visited_total > max_states or time.perf_counter() > deadline:
                raise Budget
            path.append(v)
            now_ready = ready & ~(1 << v)
            for w in succs[v]:
                if pred_mask[w] & ~nxt == 0:
                    now_ready |= 1 << w
            stack.append((nxt, after, now_ready, None))
        return None

    try:
        while best_peak > known_bound:
            found = below(best_peak - 1)
            if found is None:
                return Result(best, best_peak, True, visited_total)
            best, best_peak = found, peak(problem, found)
    except Budget:
        return Result(best, best_peak, False, visited_total)
    return Result(best, best_peak, True, visited_total)
