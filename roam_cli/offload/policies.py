"""The placements users know (save_on_cpu, ZeRO-Offload, every persistent byte on the host), what
an offload can take, and the least any placement leaves on the device."""

from roam_cli.core.graph import Graph
from roam_cli.core.memory import MemoryModel, folded_values
from roam_cli.offload.rewrite import Placement
from roam_cli.recompute import problem as recompute_problem

HOST_CLASSES = ("update", "accumulate")  # the optimizer's nodes, which ZeRO-Offload runs on the host


def offloadable(graph: Graph, mm: MemoryModel) -> dict[str, int]:
    """Forward values a transfer can take from the device until the backward, with their bytes:
    each read after the forward, owning its storage (a view's base goes, not the view), not held
    to the end of the step, and with no view of it read after the forward (that view would keep
    the device's copy)."""
    p = recompute_problem.build(graph, mm, "free")
    viewed = {p.base[v] for v in p.needed if p.base.get(v, v) != v}
    return {v: p.cost[v] for v in sorted(p.needed)
            if p.base.get(v) == v and p.cost.get(v) and v not in viewed}


def save_on_cpu(graph: Graph, mm: MemoryModel, slow: str) -> Placement:
    """PyTorch's torch.autograd.graph.save_on_cpu: every saved activation in the slow tier."""
    return Placement(slow, offloaded=frozenset(offloadable(graph, mm)))


def readers_of(graph: Graph, mm: MemoryModel) -> dict[str, set[int]]:
    """Storage root -> the nodes reading it under any name."""
    readers: dict[str, set[int]] = {}
    for i, n in enumerate(graph.nodes):
        for x in n.inputs:
            readers.setdefault(mm.storage_of[x], set()).add(i)
    return readers


def update_on_host(graph: Graph, mm: MemoryModel, slow: str, everything: bool,
                   host: frozenset[int] | None = None, readers: dict[str, set[int]] | None = None) -> Placement:
    """The optimizer's nodes run by the host, with the state they update kept there (DeepSpeed's
    ZeRO-Offload: the device fetches each parameter once and holds it the step). `everything`: every
    persistent byte in the slow tier, the parameters fetched for the forward and again for the
    backward (ZeRO-Infinity's streaming). `host`: the nodes the host runs, when not all of the
    optimizer's (some parameters' updates: update_groups). `readers`: readers_of(graph, mm), when
    the caller has it."""
    if host is None:
        host = frozenset(i for i, c in enumerate(mm.node_class) if c in HOST_CLASSES)
    movable = {r for r in mm.persistent if mm.tensor_bytes[r]} - folded_values(graph)  # ORT holds the rest itself
    if everything:
        homes = movable
    else:
        readers = readers_of(graph, mm) if readers is None else readers
        written = {mm.storage_of[o] for i in host for o in graph.nodes[i].outputs}
        homes = {r for r in movable if r in written or (readers.get(r) and readers[r] <= host)}
    return Placement(slow, homes=frozenset(homes), host_nodes=host, fetch_per_phase=everything)


def update_groups(graph: Graph, mm: MemoryModel) -> list[tuple[frozenset[int], int]]:
    """The optimizer's nodes split by the gradients they read: for each gradient the update reads (a
    value made before the optimizer), the optimizer's nodes it reaches, through in-place writes
    too; groups that share a node are one (a clipping norm over every gradient joins them all).
    Each with the persistent bytes its nodes write, most first: the state one parameter's update
    on the host takes off the device. The step counter's and the bias corrections' nodes, which
    read no gradient, are in none."""
    optimizer = {i for i, c in enumerate(mm.node_class) if c in HOST_CLASSES}
    by_storage: dict[str, set[int]] = {}
    for i, n in enumerate(graph.nodes):
        for x in n.inputs:
            by_storage.setdefault(mm.storage_of[x], set()).add(i)
    owner: dict[int, int] = {}  # optimizer node -> its group's first node (a union-find's roots)

    def find(i: int) -> int:
        while owner[i] != i:
            owner[i] = owner[owner[i]]
            i = owner[i]
        return i

    starts = {i for i in optimizer
              if any(x in graph.producer and graph.producer[x] not in optimizer
                     and mm.node_class[graph.producer[x]] != "forward" for x in graph.nodes[i].inputs)}
    for start in sorted(starts):
        reached, stack = set(), [start]
        while stack:
            i = stack.pop()
            if i in reached:
                continue
            reached.add(i)
            for out in graph.nodes[i].outputs:
                stack.extend(u for u in by_storage.get(mm.storage_of[out], ()) if u in optimizer)
        roots = {find(i) for i in reached if i in owner}
        first = min(roots | {start})
        for r in roots:
            owner[r] = first
        for i in reached:
            owner.setdefault(i, first)
    groups: dict[int, set[int]] = {}
    for i in owner:
        groups.setdefault(find(i), set()).add(i)
    sized = []
    for nodes in groups.values():
        written = {mm.storage_of[o] for i in nodes for o in graph.nodes[i].outputs} & set(mm.persistent)
        sized.append((frozenset(nodes), sum(mm.tensor_bytes[r] for r in written)))
    return sorted(sized, key=lambda g: (-g[1], min(g[0])))


def working_set(graph: Graph, mm: MemoryModel) -> tuple[int, str]:
    """The most bytes one node of the device holds at once (its inputs' and outputs' storages, each
    counted once) and that node: no placement puts less on the device while it runs. The host's
    nodes (HOST_CLASSES) are left out: a placement may run them there."""
    best, name = 0, ""
    for i, n in enumerate(graph.nodes):
        if mm.node_class[i] in HOST_CLASSES:
            continue
        held = sum(mm.tensor_bytes[r] for r in {mm.storage_of[x] for x in (*n.inputs, *n.outputs)})
        if held > best:
            best, name = held, n.name
    return best, name
