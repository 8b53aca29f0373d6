"""A planned order as the steps a device profile's cost model simulates (roam_cli.cost.estimate):
each node's tier and kind (device compute, host compute, or a transfer each way), its FLOPs
(as recomputation counts them), the bytes it reads and writes, and the steps it waits for."""

from roam_cli.cost.estimate import Estimate, Step, estimate
from roam_cli.cost.profile import Profile
from roam_cli.core.graph import Graph
from roam_cli.core.memory import MemoryModel
from roam_cli.recompute.flops import node_flops


def steps(graph: Graph, mm: MemoryModel, order: list[int]) -> list[Step]:
    tiers = mm.tiers
    pos = [0] * len(order)
    for step, i in enumerate(order):
        pos[i] = step
    out = []
    for i in order:
        n = graph.nodes[i]
        after = tuple(sorted({pos[graph.producer[x]] for x in n.inputs if x in graph.producer}))
        if tiers is not None and i in tiers.transfers:
            out.append(Step(tiers.transfers[i], "", 0, mm.tensor_bytes[n.outputs[0]], after))
            continue
        touched = sum(mm.tensor_bytes[x] for x in {*n.inputs, *n.outputs})
        kind = "host" if tiers is not None and i in tiers.host_nodes else "device"
        out.append(Step(kind, n.op_type, node_flops(graph, n), touched, after))
    return out


def planned(graph: Graph, mm: MemoryModel, order: list[int], profile: Profile) -> Estimate:
    """The estimated time (and energy) of the step run in `order` on `profile`'s device."""
    return estimate(profile, steps(graph, mm, order))
