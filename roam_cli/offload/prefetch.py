"""Fetches and all-gathers started early enough to overlap compute, and the updates waiting for a
reduce-scatter run late enough, within the device's peak.

The order stage minimises the device's peak, so it runs each transfer to the device right before
its first reader, and a rank step's all-gather right before the first reader of the parameter it
gathers: the device waits for each. One run earlier holds its bytes from there on: `hoist` moves
each fetch back over the steps whose device compute covers its transfer, as far as the live bytes
at every step it passes stay within the order's peak, its input is ready, and no earlier fetch
was moved before it (the link runs them one at a time, in order). The gathers are scheduled from
the last needed (`gathers_hoisted`), the views after each moved to its first reader
(`views_sunk`). A reduce-scatter's gradient shard is read by its parameter's update alone (the
update nodes that follow from it, which nothing else reads): those are moved later over the
compute that covers the ring, the shard held meanwhile within the peak as well. So the plan's
device bytes do not change. The schedules made so (gathers moved later or not, updates moved or
not) are checked whole: the one the cost model estimates fastest whose peak is the order's is
returned, or the given order when none is faster."""

from roam_cli.cost.estimate import COLLECTIVE, TO_DEVICE, estimate
from roam_cli.cost.profile import Profile
from roam_cli.core.collectives import ranks
from roam_cli.core.graph import Graph
from roam_cli.core.memory import DEVICE, MemoryModel, lifetimes, peak_live
from roam_cli.offload import timing

VIEWS = {"Slice", "Reshape", "Identity"}  # what roam shard writes between a gather and its readers


def hoist(graph: Graph, mm: MemoryModel, order: list[int], profile: Profile) -> list[int]:
    steps = timing.steps(graph, mm, order)
    covered = timing.device_seconds(profile, steps)
    spans = lifetimes(mm, order)
    live = [0] * (len(order) + 1)
    for s, (first, last) in zip(mm.storages, spans):
        if s.tier == DEVICE:
            live[first] += s.bytes
            live[last + 1] -= s.bytes
    for k in range(1, len(live)):
        live[k] += live[k - 1]
    peak = peak_live(mm, spans)[0]
    n = ranks(graph.metadata)
    key = {k: float(k) for k in range(len(order))}
    last_moved = -1  # the step before which the last fetch moved now runs: the link takes them in order
    for k, s in enumerate(steps):
        if s.kind != TO_DEVICE:
            continue
        need = profile.link_latency + s.bytes / profile.to_device_bandwidth
        ready = max(max(s.after, default=-1), last_moved - 1)
        q, done = k, 0.0
        while done < need and q - 1 > ready and live[q - 1] + s.bytes <= peak:
            q -= 1
            done += covered[q]
        last_moved = q
        if q < k:
            for t in range(q, k):
                live[t] += s.bytes
            key[k] = q - 0.5 + k * 1e-9  # before step q; those moved to one step keep their order
    # the schedules tried, each kept by the cost model, not by the simple timing that makes it: the
    # gathers with and without those run early moved later, the updates moved or not
    candidates = []
    views, due = views_sunk(graph, order, steps) if n > 1 else ({}, {})
    for later in ((True, False) if n > 1 else (False,)):
        moved, held = key | views, list(live)
        if n > 1:
            gathers_hoisted(steps, covered, held, peak, n, profile, moved, due, later)
        sunk = updates_sunk(graph, mm, order, steps, covered, held, peak, n, profile)
        candidates += [moved | sunk, moved]
    best, seconds = order, estimate(profile, steps, n).seconds
    for moved in candidates:
        hoisted = [order[k] for k in sorted(range(len(order)), key=moved.__getitem__)]
        # a gather moved later can pass the in-place update of the shard it reads (a recomputing
        # gather in the backward): such a schedule is no order of the step
        if hoisted == best or not runs_after_its_preds(mm, hoisted) or peak_live(mm, lifetimes(mm, hoisted))[0] > peak:
            continue
        took = estimate(profile, timing.steps(graph, mm, hoisted), n).seconds
        if took < seconds or (took == seconds and best is order):
            best, seconds = hoisted, took
    return best


def runs_after_its_preds(mm: MemoryModel, order: list[int]) -> bool:
    position = {v: k for k, v in enumerate(order)}
    return all(position[u] < position[v] for v, preds in enumerate(mm.preds) for u in preds)


