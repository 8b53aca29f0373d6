"""Maximum flow / minimum s-t cut by Dinic's algorithm: the order's step bounds
(`order.bounds`, through `min_cut`: in C where `_maxflow` is built) and the recompute
partitioner (`recompute.mincut`, whose capacities outgrow 64 bits) cut their networks with it."""

from collections import deque

import numpy as np

try:
    from roam_cli.solvers import _maxflow
except ImportError:  # optional, as every C extension (setup.py): this module is its reference
    _maxflow = None

INF = float("inf")


def min_cut(vertices: int, tails: np.ndarray, heads: np.ndarray, caps: np.ndarray, source: int,
            sink: int) -> tuple[int, np.ndarray]:
    """(the maximum flow, the source side of a minimum cut as booleans) of the network of edges
    tails[i] -> heads[i] with int64 capacities caps[i], a negative one infinite. The flow must be
    finite and fit in 62 bits (the bounds' capacities are bytes)."""
    tails, heads, caps = (np.ascontiguousarray(a, dtype=np.int64) for a in (tails, heads, caps))
    if _maxflow is not None:
        flow, side = _maxflow.min_cut(vertices, tails, heads, caps, source, sink)
        if flow is None:
            raise ValueError("min_cut: the flow is infinite")
        return flow, np.frombuffer(side, dtype=bool)
    net = Network(vertices)
    for a, b, c in zip(tails.tolist(), heads.tolist(), caps.tolist()):
        net.add(a, b, INF if c < 0 else c)
    flow = net.max_flow(source, sink)
    return flow, np.array(net.reachable(source), dtype=bool)


class Network:
    """Dinic's maximum flow on an adjacency list of edge indices (paired edges e, e ^ 1)."""

    def __init__(self, size: int):
        self.adj: list[list[int]] = [[] for _ in range(size)]
        self.head: list[int] = []
        self.cap: list[float] = []

    def add(self, a: int, b: int, capacity: float) -> None:
        self.adj[a].append(len(self.head))
        self.head.append(b)
        self.cap.append(capacity)
        self.adj[b].append(len(self.head))
        self.head.append(a)
        self.cap.append(0)

    def max_flow(self, source: int, sink: int) -> int:
        adj, head, cap = self.adj, self.head, self.cap
        total = 0
        while True:
            level = [-1] * len(adj)
            level[source] = 0
            queue = deque([source])
            while queue:
                a = queue.popleft()
                for e in adj[a]:
                    if cap[e] > 0 and level[head[e]] < 0:
                        level[head[e]] = level[a] + 1
                        queue.append(head[e])
            if level[sink] < 0:
                return int(total)
            cursor = [0] * len(adj)
            while True:
                pushed = self._augment(source, sink, level, cursor)
                if not pushed:
                    break
                total += pushed

    def reachable(self, source: int) -> list[bool]:
        """The source side of a minimum cut, once max_flow has run: what the residual reaches."""
        seen = [False] * len(self.adj)
        seen[source] = True
        stack = [source]
        while stack:
            a = stack.pop()
            for e in self.adj[a]:
                if self.cap[e] > 0 and not seen[self.head[e]]:
                    seen[self.head[e]] = True
                    stack.append(self.head[e])
        return seen

    def _augment(self, source: int, sink: int, level: list[int], cursor: list[int]) -> float:
        """One blocking-flow path found by iterative depth-first search; its bottleneck."""
        adj, head, cap = self.adj, self.head, self.cap
        path: list[int] = []  # edges
        a = source
        while True:
            if a == sink:
                pushed = min(cap[e] for e in path)
                for e in path:
                    cap[e] -= pushed
                    cap[e ^ 1] += pushed
                return pushed
            edges = adj[a]
            while cursor[a] < len(edges):
                e = edges[cursor[a]]
                if cap[e] > 0 and level[head[e]] == level[a] + 1:
                    break
                cursor[a] += 1
            else:
                if not path:
                    return 0
                level[a] = -1  # dead end
                e = path.pop()
                a = head[e ^ 1]
                cursor[a] += 1
                continue
            path.append(e)
            a = head[e]
