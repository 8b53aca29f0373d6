"""`roam report`: what a plan costs and where the peak comes from, from plan.json alone.

`summarize()` turns a plan into plain figures; `render_table()` and `render_markdown()` print
them. The strategies table reads the baselines that optimize measured in the same run
(`stats.baselines`, `stats.order.baselines`, `stats.layout.baselines`); a plan without them
shows its own row only."""

from collections import Counter
from collections.abc import Iterable

from rich import box
from rich.console import Console
from rich.table import Table

from roam_cli import pair
from roam_cli.core.units import format_bytes


def live_curve(spans: Iterable[tuple[int, int, int]], steps: int) -> list[int]:
    """Bytes live at each step for (first_step, last_step, bytes) triples, steps inclusive."""
    delta = [0] * (steps + 1)
    for first, last, nbytes in spans:
        delta[first] += nbytes
        delta[last + 1] -= nbytes
    curve, live = [], 0
    for step in range(steps):
        live += delta[step]
        curve.append(live)
    return curve


def arena_spans(plan: dict) -> list[tuple[int, int, int]]:
    """(first_step, last_step, bytes) of every tensor that owns arena space."""
    return [(t["first_step"], t["last_step"], t["bytes"]) for t in plan["tensors"] if t["offset"] is not None]


def plan_curve(plan: dict) -> list[int]:
    """Transient bytes live at each step of the plan's order."""
    return live_curve(arena_spans(plan), len(plan["order"]))


def strategy_rows(plan: dict) -> list[dict]:
    """Every (order, layout) pair measured in the plan's run, the plan's own pair first.

    A row has peak_live_bytes and/or arena_bytes (None where the run measured only the other),
    seconds where known, and how much less each needs than the original order (peak) and than
    `arena_reference()` (arena)."""
    stats = plan["stats"]
    rows: dict[tuple, dict] = {}

    def add(order, layout, peak=None, arena=None, seconds=None):
        row = rows.setdefault((order, layout), {"order": order, "layout": layout, "peak_live_bytes": None,
                                                "arena_bytes": None, "seconds": None})
        for key, value in (("peak_live_bytes", peak), ("arena_bytes", arena), ("seconds", seconds)):
            if row[key] is None and isinstance(value, (int, float)):
                row[key] = value

    own_order, own_layout = stats["order"]["strategy"], stats["layout"]["strategy"]
    add(own_order, own_layout, plan["peak_live_bytes"], plan["arena_bytes"],
        sum(stats["seconds"].get(phase, 0.0) for phase in ("order", "layout")))
    for b in stats.get("baselines", []):
        add(b.get("order"), b.get("layout"), b.get("peak_live_bytes"), b.get("arena_bytes"), b.get("seconds"))
    for b in as_list(stats["order"].get("baselines")):
        # an order baseline fixes only the order: a row of that order with a layout already has its peak
        if not any(order == b.get("strategy") for order, _ in rows):
            add(b.get("strategy"), None, b.get("peak_live_bytes"), None, b.get("seconds"))
    for b in as_list(stats["layout"].get("baselines")):
        add(own_order, b.get("strategy"), plan["peak_live_bytes"], b.get("arena_bytes", b.get("arena")),
            b.get("seconds"))

    out = list(rows.values())
    peaks = {r["order"]: r["peak_live_bytes"] for r in out if r["peak_live_bytes"] is not None}
    for r in out:  # a layout-less order row and a full row of the same order share the peak
        if r["peak_live_bytes"] is None:
            r["peak_live_bytes"] = peaks.get(r["order"])
    original_peak = peaks.get("original")
    reference = arena_reference(out, own_layout)
    floor = arena_floor(plan)  # the plan's order's layouts hold its kernel scratch too
    for r in out:
        r["this_plan"] = (r["order"], r["layout"]) == (own_order, own_layout)
        peak, arena = r["peak_live_bytes"], r["arena_bytes"]
        held = floor if r["order"] == own_order else peak
        r["fragmentation"] = arena / held - 1 if arena is not None and held else None
        r["peak_vs_original"] = reduction(peak, original_peak)
        r["arena_vs_original"] = reduction(arena, reference and reference["arena_bytes"])
        r["arena_reference"] = reference is r
    return out