def views_sunk(graph: Graph, order: list[int], steps: list) -> tuple[dict[int, float], dict[int, int]]:
    """(new sort keys of the views roam shard writes after each all-gather, each all-gather's step
    -> the step that first computes with its parameter). The Slice and Reshape after a gather cost
    no compute but wait for it, and the compute after them waits too: run right before the first
    node that reads the parameter, they leave the compute before it to hide the ring."""
    position = {i: k for k, i in enumerate(order)}
    keys: dict[int, float] = {}
    due: dict[int, int] = {}
    for k, s in enumerate(steps):
        if s.kind != COLLECTIVE or s.op_type != "AllGather":
            continue
        chain, frontier, users = [], [order[k]], []
        while frontier:
            for v in graph.nodes[frontier.pop()].outputs:
                for u in graph.consumers.get(v, ()):
                    if graph.nodes[u].op_type in VIEWS and graph.nodes[u].inputs[0] == v:
                        chain.append(u)
                        frontier.append(u)
                    else:
                        users.append(position[u])
        if not users:
            continue
        due[k] = first = min(users)
        for u in chain:  # after the gather (at most first - 0.5), before the reader, in their order
            keys[position[u]] = first - 0.25 + position[u] * 1e-9
    return keys, due


def gathers_hoisted(steps: list, covered: list[float], live: list[int], peak: int, ranks: int, profile: Profile,
                    key: dict[int, float], due: dict[int, int], later: bool) -> None:
    """Each all-gather's new sort key in `key`, scheduled from the last needed: the interconnect
    runs the gathers one at a time, in the order they are issued, so each must end where its
    parameter is first computed with (`due`) and before the one needed next must start. It is
    issued at the latest step whose compute leaves it that time: earlier than the order runs it
    where its input and the peak allow, and with `later` later where the order runs it before
    it is needed (it would hold the ring for those needed first)."""
    elapsed = [0.0]  # the device compute before each step
    for t in covered:
        elapsed.append(elapsed[-1] + t)

    def issued(q: int) -> float:
        """when a collective run before step q starts: as the step before it starts (cost.estimate)"""
        return elapsed[max(q - 1, 0)]

    gathers = [k for k, s in enumerate(steps) if s.kind == COLLECTIVE and s.op_type == "AllGather"]
    next_start = float("inf")
    for k in sorted(gathers, key=lambda k: (due.get(k, k), k), reverse=True):  # the last needed first
        s = steps[k]
        until = due.get(k, k)
        start = min(elapsed[until], next_start) - profile.interconnect.ring_seconds(s.bytes, ranks)
        ready = max(s.after, default=-1)
        q = until if later else k
        while issued(q) > start and q - 1 > ready and (q > k or live[q - 1] + s.bytes <= peak):
            q -= 1
        next_start = max(start, issued(q))
        if q < k:  # (from k to the reader its buffer, or its views', were held before)
            for t in range(q, k):
                live[t] += s.bytes
        if q != k:
            key[k] = q - 0.5 + k * 1e-9


def updates_sunk(graph: Graph, mm: MemoryModel, order: list[int], steps: list, covered: list[float],
                 live: list[int], peak: int, ranks: int, profile: Profile) -> dict[int, float]:
    """Step -> its new sort key, for the update steps moved after the compute that covers the
    reduce-scatter they wait for."""
    position = {i: k for k, i in enumerate(order)}
    moved: dict[int, float] = {}
    for k, s in enumerate(steps):
        if s.kind != COLLECTIVE or s.op_type != "ReduceScatter" or ranks < 2:
            continue
        waiting, stack = set(), [order[k]]
        while stack:  # every node that follows from the shard
            for v in graph.nodes[stack.pop()].outputs:
                for u in graph.consumers.get(v, ()):
                    if u not in waiting:
                        waiting.add(u)
                        stack.append(u)
        if not waiting or any(mm.node_class[u] != "update" for u in waiting):
            continue
        first = min(position[u] for u in waiting)
        shard = mm.tensor_bytes[graph.nodes[order[k]].outputs[0]]
        need, done, q = profile.interconnect.ring_seconds(s.bytes, ranks), 0.0, first
        for t in range(first + 1, len(order)):
            if done >= need:
                break
            if order[t] in waiting:  # moves with the others
                continue
            if live[t] + shard > peak:
                break
            done += covered[t]
            q = t
        if q > first:
            for t in range(first + 1, q + 1):
                live[t] += shard
            for u in waiting:
                if position[u] < q:
                    moved[position[u]] = q + 0.5 + position[u] * 1e-9  # after step q, in their order
    return moved
