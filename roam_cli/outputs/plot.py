"""Pictures of a plan (matplotlib, the optional extra `plot`), written as PNG and SVG.

- live memory over the steps: persistent bytes as a band at the bottom, and above it the
  transient bytes live under the plan's order and under the model's original order;
- the arena's address space: every transient tensor a rectangle (steps × addresses), coloured
  by class.

A plan with a slower tier (optimize --offload) gets a second panel in each: the slow tier's
persistent and live bytes under the device's, with the transfers between them marked, and its
own arena under the device's. The curves and bands above them count the device's bytes alone.

The original order's curve is recomputed from the model rather than stored in the plan: the
plan stays as small as before, and the curve is exact for any plan, old or new."""

import io
from pathlib import Path

from roam_cli import order, pair
from roam_cli.core import memory
from roam_cli.core.errors import RoamError
from roam_cli.core.fileio import make_folder, write_atomic
from roam_cli.core.units import format_bytes
from roam_cli.outputs.report import live_curve, persistent_by_kind, plan_curve, strategy_rows

FORMATS = ("png", "svg")
CLASS_COLORS = {"activation": "#4e79a7", "gradient": "#f28e2c", "update_temp": "#59a14f", "transfer": "#76b7b2",
                "index": "#bab0ac"}
PERSISTENT_COLOR = "#bab0ab"
MARK_COLOR = "#76448a"  # the budget line and the peak step
ORDER_COLORS = ("#e15759", "#4e79a7")  # the original order, the plan's order
SLOW_COLOR = "#b07aa1"  # the slow tier's live bytes
TRANSFER_MARKS = {"to_host": ("v", "#e15759"), "to_device": ("^", "#59a14f")}  # marker, colour


def order_curve(mm: memory.MemoryModel, order_: list[int]) -> list[int]:
    """Transient bytes live on the device at each step when the nodes run in `order_`."""
    spans = memory.lifetimes(mm, order_)
    return live_curve([(first, last, s.bytes) for s, (first, last) in zip(mm.storages, spans)
                       if s.tier == memory.DEVICE], len(order_))


def tier_curve(plan: dict, tier: str = memory.DEVICE) -> list[int]:
    """Transient bytes live at each step of the plan's order in one tier."""
    return plan_curve({**plan, "tensors": [t for t in plan["tensors"] if t.get("tier", memory.DEVICE) == tier]})


def transfers(plan: dict) -> dict[str, list[dict]]:
    """The plan's transfer tensors by direction: a copy made in the slow tier goes to the host."""
    out: dict[str, list[dict]] = {d: [] for d in TRANSFER_MARKS}
    for t in plan["tensors"]:
        if t["kind"] == "transfer":
            out["to_host" if "tier" in t else "to_device"].append(t)
    return out


def original_curve(mm: memory.MemoryModel) -> list[int]:
    return order_curve(mm, order.original(mm))


def original_curve_from_model(plan: dict, model_path: Path, inplace: dict[str, str],
                              shapes_from_run: bool = False) -> list[int] | None:
    """The original order's curve for a plan made earlier: import its model again, and check
    that the memory model rebuilt here gives the plan's own curve for the plan's order. None for a
    plan with tiers and its source model, whose graph has none of the transfers the plan orders:
    its steps are not the plan's (the annotated model gives the curve)."""
    with pair.planned_graph(model_path, plan, shapes_from_run) as imported:
        member = pair.member(plan, imported.sha256)
        if member is None:
            raise RoamError(f"{model_path}: {pair.refusal(plan, imported.sha256)}")
    if "tiers" in plan and member == "source_model":
        return None
    mm = memory.build(imported.graph, plan["alignment"], inplace)
    index = {n.name: i for i, n in enumerate(imported.graph.nodes)}
    if order_curve(mm, [index[name] for name in plan["order"]]) != tier_curve(plan):
        raise RoamError("the memory model rebuilt from the model differs from the plan's: "
                        "pass the --inplace pairs the plan was made with")
    return original_curve(mm)


def figure_class():
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise RoamError("pictures need matplotlib: pip install matplotlib (the plot extra)") from None
    return Figure


def byte_unit(largest: int) -> tuple[str, int]:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if largest >= 2 * size:
            return unit, size
    return "B", 1


def model_name(plan: dict) -> str:
    """The model file with its folder (ONNX Runtime's artifacts are all training_model.onnx)."""
    path = Path(plan["model"]["path"])
    return path.name if path.parent.name in ("", "..") else f"{path.parent.name}/{path.name}"


def save(fig, stem: Path, formats: tuple[str, ...]) -> list[Path]:
    """Render to memory first, then write each file atomically."""
    from matplotlib import rc_context

    written = []
    for fmt in formats:
        buf = io.BytesIO()
        # SVG text stays text (searchable, smaller); no date, so the same plan gives the same file
        with rc_context({"svg.fonttype": "none", "svg.hashsalt": "roam"}):
            fig.savefig(buf, format=fmt, dpi=150, metadata={"Date": None} if fmt == "svg" else {})
        path = stem.with_suffix(f".{fmt}")
        write_atomic(path, buf.getvalue())
        written.append(path)
    return written


