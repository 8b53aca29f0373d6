"""`--recompute free`: the saved set a min-cut partitioner chooses (as torch.compile's does).

One flow network over the forward pass: a vertex per node and two per value (in, out). Cutting
value v's in->out edge saves v, at its bytes; cutting source->node recomputes the node, at its
price (problem.py: its FLOPs, a gather's communication; infinite for a node that may not be
copied). A needed value's out vertex is tied to the sink, so every needed value ends up saved or
recomputed from saved and persistent values. Bytes weigh more than all prices together: the cut
keeps the fewest bytes live across the forward/backward boundary, and among such cuts pays the
least. A Dropout output that can be replayed has a vertex of its own for the replay (cut from the
source at its FLOPs, reading the Dropout's input and mask) instead of the edge from the Dropout,
which is never copied."""

from roam_cli.recompute.problem import Problem
from roam_cli.solvers.maxflow import INF, Network

SOURCE, SINK = 0, 1


def solve(problem: Problem) -> set[str]:
    """The saved values of a minimum cut."""
    per_byte = sum(problem.price) + sum(f for _, f in problem.replays.values()) + 1
    nodes = len(problem.nodes)
    value_in = {v: 2 + nodes + 2 * k for k, v in enumerate(problem.cost)}  # its out vertex: one more
    replay_vertex = {v: 2 + nodes + 2 * len(value_in) + k for k, v in enumerate(problem.replays)}
    net = Network(2 + nodes + 2 * len(value_in) + len(replay_vertex))
    for k, (ins, outs) in enumerate(zip(problem.inputs, problem.outputs)):
        node = 2 + k
        net.add(SOURCE, node, problem.price[k] if problem.copyable[k] else INF)
        for x in ins:
            if x in value_in:
                net.add(value_in[x] + 1, node, INF)
        for v in outs:
            if v in value_in and v not in problem.replays:
                net.add(node, value_in[v], INF)
    for v, (ins, flops) in problem.replays.items():
        net.add(SOURCE, replay_vertex[v], flops)
        for x in ins:
            if x in value_in:
                net.add(value_in[x] + 1, replay_vertex[v], INF)
        net.add(replay_vertex[v], value_in[v], INF)
    for v, vin in value_in.items():
        cost = problem.cost[v]
        net.add(vin, vin + 1, INF if cost is None else cost * per_byte)
        if v in problem.needed:
            net.add(vin + 1, SINK, INF)
    net.max_flow(SOURCE, SINK)  # finite: keeping every needed value is a cut
    source_side = net.reachable(SOURCE)
    return {v for v, vin in value_in.items() if source_side[vin] and not source_side[vin + 1]}
