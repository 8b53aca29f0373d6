"""Maximum flow / minimum s-t cut (Dinic's algorithm) on integer capacities.

Plain values in and out: `min_cut(n, edges, s, t)` -> the source side of a minimum cut."""

from collections import deque

INF = float("inf")


def min_cut(n: int, edges: list[tuple[int, int, float]], s: int, t: int) -> set[int]:
    """Vertices on the source side of a minimum s-t cut of the graph with vertices 0..n-1 and
    directed `edges` (u, v, capacity); capacities are ints or INF. Raises ValueError when every
    cut is infinite."""
    head = [[] for _ in range(n)]  # vertex -> indices into to/cap (edge k's reverse is k ^ 1)
    to: list[int] = []
    cap: list[float] = []
    for u, v, c in edges:
        head[u].append(len(to))
        to.append(v)
        cap.append(c)
        head[v].append(len(to))
        to.append(u)
        cap.append(0)
    while True:
        level = levels(n, head, to, cap, s)
        if level[t] < 0:
            break
        cursor = [0] * n
        while True:
            pushed = augment(head, to, cap, level, cursor, s, t)
            if pushed == 0:
                break
            if pushed == INF:
                raise ValueError("every cut is infinite")
    level = levels(n, head, to, cap, s)
    return {v for v in range(n) if level[v] >= 0}


def levels(n, head, to, cap, s) -> list[int]:
    level = [-1] * n
    level[s] = 0
    queue = deque([s])
    while queue:
        u = queue.popleft()
        for k in head[u]:
            if cap[k] > 0 and level[to[k]] < 0:
                level[to[k]] = level[u] + 1
                queue.append(to[k])
    return level


def augment(head, to, cap, level, cursor, s, t) -> float:
    """One blocking-flow path from s to t along increasing levels (iterative DFS); its flow."""
    path: list[int] = []  # edge indices
    u = s
    while True:
        if u == t:
            pushed = min(cap[k] for k in path)
            if pushed == INF:
                return INF
            for k in path:
                cap[k] -= pushed
                cap[k ^ 1] += pushed
            return pushed
        edges = head[u]
        while cursor[u] < len(edges):
            k = edges[cursor[u]]
            if cap[k] > 0 and level[to[k]] == level[u] + 1:
                break
            cursor[u] += 1
        else:
            if u == s:
                return 0
            level[u] = -1  # dead end: no blocking path through u in this phase
            k = path.pop()
            u = to[k ^ 1]
            cursor[u] += 1
            continue
        path.append(edges[cursor[u]])
        u = to[edges[cursor[u]]]
