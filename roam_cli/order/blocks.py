"""Repeated-block reuse: a canonical form for (sub)problems, so each shape is solved once.

Transformer layers produce segments that are the same problem up to node numbering (and up to
the constant bytes passing through, which do not change which order is best). `canonical()`
renumbers a problem by a topological sort whose ties are broken by structural labels (refined
Weisfeiler-Lehman style over predecessors and successors), then by the given numbering, and
returns the renumbered problem without its base as a hashable key. Equal keys mean equal
problems, so an order found for one is exact for the other; two copies that the labels cannot
tell apart and the given numbering orders differently only miss a reuse."""

import heapq

from roam_cli.order.problem import Problem

ROUNDS = 3


ALLOCATES, READS = 0, 1


def labels(problem: Problem) -> list[int]:
    """Structural labels (integers only: string hashes change from run to run)."""
    touch: list[list[tuple]] = [[] for _ in range(problem.n)]
    for buf in problem.buffers:
        shape = (buf.bytes, len(buf.alloc), len(buf.readers), buf.to_end)
        for a in buf.alloc:
            touch[a].append((ALLOCATES, *shape))
        for r in buf.readers:
            touch[r].append((READS, *shape))
    label = [hash((len(problem.preds[v]), len(problem.succs[v]), tuple(sorted(touch[v])))) for v in range(problem.n)]
    for _ in range(ROUNDS):
        label = [hash((label[v], tuple(sorted(label[u] for u in problem.preds[v])),
                       tuple(sorted(label[w] for w in problem.succs[v])))) for v in range(problem.n)]
    return label


def canonical(problem: Problem) -> tuple[tuple, list[int]]:
    """(key, numbering): numbering[i] is the node that is node i of the canonical form."""
    label = labels(problem)
    indegree = [len(p) for p in problem.preds]
    ready = [(label[v], v) for v in range(problem.n) if indegree[v] == 0]
    heapq.heapify(ready)
    numbering = []
    while ready:
        _, v = heapq.heappop(ready)
        numbering.append(v)
        for w in problem.succs[v]:
            indegree[w] -= 1
            if indegree[w] == 0:
                heapq.heappush(ready, (label[w], w))
    new = {v: i for i, v in enumerate(numbering)}
    preds = tuple(tuple(sorted(new[u] for u in problem.preds[v])) for v in numbering)
    buffers = tuple(sorted((b.bytes, tuple(sorted(new[a] for a in b.alloc)), tuple(sorted(new[r] for r in b.readers)),
                            b.to_end) for b in problem.buffers))
    return (preds, buffers), numbering