def below(ax, handles=None, columns: int = 2) -> None:
    """The legend under the axes, where it hides no data."""
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.11), ncol=columns, fontsize=9,
              frameon=False)


def live_memory(plan: dict, original_curve: list[int] | None, stem: Path, formats=FORMATS,
                budget: int | None = None) -> list[Path]:
    """Persistent band + transient live bytes per step, for the original order and the plan's."""
    Figure = figure_class()
    persistent = plan["persistent_bytes"]
    strategy = plan["stats"]["order"]["strategy"]
    curves = []
    if original_curve is not None and strategy != "original":
        curves.append((f"original order: transient peak {format_bytes(max(original_curve, default=0))}",
                       original_curve, ORDER_COLORS[0]))
    own = tier_curve(plan)
    curves.append((f"{strategy} order (this plan): transient peak {format_bytes(plan['peak_live_bytes'])}", own,
                   ORDER_COLORS[1]))
    needed = persistent + plan["arena_bytes"]
    reference = next((r for r in strategy_rows(plan) if r["arena_reference"] and not r["this_plan"]), None)
    lines = [needed] + ([persistent + reference["arena_bytes"]] if reference else []) + ([budget] if budget else [])
    top = max([persistent + max(c, default=0) for _, c, _ in curves] + lines)
    unit, scale = byte_unit(top)
    steps = len(plan["order"])
    xs = list(range(steps + 1))

    tiers = plan.get("tiers")
    fig = Figure(figsize=(11, 7 if tiers is None else 11), layout="constrained")
    if tiers is None:
        ax = fig.add_subplot()
    else:  # the device above, the slow tier below on the same steps
        ax, slow_ax = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    classes = ", ".join(f"{kind} {format_bytes(n)}" for kind, n in persistent_by_kind(plan).items()
                        if n >= persistent / 100)
    ax.fill_between([0, steps], 0, persistent / scale, color=PERSISTENT_COLOR, alpha=0.6, linewidth=0,
                    label=f"persistent: {format_bytes(persistent)} ({classes})")

    def heights(curve):  # one more point than steps: the last step drawn to its end
        return [(persistent + v) / scale for v in curve + curve[-1:]]

    for label, curve, color in curves:
        ax.step(xs, heights(curve), where="post", color=color, linewidth=1.4, label=label)
    # shade the plan's curve only: the white gap above it is what the plan saves
    ax.fill_between(xs, persistent / scale, heights(own), step="post", color=ORDER_COLORS[1], alpha=0.15,
                    linewidth=0)
    ax.axhline(needed / scale, color=ORDER_COLORS[1], linestyle="--", linewidth=1,
               label=f"persistent + arena, this plan ({plan['stats']['layout']['strategy']} layout): "
                     f"{format_bytes(needed)}")
    if reference:  # what eager PyTorch would reserve, say
        ax.axhline((persistent + reference["arena_bytes"]) / scale, color=ORDER_COLORS[0], linestyle="--", linewidth=1,
                   label=f"persistent + arena, {reference['order']} order + {reference['layout']} layout: "
                         f"{format_bytes(persistent + reference['arena_bytes'])}")
    if budget:
        ax.axhline(budget / scale, color=MARK_COLOR, linestyle=":", linewidth=1.6,
                   label=f"budget: {format_bytes(budget)}")
    ax.set_xlim(0, steps)
    ax.set_ylim(0, top / scale * 1.12)
    ax.set_ylabel(f"{'' if tiers is None else 'device: '}persistent + live transient ({unit})")
    ax.set_title(f"Memory over one training step: {model_name(plan)}, {steps:,} operators")
    ax.grid(True, alpha=0.3)
    below(ax, columns=1)  # long labels: one column keeps the axes wide
    if tiers is None:
        ax.set_xlabel("step (operator index in execution order)")
    else:
        slow_tier(slow_ax, plan)
    return save(fig, stem, formats)


def slow_tier(ax, plan: dict) -> None:
    """The slow tier's persistent band and live bytes, and the transfers marked at their steps."""
    tiers = plan["tiers"]
    name, persistent, curve = tiers["slow"], tiers["persistent_bytes"], tier_curve(plan, tiers["slow"])
    needed = persistent + tiers["arena_bytes"]
    unit, scale = byte_unit(needed)
    steps = len(plan["order"])
    xs = list(range(steps + 1))
    heights = [(persistent + v) / scale for v in curve + curve[-1:]]
    ax.fill_between([0, steps], 0, persistent / scale, color=PERSISTENT_COLOR, alpha=0.6, linewidth=0,
                    label=f"{name} persistent: {format_bytes(persistent)}")
    ax.step(xs, heights, where="post", color=SLOW_COLOR, linewidth=1.4,
            label=f"{name} live transient: peak {format_bytes(tiers['peak_live_bytes'])}")
    ax.fill_between(xs, persistent / scale, heights, step="post", color=SLOW_COLOR, alpha=0.15, linewidth=0)
    ax.axhline(needed / scale, color=SLOW_COLOR, linestyle="--", linewidth=1,
               label=f"{name} persistent + arena: {format_bytes(needed)}")
    for row, (direction, moved) in enumerate(transfers(plan).items()):
        marker, color = TRANSFER_MARKS[direction]
        if moved:  # above the curves (the axes leave room): one mark per transfer, at its step
            ax.plot([t["first_step"] + 0.5 for t in moved], [0.93 - 0.07 * row] * len(moved), linestyle="none",
                    marker=marker, markersize=4, color=color, transform=ax.get_xaxis_transform(),
                    label=f"transfers {direction.replace('_', ' ')}: {len(moved):,}, "
                          f"{format_bytes(sum(t['bytes'] for t in moved))}")
    ax.set_ylim(0, max(needed, 1) / scale * 1.3)
    ax.set_xlabel("step (operator index in execution order)")
    ax.set_ylabel(f"{name}: persistent + live transient ({unit})")
    ax.grid(True, alpha=0.3)
    below(ax)


