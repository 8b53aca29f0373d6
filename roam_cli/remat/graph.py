"""A node-link graph as plain values, and what a schedule of it costs.

The files are networkx node-link JSON as Checkmate's and Moccasin's benchmarks ship them: nodes
with `cost_ram` (bytes of the output) and `cost_cpu` (duration), or `out_cost` and `duration` in
the random layered graphs; node ids in `id`, else `name`; edges in `links` or `edges`, each
`source`/`target` or `0`/`1`; `graph.order` (a list, or a list written as a string) is the given
topological order.

Memory follows Moccasin's `util.get_mem_from_schedule`: a computation's output is live from its
step to the last step that reads it, where a read binds to the latest computation of the value
before it; a step holds its own output and every live value."""

import json
from dataclasses import dataclass
from pathlib import Path

from roam_cli.core.errors import RoamError
from roam_cli.core.fileio import read_json
from roam_cli.core.graph import smallest_first_order


@dataclass(frozen=True)
class Graph:
    ids: tuple  # node ids as the file names them
    ram: tuple[int, ...]
    cpu: tuple[int, ...]
    preds: tuple[tuple[int, ...], ...]  # by index, no repeats
    order: tuple[int, ...]  # the given topological order (indices), or the smallest-first one
    name: str = ""

    @property
    def n(self) -> int:
        return len(self.ids)

    @property
    def succs(self) -> tuple[tuple[int, ...], ...]:
        out: list[list[int]] = [[] for _ in self.ids]
        for v, ps in enumerate(self.preds):
            for u in ps:
                out[u].append(v)
        return tuple(tuple(s) for s in out)


def _number(node: dict, names: tuple[str, str], path: Path) -> int:
    for name in names:
        if name in node:
            value = node[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise RoamError(f"{path}: node {node.get('id', node.get('name'))!r}: {name} {value!r} "
                                "is not a non-negative integer")
            return value
    raise RoamError(f"{path}: node {node.get('id', node.get('name'))!r} has neither {' nor '.join(names)}")


def read(path: str | Path) -> Graph:
    path = Path(path)
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise RoamError(f"{path}: not a node-link graph (no 'nodes' list)")
    edges = data.get("links", data.get("edges"))
    if not isinstance(edges, list) or not data["nodes"]:
        raise RoamError(f"{path}: not a node-link graph (no nodes, or no 'links'/'edges' list)")
    ids, ram, cpu = [], [], []
    for node in data["nodes"]:
        if not isinstance(node, dict) or not ("id" in node or "name" in node):
            raise RoamError(f"{path}: a node without an id: {str(node)[:80]}")
        ids.append(node["id"] if "id" in node else node["name"])
        ram.append(_number(node, ("cost_ram", "out_cost"), path))
        cpu.append(_number(node, ("cost_cpu", "duration"), path))
    try:
        index = {v: i for i, v in enumerate(ids)}
    except TypeError:
        raise RoamError(f"{path}: node ids must be numbers or strings") from None
    if len(index) != len(ids):
        raise RoamError(f"{path}: a node id appears twice")
    preds: list[set[int]] = [set() for _ in ids]
    for e in edges:
        ends = (e.get("source"), e.get("target")) if isinstance(e, dict) and "source" in e else \
            (e.get("0"), e.get("1")) if isinstance(e, dict) else (None, None)
        try:
            u, v = index[ends[0]], index[ends[1]]
        except (KeyError, TypeError):
            raise RoamError(f"{path}: an edge names no node of the graph: {str(e)[:80]}") from None
        if u == v:
            raise RoamError(f"{path}: node {ids[u]!r} reads itself")
        preds[v].add(u)
    preds_t = tuple(tuple(sorted(p)) for p in preds)
    succs: list[list[int]] = [[] for _ in ids]
    for v, ps in enumerate(preds_t):
        for u in ps:
            succs[u].append(v)
    topo = smallest_first_order([len(p) for p in preds_t], tuple(tuple(s) for s in succs))
    if len(topo) != len(ids):
        raise RoamError(f"{path}: the graph has a cycle")
    graph_attrs = data.get("graph") if isinstance(data.get("graph"), dict) else {}
    given = graph_attrs.get("order")
    if given is not None:
        order = _given_order(given, index, preds_t, path)
    else:
        order = tuple(topo)
    return Graph(tuple(ids), tuple(ram), tuple(cpu), preds_t, order, str(graph_attrs.get("name", path.stem)))


def _given_order(given, index: dict, preds: tuple, path: Path) -> tuple[int, ...]:
    try:
        listed = json.loads(given) if isinstance(given, str) else given
        order = tuple(index[v] for v in listed)
    except (ValueError, KeyError, TypeError):
        raise RoamError(f"{path}: graph.order is not a list of the graph's node ids") from None
    pos = {v: i for i, v in enumerate(order)}
    if len(pos) != len(index) or len(order) != len(index):
        raise RoamError(f"{path}: graph.order does not list every node once")
    if any(pos[u] > pos[v] for v, ps in enumerate(preds) for u in ps):
        raise RoamError(f"{path}: graph.order is not a topological order")
    return order


def cost(graph: Graph, schedule: list[int]) -> tuple[int, int]:
    """(peak bytes, total compute) of a schedule of node indices; ValueError when a read finds no
    computation of its value before it."""
    latest: dict[int, int] = {}  # node -> step of its latest computation
    last_read: list[int] = []  # per step: the last step that reads its output (itself when none)
    for step, v in enumerate(schedule):
        last_read.append(step)
        for u in graph.preds[v]:
            if u not in latest:
                raise ValueError(f"step {step} reads node {u} before it runs")
            last_read[latest[u]] = step
        latest[v] = step
    delta = [0] * (len(schedule) + 1)
    for step, v in enumerate(schedule):
        delta[step] += graph.ram[v]
        delta[last_read[step] + 1] -= graph.ram[v]
    live, peak = 0, 0
    for d in delta[:-1]:
        live += d
        peak = max(peak, live)
    return peak, sum(graph.cpu[v] for v in schedule)


def step_floor(graph: Graph) -> tuple[int, int]:
    """(bytes, node): the largest single step, a node's output with all its inputs live; no
    budget below it has a schedule."""
    return max((graph.ram[v] + sum(graph.ram[u] for u in ps), v) for v, ps in enumerate(graph.preds))