def arena_reference(rows: list[dict], own_layout: str) -> dict | None:
    """The row arenas are compared with: the original order with PyTorch's caching allocator
    (what eager PyTorch would reserve) if measured, else with the plan's layout, else any."""
    measured = [r for r in rows if r["order"] == "original" and r["arena_bytes"] is not None]
    for layout in ("pytorch", own_layout):
        for r in measured:
            if r["layout"] == layout:
                return r
    return measured[0] if measured else None


def as_list(baselines) -> list[dict]:
    """Baselines as a list of dicts with a `strategy` key (a dict is keyed by strategy)."""
    if isinstance(baselines, dict):
        return [{"strategy": k, **(v if isinstance(v, dict) else {"arena_bytes": v})} for k, v in baselines.items()]
    return [b for b in baselines or [] if isinstance(b, dict)]


def reduction(value, reference) -> float | None:
    """How much smaller `value` is than `reference` (0.25 = 25% less); None when unknown."""
    if value is None or not reference:
        return None
    return 1 - value / reference


def arena_floor(plan: dict) -> int:
    """The most the device's arena holds at one step: its live tensors and the kernel scratch
    placed beside them (optimize --workspace calibrate). No layout of the plan's order needs less;
    what the arena has above it is fragmentation."""
    if not plan.get("workspace"):
        return plan["peak_live_bytes"]
    device = {"tensors": [t for t in plan["tensors"] if "tier" not in t]}  # a slow tier has an arena of its own
    scratch = [(w["step"], w["step"], w["bytes"]) for w in plan["workspace"]]
    return max(live_curve(arena_spans(device) + scratch, len(plan["order"])), default=0)


def workspace_figures(plan: dict) -> dict:
    """The plan's kernel scratch: how many buffers, their bytes, and the most live at one step."""
    per_step: dict[int, int] = {}
    for w in plan.get("workspace", ()):
        per_step[w["step"]] = per_step.get(w["step"], 0) + w["bytes"]
    return {"buffers": len(plan.get("workspace", ())), "bytes": sum(per_step.values()),
            "max_at_one_step": max(per_step.values(), default=0)}


def workspace_line(w: dict) -> str:
    return (f"{w['buffers']} kernel scratch buffers, {format_bytes(w['bytes'])} in all, at most "
            f"{format_bytes(w['max_at_one_step'])} at one step (placed in the arena)")


def persistent_by_kind(plan: dict) -> dict[str, int]:
    """Persistent bytes per class, largest first."""
    by_kind: dict[str, int] = {}
    for t in plan["tensors"]:
        if t["offset"] is None and "alias_of" not in t and "tier" not in t:  # the device's
            by_kind[t["kind"]] = by_kind.get(t["kind"], 0) + t["bytes"]
    return dict(sorted(by_kind.items(), key=lambda kv: -kv[1]))


def bytes_by_type(plan: dict) -> list[dict]:
    """Bytes by class and element type, largest first within each storage: the device's persistent
    tensors (a mixed-precision step's float32 masters and optimizer state), then the arena's at the
    peak, where a mixed-precision step's low-precision weight copies are a class of their own."""
    peak_step = plan.get("peak_step", 0)
    rows: dict[tuple[str, str, str], int] = {}
    for t in plan["tensors"]:
        if "alias_of" in t or "tier" in t:
            continue
        if t["offset"] is None:
            key = ("persistent", t["kind"], t.get("dtype", "–"))
        elif t["first_step"] <= peak_step <= t["last_step"]:
            key = ("arena, live at peak", "weight copy" if "copy_of" in t else t["kind"], t.get("dtype", "–"))
        else:
            continue
        rows[key] = rows.get(key, 0) + t["bytes"]
    ordered = sorted(rows.items(), key=lambda kv: (kv[0][0] != "persistent", -kv[1]))
    return [{"storage": storage, "class": kind, "dtype": dtype, "bytes": n} for (storage, kind, dtype), n in ordered]


