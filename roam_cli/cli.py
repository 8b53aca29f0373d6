"""The `roam` command line: parses, calls, prints. Exit codes: 0 ok, 1 check failed, 2 bad input."""

import dataclasses
import json
import os
import sys
from pathlib import Path

import click
from rich.console import Console

from roam_cli import __version__, budget as budget_mod, layout, order, pair, pipeline, recompute, tradeoff as tradeoff_mod
from roam_cli.core import plan as plan_io
from roam_cli.core.errors import CheckFailed, RoamBug, RoamError
from roam_cli.core.fileio import check_output_folder, check_output_path, make_folder, write_all_atomic, write_atomic
from roam_cli.core.memory import SLOW_TIERS
from roam_cli.core.units import format_bytes, parse_bytes
from roam_cli.cost import profile as cost_profile
from roam_cli.frontend import training_graph
from roam_cli.offload import planner as offload_planner
from roam_cli.precision import PRECISIONS
from roam_cli.outputs import report as report_mod
from roam_cli.solvers import milp

out = Console()
err = Console(stderr=True)


def parse_pairs(values: tuple[str, ...], what: str, as_int: bool) -> dict:
    pairs = {}
    for v in values:
        key, sep, value = v.partition("=")
        if not sep or not key or not value:
            raise RoamError(f"{what} expects NAME=VALUE, got {v!r}")
        if as_int:
            try:
                value = int(value)
                assert value >= 0
            except (ValueError, AssertionError):
                raise RoamError(f"{what} {key}: {v.partition('=')[2]!r} is not a non-negative integer") from None
        pairs[key] = value
    return pairs


class Progress:
    """A spinner on stderr while a long step runs (silent with -q or when not a terminal)."""

    def __init__(self, quiet: bool):
        self.status = None if quiet or not err.is_terminal else err.status("starting")

    def __enter__(self):
        if self.status:
            self.status.start()
        return self

    def __call__(self, message: str):
        if self.status:
            self.status.update(message)

    def __exit__(self, *exc):
        if self.status:
            self.status.stop()


class ByteSize(click.ParamType):
    """A byte quantity as people write it: 16GiB, 512MB, 4096; at least one byte (a budget of
    nothing is a typo, not a question)."""

    name = "BYTES"

    def convert(self, value, param, ctx):
        try:
            size = value if isinstance(value, int) else parse_bytes(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)
        if size < 1:
            self.fail(f"must be at least 1 byte, got {value!r}", param, ctx)
        return size


JOBS = click.IntRange(min=1)  # --jobs: parallel solver processes
SECONDS = click.FloatRange(min=0, min_open=True)  # --time-limit
GAP = click.FloatRange(min=0, max=1)  # --gap: a fraction


BUDGET_HELP = "Memory the device has for this step, e.g. 16GiB: says whether the plan fits (exit 1 if not)."


def fail_over_budget(verdict: dict | None) -> None:
    """A plan over its budget fails the check: the message on stderr, exit 1."""
    if verdict is not None and not verdict["fits"]:
        raise CheckFailed(report_mod.budget_line(verdict))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="roam")
@click.option("-q", "--quiet", is_flag=True, help="Print only results and errors.")
@click.option("-v", "--verbose", is_flag=True, help="Print notes about the model and each phase.")
@click.pass_context
def cli(ctx, quiet, verbose):
    """roam: fit DNN training into less accelerator memory.

    Reads an ONNX training graph, chooses the operator order and every tensor's
    address in one static arena, and writes a plan a runtime can follow.

    \b
    Exit codes: 0 ok, 1 a check failed, 2 bad input or usage.
    """
    ctx.obj = {"quiet": quiet, "verbose": verbose}


@cli.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", "plan_path", required=True, type=click.Path(path_type=Path), help="Plan JSON to write.")
@click.option("--annotated-model", type=click.Path(path_type=Path),
              help="Also write the model with nodes in planned order and plan facts in metadata_props.")
@click.option("--dim", "dims", multiple=True, metavar="NAME=N", help="Bind a symbolic dimension (repeatable).")
@click.option("--alignment", default=256, show_default=True, type=int, help="Round every tensor up to this many bytes.")
@click.option("--order", "order_strategy", default=order.STRATEGIES[0], show_default=True,
              type=click.Choice(order.STRATEGIES), help="Ordering strategy; roam never does worse than the others.")
@click.option("--solver", type=click.Choice(milp.SOLVERS), default="cbc", show_default=True,
              help="MILP solver of --order ilp-global and the layout ILP (highs needs the highspy package).")
@click.option("--layout", "layout_strategy", default=None, type=click.Choice(layout.STRATEGIES),
              help=f"Layout strategy [default: {layout.STRATEGIES[0]}].")
@click.option("--shapes-from-run", is_flag=True, help="Run the graph once in ONNX Runtime to learn shapes static inference cannot.")
@click.option("--inplace", "inplace", multiple=True, metavar="OUTPUT=STATE",
              help="Declare that graph output OUTPUT replaces input STATE in place (repeatable).")
@click.option("--loss", default=None, help="Name of the loss tensor (default: the first scalar float output).")
@click.option("--time-limit", type=SECONDS, default=None, help="Seconds the solvers may use in all.")
@click.option("--gap", type=GAP, default=pipeline.Options.gap, show_default=True,
              help="Stop searching once the order's peak is within this fraction of its lower bound, and the "
                   "arena within a tenth of it of the peak of live bytes (0: search until proven or out of time; "
                   "a gap under one alignment unit is always closed by proof).")
@click.option("--jobs", type=JOBS, default=os.cpu_count() or 1, show_default=True, help="Parallel solver processes.")
@click.option("--budget", type=ByteSize(), default=None, help=BUDGET_HELP)
@click.option("--recompute", "recompute_mode", type=click.Choice(recompute.MODES), default="off", show_default=True,
              help="Recompute values in the backward instead of keeping them: free (cheap ops only, min-cut) "
                   "or budget (the fewest FLOPs that fit --budget).")
@click.option("--offload", type=click.Choice(SLOW_TIERS), default=None,
              help="Plan with a slower memory tier: host memory or storage paged to. Values, optimizer state and "
                   "the update may leave the device; --budget then counts the device's bytes, and the plan is the "
                   "fitting one of the least estimated time on --device.")
@click.option("--device", "device_profile", default=None, metavar="PROFILE",
              help=f"Device profile of --offload's estimates: a shipped name ({', '.join(cost_profile.shipped())}) "
                   f"or a JSON file [default: {cost_profile.DEFAULT}].")
@click.option("--objective", type=click.Choice(offload_planner.OBJECTIVES), default="time", show_default=True,
              help="What --offload minimises among the plans that fit: estimated step time, or energy.")
