"""A plan in formats other tools open: a Chrome/Perfetto trace and a PyTorch memory snapshot.

Both put one operator per step on a timeline, 1 µs per step (the plan has steps, not times).

- `perfetto_trace()`: Chrome trace-event JSON (ui.perfetto.dev, chrome://tracing): each operator
  a slice on an "operators" track; the arena's live bytes and its highest used address as
  counter tracks.
- `memory_snapshot()`: the dict `torch.cuda.memory._snapshot()` returns, which PyTorch's
  memory_viz page (pytorch.org/memory_viz) renders: the arena and the persistent tensors as two
  segments, one alloc event per tensor at its first step and free events after its last step.
  The arena's addresses are the plan's offsets from an arbitrary base; persistent tensors have
  no offset in the plan and are packed in plan order in a segment of their own.

A plan with a slower tier (optimize --offload) exports it beside the device: in the trace, its
arena's counters named after it and the transfers on a track of their own, each from its step to
the step that needs its copy; in the snapshot, a second device (memory_viz's device selector)
holding the slow tier's arena and persistent tensors."""

import pickle

from roam_cli.core.memory import DEVICE
from roam_cli.outputs.report import plan_curve

PID, OPS_TID, TRANSFERS_TID = 1, 1, 2
# Arbitrary device addresses: below 2**53 so that JavaScript reads them exactly.
ARENA_BASE = 0x7F00_0000_0000
SEGMENT_GAP = 2**21
# memory_viz's JavaScript unpickler reads protocols 2 to 4 only.
PICKLE_PROTOCOL = 4


def in_tier(plan: dict, tier: str) -> dict:
    """The plan as one tier's memory sees it: its tensors only."""
    return {**plan, "tensors": [t for t in plan["tensors"] if t.get("tier", DEVICE) == tier]}


def memories(plan: dict) -> list[tuple[str, int, int]]:
    """(tier, arena bytes, persistent bytes) of each memory the plan uses, the device first."""
    tiers = plan.get("tiers")
    return [(DEVICE, plan["arena_bytes"], plan["persistent_bytes"])] + (
        [(tiers["slow"], tiers["arena_bytes"], tiers["persistent_bytes"])] if tiers else [])


def step_events(plan: dict) -> tuple[list[list[dict]], list[list[dict]]]:
    """Per step: the arena tensors allocated at it, and those freed after it (of one tier: `in_tier`)."""
    steps = len(plan["order"])
    born: list[list[dict]] = [[] for _ in range(steps)]
    dying: list[list[dict]] = [[] for _ in range(steps)]
    for t in plan["tensors"]:
        if t["offset"] is not None and t["bytes"] > 0:
            born[t["first_step"]].append(t)
            dying[t["last_step"]].append(t)
    for group in born + dying:
        group.sort(key=lambda t: t["offset"])
    return born, dying


def perfetto_trace(plan: dict) -> dict:
    tiers = plan.get("tiers")
    device = in_tier(plan, DEVICE)
    born, dying = step_events(device)
    live = plan_curve(device)
    events = [
        {"name": "process_name", "ph": "M", "pid": PID, "args": {"name": f"roam plan: {plan['model']['path']}"}},
        {"name": "thread_name", "ph": "M", "pid": PID, "tid": OPS_TID, "args": {"name": "operators (1 µs = 1 step)"}},
    ]
    for step, node in enumerate(plan["order"]):  # the allocations are the device's
        events.append({"name": node, "cat": "op", "ph": "X", "ts": step, "dur": 1, "pid": PID, "tid": OPS_TID,
                       "args": {"step": step, "allocates_bytes": sum(t["bytes"] for t in born[step]),
                                "frees_bytes": sum(t["bytes"] for t in dying[step]), "live_bytes": live[step],
                                "allocates": [t["name"] for t in born[step]]}})
    for tier, _, _ in memories(plan):
        events += arena_counters(in_tier(plan, tier), "arena" if tiers is None else f"{tier} arena")
    other = {"model": plan["model"]["path"], "arena_bytes": plan["arena_bytes"],
             "persistent_bytes": plan["persistent_bytes"], "peak_live_bytes": plan["peak_live_bytes"],
             "time_unit": "1 us = 1 step"}
    if tiers is not None:
        events.append({"name": "thread_name", "ph": "M", "pid": PID, "tid": TRANSFERS_TID,
                       "args": {"name": f"transfers between the device and the {tiers['slow']}"}})
        # async spans (they may overlap): from the transfer's step to the step that reads its copy
        for k, t in enumerate(plan.get("offload", {}).get("transfers", ())):
            span = {"name": f"{t['direction']}: {t['value']}", "cat": "transfer", "id": k, "pid": PID,
                    "tid": TRANSFERS_TID}
            events += [span | {"ph": "b", "ts": t["step"], "args": {"node": t["node"], "bytes": t["bytes"]}},
                       span | {"ph": "e", "ts": t["needed_at"]}]
        other["tiers"] = {k: tiers[k] for k in ("slow", "arena_bytes", "persistent_bytes", "peak_live_bytes")}
    return {"traceEvents": events, "otherData": other}