def summarize(plan: dict, top: int = 10, budget: dict | None = None) -> dict:
    """Plain figures: totals, strategies, bytes by class, the tensors live at the peak step.

    `budget` is a `roam_cli.budget.check()` result, included as is."""
    tensors = plan["tensors"]
    peak_step = plan.get("peak_step", 0)
    transient_by_kind: dict[str, int] = {}
    at_peak_by_kind: dict[str, int] = {}
    at_peak = []
    for t in tensors:
        if t["offset"] is None or "tier" in t:  # persistent, an alias sharing another tensor's storage, or off the device
            continue
        transient_by_kind[t["kind"]] = transient_by_kind.get(t["kind"], 0) + t["bytes"]
        if t["first_step"] <= peak_step <= t["last_step"]:
            at_peak_by_kind[t["kind"]] = at_peak_by_kind.get(t["kind"], 0) + t["bytes"]
            at_peak.append(t)
    at_peak.sort(key=lambda t: (-t["bytes"], t["name"]))
    peak = plan["peak_live_bytes"]
    arena = plan["arena_bytes"]
    summary = {
        "model": plan["model"]["path"],
        "pair": pair.members(plan),
        "dims": plan.get("dims", {}),
        "nodes": len(plan["order"]),
        "order_strategy": plan["stats"]["order"]["strategy"],
        "layout_strategy": plan["stats"]["layout"]["strategy"],
        "persistent_bytes": plan["persistent_bytes"],
        "peak_live_bytes": peak,
        "arena_bytes": arena,
        "total_bytes": plan["persistent_bytes"] + arena,
        # kernel scratch placed in the arena (optimize --workspace calibrate): buffers, bytes, the most at one step
        "workspace": workspace_figures(plan),
        "fragmentation": (arena / arena_floor(plan) - 1) if peak else 0.0,
        "peak_step": peak_step,
        "peak_node": plan["order"][peak_step] if plan["order"] else None,
        "order_bound": order_bound(plan),
        "strategies": strategy_rows(plan),
        "persistent_by_kind": persistent_by_kind(plan),
        "transient_at_peak_by_kind": at_peak_by_kind,
        "transient_allocated_by_kind": transient_by_kind,
        "bytes_by_type": bytes_by_type(plan),
        "largest_at_peak": [{k: t[k] for k in ("name", "kind", "bytes", "first_step", "last_step")}
                            for t in at_peak[:top]],
        "seconds": plan["stats"].get("seconds", {}),
        "fallbacks": [f"{phase}: {plan['stats'][phase]['fallback']}" for phase in ("order", "layout")
                      if plan["stats"][phase].get("fallback")],
    }
    effect = ort_effect(plan)
    if effect is not None:
        summary["ort_optimization"] = effect
    if "lowering" in plan["stats"]:
        summary["lowering"] = plan["stats"]["lowering"]
    if "recompute" in plan:
        summary["recompute"] = recompute_effect(plan)
    if "offload" in plan:
        summary["offload"] = offload_effect(plan)
    if "sharding" in plan:
        summary["sharding"] = plan["sharding"]
    if budget is not None:
        summary["budget"] = budget
    return summary


def order_bound(plan: dict) -> dict | None:
    """How far the plan's order can be from the best order: {lower_bound_bytes, proven_optimal,
    gap} (gap = peak / bound − 1, what a better order could save at most, as a share of the
    bound); None for a plan whose order strategy records no bound."""
    stats = plan["stats"]["order"]
    if "lower_bound_bytes" not in stats:
        return None
    bound, peak = stats["lower_bound_bytes"], plan["peak_live_bytes"]
    proven = stats.get("proven_optimal", False) or peak <= bound
    found = {"lower_bound_bytes": bound, "proven_optimal": proven,
             "gap": 0.0 if proven or not bound else peak / bound - 1}
    if stats.get("gap") and not proven and found["gap"] <= stats["gap"]:  # --gap stopped the search there
        found["stop_gap"] = stats["gap"]  # (not the time limit, which --gap's default can leave further off)
    if stats.get("stopped_at_target") and not proven:  # --recompute budget: the plan fit, the search stopped
        found["stop_target_bytes"] = stats["target_bytes"]
    return found


def share(x: float) -> str:
    """A fraction as a percentage, with two significant digits below 1 % (0.036%, not 0.0%)."""
    return f"{x:.1%}" if x >= 0.01 or x == 0 else f"{100 * x:.2g}%"


