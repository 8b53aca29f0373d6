"""Ordering strategies: a topological order of all nodes, chosen to minimise peak live bytes.

Every strategy takes a `MemoryModel` (plain values: preds, storages) and returns node indices."""

import heapq

from roam_cli.memory import MemoryModel

STRATEGIES = ("original",)


def original(mm: MemoryModel) -> list[int]:
    """The model's node order: file order, with the fewest moves that honour in-place rules."""
    indegree = [len(p) for p in mm.preds]
    users: list[list[int]] = [[] for _ in mm.preds]
    for b, ps in enumerate(mm.preds):
        for a in ps:
            users[a].append(b)
    ready = [i for i, d in enumerate(indegree) if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            indegree[u] -= 1
            if indegree[u] == 0:
                heapq.heappush(ready, u)
    return order


def solve(mm: MemoryModel, strategy: str = "original", **options) -> tuple[list[int], dict]:
    if strategy == "original":
        return original(mm), {}
    raise ValueError(f"unknown order strategy {strategy!r}")
