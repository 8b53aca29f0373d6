"""The plan's `sharding`: which rank layout a plan is for, what its collectives move per step, and
how long they take on a device profile's interconnect, and how much of that the step waits for.

Each collective is a ring over the N ranks (cost.profile.Interconnect): (N − 1) / N of its bytes
each way plus N − 1 hops of latency. The step is simulated once with the collectives on a stream
of their own beside the compute, each issued when the plan's order reaches it (cost.estimate),
and once with every collective free: the difference is the exposed time, what the compute waits
for. Recomputing an all-gather (a parameter gathered again in the backward) adds its bytes."""

from roam_cli.cost import profile as profile_mod
from roam_cli.cost.estimate import estimate
from roam_cli.core.collectives import ALL_GATHER, REDUCE_SCATTER, sharding
from roam_cli.core.graph import Graph
from roam_cli.core.memory import MemoryModel, recompute_copies
from roam_cli.offload import timing


def record(graph: Graph, mm: MemoryModel, order: list[int], device: str | None) -> dict | None:
    """The plan's `sharding` for `graph` run in `order`, estimated on profile `device` (None: the
    default for rank steps); None for a graph that is not a rank step."""
    meta = sharding(graph.metadata)
    if meta is None:
        return None
    ranks = meta["ranks"]
    profile = profile_mod.for_step(device, sharded=True)
    copies = recompute_copies(graph)
    moved = {op: {"count": 0, "bytes": 0} for op in (ALL_GATHER, REDUCE_SCATTER)}
    regathered = 0
    for n in graph.nodes:
        op = (n.domain, n.op_type)
        if op in moved:
            moved[op]["count"] += 1
            moved[op]["bytes"] += graph.values[n.outputs[0] if op == ALL_GATHER else n.inputs[0]].nbytes
            regathered += n.name in copies
    steps = timing.steps(graph, mm, order)
    with_them, without = estimate(profile, steps, ranks), estimate(profile, steps, 1)
    total = moved[ALL_GATHER]["bytes"] + moved[REDUCE_SCATTER]["bytes"]
    return {
        "ranks": ranks,
        "parameters": len(meta["parameters"]),
        "sharded_state": len(meta.get("state", {})),
        "batch": meta.get("batch"),
        "communication": {
            "all_gather": moved[ALL_GATHER] | {"regathered": regathered},
            "reduce_scatter": moved[REDUCE_SCATTER],
            # a ring sends (N − 1) / N of each buffer from every rank (its bytes are N shards: exact)
            "sent_bytes": total // ranks * (ranks - 1),
            "profile": profile.name,
            "interconnect": profile.interconnect.name,
            "seconds": with_them.network_seconds,
            "exposed_seconds": max(0.0, with_them.seconds - without.seconds),
            "step_seconds": with_them.seconds,
        },
    }