def order_bound_line(b: dict) -> str:
    if b["proven_optimal"]:
        return f"proven optimal (bound {format_bytes(b['lower_bound_bytes'])})"
    stop = f"; the search stopped within --gap {share(b['stop_gap'])}" if "stop_gap" in b else ""
    if "stop_target_bytes" in b:
        stop += (f"; the search stopped once the peak fit the budget (at most "
                 f"{format_bytes(b['stop_target_bytes'])} besides the persistent bytes)")
    return f"within {share(b['gap'])} of optimal (bound {format_bytes(b['lower_bound_bytes'])}{stop})"


FALLBACK_NOTE = "fell back (the plan is valid, perhaps not the best) — "
DATA_INPUT_NOTE = ("data inputs (token ids, labels, images) are supplied by the caller and live the whole step: "
                   "counted as persistent, outside the arena.")


def budget_line(b: dict) -> str:
    counted = ("persistent + arena" if "slow_tier" not in b
               else f"on the device: persistent + arena; the {b['slow_tier']} tier's bytes are not counted")
    if b["fits"]:
        return (f"fits the budget of {format_bytes(b['budget_bytes'])}: needs {format_bytes(b['needed_bytes'])} "
                f"({counted}), {format_bytes(b['headroom_bytes'])} to spare")
    return (f"does NOT fit the budget of {format_bytes(b['budget_bytes'])}: needs {format_bytes(b['needed_bytes'])} "
            f"({counted}), {format_bytes(-b['headroom_bytes'])} over")


def ort_effect(plan: dict) -> dict | None:
    """ONNX Runtime's optimisations the plan's graph went through (level, provider, version) and
    the graph's nodes and the plan's bytes before and after them; None for a plan without."""
    if "ort_optimization" not in plan["stats"]:
        return None
    return {**plan["ort_optimized"], **plan["stats"]["ort_optimization"]}


def change_line(before: dict, after: dict) -> str:
    """Nodes, peak live and arena of two plans' graph_figures: before → after (relative change)."""
    def change(key: str) -> str:
        relative = after[key] / before[key] - 1 if before[key] else 0.0
        sign = "−" if relative < 0 else "+" if relative > 0 else ""
        return f"{format_bytes(before[key])} → {format_bytes(after[key])} ({sign}{abs(relative):.1%})"

    return (f"{before['nodes']:,} → {after['nodes']:,} nodes, peak live {change('peak_live_bytes')}, "
            f"arena {change('arena_bytes')}")


def ort_line(effect: dict) -> str:
    """What ONNX Runtime's optimisations did to the graph and its plan (summary's ort_optimization)."""
    return (f"ORT optimisations ({effect['level']}, {effect['provider']}): "
            + change_line(effect["before"], effect["after"]))


def lowering_line(lowering: dict) -> str:
    """The fused graph's plan against this one, of its lowering to standard ONNX (`roam lower`)."""
    return f"lowered from {lowering['fused_model']['path']}: " + change_line(lowering["fused"], lowering["lowered"])


POLICY_NAMES = {"keep": "keep everything on the device", "save_on_cpu": "save_on_cpu (every saved activation offloaded)",
                "zero_offload": "ZeRO-Offload (optimizer state and update on the host)",
                "all_on_host": "every persistent byte on the host (streamed)", "recompute_only": "recompute only",
                "planned": "planned: activations offloaded", "planned+zero_offload": "planned: ZeRO-Offload + activations",
                "planned+all_on_host": "planned: all persistent on the host + activations",
                "planned+updates": "planned: the largest parameters' updates on the host"}


def policy_name(policy: str) -> str:
    """A candidate's name as the report says it ("+free": on the graph with `free` recomputation)."""
    base, free = policy.removesuffix("+free"), policy.endswith("+free")
    return POLICY_NAMES.get(base, base) + (", recompute free" if free else "")
OBJECTIVE_WORDS = {"time": "step time", "energy": "energy"}
OFFLOAD_COLUMNS = ("candidate", "device bytes", "slow tier bytes", "transfers", "est. step time", "est. energy", "fits")


