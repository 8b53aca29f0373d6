"""The picture of a memory / extra-FLOPs front (`roam tradeoff --plot DIR`): memory each plan
needs (persistent + arena) against the FLOPs it recomputes (on a rank step, its price: the
gathers again' communication too), as a share of the step's; the dominated plans greyed;
reference points (PyTorch eager, checkpointing, FSDP2's policies) marked where given."""

from pathlib import Path

from roam_cli.core.fileio import make_folder
from roam_cli.core.units import format_bytes
from roam_cli.outputs.plot import FORMATS, MARK_COLOR, ORDER_COLORS, below, byte_unit, figure_class, save

STEM = "front"
MARKERS = ("*", "D", "P", "X", "s", "^")


def picture_paths(out_dir: Path, formats=FORMATS) -> list[Path]:
    return [out_dir / f"{STEM}.{fmt}" for fmt in formats]


def picture(front: dict, out_dir: Path, formats=FORMATS) -> list[Path]:
    """front.json's figures drawn into out_dir (made if missing)."""
    Figure = figure_class()
    points, dominated, marks = front["points"], front["dominated"], front.get("marks", [])
    top = max(p["total_bytes"] for p in points + dominated + marks)
    unit, scale = byte_unit(top)
    fig = Figure(figsize=(9, 6), layout="constrained")
    ax = fig.add_subplot()
    xs = [p["price_pct"] for p in points]
    ys = [p["total_bytes"] / scale for p in points]
    ax.step(xs, ys, where="post", color=ORDER_COLORS[1], linewidth=1.2, alpha=0.6)
    ax.plot(xs, ys, "o", color=ORDER_COLORS[1],
            label=f"roam: {len(points)} verified plans (persistent + arena), "
                  f"{format_bytes(points[-1]['total_bytes'])} to {format_bytes(points[0]['total_bytes'])}")
    if dominated:
        ax.plot([p["price_pct"] for p in dominated], [p["total_bytes"] / scale for p in dominated], "x",
                color="#bab0ab", label=f"roam: {len(dominated)} dominated plans (dropped)")
    for k, m in enumerate(marks):
        ax.plot([m["extra_flops_pct"]], [m["total_bytes"] / scale], MARKERS[k % len(MARKERS)], markersize=10,
                color=MARK_COLOR if k == 0 else ORDER_COLORS[0],
                label=f"{m['name']}: {format_bytes(m['total_bytes'])}, {m['extra_flops_pct']:.1f} % extra")
    ax.set_xscale("symlog", linthresh=0.1)
    ax.set_ylim(0, top / scale * 1.1)
    if any("sent_bytes" in p for p in points):  # a rank step: a gather again priced at its ring's time
        ax.set_xlabel("extra FLOPs + gathers again at ring time (% of the step's; symlog, linear below 0.1 %)")
    else:
        ax.set_xlabel("extra FLOPs (% of the step's; symmetric log scale, linear below 0.1 %)")
    ax.set_ylabel(f"memory of the step ({unit})")
    model = Path(front["model"])
    ax.set_title(f"Memory against recomputation: {model.parent.name + '/' if model.parent.name else ''}{model.name}")
    ax.grid(True, alpha=0.3)
    below(ax, columns=1)
    make_folder(out_dir)
    return save(fig, out_dir / STEM, formats)
