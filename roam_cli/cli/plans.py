"""`roam verify`, `report`, `plot` and `export`: what is done with a plan."""

import json
from pathlib import Path

import click

from roam_cli import budget as budget_mod, pair
from roam_cli.cli import BUDGET_HELP, ByteSize, Progress, cli, err, fail_over_budget, out, parse_pairs
from roam_cli.core import plan as plan_io
from roam_cli.core.errors import CheckFailed, RoamError
from roam_cli.core.fileio import check_output_folder, check_output_path, write_atomic
from roam_cli.core.units import format_bytes
from roam_cli.outputs import report as report_mod


@cli.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path))
@click.option("--shapes-from-run", is_flag=True, help="Learn shapes by running the graph (as optimize did).")
@click.option("--json", "as_json", is_flag=True, help="Print what was checked as JSON.")
@click.pass_obj
def verify(obj, model, plan_path, shapes_from_run, as_json):
    """Check PLAN against MODEL independently of the planners. MODEL is either file of the
    plan's pair: the model optimize read or the annotated model it wrote.

    Order is a topological permutation of all nodes, every transient tensor is placed for
    its whole life, no two live tensors overlap, the arena covers every tensor. A plan with a
    slower tier (optimize --offload) is checked per tier, the device's and the slow tier's
    arenas apart, and every node reads its values in the tier it runs in.

    \b
    Example:
      roam verify training_model.onnx plan.json
    """
    from roam_cli.verify import Violation
    from roam_cli.verify import verify as check

    plan = plan_io.read(plan_path)
    with pair.planned_graph(model, plan, shapes_from_run) as imported:
        try:
            summary = check(imported.graph, imported.sha256, plan)
        except Violation as v:
            raise CheckFailed(f"plan invalid: {v}") from None
    slow = summary.slow
    if as_json:
        click.echo(json.dumps({"ok": True, "nodes": summary.nodes, "placed": summary.placed,
                               "arena_bytes": summary.arena, "peak_live_bytes": summary.peak_live}
                              | ({"tiers": slow} if slow else {}), indent=1))
    elif not obj["quiet"]:
        out.print(f"plan OK: {summary.nodes} nodes in topological order, {summary.placed} tensors placed, "
                  f"no overlaps, {'device ' if slow else ''}arena {format_bytes(summary.arena)} "
                  f"(peak live {format_bytes(summary.peak_live)})"
                  + (f"; {slow['tier']}: {slow['placed']} tensors placed, arena {format_bytes(slow['arena_bytes'])} "
                     f"(peak live {format_bytes(slow['peak_live_bytes'])}), {slow['transfers']} transfers, every read "
                     "in its reader's tier" if slow else ""))


@cli.command()
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown"]), default="table",
              show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=0),
              help="How many of the tensors live at the peak to list.")
@click.option("--budget", type=ByteSize(), default=None, help=BUDGET_HELP)
def report(plan_path, fmt, as_json, top, budget):
    """Show what PLAN costs: every strategy measured in its run side by side, persistent,
    peak, arena, fragmentation, bytes by tensor class, the tensors live at the peak.

    \b
    Examples:
      roam report plan.json
      roam report plan.json --format markdown > plan.md
      roam report plan.json --budget 16GiB --json
    """
    plan = plan_io.read(plan_path)
    verdict = budget_mod.check(plan, budget) if budget is not None else None
    summary = report_mod.summarize(plan, top, verdict)
    if as_json or fmt == "json":
        click.echo(json.dumps(summary, indent=1))
    elif fmt == "markdown":
        click.echo(report_mod.render_markdown(summary), nl=False)
    else:
        report_mod.render_table(summary, out)
    fail_over_budget(verdict)

@cli.command()
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(path_type=Path, file_okay=False),
              help="Directory to write the pictures into (made if missing).")
@click.option("--model", "model_path", type=click.Path(path_type=Path),
              help="The model optimize read (or the annotated model it wrote), for the original order's curve "
                   "[default: the plan's source_model.path].")
@click.option("--format", "formats", default="png,svg", show_default=True, metavar="png,svg",
              help="Picture formats, comma-separated.")
@click.option("--budget", type=ByteSize(), default=None, help="Draw this budget as a line.")
@click.option("--inplace", "inplace", multiple=True, metavar="OUTPUT=STATE",
              help="The --inplace pairs the plan was made with (repeatable).")