@click.option("--plot", "plot_dir", type=click.Path(path_type=Path, file_okay=False),
              help="Also draw the plan's pictures (PNG and SVG) into this directory, made if missing "
                   "(needs matplotlib: the plot extra).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan's summary as JSON.")
@click.option("--reproducible", is_flag=True,
              help="Leave wall-clock times out of the plan: the same model and options give the same bytes.")
@click.option("--ort-optimized", type=click.Choice(pipeline.ORT_LEVELS), is_flag=False, flag_value="extended",
              default=None, help="Plan the graph ONNX Runtime runs: apply its graph optimisations at this level first "
                                 "(alone: extended). The annotated model is that graph, in planned order.")
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default=None,
              help="Whose graph optimisations --ort-optimized applies [default: cpu].")
@click.option("--workspace", "workspace_mode", type=click.Choice(["none", "calibrate"]), default="none",
              show_default=True,
              help="calibrate: run one step of MODEL on ONNX Runtime (CPU) to learn each node's kernel scratch, "
                   "and place it in the arena like a tensor (roam train then holds the plan's arena).")
@click.pass_obj
def optimize(obj, model, plan_path, annotated_model, dims, alignment, order_strategy, solver, layout_strategy,
             shapes_from_run, inplace, loss, time_limit, gap, jobs, budget, recompute_mode, offload, device_profile,
             objective, plot_dir, as_json, reproducible, ort_optimized, provider, workspace_mode):
    """Plan MODEL: choose the order and the arena layout, write the plan.

    \b
    Examples:
      roam optimize training_model.onnx -o plan.json
      roam optimize model.onnx -o plan.json --dim batch=8 --annotated-model planned.onnx
      roam optimize model.onnx -o plan.json --budget 16GiB --plot pictures/
      roam optimize training_model.onnx -o plan.json --ort-optimized extended --annotated-model planned.onnx
      roam optimize full_step.onnx -o plan.json --recompute free
      roam optimize full_step.onnx -o plan.json --recompute budget --budget 6GiB
      roam optimize full_step.onnx -o plan.json --workspace calibrate
      roam optimize full_step.onnx -o plan.json --offload host --budget 1GiB --device pcie-gen5-gpu
    """
    check_output_path(plan_path, [model])
    if provider is not None and ort_optimized is None:
        raise RoamError("--provider chooses whose optimisations --ort-optimized applies: give --ort-optimized too")
    if recompute_mode == "budget" and budget is None:
        raise RoamError("--recompute budget needs --budget SIZE: the memory the plan must fit")
    if offload is None and (device_profile is not None or objective != "time"):
        raise RoamError("--device and --objective weigh the plans of --offload: give --offload host|storage too")
    if offload is not None and (recompute_mode != "off" or ort_optimized is not None):
        raise RoamError("--offload weighs recomputation itself (its candidates include recompute only); "
                        "leave out --recompute and --ort-optimized")
    if device_profile is not None:
        cost_profile.load(device_profile)  # a bad profile is refused before any work is done
    milp.check_solver(solver)
    if plot_dir is not None:
        from roam_cli.outputs import plot

        plot.figure_class()  # matplotlib is there, before any work is done
        check_output_folder(plot_dir, plot.picture_paths(plot_dir), [model, plan_path])
    if ort_optimized is not None and annotated_model is None:  # the plan's graph: written whether asked for or not
        annotated_model = pipeline.default_annotated_path(plan_path)
    if annotated_model is not None:
        check_output_path(annotated_model, [model, plan_path])
    options = pipeline.Options(
        dims=parse_pairs(dims, "--dim", True), alignment=alignment, order=order_strategy,
        layout=layout_strategy or layout.STRATEGIES[0], shapes_from_run=shapes_from_run,
        inplace=parse_pairs(inplace, "--inplace", False), loss=loss, time_limit=time_limit, gap=gap, jobs=jobs,
        solver=solver, reproducible=reproducible, ort_optimized=ort_optimized, provider=provider or "cpu",
        recompute=recompute_mode, budget=budget, offload=offload, device=device_profile, objective=objective)
    if workspace_mode == "calibrate":
        from roam_cli.runtime.calibrate import node_workspace

        with Progress(obj["quiet"]) as progress:
            progress("calibrating: one step on ONNX Runtime, for each node's workspace")
            options.workspace = node_workspace(model, options.dims, alignment)
    with Progress(obj["quiet"]) as progress, \
            pipeline.scratch(annotated_model if ort_optimized else None) as ort_model:
        result = pipeline.run(model, plan_path, options, progress, ort_model)
        # both or neither: a Ctrl-C never leaves the plan without the annotated model (or the reverse)
        write_all_atomic(pipeline.files(result, plan_path, annotated_model))
    plan = result.plan
    pictures = []
    if plot_dir is not None:
        with Progress(obj["quiet"]) as progress:
            progress("drawing the pictures")
            pictures = plot.all_pictures(plan, plot.original_curve(result.mm), plot_dir, budget=budget)
    verdict = budget_mod.check(plan, budget) if budget is not None else None
    if as_json:
        click.echo(json.dumps({**report_mod.summarize(plan, budget=verdict),
                               "pictures": [str(p) for p in pictures]}, indent=1))
        fail_over_budget(verdict)
        return
    if obj["verbose"]:
        for note in result.notes:
            err.print(f"note: {note}")
    elif not obj["quiet"]:
        for note in result.notes:
            if "external data" in note or "refers to" in note:
                err.print(f"note: {note}")
    if not obj["quiet"]:
        frag = plan["arena_bytes"] / report_mod.arena_floor(plan) - 1 if plan["peak_live_bytes"] else 0.0
        out.print(f"wrote {plan_path}: {len(plan['order'])} nodes, arena {format_bytes(plan['arena_bytes'])} "
                  f"(peak live {format_bytes(plan['peak_live_bytes'])}, fragmentation {frag:.2%}), "
                  f"persistent {format_bytes(plan['persistent_bytes'])}")
        effect = report_mod.ort_effect(plan)
        if effect is not None:
            out.print(report_mod.ort_line(effect), highlight=False)
        if "recompute" in plan:
            out.print(report_mod.recompute_line(report_mod.recompute_effect(plan)), highlight=False)
        if "offload" in plan:
            for line in report_mod.offload_lines(plan):
                out.print(line, highlight=False)
        for picture in pictures:
            out.print(f"wrote {picture}", highlight=False)
        if verdict is not None and verdict["fits"]:
            out.print(report_mod.budget_line(verdict), highlight=False)
    fail_over_budget(verdict)


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
    from roam_cli.verify import Violation, verify as check

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
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--plan", "plan_path", required=True, type=click.Path(path_type=Path), help="Plan JSON made for MODEL.")
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="ONNX Runtime execution provider.")
@click.option("--inputs", "inputs_path", type=click.Path(path_type=Path),
              help="Feeds: an .npz with one array per graph input; inputs it lacks are synthesised.")
