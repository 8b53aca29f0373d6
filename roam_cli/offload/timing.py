"""A planned order as the steps a device profile's cost model simulates (roam_cli.cost.estimate):
each node's tier and kind (device compute, host compute, a transfer each way, or a rank step's
collective), its FLOPs (as recomputation counts them), the bytes it reads and writes (a
collective: the bytes it gathers or reduces), and the steps it waits for."""

from dataclasses import replace

from roam_cli.cost.estimate import COLLECTIVE, DEVICE as DEVICE_STEP, Estimate, Step, estimate
from roam_cli.cost.profile import Profile, op_class
from roam_cli.core.collectives import ALL_GATHER, COLLECTIVES, ranks
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
        if (n.domain, n.op_type) in COLLECTIVES:  # the whole buffer: the all-gather's output, the reduce-scatter's input
            whole = n.outputs[0] if (n.domain, n.op_type) == ALL_GATHER else n.inputs[0]
            out.append(Step(COLLECTIVE, n.op_type, 0, graph.values[whole].nbytes, after))
            continue
        touched = sum(mm.tensor_bytes[x] for x in {*n.inputs, *n.outputs})
        kind = "host" if tiers is not None and i in tiers.host_nodes else "device"
        out.append(Step(kind, n.op_type, node_flops(graph, n), touched, after))
    return out


def planned(graph: Graph, mm: MemoryModel, order: list[int], profile: Profile) -> Estimate:
    """The estimated time (and energy) of the step run in `order` on `profile`'s device (a rank
    step: one of its ranks, the others running the same order)."""
    return estimate(profile, steps(graph, mm, order), ranks(graph.metadata))


def floor(graph: Graph, mm: MemoryModel, profile: Profile) -> float:
    """The least time any order of the graph can be estimated at (`estimate`): each stream runs its
    steps one at a time, so the step takes at least the busiest stream's total, and that total is
    the same in every order. The total is summed here in the graph's node order, where `estimate`
    sums in the planned order: the two can differ in the last digits of a float."""
    busy = estimate(profile, [replace(s, after=()) for s in steps(graph, mm, range(len(graph.nodes)))],
                    ranks(graph.metadata))
    device = busy.device_compute_seconds + (0.0 if profile.overlap else busy.to_host_seconds + busy.to_device_seconds)
    link = (busy.to_host_seconds + busy.to_device_seconds if not profile.duplex
            else max(busy.to_host_seconds, busy.to_device_seconds))
    return max(device, busy.host_compute_seconds, link if profile.overlap else 0.0, busy.network_seconds)


def device_seconds(profile: Profile, steps: list[Step]) -> list[float]:
    """Each step's time on the device's compute stream, as `estimate` counts it (0 off it)."""
    rate, bandwidth = profile.device_flops, profile.device_memory_bandwidth
    return [profile.kernel_overhead + max(s.flops / rate[op_class(s.op_type)], s.bytes / bandwidth)
            if s.kind == DEVICE_STEP else 0.0 for s in steps]


def hidden_share(graph: Graph, mm: MemoryModel, order: list[str], values: dict[str, int],
                 profile: Profile) -> dict[str, float]:
    """For each forward value (name -> bytes), the share of its round trip (out after its last
    forward reader, back before its first reader after the forward) that the device compute
    between the two covers in `order` (node names): 1 when offloading it costs no time."""
    index = graph.node_index()
    planned = [index[name] for name in order]
    pos = [0] * len(planned)
    for step, i in enumerate(planned):
        pos[i] = step
    elapsed = [0.0]  # device seconds before each step
    for t in device_seconds(profile, steps(graph, mm, planned)):
        elapsed.append(elapsed[-1] + t)
    share = {}
    for v, nbytes in values.items():
        readers = graph.consumers.get(v, ())
        forward = [pos[u] for u in readers if mm.node_class[u] == "forward"]
        after = [pos[u] for u in readers if mm.node_class[u] != "forward"]
        out = max(forward + [pos[graph.producer[v]]])
        back = min(after, default=out)
        trip = 2 * profile.link_latency + nbytes / profile.to_host_bandwidth + nbytes / profile.to_device_bandwidth
        window = elapsed[back] - elapsed[out + 1] if back > out else 0.0
        share[v] = min(1.0, window / trip) if trip else 1.0
    return share


def live_at(graph: Graph, order: list[str], values: list[str], step: int) -> set[str]:
    """The values (forward values, by name) whose own storage holds them at `step` of `order` (node
    names): made at or before it, read at or after it (offloading one of them lowers that step)."""
    pos = {name: k for k, name in enumerate(order)}
    live = set()
    for v in values:
        readers = [pos[graph.nodes[u].name] for u in graph.consumers.get(v, ())]
        if pos[graph.nodes[graph.producer[v]].name] <= step <= max(readers, default=-1):
            live.add(v)
    return live