def offload_effect(plan: dict) -> dict:
    """The tiers of an --offload plan: the placement chosen, the device's and the slow tier's bytes,
    the transfers, the estimated step against keeping everything, and every candidate weighed."""
    o, tiers = plan["offload"], plan["tiers"]
    keep = next((c for c in o["candidates"] if c["policy"] == "keep"), None)
    moved = {d: sum(t["bytes"] for t in o["transfers"] if t["direction"] == d) for d in ("to_host", "to_device")}
    return {"policy": o["policy"], "profile": o["profile"], "objective": o["objective"], "slow_tier": tiers["slow"],
            "device_bytes": plan["persistent_bytes"] + plan["arena_bytes"],
            "slow_bytes": tiers["persistent_bytes"] + tiers["arena_bytes"], "slow_arena_bytes": tiers["arena_bytes"],
            "slow_persistent_bytes": tiers["persistent_bytes"], "host_nodes": len(tiers.get("host_nodes", ())),
            "transfers": len(o["transfers"]), "bytes_moved": moved, "estimate": o["estimate"],
            "keep_estimate": keep["estimate"] if keep else None, "candidates": o["candidates"]}


def offload_lines(plan: dict) -> list[str]:
    return offload_lines_of(offload_effect(plan))


def offload_lines_of(e: dict) -> list[str]:
    """What the tiered plan holds where and what it costs (summary's offload), in lines."""
    est = e["estimate"]
    lines = [f"offload ({policy_name(e['policy'])}): device {format_bytes(e['device_bytes'])}, "
             f"{e['slow_tier']} {format_bytes(e['slow_bytes'])} (persistent {format_bytes(e['slow_persistent_bytes'])} + "
             f"arena {format_bytes(e['slow_arena_bytes'])}); {e['transfers']:,} transfers moving "
             f"{format_bytes(e['bytes_moved']['to_host'])} out and {format_bytes(e['bytes_moved']['to_device'])} back"
             + (f"; {e['host_nodes']:,} nodes run by the host" if e["host_nodes"] else "")]
    text = f"estimated step on {e['profile']}: {format_seconds(est['seconds'])}"
    if est.get("energy_joules") is not None:
        text += f", {est['energy_joules']:.4g} J"
    keep = e["keep_estimate"]
    if keep is not None and keep["seconds"]:
        text += (f" (keeping everything on the device: {format_seconds(keep['seconds'])}, "
                 f"{est['seconds'] / keep['seconds'] - 1:+.1%})")
    lines.append(text + " — an estimate from the profile's figures, not a measurement")
    kept = next((c for c in e["candidates"] if c["policy"] == "keep"), None)
    if kept is not None and kept["fits"] and e["policy"] != "keep":  # offloading, though all would fit
        lines.append(f"keeping everything on the device fits the budget too ({format_bytes(kept['device_bytes'])}); "
                     f"this placement is the one of least estimated {OBJECTIVE_WORDS[e['objective']]} that fits "
                     "(--objective), not one the budget forces")
    return lines


def offload_rows(e: dict) -> list[tuple[str, ...]]:
    rows = []
    for c in e["candidates"]:
        est = c["estimate"] or {}  # none: not planned, and its time depends on the order it was not given
        planned = c.get("planned", True)
        # not planned: its persistent bytes on the device alone were over the budget
        device = format_bytes(c["device_bytes"]) if planned else f"≥ {format_bytes(c['persistent_bytes'])}"
        rows.append((policy_name(c["policy"]), device,
                     "—" if c["slow_bytes"] is None else format_bytes(c["slow_bytes"]),
                     "—" if c["transfers"] is None else f"{c['transfers']:,}",
                     "—" if est.get("seconds") is None else format_seconds(est["seconds"]),
                     "—" if est.get("energy_joules") is None else f"{est['energy_joules']:.4g} J",
                     "yes" if c["fits"] else "no" if planned else "no, not planned"))
    return rows


def offload_note(e: dict) -> str | None:
    """What the table's figures of a candidate not planned are."""
    if all(c.get("planned", True) for c in e["candidates"]):
        return None
    return ("not planned: a placement whose persistent bytes on the device alone (≥) are over the budget, which "
            "no order or layout changes; — where a figure needs the plan (a time without transfers needs none)")