@click.option("--seed", default=0, show_default=True, type=int,
              help="Seed of the synthetic inputs and of random ops (Dropout) that have none.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.pass_obj
def execute(obj, model, plan_path, provider, inputs_path, seed, as_json):
    """Run MODEL on ONNX Runtime as the plan says, and check that the plan can be followed.
    MODEL is either file of the plan's pair: the model optimize read or the annotated model it wrote.

    One training step of the annotated model with execution_order PRIORITY_BASED (the order
    ORT ran the nodes in, from its profiler, against the plan's), and the arena replay: every
    node in plan order in one buffer of arena_bytes, each tensor bound at its planned offset.
    Both are compared with a plain ORT run of MODEL. Also reports ORT's own arena bytes for
    the original and the planned order. Exit 1 when under 99.9% of node pairs ran in plan
    order or a result differs by more than 1e-5 relative.

    \b
    Examples:
      roam execute training_model.onnx --plan plan.json
      roam execute training_model.onnx --plan plan.json --provider cuda --inputs batch.npz --json
    """
    from roam_cli.runtime.execute import execute_plan, render

    plan = plan_io.read(plan_path)
    with Progress(obj["quiet"]) as progress:
        result = execute_plan(model, plan, provider, inputs_path, seed, progress)
    if as_json:
        click.echo(json.dumps(result, indent=1))
    elif not obj["quiet"]:
        render(result, out)
    if result["failures"]:
        more = f" (and {len(result['failures']) - 1} more)" if len(result["failures"]) > 1 else ""
        raise CheckFailed(result["failures"][0] + more)


@cli.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--plan", "plan_path", required=True, type=click.Path(path_type=Path), help="Plan JSON made for MODEL.")
@click.option("--steps", default=20, show_default=True, type=int, help="Training steps to run.")
@click.option("--inputs", "inputs_path", type=click.Path(path_type=Path),
              help="An .npz by input name: starting state, and data (one batch, or [steps, ...] cycled); "
                   "what it lacks is synthesised, optimizer state starts at zero.")
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="ONNX Runtime execution provider.")
@click.option("--allocator", type=click.Choice(["roam", "ort", "ort-same-as-requested"]), default="roam",
              show_default=True, help="roam: ORT's requests served from the plan's arena; ort: ORT's own arena.")
@click.option("--learning-rate", default=1e-3, show_default=True, type=float,
              help="The learning_rate input, when --inputs does not give it.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of synthetic inputs and of random ops.")
@click.option("--compare", is_flag=True,
              help="Run the same steps on a plain ORT session too and check outputs and final state (1e-5).")
@click.option("--allow-unplanned", is_flag=True,
              help="Serve requests the plan does not cover from the system and count them, instead of stopping.")
@click.option("--save-weights", "save_weights", type=click.Path(path_type=Path),
              help="Write the trained parameters under their PyTorch names (.safetensors or .npz): "
                   "model.load_state_dict(weights, strict=False) loads them.")