def address_layout(plan: dict, stem: Path, formats=FORMATS) -> list[Path]:
    """Every arena tensor as a rectangle [first_step, last_step + 1) × [offset, offset + bytes):
    the device's arena, and under it the slow tier's when the plan has one."""
    Figure = figure_class()
    tiers = plan.get("tiers")
    fig = Figure(figsize=(11, 6.5 if tiers is None else 11), layout="constrained")
    stats = plan["stats"]
    title = (f"Arena layout: {model_name(plan)}, order {stats['order']['strategy']}, "
             f"layout {stats['layout']['strategy']}")
    if tiers is None:
        ax = fig.add_subplot()
        arena_panel(ax, plan, memory.DEVICE, plan["arena_bytes"], "arena")
    else:
        ax, slow_ax = fig.subplots(2, 1, sharex=True)
        arena_panel(ax, plan, memory.DEVICE, plan["arena_bytes"], "device arena")
        arena_panel(slow_ax, plan, tiers["slow"], tiers["arena_bytes"], f"{tiers['slow']} arena")
    ax.set_title(title)
    return save(fig, stem, formats)


def arena_panel(ax, plan: dict, tier: str, arena: int, arena_name: str) -> None:
    """One tier's arena: its tensors by class, the arena's size and the step of its peak."""
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch

    unit, scale = byte_unit(arena)
    steps = len(plan["order"])
    boxes: dict[str, list] = {}
    totals: dict[str, int] = {}
    for t in plan["tensors"]:
        if t["offset"] is None or not t["bytes"] or t.get("tier", memory.DEVICE) != tier:
            continue
        x0, x1 = t["first_step"], t["last_step"] + 1
        y0, y1 = t["offset"] / scale, (t["offset"] + t["bytes"]) / scale
        boxes.setdefault(t["kind"], []).append([(x0, y0), (x1, y0), (x1, y1), (x0, y1)])
        totals[t["kind"]] = totals.get(t["kind"], 0) + 1

    handles = []
    for kind, polys in sorted(boxes.items()):
        color = CLASS_COLORS.get(kind, "#9c755f")
        # a darker edge of the same hue: separates neighbours without washing out thin tensors
        edge = tuple(0.6 * c for c in to_rgb(color))
        ax.add_collection(PolyCollection(polys, facecolors=color, edgecolors=[edge], linewidths=0.3))
        handles.append(Patch(color=color, label=f"{kind} ({totals[kind]:,} tensors)"))
    if tier == memory.DEVICE:
        peak, peak_step = plan["peak_live_bytes"], plan.get("peak_step", 0)
    else:  # the plan states the slow tier's peak, not its step
        curve = tier_curve(plan, tier)
        peak = max(curve, default=0)
        peak_step = curve.index(peak) if curve else 0
    handles.append(ax.axhline(arena / scale, color="black", linestyle="--", linewidth=1,
                              label=f"{arena_name}: {format_bytes(arena)}"))
    handles.append(ax.axvline(peak_step, color=MARK_COLOR, linestyle=":", linewidth=1.2,
                              label=f"peak live {format_bytes(peak)} at step {peak_step}"))
    ax.set_xlim(0, max(steps, 1))
    ax.set_ylim(0, max(arena, 1) / scale * 1.08)
    ax.set_xlabel("step (operator index in execution order)")
    ax.set_ylabel(f"{arena_name} offset ({unit})")
    below(ax, handles)
    ax.grid(True, alpha=0.3)


STEMS = ("live_memory", "layout")


def picture_paths(out_dir: Path, formats=FORMATS) -> list[Path]:
    """The files all_pictures() writes, for callers to check before any work is done."""
    return [out_dir / f"{stem}.{fmt}" for stem in STEMS for fmt in formats]


def all_pictures(plan: dict, original_curve: list[int] | None, out_dir: Path, formats=FORMATS,
                 budget: int | None = None) -> list[Path]:
    """Both pictures in every format, into `out_dir` (made if missing)."""
    make_folder(out_dir)
    return (live_memory(plan, original_curve, out_dir / STEMS[0], formats, budget)
            + address_layout(plan, out_dir / STEMS[1], formats))