def sharding_lines(sh: dict, dims: dict) -> list[str]:
    """A rank step's plan: the layout it is for, what its collectives move, their estimated time."""
    n = sh["ranks"]
    text = (f"one rank of {n} (fully sharded): {sh.get('parameters', 0):,} parameters and "
            f"{sh.get('sharded_state', 0):,} optimizer state tensors held 1/{n} each")
    batch = sh.get("batch")
    if batch:
        rows = dims.get(batch["rank"], batch["rank"]) if isinstance(batch["rank"], str) else batch["rank"]
        text += f"; the rank's batch {rows} rows of the global {n * rows if isinstance(rows, int) else '?'}"
    lines = [text]
    c = sh.get("communication")
    if c:
        ag, rs = c["all_gather"], c["reduce_scatter"]
        again = f", {ag['regathered']:,} of them gathering a parameter again in the backward" if ag.get("regathered") else ""
        lines.append(f"communication per step: {ag['count']:,} all-gathers of {format_bytes(ag['bytes'])}{again}; "
                     f"{rs['count']:,} reduce-scatters of {format_bytes(rs['bytes'])}; each rank sends "
                     f"{format_bytes(c['sent_bytes'])} (and receives as much)")
        lines.append(f"estimated on {c['profile']} ({c.get('interconnect', 'its interconnect')}): "
                     f"{format_seconds(c['seconds'])} of communication, {format_seconds(c['exposed_seconds'])} exposed "
                     f"(the compute waits for it) in a step of {format_seconds(c['step_seconds'])} — an estimate from "
                     "the profile's figures, not a measurement")
    return lines


def format_seconds(x: float) -> str:
    return f"{x * 1e3:,.3g} ms" if x < 1 else f"{x:,.3g} s"


def recompute_effect(plan: dict) -> dict:
    """The plan's recomputation: copies, the FLOPs they add (absolute and as a share of the step's),
    the bytes kept across the forward/backward boundary and the plan's figures without and with
    it, and per op class the copies, their FLOPs and the bytes no longer kept."""
    r = plan["recompute"]
    copies_by_class = Counter(n.get("class") or n["op_type"] for n in r["nodes"])
    step = r["step_flops"]
    by_class = [{"class": c, "copies": copies_by_class.get(c, 0), "flops": v.get("flops", 0),
                 "flops_share": v.get("flops", 0) / step if step else 0.0, "bytes_not_kept": v.get("bytes_not_kept", 0)}
                for c, v in sorted(r.get("by_class", {}).items())]
    return {"mode": r["mode"], "copies": len(r["nodes"]), "tensors": len(r["tensors"]),
            "extra_flops": r["extra_flops"], "step_flops": step,
            "extra_flops_share": r["extra_flops"] / step if step else 0.0,
            "kept_bytes": r.get("kept_bytes"), "plans": plan["stats"].get("recompute"), "by_class": by_class}


def recompute_line(e: dict) -> str:
    """One line: what recomputation saved and what it costs."""
    text = f"recompute ({e['mode']}): {e['copies']:,} nodes added"
    plans = e["plans"]
    if plans:
        before, after = plans["before"]["peak_live_bytes"], plans["after"]["peak_live_bytes"]
        change = after / before - 1 if before else 0.0
        text += (f", peak live {format_bytes(before)} → {format_bytes(after)} ({'−' if change < 0 else '+'}"
                 f"{abs(change):.1%})")
    if e["kept_bytes"]:
        text += (f", kept for the backward {format_bytes(e['kept_bytes']['before'])} → "
                 f"{format_bytes(e['kept_bytes']['after'])}")
    return (text + f"; {format_flops(e['extra_flops'])} more ({e['extra_flops_share']:.2%} of the step's "
            f"{format_flops(e['step_flops'])})")


def format_flops(n: int) -> str:
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n} FLOP"


RECOMPUTE_COLUMNS = ("op class", "added nodes", "FLOPs", "of step", "not kept")


def recompute_rows(e: dict) -> list[tuple[str, ...]]:
    return [(c["class"], f"{c['copies']:,}", format_flops(c["flops"]), f"{c['flops_share']:.2%}",
             format_bytes(c["bytes_not_kept"])) for c in e["by_class"]]


def cell_bytes(n) -> str:
    return "–" if n is None else format_bytes(n)


def cell_ratio(x) -> str:
    return "–" if x is None else f"{x:.1%}"


def cell_seconds(s) -> str:
    return "–" if s is None else f"{s:.2f}"


