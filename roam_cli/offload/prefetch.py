"""Fetches started early enough to overlap compute, within the device's peak.

The order stage minimises the device's peak, so it runs each transfer to the device right before
its first reader, and the device waits for it. A fetch run earlier holds its bytes from there
on: `hoist` moves each one back over the steps whose device compute covers its transfer time,
as far as the live bytes at every step it passes stay within the order's peak and its input is
ready, so that the plan's device bytes do not change. The order it returns is checked whole: if
its peak is over the given order's, the given order is returned."""

from roam_cli.cost.estimate import TO_DEVICE
from roam_cli.cost.profile import Profile
from roam_cli.core.graph import Graph
from roam_cli.core.memory import DEVICE, MemoryModel, lifetimes, peak_live
from roam_cli.offload import timing


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
    key = [float(k) for k in range(len(order))]
    for k, s in enumerate(steps):
        if s.kind != TO_DEVICE:
            continue
        ready = max(s.after, default=-1)
        need = profile.link_latency + s.bytes / profile.to_device_bandwidth
        q, done = k, 0.0
        while done < need and q - 1 > ready and live[q - 1] + s.bytes <= peak:
            q -= 1
            done += covered[q]
        if q < k:
            for t in range(q, k):
                live[t] += s.bytes
            key[k] = q - 0.5 + k * 1e-9  # before step q; fetches moved to one step keep their order
    hoisted = [order[k] for k in sorted(range(len(order)), key=key.__getitem__)]
    if hoisted == order or peak_live(mm, lifetimes(mm, hoisted))[0] > peak:
        return order
    return hoisted
