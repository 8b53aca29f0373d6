"""`roam report`: what a plan costs and where the peak comes from, from plan.json alone."""

from rich.console import Console
from rich.table import Table

from roam_cli.units import format_bytes


def summarize(plan: dict, top: int = 10) -> dict:
    """Plain figures: totals, bytes by class, and the tensors live at the peak step."""
    tensors = plan["tensors"]
    peak_step = plan.get("peak_step", 0)
    persistent_by_kind: dict[str, int] = {}
    transient_by_kind: dict[str, int] = {}
    at_peak_by_kind: dict[str, int] = {}
    at_peak = []
    for t in tensors:
        if "alias_of" in t:
            continue
        if t["offset"] is None:
            persistent_by_kind[t["kind"]] = persistent_by_kind.get(t["kind"], 0) + t["bytes"]
            continue
        transient_by_kind[t["kind"]] = transient_by_kind.get(t["kind"], 0) + t["bytes"]
        if t["first_step"] <= peak_step <= t["last_step"]:
            at_peak_by_kind[t["kind"]] = at_peak_by_kind.get(t["kind"], 0) + t["bytes"]
            at_peak.append(t)
    at_peak.sort(key=lambda t: (-t["bytes"], t["name"]))
    peak = plan["peak_live_bytes"]
    arena = plan["arena_bytes"]
    return {
        "model": plan["model"]["path"],
        "nodes": len(plan["order"]),
        "order_strategy": plan["stats"]["order"]["strategy"],
        "layout_strategy": plan["stats"]["layout"]["strategy"],
        "persistent_bytes": plan["persistent_bytes"],
        "peak_live_bytes": peak,
        "arena_bytes": arena,
        "total_bytes": plan["persistent_bytes"] + arena,
        "fragmentation": (arena / peak - 1) if peak else 0.0,
        "peak_step": peak_step,
        "peak_node": plan["order"][peak_step] if plan["order"] else None,
        "persistent_by_kind": persistent_by_kind,
        "transient_at_peak_by_kind": at_peak_by_kind,
        "transient_allocated_by_kind": transient_by_kind,
        "largest_at_peak": [{k: t[k] for k in ("name", "kind", "bytes", "first_step", "last_step")}
                            for t in at_peak[:top]],
        "seconds": plan["stats"].get("seconds", {}),
    }


def render_table(s: dict, console: Console) -> None:
    head = Table(title=f"roam plan for {s['model']}", show_header=False, title_justify="left")
    head.add_column(style="bold")
    head.add_column(justify="right")
    head.add_row("nodes", f"{s['nodes']:,}")
    head.add_row("strategy", f"order {s['order_strategy']}, layout {s['layout_strategy']}")
    head.add_row("persistent", format_bytes(s["persistent_bytes"]))
    head.add_row("transient peak live", format_bytes(s["peak_live_bytes"]))
    head.add_row("arena", format_bytes(s["arena_bytes"]))
    head.add_row("fragmentation", f"{s['fragmentation']:.2%}")
    head.add_row("total (persistent + arena)", format_bytes(s["total_bytes"]))
    head.add_row("peak at step", f"{s['peak_step']} ({s['peak_node']})")
    console.print(head)

    kinds = Table(title="bytes by tensor class", title_justify="left")
    kinds.add_column("class")
    kinds.add_column("storage")
    kinds.add_column("bytes", justify="right")
    for kind, n in sorted(s["persistent_by_kind"].items(), key=lambda kv: -kv[1]):
        kinds.add_row(kind, "persistent", format_bytes(n))
    for kind, n in sorted(s["transient_at_peak_by_kind"].items(), key=lambda kv: -kv[1]):
        kinds.add_row(kind, "arena, live at peak", format_bytes(n))
    console.print(kinds)
    if "data_input" in s["persistent_by_kind"]:
        console.print("[dim]data inputs (token ids, labels, images) are supplied by the caller and live the "
                      "whole step: counted as persistent, outside the arena.[/dim]")

    top = Table(title=f"largest tensors live at the peak (step {s['peak_step']})", title_justify="left")
    for col, justify in (("tensor", "left"), ("class", "left"), ("bytes", "right"), ("steps", "right")):
        top.add_column(col, justify=justify, overflow="fold")
    for t in s["largest_at_peak"]:
        top.add_row(t["name"], t["kind"], format_bytes(t["bytes"]), f"{t['first_step']}..{t['last_step']}")
    console.print(top)