def arena_counters(plan: dict, name: str) -> list[dict]:
    """The arena's live bytes and highest used address at each step, and zero after the last."""
    born, dying = step_events(plan)
    live = plan_curve(plan)
    active: dict[str, dict] = {}  # arena tensors live at the step
    events = []
    for step in range(len(plan["order"])):
        active.update((t["name"], t) for t in born[step])
        events += counters(name, step, live[step], max((t["offset"] + t["bytes"] for t in active.values()), default=0))
        for t in dying[step]:
            del active[t["name"]]
    return events + counters(name, len(plan["order"]), 0, 0)


def counters(name: str, step: int, live: int, top: int) -> list[dict]:
    # one series per counter: the legacy Chrome viewer stacks the series of one counter
    return [{"name": f"{name} live bytes", "ph": "C", "ts": step, "pid": PID, "args": {"bytes": live}},
            {"name": f"{name} highest used address", "ph": "C", "ts": step, "pid": PID, "args": {"bytes": top}}]


def frames(t: dict, plan: dict) -> list[dict]:
    """memory_viz shows a block's frames as its stack: name the tensor, its class and producer."""
    return [{"filename": t["name"], "line": t["first_step"],
             "name": f"{t['kind']}, made by {plan['order'][t['first_step']]}"}]


def event(action: str, addr: int, size: int, step: int, frames_: list[dict]) -> dict:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": step, "frames": frames_}


def segment(address: int, size: int, blocks: list[dict], device: int = 0) -> dict:
    """A segment whose blocks tile it: the live ones as given (address, size, frames), the gaps inactive."""
    tiled, cursor = [], address
    for b in sorted(blocks, key=lambda b: b["address"]):
        if b["address"] > cursor:
            tiled.append({"address": cursor, "size": b["address"] - cursor, "requested_size": 0,
                          "state": "inactive", "frames": []})
        tiled.append({**b, "requested_size": b["size"], "state": "active_allocated"})
        cursor = b["address"] + b["size"]
    if cursor < address + size:
        tiled.append({"address": cursor, "size": address + size - cursor, "requested_size": 0,
                      "state": "inactive", "frames": []})
    allocated = sum(b["size"] for b in blocks)
    return {"device": device, "address": address, "total_size": size, "allocated_size": allocated,
            "active_size": allocated, "requested_size": allocated, "stream": 0, "segment_type": "large",
            "frames": [], "blocks": tiled}


def memory_snapshot(plan: dict) -> dict:
    """The plan replayed as allocator events, one device per memory (the slow tier second). At
    the end, the transient tensors are freed and the persistent ones remain, as after a training
    step."""
    segments, traces = [], []
    for device, (tier, arena, persistent_bytes) in enumerate(memories(plan)):
        tier_segments, trace = tier_snapshot(in_tier(plan, tier), arena, persistent_bytes, device)
        segments += tier_segments
        traces.append(trace)
    return {"segments": segments, "device_traces": traces}


def tier_snapshot(plan: dict, arena: int, persistent_bytes: int, device: int) -> tuple[list[dict], list[dict]]:
    """One memory's segments and allocator events (`plan`: that tier's tensors, `in_tier`)."""
    born, dying = step_events(plan)
    persistent_base = ARENA_BASE + -(-max(arena, 1) // SEGMENT_GAP) * SEGMENT_GAP + SEGMENT_GAP
    persistent = [t for t in plan["tensors"] if t["offset"] is None and "alias_of" not in t and t["bytes"] > 0]
    trace = [event("segment_alloc", persistent_base, persistent_bytes, 0, [])] if persistent else []
    kept, addr = [], persistent_base
    for t in persistent:
        f = frames(t, plan)
        trace.append(event("alloc", addr, t["bytes"], 0, f))
        kept.append({"address": addr, "size": t["bytes"], "frames": f})
        addr += t["bytes"]
    if arena:
        trace.append(event("segment_alloc", ARENA_BASE, arena, 0, []))
    for step in range(len(plan["order"])):
        for t in born[step]:
            trace.append(event("alloc", ARENA_BASE + t["offset"], t["bytes"], step, frames(t, plan)))
        for t in dying[step]:
            for action in ("free_requested", "free_completed"):
                trace.append(event(action, ARENA_BASE + t["offset"], t["bytes"], step, frames(t, plan)))
    segments = [segment(ARENA_BASE, arena, [], device)] if arena else []
    if persistent:
        segments.append(segment(persistent_base, persistent_bytes, kept, device))
    return segments, trace


def memory_snapshot_bytes(plan: dict) -> bytes:
    return pickle.dumps(memory_snapshot(plan), protocol=PICKLE_PROTOCOL)
