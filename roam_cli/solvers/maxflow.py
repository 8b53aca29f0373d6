"""Maximum flow / minimum s-t cut by Dinic's algorithm: the order's step bounds
(`order.bounds`) and the recompute partitioner (`recompute.mincut`) cut their networks with it."""

from collections import deque

INF = float("inf")


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