@click.option("--shapes-from-run", is_flag=True, help="Learn shapes by running the graph (as optimize did).")
@click.option("--json", "as_json", is_flag=True, help="Print the files written as JSON.")
@click.pass_obj
def plot(obj, plan_path, out_dir, model_path, formats, budget, inplace, shapes_from_run, as_json):
    """Draw PLAN: live memory over the steps (the original order vs the plan's, persistent
    bytes as a band) and the arena's address space (each tensor a rectangle, steps × addresses,
    coloured by class). Writes live_memory.{png,svg} and layout.{png,svg}.

    The original order's curve is recomputed from the plan's model; without the model the
    picture shows the plan's curve only.

    \b
    Examples:
      roam plot plan.json -o pictures/
      roam plot plan.json -o pictures/ --model training_model.onnx --format png --budget 16GiB
    """
    from roam_cli.outputs import plot as plot_mod

    fmts = tuple(f.strip().lower() for f in formats.split(",") if f.strip())
    unknown = [f for f in fmts if f not in plot_mod.FORMATS]
    if unknown or not fmts:
        raise RoamError(f"--format: {', '.join(unknown) or formats!r} is not one of {', '.join(plot_mod.FORMATS)}")
    plot_mod.figure_class()  # matplotlib is there, before any work is done
    plan = plan_io.read(plan_path)
    if model_path is None:
        source = pair.source(plan)["path"]
        model_path = plan_path.resolve().parent / source
        if not model_path.exists():
            model_path = None
            if not obj["quiet"]:
                err.print(f"note: the plan's model {source} is absent: drawing the plan's curve only "
                          "(--model MODEL adds the original order's)", highlight=False)
    check_output_folder(out_dir, plot_mod.picture_paths(out_dir, fmts),
                        [plan_path] + ([model_path] if model_path else []))
    with Progress(obj["quiet"]) as progress:
        curve = None
        if model_path is not None:
            progress("recomputing the original order's live memory")
            curve = plot_mod.original_curve_from_model(plan, model_path, parse_pairs(inplace, "--inplace", False),
                                                       shapes_from_run)
        progress("drawing")
        written = plot_mod.all_pictures(plan, curve, out_dir, fmts, budget)
    if as_json:
        click.echo(json.dumps({"written": [str(p) for p in written]}, indent=1))
    elif not obj["quiet"]:
        for path in written:
            out.print(f"wrote {path}", highlight=False)


@cli.command()
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path))
@click.option("--perfetto", "trace_path", type=click.Path(path_type=Path),
              help="Write a Chrome/Perfetto trace JSON (open in ui.perfetto.dev or chrome://tracing).")
@click.option("--memory-snapshot", "snapshot_path", type=click.Path(path_type=Path),
              help="Write a PyTorch memory snapshot pickle (open in pytorch.org/memory_viz).")
@click.option("--json", "as_json", is_flag=True, help="Print the files written as JSON.")
@click.pass_obj
def export(obj, plan_path, trace_path, snapshot_path, as_json):
    """Write PLAN in formats other tools open: operators on a step timeline with the arena's
    occupancy as a counter (Perfetto), and allocation/free events with sizes and addresses
    (PyTorch memory_viz). One step is 1 µs on both timelines.

    \b
    Examples:
      roam export plan.json --perfetto trace.json
      roam export plan.json --memory-snapshot snapshot.pickle --perfetto trace.json
    """
    from roam_cli.outputs import export as export_mod

    outputs = [(p, f) for p, f in ((trace_path, "perfetto"), (snapshot_path, "snapshot")) if p is not None]
    if not outputs:
        raise RoamError("nothing to export: give --perfetto FILE and/or --memory-snapshot FILE")
    if trace_path is not None and snapshot_path is not None:
        check_output_path(snapshot_path, [trace_path])
    for path, _ in outputs:
        check_output_path(path, [plan_path])
    plan = plan_io.read(plan_path)
    for path, kind in outputs:
        if kind == "perfetto":
            write_atomic(path, json.dumps(export_mod.perfetto_trace(plan)))
        else:
            write_atomic(path, export_mod.memory_snapshot_bytes(plan))
    if as_json:
        click.echo(json.dumps({"written": [str(p) for p, _ in outputs]}, indent=1))
    elif not obj["quiet"]:
        for path, kind in outputs:
            out.print(f"wrote {path} ({'Perfetto trace' if kind == 'perfetto' else 'PyTorch memory snapshot'})",
                      highlight=False)