def headline(s: dict) -> list[tuple[str, str]]:
    dims = ", ".join(f"{k}={v}" for k, v in s["dims"].items())
    rows = [(field.replace("_", " "), f"{ref['path']} (sha256 {ref['sha256'][:12]})") for field, ref in s["pair"].items()]
    rows.append(("nodes", f"{s['nodes']:,}"))
    if dims:
        rows.append(("dims", dims))
    # a tiered plan: these count the device's bytes alone; a rank step's plan: one rank's
    on = " on the device" if "offload" in s else " per rank" if "sharding" in s else ""
    rows += [
        ("strategy", f"order {s['order_strategy']}, layout {s['layout_strategy']}"),
        ("persistent" + on, format_bytes(s["persistent_bytes"])),
        ("transient peak live" + on, format_bytes(s["peak_live_bytes"])),
        *([("order", order_bound_line(s["order_bound"]))] if s["order_bound"] else []),
        ("arena" + on, format_bytes(s["arena_bytes"])),
        *([("workspace", workspace_line(s["workspace"]))] if s["workspace"]["buffers"] else []),
        ("fragmentation", f"{s['fragmentation']:.2%}"),
        ("total (persistent + arena)" + on, format_bytes(s["total_bytes"])),
        ("peak at step", f"{s['peak_step']} ({s['peak_node']})"),
    ]
    return rows


# two-line headers keep the table within 80 columns
STRATEGY_COLUMNS = ("order", "layout", "peak\nlive", "arena", "peak\nsaved", "arena\nsaved", "frag.", "solve\ns")
def strategy_note(rows: list[dict]) -> str:
    ref = next((r for r in rows if r["arena_reference"]), None)
    arena = f"arena saved: less than {ref['order']} order + {ref['layout']} layout; " if ref else ""
    return (f"* = this plan; peak saved: less than the original order; {arena}"
            "frag. = arena / peak live − 1 (kernel scratch in the arena counted as live)")


def strategy_cells(r: dict) -> list[str]:
    mark = "* " if r["this_plan"] else ""
    return [f"{mark}{r['order'] or '–'}", r["layout"] or "–", cell_bytes(r["peak_live_bytes"]),
            cell_bytes(r["arena_bytes"]), cell_ratio(r["peak_vs_original"]), cell_ratio(r["arena_vs_original"]),
            cell_ratio(r["fragmentation"]), cell_seconds(r["seconds"])]


def class_rows(s: dict) -> list[tuple[str, str, str, str]]:
    return [(r["class"], r["dtype"], r["storage"], format_bytes(r["bytes"])) for r in s["bytes_by_type"]]


def peak_rows(s: dict) -> list[tuple[str, str, str, str]]:
    return [(t["name"], t["kind"], format_bytes(t["bytes"]), f"{t['first_step']}..{t['last_step']}")
            for t in s["largest_at_peak"]]


