"""Pictures of a plan (matplotlib, the optional extra `plot`), written as PNG and SVG.

- live memory over the steps: persistent bytes as a band at the bottom, and above it the
  transient bytes live under the plan's order and under the model's original order;
- the arena's address space: every transient tensor a rectangle (steps × addresses), coloured
  by class.

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
CLASS_COLORS = {"activation": "#4e79a7", "gradient": "#f28e2c", "update_temp": "#59a14f"}
PERSISTENT_COLOR = "#bab0ab"
MARK_COLOR = "#76448a"  # the budget line and the peak step
ORDER_COLORS = ("#e15759", "#4e79a7")  # the original order, the plan's order


def order_curve(mm: memory.MemoryModel, order_: list[int]) -> list[int]:
    """Transient bytes live at each step when the nodes run in `order_`."""
    spans = memory.lifetimes(mm, order_)
    return live_curve([(first, last, s.bytes) for s, (first, last) in zip(mm.storages, spans)], len(order_))


def original_curve(mm: memory.MemoryModel) -> list[int]:
    return order_curve(mm, order.original(mm))


def original_curve_from_model(plan: dict, model_path: Path, inplace: dict[str, str],
                              shapes_from_run: bool = False) -> list[int]:
    """The original order's curve for a plan made earlier: import its model again, and check
    that the memory model rebuilt here gives the plan's own curve for the plan's order."""
    with pair.planned_graph(model_path, plan, shapes_from_run) as imported:
        if pair.member(plan, imported.sha256) is None:
            raise RoamError(f"{model_path}: {pair.refusal(plan, imported.sha256)}")
    mm = memory.build(imported.graph, plan["alignment"], inplace)
    index = {n.name: i for i, n in enumerate(imported.graph.nodes)}
    if order_curve(mm, [index[name] for name in plan["order"]]) != plan_curve(plan):
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
    own = plan_curve(plan)
    curves.append((f"{strategy} order (this plan): transient peak {format_bytes(plan['peak_live_bytes'])}", own,
                   ORDER_COLORS[1]))
    needed = persistent + plan["arena_bytes"]
    reference = next((r for r in strategy_rows(plan) if r["arena_reference"] and not r["this_plan"]), None)
    lines = [needed] + ([persistent + reference["arena_bytes"]] if reference else []) + ([budget] if budget else [])
    top = max([persistent + max(c, default=0) for _, c, _ in curves] + lines)
    unit, scale = byte_unit(top)
    steps = len(plan["order"])
    xs = list(range(steps + 1))

    fig = Figure(figsize=(11, 7), layout="constrained")
    ax = fig.add_subplot()
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
    ax.set_xlabel("step (operator index in execution order)")
    ax.set_ylabel(f"persistent + live transient ({unit})")
    ax.set_title(f"Memory over one training step: {model_name(plan)}, {steps:,} operators")
    ax.grid(True, alpha=0.3)
    below(ax, columns=1)  # long labels: one column keeps the axes wide
    return save(fig, stem, formats)


def address_layout(plan: dict, stem: Path, formats=FORMATS) -> list[Path]:
    """Every arena tensor as a rectangle [first_step, last_step + 1) × [offset, offset + bytes)."""
    Figure = figure_class()
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch

    arena = plan["arena_bytes"]
    unit, scale = byte_unit(arena)
    steps = len(plan["order"])
    boxes: dict[str, list] = {}
    totals: dict[str, int] = {}
    for t in plan["tensors"]:
        if t["offset"] is None or not t["bytes"]:
            continue
        x0, x1 = t["first_step"], t["last_step"] + 1
        y0, y1 = t["offset"] / scale, (t["offset"] + t["bytes"]) / scale
        boxes.setdefault(t["kind"], []).append([(x0, y0), (x1, y0), (x1, y1), (x0, y1)])
        totals[t["kind"]] = totals.get(t["kind"], 0) + 1

    fig = Figure(figsize=(11, 6.5), layout="constrained")
    ax = fig.add_subplot()
    handles = []
    for kind, polys in sorted(boxes.items()):
        color = CLASS_COLORS.get(kind, "#9c755f")
        # a darker edge of the same hue: separates neighbours without washing out thin tensors
        edge = tuple(0.6 * c for c in to_rgb(color))
        ax.add_collection(PolyCollection(polys, facecolors=color, edgecolors=[edge], linewidths=0.3))
        handles.append(Patch(color=color, label=f"{kind} ({totals[kind]:,} tensors)"))
    peak_step = plan.get("peak_step", 0)
    handles.append(ax.axhline(arena / scale, color="black", linestyle="--", linewidth=1,
                              label=f"arena: {format_bytes(arena)}"))
    handles.append(ax.axvline(peak_step, color=MARK_COLOR, linestyle=":", linewidth=1.2,
                              label=f"peak live {format_bytes(plan['peak_live_bytes'])} at step {peak_step}"))
    ax.set_xlim(0, max(steps, 1))
    ax.set_ylim(0, max(arena, 1) / scale * 1.08)
    ax.set_xlabel("step (operator index in execution order)")
    ax.set_ylabel(f"arena offset ({unit})")
    stats = plan["stats"]
    ax.set_title(f"Arena layout: {model_name(plan)}, order {stats['order']['strategy']}, "
                 f"layout {stats['layout']['strategy']}")
    below(ax, handles)
    ax.grid(True, alpha=0.3)
    return save(fig, stem, formats)


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
