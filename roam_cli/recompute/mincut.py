"""`--recompute free`: the saved set a min-cut partitioner chooses (as torch.compile's does).

One flow network over the forward pass: a vertex per node and two per value (in, out). Cutting
value v's in->out edge saves v, at its bytes; cutting source->node recomputes the node, at its
FLOPs (infinite for a node that may not be copied). A needed value's out vertex is tied to the
sink, so every needed value ends up saved or recomputed from saved and persistent values. Bytes
weigh more than all FLOPs together: the cut keeps the fewest bytes live across the
forward/backward boundary, and among such cuts recomputes the fewest FLOPs. A Dropout output
that can be replayed has a vertex of its own for the replay (cut from the source at its FLOPs,
reading the Dropout's input and mask) instead of the edge from the Dropout, which is never
copied."""

from roam_cli.recompute.maxflow import INF, min_cut
from roam_cli.recompute.problem import Problem

SOURCE, SINK = 0, 1


def solve(problem: Problem) -> set[str]:
    """The saved values of a minimum cut."""
    per_byte = sum(problem.flops) + sum(f for _, f in problem.replays.values()) + 1
    vertex_of_node = [2 + k for k in range(len(problem.nodes))]
    value_in: dict[str, int] = {}
    count = 2 + len(problem.nodes)
    for v in problem.cost:
        value_in[v] = count  # its out vertex is count + 1
        count += 2
    edges = []
    for k, (ins, outs) in enumerate(zip(problem.inputs, problem.outputs)):
        node = vertex_of_node[k]
        edges.append((SOURCE, node, problem.flops[k] if problem.copyable[k] else INF))
        edges.extend((value_in[x] + 1, node, INF) for x in ins if x in value_in)
        edges.extend((node, value_in[v], INF) for v in outs if v in value_in and v not in problem.replays)
    for v, (ins, flops) in problem.replays.items():
        replay = count
        count += 1
        edges.append((SOURCE, replay, flops))
        edges.extend((value_in[x] + 1, replay, INF) for x in ins if x in value_in)
        edges.append((replay, value_in[v], INF))
    for v, vin in value_in.items():
        cost = problem.cost[v]
        edges.append((vin, vin + 1, INF if cost is None else cost * per_byte))
        if v in problem.needed:
            edges.append((vin + 1, SINK, INF))
    source_side = min_cut(count, edges, SOURCE, SINK)
    return {v for v, vin in value_in.items() if vin in source_side and vin + 1 not in source_side}