def render_table(s: dict, console: Console) -> None:
    head = Table(title=f"roam plan for {s['model']}", show_header=False, title_justify="left")
    head.add_column(style="bold")
    head.add_column(justify="right")
    for name, value in headline(s):
        head.add_row(name, value)
    console.print(head)
    if "ort_optimization" in s:
        console.print(ort_line(s["ort_optimization"]), highlight=False)
    if "lowering" in s:
        console.print(lowering_line(s["lowering"]), highlight=False)
    if "recompute" in s:
        console.print(recompute_line(s["recompute"]), highlight=False)
        per_class = Table(title="recomputed, by op class", title_justify="left", box=box.SIMPLE_HEAD)
        for col in RECOMPUTE_COLUMNS:
            per_class.add_column(col, justify="left" if col == "op class" else "right")
        for row in recompute_rows(s["recompute"]):
            per_class.add_row(*row)
        console.print(per_class)
    if "sharding" in s:
        for line in sharding_lines(s["sharding"], s["dims"]):
            console.print(line, highlight=False)
    if "offload" in s:
        for line in offload_lines_of(s["offload"]):
            console.print(line, highlight=False)
        weighed = Table(title="plans weighed (device bytes: persistent on the device + arena)", title_justify="left",
                        box=box.SIMPLE_HEAD)
        for col in OFFLOAD_COLUMNS:
            weighed.add_column(col, justify="left" if col == "candidate" else "right")
        for row in offload_rows(s["offload"]):
            weighed.add_row(*row)
        console.print(weighed)
        if offload_note(s["offload"]):
            console.print(offload_note(s["offload"]), highlight=False)
    if "budget" in s:
        style = "green" if s["budget"]["fits"] else "bold red"
        console.print(f"[{style}]{budget_line(s['budget'])}[/{style}]")
    for line in s["fallbacks"]:
        console.print(f"[yellow]{FALLBACK_NOTE}{line}[/yellow]", highlight=False)

    strategies = Table(title="strategies measured in this run", title_justify="left", box=box.SIMPLE_HEAD,
                       show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    for col in STRATEGY_COLUMNS:  # the figures never wrap: the strategy names do, at a narrow terminal
        left = col in ("order", "layout")
        strategies.add_column(col, justify="left" if left else "right", no_wrap=not left,
                              overflow="fold" if left else "ellipsis")
    for r in s["strategies"]:
        strategies.add_row(*strategy_cells(r))
    console.print(strategies)
    console.print(f"[dim]{strategy_note(s['strategies'])}[/dim]")

    kinds = Table(title="bytes by tensor class and element type", title_justify="left")
    for col, justify in (("class", "left"), ("type", "left"), ("storage", "left"), ("bytes", "right")):
        kinds.add_column(col, justify=justify)
    for row in class_rows(s):
        kinds.add_row(*row)
    console.print(kinds)
    if "data_input" in s["persistent_by_kind"]:
        console.print(f"[dim]{DATA_INPUT_NOTE}[/dim]")

    top = Table(title=f"largest tensors live at the peak (step {s['peak_step']})", title_justify="left")
    for col, justify in (("tensor", "left"), ("class", "left"), ("bytes", "right"), ("steps", "right")):
        top.add_column(col, justify=justify, overflow="fold")
    for row in peak_rows(s):
        top.add_row(*row)
    console.print(top)


def markdown_table(header: Iterable[str], rows: Iterable[Iterable[str]], right: set[int] = frozenset()) -> str:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |")
    return "\n".join(lines)


def render_markdown(s: dict) -> str:
    parts = [f"## roam plan for `{s['model']}`", "",
             markdown_table(("", "value"), [(f"**{k}**", v) for k, v in headline(s)], {1})]
    if "ort_optimization" in s:
        parts += ["", ort_line(s["ort_optimization"])]
    if "lowering" in s:
        parts += ["", lowering_line(s["lowering"])]
    if "recompute" in s:
        parts += ["", recompute_line(s["recompute"]), "",
                  markdown_table(RECOMPUTE_COLUMNS, recompute_rows(s["recompute"]), {1, 2, 3, 4})]
    if "sharding" in s:
        parts += ["", *sharding_lines(s["sharding"], s["dims"])]
    if "offload" in s:
        parts += ["", *offload_lines_of(s["offload"]), "",
                  markdown_table(OFFLOAD_COLUMNS, offload_rows(s["offload"]), {1, 2, 3, 4, 5})]
        if offload_note(s["offload"]):
            parts += ["", offload_note(s["offload"])]
    if "budget" in s:
        parts += ["", ("✅ " if s["budget"]["fits"] else "❌ ") + budget_line(s["budget"])]
    parts += [f"\n⚠️ {FALLBACK_NOTE}{line}" for line in s["fallbacks"]]
    parts += ["", "### Strategies measured in this run", "",
              strategy_note(s["strategies"]).replace("* =", "`*` ="), "",
              markdown_table([c.replace("\n", " ") for c in STRATEGY_COLUMNS], map(strategy_cells, s["strategies"]),
                             set(range(2, 8))),
              "", "### Bytes by tensor class and element type", "",
              markdown_table(("class", "type", "storage", "bytes"), class_rows(s), {3})]
    if "data_input" in s["persistent_by_kind"]:
        parts += ["", DATA_INPUT_NOTE[0].upper() + DATA_INPUT_NOTE[1:]]
    parts += ["", f"### Largest tensors live at the peak (step {s['peak_step']}, `{s['peak_node']}`)", "",
              markdown_table(("tensor", "class", "bytes", "steps"),
                             [(f"`{n}`", k, b, st) for n, k, b, st in peak_rows(s)], {2, 3})]
    return "\n".join(parts) + "\n"