@click.option("--save-model", "save_model", type=click.Path(path_type=Path),
              help="Write the inference export the step was made from, with the trained weights.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.pass_obj
def train(obj, model, plan_path, steps, inputs_path, provider, allocator, learning_rate, seed, compare,
          allow_unplanned, save_weights, save_model, as_json):
    """Run STEPS training steps of MODEL on ONNX Runtime as PLAN says. MODEL is either file of
    the plan's pair: the whole-step model optimize read (roam make-training-graph
    --in-graph-optimizer writes one) or the annotated model it wrote; both run the same graph.

    The pair is verified first: a plan that does not hold stops before step 1 (exit 1). Then
    the plan's order (PRIORITY_BASED), the state updated in place (each `<state>.out` output
    written into its input's buffer), and with --allocator roam ORT's own session allocating
    from the plan's arena: each request of step 1 is matched to the planned tensor it is, and
    every later step serves it at that tensor's plan offset. A request that leaves the plan
    stops the run (exit 1) unless --allow-unplanned, which serves it from the system and
    counts it. Prints the loss per step, the bytes ORT held and the plan's. Exit 1 with
    --compare when the planned run differs from the plain one by more than 1e-5 relative.

    A step roam made from an inference export starts from that export's weights (where it can be
    read; else they are synthesised, and a warning says so), and gives them
    back: --save-weights for PyTorch, --save-model as the export with the trained weights.

    \b
    Examples:
      roam train step.onnx --plan plan.json --steps 20
      roam train step.onnx --plan plan.json --inputs batches.npz --compare --json
      roam train step.onnx --plan plan.json --allow-unplanned
      roam train step.onnx --plan plan.json --steps 100 --save-weights trained.safetensors --save-model trained.onnx
    """
    from roam_cli.runtime.train import RTOL, render_step, render_summary, train as run_training

    outputs = [p for p in (save_weights, save_model) if p is not None]
    for i, path in enumerate(outputs):
        check_output_path(path, [model, plan_path, *outputs[:i]])
    plan = plan_io.read(plan_path)
    show = not (as_json or obj["quiet"])
    result = run_training(model, plan, steps, device=provider, inputs_path=inputs_path, seed=seed,
                          learning_rate=learning_rate, allocator=allocator, compare=compare,
                          allow_unplanned=allow_unplanned, on_step=(lambda r: out.print(render_step(r, steps, plan), highlight=False, soft_wrap=True)) if show else None,
                          save_weights=save_weights, save_model=save_model)
    if as_json:
        click.echo(json.dumps(result, indent=1))
    elif not obj["quiet"]:
        render_summary(result, out)
    differs = compare and max(result["compare"]["outputs_max_rel"], result["compare"]["state_max_rel"]) > RTOL
    if differs:
        raise CheckFailed(f"the planned run differs from the plain ORT run by more than {RTOL:g} relative "
                          f"(outputs {result['compare']['outputs_max_rel']:.3g}, state {result['compare']['state_max_rel']:.3g})")


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


@cli.command("max-batch")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--dim-name", "dim", default="batch", show_default=True, help="The symbolic dimension to search.")
@click.option("--budget", type=ByteSize(), required=True, help="Memory the device has for this step, e.g. 80GiB.")
@click.option("--dim", "dims", multiple=True, metavar="NAME=N", help="Bind another symbolic dimension (repeatable).")
@click.option("--order", "order_strategy", default=order.STRATEGIES[0], show_default=True,
              type=click.Choice(order.STRATEGIES),
              help="Order strategy to size; the original order is always measured beside it (and seeds the search).")
@click.option("--layout", "layout_strategy", default=None, type=click.Choice(layout.STRATEGIES),
              help=f"Layout strategy [default: {layout.STRATEGIES[0]}].")
@click.option("--alignment", default=256, show_default=True, type=int, help="Round every tensor up to this many bytes.")
@click.option("--inplace", "inplace", multiple=True, metavar="OUTPUT=STATE",
              help="Declare that graph output OUTPUT replaces input STATE in place (repeatable).")
@click.option("--loss", default=None, help="Name of the loss tensor (default: the first scalar float output).")
@click.option("--time-limit", type=SECONDS, default=None, help="Seconds the solvers may use for each plan.")
@click.option("--jobs", type=JOBS, default=os.cpu_count() or 1, show_default=True, help="Parallel solver processes.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def max_batch(obj, model, dim, budget, dims, order_strategy, layout_strategy, alignment, inplace, loss, time_limit,
              jobs, as_json):
    """Find the largest value of a symbolic dimension of MODEL (a batch size) whose plan fits
    BUDGET, with the chosen order strategy and with the original order.

    Re-plans the model at each probed value, galloping then bisecting, so the answer n fits
    while n + 1 does not. Exit 1 when not even 1 fits.

    \b
    Examples:
      roam max-batch model.onnx --dim-name batch --budget 80GiB
      roam max-batch model.onnx --dim-name batch --dim seq=1024 --budget 24GiB --order original --json
    """
    base = pipeline.Options(
        dims=parse_pairs(dims, "--dim", True), alignment=alignment, order=order_strategy,
        layout=layout_strategy or layout.STRATEGIES[0], inplace=parse_pairs(inplace, "--inplace", False),
        loss=loss, time_limit=time_limit, jobs=jobs)
    strategies = list(dict.fromkeys(["original", order_strategy]))
    results = []
    with rich_progress(obj["quiet"]) as bar:
        for strategy in strategies:
            task = bar.add_task(f"order {strategy}", total=None)

            def probed(n, nbytes, task=task, strategy=strategy):
                verdict = "fits" if nbytes <= budget else "does not fit"
                bar.update(task, advance=1, description=f"order {strategy}: {dim}={n:,} {verdict} "
                                                        f"({format_bytes(nbytes)})")

            # the original order's answer is where the (slower) chosen strategy starts its search
            start = results[0].max_value if results and results[0].max_value else 1
            results.append(budget_mod.max_value(model, dim, budget, dataclasses.replace(base, order=strategy),
                                                start, probed))
            bar.update(task, total=len(results[-1].probes))
    if as_json:
        click.echo(json.dumps({"dim": dim, "budget_bytes": budget, "dims": base.dims,
                               "results": [{**dataclasses.asdict(r), "probes": sorted(r.probes.items())}
                                           for r in results]}, indent=1))
    else:
        render_max_batch(results, dim, budget, model, base.dims)
    if not any(r.max_value for r in results):
        raise CheckFailed(f"no plan fits {format_bytes(budget)}, not even at {dim}=1")


def rich_progress(quiet: bool):
    """A progress bar on stderr for multi-step searches (silent with -q or when not a terminal)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress as RichProgress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    return RichProgress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=err, transient=True, disable=quiet or not err.is_terminal)


def render_max_batch(results: list, dim: str, budget: int, model: Path, dims: dict[str, int]) -> None:
    from rich.table import Table

    table = Table(title=f"largest {dim} that fits {format_bytes(budget)} ({model})", title_justify="left")
    for col in ("order", "layout", dim, "needs", f"{dim} + 1 needs", "plans made"):
        table.add_column(col, justify="left" if col in ("order", "layout") else "right")
    for r in results:
        needs = format_bytes(r.at_max["needed_bytes"]) if r.at_max else "–"
        table.add_row(r.order, r.layout, f"{r.max_value:,}", needs, format_bytes(r.next_needed_bytes),
                      str(len(r.probes)))
    out.print(table)
    best = max(reversed(results), key=lambda r: r.max_value)  # on a tie, the chosen strategy
    if best.max_value:
        bound = " ".join(f"--dim {k}={v}" for k, v in {**dims, dim: best.max_value}.items())
        out.print(f"plan it: roam optimize {model} -o plan.json {bound} --order {best.order} --layout {best.layout}",
                  highlight=False)


def split_names(values: tuple[str, ...]) -> list[str]:
    return [name for v in values for name in v.split(",") if name]


@cli.command()
@click.argument("graph_path", metavar="GRAPH.json", type=click.Path(path_type=Path))
@click.argument("schedule_in", metavar="[SCHEDULE.json]", required=False, type=click.Path(path_type=Path))
@click.option("-o", "--output", "out_path", type=click.Path(path_type=Path), help="Schedule to write.")
@click.option("--budget", type=ByteSize(), default=None, help="Peak memory the schedule must fit, e.g. 12GiB.")
@click.option("--budget-fraction", type=click.FloatRange(min=0, min_open=True), default=None,
              help="The budget as a fraction of the given order's peak, e.g. 0.8.")
@click.option("--time-limit", type=SECONDS, default=60.0, show_default=True, help="Seconds the search may use.")
@click.option("--check", is_flag=True, help="Validate SCHEDULE.json against GRAPH.json instead of solving.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_obj
def remat(obj, graph_path, schedule_in, out_path, budget, budget_fraction, time_limit, check, as_json):
    """Schedule a node-link graph (Checkmate's, Moccasin's) to fit a memory budget, a node
    allowed to run again (a recomputation), at the least total compute; or solve a POET problem
    (poet-problem-v1: its RAM and runtime budgets in the file): per stage what to recompute, keep,
    page out and page in, at the least energy (docs/poet.md).

    \b
    Examples:
      roam remat graph.json --budget-fraction 0.8 -o schedule.json
      roam remat --check graph.json schedule.json
      roam remat vgg16.problem.json -o schedule.json --time-limit 300
      roam remat --check vgg16.problem.json schedule.json
    """
    from roam_cli.remat import poet

    if poet.is_poet(graph_path):
        if budget is not None or budget_fraction is not None:
            raise RoamError("a POET problem carries its own RAM and runtime budgets: drop --budget/--budget-fraction")
        remat_poet(obj, graph_path, schedule_in, out_path, time_limit, check, as_json)
        return
    if check:
        from roam_cli.remat.check import check as check_schedule

        if schedule_in is None or out_path is not None or budget_fraction is not None:
            raise RoamError("--check takes GRAPH.json SCHEDULE.json, and --budget BYTES or the schedule's own")
        try:
            problem, measured = check_schedule(graph_path, schedule_in, budget)
        except ValueError as e:
            raise RoamError(str(e)) from None
        if problem:
            raise CheckFailed(f"invalid schedule: {problem}")
        if not obj["quiet"] or as_json:
            out.print(json.dumps(measured) if as_json else
                      f"valid: peak {measured['peak']}, compute {measured['compute']} "
                      f"(baseline {measured['baseline_compute']})", highlight=False, soft_wrap=True)
        return
    from roam_cli import remat as remat_mod

    if schedule_in is not None or out_path is None:
        raise RoamError("remat takes GRAPH.json and -o SCHEDULE.json (a second file only with --check)")
    check_output_path(out_path, [graph_path])
    doc = remat_mod.remat(graph_path, budget, budget_fraction, time_limit)
    write_atomic(out_path, json.dumps(doc) + "\n")
    summary = {k: v for k, v in doc.items() if k != "schedule"}
    if as_json:
        out.print(json.dumps(summary), highlight=False, soft_wrap=True)
    elif not obj["quiet"]:
        out.print(f"wrote {out_path}: {len(doc['schedule'])} steps ({doc['recomputations']} recomputations), "
                  f"peak {doc['peak']} of budget {doc['budget']}, compute {doc['compute']} "
                  f"(+{doc['overhead_percent']:.3f} % over {doc['baseline_compute']}), {doc['status']}, "
                  f"{doc['seconds']:.1f} s", highlight=False, soft_wrap=True)


def remat_poet(obj, problem_path: Path, schedule_in: Path | None, out_path: Path | None, time_limit: float,
               check: bool, as_json: bool) -> None:
    """`roam remat` on a POET problem: solve it, or check a schedule of it (--check)."""
    from roam_cli.remat import poet, poet_check, poet_solve

    if check:
        if schedule_in is None or out_path is not None:
            raise RoamError("--check takes PROBLEM.json SCHEDULE.json")
        try:
            verdict = poet_check.check(problem_path, schedule_in)
        except ValueError as e:
            raise RoamError(str(e)) from None
        if as_json:
            out.print(json.dumps(verdict), highlight=False, soft_wrap=True)
        if not verdict["valid"]:
            for line in verdict["violations"][:20]:
                err.print(line, highlight=False, soft_wrap=True)
            raise CheckFailed(f"invalid schedule: {len(verdict['violations'])} violation(s), "
                              f"the first: {verdict['violations'][0]}")
        if not obj["quiet"] and not as_json:
            out.print(f"valid: energy {verdict['energy_joules']:.6g} J (compute {verdict['compute_joules']:.6g}, "
                      f"paging {verdict['paging_joules']:.6g}), peak RAM {verdict['peak_ram_bytes']:g} bytes, "
                      f"runtime {verdict['runtime']:.6g}", highlight=False, soft_wrap=True)
        return
    if schedule_in is not None or out_path is None:
        raise RoamError("remat takes PROBLEM.json and -o SCHEDULE.json (a second file only with --check)")
    check_output_path(out_path, [problem_path])
    problem = poet.read(problem_path)
    found = poet_solve.solve(problem, time_limit)
    if isinstance(found, str):
        raise CheckFailed(f"no schedule fits: {found}")
    poet.write(out_path, found.schedule, problem.T)
    summary = found.summary(problem)
    if as_json:
        out.print(json.dumps(summary), highlight=False, soft_wrap=True)
    elif not obj["quiet"]:
        out.print(f"wrote {out_path}: energy {summary['energy_joules']:.6g} J (compute "
                  f"{summary['compute_joules']:.6g}, paging {summary['paging_joules']:.6g}), peak RAM "
                  f"{summary['peak_ram_bytes']:g} of {problem.ram_budget:g} bytes, runtime {summary['runtime']:.6g} "
                  f"of {problem.runtime_budget:.6g}, {summary['status']}, {summary['seconds']:.1f} s",
                  highlight=False, soft_wrap=True)

@cli.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", "front_path", required=True, type=click.Path(path_type=Path),
              help="front.json to write: each point's budget, memory, extra FLOPs and verdict.")
@click.option("--points", default=10, show_default=True, type=click.IntRange(min=tradeoff_mod.MIN_POINTS),
              help="Points the front should have (fewer when the step has no more distinct plans).")
@click.option("--plans", "plans_dir", type=click.Path(path_type=Path, file_okay=False),
              help="Write each point's plan into this folder (point-01.json, ...; `roam verify MODEL` checks each).")
@click.option("--plot", "plot_dir", type=click.Path(path_type=Path, file_okay=False),
              help="Draw the front into this folder (front.png, front.svg; pip install '.[plot]').")
@click.option("--mark", "marks", multiple=True, metavar="NAME=BYTES[@FLOPS]",
              help="A reference point for the picture, e.g. 'PyTorch eager=3.5GiB' or 'checkpointing=2.3GiB@23.3%' "
                   "(extra FLOPs as a count or a share of the step; repeatable).")
@click.option("--dim", "dims", multiple=True, metavar="NAME=N", help="Bind a symbolic dimension (repeatable).")
@click.option("--time-limit", type=SECONDS, default=None,
              help="Seconds for the whole sweep, shared by its plans (default: 60 per point).")
@click.option("--solver", type=click.Choice(milp.SOLVERS), default="cbc", show_default=True,
              help="MILP solver of the ordering, layout and recompute programs.")
@click.option("--jobs", type=JOBS, default=os.cpu_count() or 1, show_default=True, help="Parallel solver processes.")
@click.option("--offload", type=click.Choice(SLOW_TIERS), default=None,
              help="The device-memory / estimated-time front with a slower tier instead, the fixed policies "
                   "(save_on_cpu, ZeRO-Offload, recompute only...) beside it.")
@click.option("--device", "device_profile", default=None, metavar="PROFILE",
              help=f"Device profile of --offload's estimates [default: {cost_profile.DEFAULT}].")
@click.option("--json", "as_json", is_flag=True, help="Print front.json's points as JSON.")
@click.pass_obj
def tradeoff(obj, model, front_path, points, plans_dir, plot_dir, marks, dims, time_limit, solver, jobs, offload,
             device_profile, as_json):
    """The memory / extra-FLOPs front of the training step MODEL: plans from keeping every
    forward value through `--recompute free` to the most recomputation roam can plan, each
    verified; dominated plans dropped, so that less memory always costs more FLOPs.

    \b
    Examples:
      roam tradeoff full_step.onnx -o front.json --plot pictures/
      roam tradeoff full_step.onnx -o front.json --points 12 --plans plans/ --time-limit 600
      roam tradeoff full_step.onnx -o front.json --plot pictures/ --mark 'PyTorch eager=3.46GiB' \\
          --mark 'checkpointing=2.32GiB@23.3%'
      roam tradeoff full_step.onnx -o front.json --offload host --device pcie-gen5-gpu
    """
    check_output_path(front_path, [model])
    milp.check_solver(solver)
    if offload is not None:
        if plans_dir or plot_dir or marks:
            raise RoamError("--offload's front is written as front.json and printed: leave out --plans, --plot and --mark")
        if device_profile is not None:
            cost_profile.load(device_profile)
        options = pipeline.Options(dims=parse_pairs(dims, "--dim", True), layout=layout.STRATEGIES[0],
                                   time_limit=time_limit, jobs=jobs, solver=solver, offload=offload, device=device_profile)
        with Progress(obj["quiet"]) as progress:
            front = tradeoff_mod.offload_front(model, options, points, progress)
        write_atomic(front_path, json.dumps(front, indent=1) + "\n")
        if as_json:
            click.echo(json.dumps(front, indent=1))
        elif not obj["quiet"]:
            render_offload_front(front)
            out.print(f"wrote {front_path}", highlight=False)
        return
    if device_profile is not None:
        raise RoamError("--device weighs --offload's plans: give --offload host|storage too")
    references = []
    for m in marks:
        name, sep, value = m.partition("=")
        size, _, extra = value.partition("@")
        if not sep or not name or not size:
            raise RoamError(f"--mark expects NAME=BYTES[@FLOPS], got {m!r}")
        references.append((name, parse_size(m, size), extra or None))
    if plot_dir is not None:
        from roam_cli.outputs import front_plot, plot

        plot.figure_class()  # matplotlib is there, before any work is done
        check_output_folder(plot_dir, front_plot.picture_paths(plot_dir), [model, front_path])
    if plans_dir is not None:
        check_output_folder(plans_dir, [plans_dir / plan_name(k) for k in range(points)], [model, front_path])
    options = pipeline.Options(dims=parse_pairs(dims, "--dim", True), time_limit=time_limit, jobs=jobs, solver=solver)
    with Progress(obj["quiet"]) as progress:
        front = tradeoff_mod.sweep(model, options, points, plans_dir or front_path.parent, progress)
    plans = front.pop("plans")
    if front["unverified"]:
        bad = front["unverified"][0]
        raise CheckFailed(f"{len(front['unverified'])} plans failed verification, the first ({bad['label']}): "
                          f"{bad['violation']}")
    step_flops = front["points"][0]["step_flops"]
    front["marks"] = [tradeoff_mod.mark(name, size, extra, step_flops) for name, size, extra in references]
    written: dict = {}
    for k, (point, plan) in enumerate(zip(front["points"], plans)):
        point["plan"] = None
        if plans_dir is not None:
            point["plan"] = str(plans_dir / plan_name(k))
            written[plans_dir / plan_name(k)] = plan_io.dumps(plan)
    written[front_path] = json.dumps(front, indent=1) + "\n"
    if plans_dir is not None:
        make_folder(plans_dir)
    write_all_atomic(written)
    pictures = front_plot.picture(front, plot_dir) if plot_dir is not None else []
    if as_json:
        click.echo(json.dumps({**front, "pictures": [str(p) for p in pictures]}, indent=1))
        return
    if not obj["quiet"]:
        render_front(front)
        out.print(f"wrote {front_path}" + "".join(f", {p}" for p in pictures), highlight=False)
    if len(front["points"]) < points:
        err.print(f"note: the front has {len(front['points'])} points, fewer than the {points} asked for: no other "
                  "budget gave a plan that is not dominated")


def render_offload_front(front: dict) -> None:
    from rich.table import Table

    table = Table(title=f"device memory / estimated time front of {front['model']} ({front['offload']} tier, "
                        f"{front['profile']}; times are estimates)", title_justify="left")
    for column in ("plan", "device bytes", "est. step time", "transfers", "dominated by"):
        table.add_column(column, justify="left" if column in ("plan", "dominated by") else "right")
    for p in front["points"]:
        table.add_row(f"front: {report_mod.policy_name(p['policy'])}", format_bytes(p["device_bytes"]),
                      report_mod.format_seconds(p["seconds"]), f"{p['transfers']:,}", "")
    for p in front["policies"]:
        by = p["dominated_by"]
        table.add_row(f"policy: {report_mod.policy_name(p['policy'])}", format_bytes(p["device_bytes"]),
                      report_mod.format_seconds(p["seconds"]), f"{p['transfers']:,}",
                      "—" if by is None else f"{format_bytes(by['device_bytes'])} at {report_mod.format_seconds(by['seconds'])}")
    out.print(table)


def plan_name(k: int) -> str:
    return f"point-{k + 1:02d}.json"


def parse_size(mark: str, size: str) -> int:
    try:
        return parse_bytes(size)
    except ValueError as e:
        raise RoamError(f"--mark {mark!r}: {e}") from None


def render_front(front: dict) -> None:
    from rich.table import Table

    table = Table(title=f"memory / extra FLOPs front of {front['model']}", title_justify="left")
    for column in ("point", "persistent + arena", "arena", "extra FLOPs", "% of the step", "nodes added", "verified"):
        table.add_column(column, justify="left" if column == "point" else "right")
    for p in front["points"]:
        table.add_row(p["label"], format_bytes(p["total_bytes"]), format_bytes(p["arena_bytes"]), f"{p['extra_flops']:,}",
                      f"{p['extra_flops_pct']:.3f}", str(p["nodes_added"]), "yes" if p["verified"] else "NO")
    out.print(table)
    if front["dominated"]:
        out.print(f"{len(front['dominated'])} dominated plans dropped (in front.json's `dominated`): another plan "
                  "needs no more memory and no more FLOPs", highlight=False)


@cli.command("layout-csv")
@click.argument("csv_in", metavar="IN.csv", type=click.Path(path_type=Path))
@click.option("-o", "--output", "csv_out", required=True, type=click.Path(path_type=Path),
              help="CSV to write: the input rows plus an offset column.")
@click.option("--capacity", type=click.IntRange(min=1), default=None,
              help="Arena size to fit in; exit 1 when it cannot be met.")
@click.option("--time-limit", type=SECONDS, default=None, help="Seconds the layout solver may use.")
@click.option("--jobs", type=JOBS, default=os.cpu_count() or 1, show_default=True, help="Parallel solver processes.")
@click.pass_obj
def layout_csv(obj, csv_in, csv_out, capacity, time_limit, jobs):
    """Place the buffers of a minimalloc CSV (id,lower,upper,size; lifetimes [lower, upper)).

    \b
    Example:
      roam layout-csv sample_models/minimalloc/A.1048576.csv -o A.out.csv --capacity 1048576
    """
    from roam_cli.layout.csv_io import read_csv, write_csv

    check_output_path(csv_out, [csv_in])
    try:
        ids, buffers = read_csv(csv_in)
    except (OSError, ValueError) as e:
        raise RoamError(str(e).splitlines()[0] if str(e) else f"cannot read {csv_in}") from None
    placed = layout.place(buffers, "roam", time_limit=time_limit, jobs=jobs, capacity=capacity)
    write_csv(csv_out, ids, buffers, placed.offsets)
    if not obj["quiet"]:
        out.print(f"height {placed.arena} (peak live {placed.stats['lower_bound']}, {len(buffers)} buffers)",
                  soft_wrap=True)
    if capacity is not None and not placed.stats["fits"]:
        raise CheckFailed(f"capacity {capacity} not met: height {placed.arena}")


@cli.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out_path", required=True, type=click.Path(path_type=Path),
              help="Standard-ONNX model to write.")
@click.option("--json", "as_json", is_flag=True, help="Print what was rewritten as JSON.")
@click.pass_obj
def lower(obj, model, out_path, as_json):
    """Rewrite ONNX Runtime's fused training ops (com.microsoft) as standard ONNX ops.

    Same graph inputs and outputs, in the same order; an in-place update (gradient accumulator)
    adds a graph output `<state>.out`. Any ONNX runtime then runs the graph. Weights are not read.

    \b
    Example:
      roam lower training_model.onnx -o training_model.lowered.onnx
    """
    from roam_cli import lower as lower_mod
    from roam_cli.frontend.onnx_import import load_model

    check_output_path(out_path, [model])
    source, sha = load_model(model)
    lowered = lower_mod.lower_model(source)
    lower_mod.write_lowered(lowered, model, sha, out_path)
    summary = lower_mod.summary(source, lowered)
    if as_json:
        out.print_json(json.dumps({"model": str(model), "output": str(out_path), **summary}))
    elif not obj["quiet"]:
        rewritten = ", ".join(f"{op} {n}" for op, n in summary["rewritten"].items()) or "nothing to rewrite"
        out.print(f"wrote {out_path}: {summary['nodes_before']} -> {summary['nodes_after']} nodes; rewritten: "
                  f"{rewritten}", soft_wrap=True, highlight=False)


@cli.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out_path", required=True, type=click.Path(path_type=Path),
              help="The graph the CPU provider runs, to write.")
@click.option("--json", "as_json", is_flag=True, help="Print how many nodes were emulated as JSON.")
@click.pass_obj
def emulate(obj, model, out_path, as_json):
    """Run a bf16 or fp16 graph on ONNX Runtime's CPU provider with a GPU's rounding.

    The CPU provider has no bfloat16 arithmetic, and runs float16 in float32 without rounding
    products' inputs. Each node without a kernel of its 16-bit type computes in float32 between a
    Cast of its inputs and a rounding Cast of its results, as a GPU's kernel rounds; every 16-bit
    tensor keeps its name, type and size. Plan the written graph: it is the one that runs.

    \b
    Example:
      roam emulate step.onnx -o step.cpu.onnx && roam optimize step.cpu.onnx -o plan.json
    """
    from roam_cli import lower as lower_mod
    from roam_cli.frontend.onnx_import import load_model
    from roam_cli.precision.emulate import emulate as rewrite

    check_output_path(out_path, [model])
    source, _ = load_model(model)
    count = rewrite(source)
    if not count:
        raise RoamError(f"{model} has no bf16 or fp16 node the CPU provider lacks a kernel for: it runs as it is")
    lower_mod.relocate_weights(source, model, out_path)
    write_atomic(out_path, source.SerializeToString())
    if as_json:
        out.print_json(json.dumps({"model": str(model), "output": str(out_path), "emulated_nodes": count}))
    elif not obj["quiet"]:
        out.print(f"wrote {out_path}: {count:,} 16-bit nodes computed in float32 and rounded", highlight=False)


@cli.command("make-training-graph")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out_path", required=True, type=click.Path(path_type=Path),
              help="Training graph to write (with --in-graph-optimizer: the whole step).")
@click.option("--loss", type=click.Choice(list(training_graph.LOSSES)),
              help="Loss added on the first output (none: the first output already is the loss).")
@click.option("--requires-grad", "requires_grad", multiple=True, metavar="NAMES",
              help="Trainable parameters, comma-separated (default: initializers named like parameters).")
@click.option("--frozen", multiple=True, metavar="PATTERNS",
              help="Parameters not to train: globs, comma-separated (buffers are never trained).")
@click.option("--trainable", multiple=True, metavar="PATTERNS",
              help="Also train the floating-point initializers (not scalars) these globs match, comma-separated "
                   "(weights the exporter folded into constants, e.g. 'val_*').")
@click.option("--json", "as_json", is_flag=True,
              help="Print the trainable, frozen, constant, recovered, folded, merged, missing, tied and computed names "
                   "as JSON.")
@click.option("--optimizer", type=click.Choice(list(training_graph.ARTIFACT_OPTIMIZERS)), default="adamw",
              show_default=True)
@click.option("--in-graph-optimizer", "in_graph", is_flag=True,
              help="One graph for the whole step: each parameter's update right after its backward.")
@click.option("--optimizer-model", "optimizer_path", type=click.Path(path_type=Path),
              help="Optimizer graph to write [default: OUTPUT with .optimizer.onnx].")
@click.option("--checkpoint", "checkpoint_path", type=click.Path(path_type=Path),
              help="Also write the ONNX Runtime checkpoint (the only output that reads the weights).")
@click.option("--dim", "dims", multiple=True, metavar="NAME=N",
              help="Bind a symbolic input dimension before differentiating (repeatable; roam's backward needs "
                   "static shapes).")
@click.option("--backend", type=click.Choice(["roam", "ort-artifacts"]), default="roam", show_default=True,
              help="Who builds the backward: roam (standard ONNX, no torch) or ONNX Runtime's training artifacts.")
@click.option("--fused", is_flag=True,
              help="With --backend ort-artifacts: keep ONNX Runtime's fused training ops (runs on "
                   "onnxruntime-training only) instead of writing standard ONNX.")
@click.option("--optimizer-setting", "optimizer_settings", multiple=True, metavar="NAME=VALUE",
              help="A setting of the in-graph optimizer over its default (AdamW: beta1, beta2, eps, weight_decay, "
                   "convention=onnxruntime|pytorch: whose maths).")
@click.option("--allow-folded-batchnorm", is_flag=True,
              help="Train an export whose BatchNorms the exporter folded into its convolutions as it is, the "
                   "folded convolution weights and biases its parameters (refused by default: it computes the "
                   "eval-mode function).")
@click.option("--precision", type=click.Choice(list(PRECISIONS)),
              help="Mixed precision: float32 master weights and optimizer state, matrix products and convolutions "
                   "in bf16 or fp16 as torch.autocast runs them [default: what the export computes in].")
@click.option("--grad-scaler", "scaler_settings", multiple=True, metavar="NAME=VALUE",
              help="fp16's loss scaling over torch.amp.GradScaler's defaults (init_scale, growth_factor, "
                   "backoff_factor, growth_interval, enabled).")
@click.pass_obj
def make_training_graph(obj, model, out_path, loss, requires_grad, frozen, trainable, as_json, optimizer, in_graph,
                        optimizer_path, checkpoint_path, dims, backend, fused, optimizer_settings, allow_folded_batchnorm,
                        precision, scaler_settings):
    """Turn an inference ONNX export into a training graph: forward, loss, backward.

    Repairs what exporters leave out, reports which parameters survived the export, and builds
    the backward without reading a weight: roam's own (default; standard ONNX, nothing but onnx
    installed; no optimizer graph, use --in-graph-optimizer for the step) or, with --backend
    ort-artifacts, ONNX Runtime's training artifacts (needs onnxruntime-training and torch), written
    in standard ONNX as `roam lower` writes it unless --fused.

    \b
    Examples:
      roam make-training-graph model.onnx -o train.onnx --loss cross-entropy
      roam make-training-graph model.onnx -o step.onnx --loss none --in-graph-optimizer
      roam make-training-graph training_model.onnx -o step.onnx --in-graph-optimizer --optimizer sgd
      roam make-training-graph model.onnx -o train.onnx --loss none --trainable 'val_*' --json
      roam make-training-graph model.onnx -o step.onnx --loss cross-entropy --dim batch=8 --dim seq=128
    """
    if optimizer_path is None:
        optimizer_path = out_path.with_name(out_path.name.removesuffix(".onnx") + ".optimizer.onnx")
    from roam_cli.backward import step

    made = training_graph.make(model, out_path, loss=loss, requires_grad=split_names(requires_grad) or None,
                               frozen=split_names(frozen), trainable=split_names(trainable), optimizer=optimizer,
                               in_graph=in_graph, optimizer_path=optimizer_path, checkpoint_path=checkpoint_path,
                               dims=parse_pairs(dims, "--dim", True), backward=step.build if backend == "roam" else training_graph.build, fused=fused,
                               allow_folded_batchnorm=allow_folded_batchnorm,
                               optimizer_settings=parse_pairs(optimizer_settings, "--optimizer-setting", False),
                               precision=precision, scaler_settings=parse_pairs(scaler_settings, "--grad-scaler", False))
    if as_json:
        names = made.survey.names() if made.survey is not None else {}
        click.echo(json.dumps(names | {"warnings": made.survey.warnings() if made.survey else [],
                                       "written": [str(path) for path, _, _ in made.written]}
                              | ({"precision": made.precision} if made.precision else {}), indent=1))
    elif made.survey is not None and not obj["quiet"]:
        s = made.survey
        out.print(f"parameters: {len(s.trainable):,} trainable ({s.elements:,} elements), {len(s.frozen):,} frozen, "
                  f"{len(s.constants):,} constants", highlight=False)
        if made.repaired:
            out.print("repaired: " + ", ".join(f"{op} ×{n}" for op, n in sorted(made.repaired.items())), highlight=False)
        if s.recovered:
            shown = ", ".join(f"{c} -> {p}" for c, p in list(s.recovered.items())[:3])
            out.print(f"recovered: {len(s.recovered)} weights the exporter folded into constants (transposed, cast), trained "
                      f"as their parameters ({shown}{', ...' if len(s.recovered) > 3 else ''}; --json lists them)",
                      highlight=False, soft_wrap=True)
        if made.precision:
            out.print(precision_line(made.precision), highlight=False, soft_wrap=True)
    if made.survey is not None:
        for warning in made.survey.warnings():
            click.echo(f"warning: {warning}", err=True)
    if not obj["quiet"] and not as_json:
        for path, what, nodes in made.written:
            out.print(f"wrote {path}: {what}" + (f", {nodes:,} nodes" if nodes else ""), highlight=False)


def precision_line(p: dict) -> str:
    """`mixed precision bf16: 28 weight copies cast from float32 masters; ...`"""
    line = (f"mixed precision {p['precision']}: float32 masters and optimizer state, {p['weight_copies']} "
            f"low-precision weight copies cast in the step")
    s = p["grad_scaler"]
    if s:
        line += (f"; loss scaled as GradScaler scales it (from {s['init_scale']:g}, ×{s['growth_factor']:g} after "
                 f"{s['growth_interval']} clean steps, ×{s['backoff_factor']:g} and the update skipped on an overflow)")
    return line


def main() -> None:
    try:
        code = cli.main(standalone_mode=False)
    except click.exceptions.Exit as e:
        code = e.exit_code
    except click.exceptions.Abort:
        err.print("roam: interrupted", highlight=False)
        code = 130
    except KeyboardInterrupt:
        print("roam: interrupted", file=sys.stderr)
        code = 130
    except click.UsageError as e:
        print(f"roam: error: {e.format_message().splitlines()[0]}", file=sys.stderr)
        code = 2
    except click.ClickException as e:
        print(f"roam: error: {e.format_message().splitlines()[0]}", file=sys.stderr)
        code = 2
    except RoamError as e:
        print(f"roam: error: {str(e).splitlines()[0] if str(e) else 'bad input'}", file=sys.stderr)
        code = 2
    except CheckFailed as e:
        print(f"roam: {e}", file=sys.stderr)
        code = 1
    except RoamBug as e:
        print(f"roam: internal error: {str(e).splitlines()[0]}", file=sys.stderr)
        code = 3
    except MemoryError:
        print("roam: error: out of memory", file=sys.stderr)
        code = 2
    except Exception as e:  # a bug: one line, and the traceback only on request
        if os.environ.get("ROAM_DEBUG"):
            raise
        print(f"roam: internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
              "(set ROAM_DEBUG=1 for a traceback)", file=sys.stderr)
        code = 3
    sys.exit(code if isinstance(code, int) else 0)
