"""`roam optimize`, `max-batch` and `tradeoff`: plans made."""

import dataclasses
import json
import os
from pathlib import Path

import click

from roam_cli import budget as budget_mod, layout, order, pipeline, recompute, shard, tradeoff as tradeoff_mod
from roam_cli.cli import (BUDGET_HELP, GAP, JOBS, SECONDS, ByteSize, Progress, cli, err, fail_over_budget, out,
                          parse_pairs)
from roam_cli.core import plan as plan_io
from roam_cli.core.errors import CheckFailed, RoamError
from roam_cli.core.fileio import check_output_folder, check_output_path, make_folder, write_all_atomic, write_atomic
from roam_cli.core.memory import SLOW_TIERS
from roam_cli.core.units import format_beside, format_bytes, parse_bytes
from roam_cli.cost import profile as cost_profile
from roam_cli.offload import planner as offload_planner
from roam_cli.outputs import report as report_mod
from roam_cli.solvers import milp


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
                   "or budget (the fewest FLOPs that fit --budget; on a rank step, each parameter gathered "
                   "again priced at its communication time too).")
@click.option("--offload", type=click.Choice(SLOW_TIERS), default=None,
              help="Plan with a slower memory tier: host memory or storage paged to. Values, optimizer state and "
                   "the update may leave the device; --budget then counts the device's bytes, and the plan is the "
                   "fitting one of the least estimated time on --device.")
@click.option("--device", "device_profile", default=None, metavar="PROFILE",
              help=f"Device profile of --offload's estimates and a rank step's communication: a shipped name "
                   f"({', '.join(cost_profile.shipped())}) or a JSON file [default: {cost_profile.DEFAULT}; "
                   f"a rank step's: {cost_profile.DEFAULT_SHARDED}].")
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
    sharded = shard.is_rank_step(model)
    if offload is None and objective != "time":
        raise RoamError("--objective weighs the plans of --offload: give --offload host|storage too")
    if offload is None and device_profile is not None and not sharded:
        raise RoamError("--device weighs the plans of --offload and a rank step's communication (roam shard): "
                        "give --offload host|storage too")
    if offload is not None and (recompute_mode != "off" or ort_optimized is not None):
        raise RoamError("--offload weighs recomputation itself (its candidates include recompute only); "
                        "leave out --recompute and --ort-optimized")
    if device_profile is not None or sharded:
        cost_profile.for_step(device_profile, sharded)  # a bad profile is refused before any work is done
    milp.check_solver(solver)
    if plot_dir is not None:
        from roam_cli.outputs import plot

        plot.figure_class()  # matplotlib is there, before any work is done
        check_output_folder(plot_dir, plot.picture_paths(plot_dir), [model, plan_path])
    if ort_optimized is not None and annotated_model is None:  # the plan's graph: written whether asked for or not
        annotated_model = pipeline.default_annotated_path(plan_path)
    if annotated_model is not None:
        check_output_path(annotated_model, [model], [plan_path])
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
        if annotated_model is not None:
            out.print(f"wrote {annotated_model}: the graph in the plan's order (ONNX Runtime follows it with "
                      "ExecutionOrder.PRIORITY_BASED)", highlight=False, soft_wrap=True)
        effect = report_mod.ort_effect(plan)
        if effect is not None:
            out.print(report_mod.ort_line(effect), highlight=False)
        if "recompute" in plan:
            out.print(report_mod.recompute_line(report_mod.recompute_effect(plan)), highlight=False)
        if "offload" in plan:
            for line in report_mod.offload_lines(plan):
                out.print(line, highlight=False)
        if "sharding" in plan:
            for line in report_mod.sharding_lines(plan["sharding"], plan["dims"]):
                out.print(line, highlight=False)
        for picture in pictures:
            out.print(f"wrote {picture}", highlight=False)
        if verdict is not None and verdict["fits"]:
            out.print(report_mod.budget_line(verdict), highlight=False)
    fail_over_budget(verdict)

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
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.progress import (
        Progress as RichProgress,
    )

    return RichProgress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=err, transient=True, disable=quiet or not err.is_terminal)


def render_max_batch(results: list, dim: str, budget: int, model: Path, dims: dict[str, int]) -> None:
    from rich.table import Table

    table = Table(title=f"largest {dim} that fits {format_bytes(budget)} ({model})", title_justify="left")
    for col in ("order", "layout", dim, "needs", f"{dim} + 1 needs", "plans made"):
        table.add_column(col, justify="left" if col in ("order", "layout") else "right")
    for r in results:
        needs = format_beside(r.at_max["needed_bytes"], budget) if r.at_max else "–"
        table.add_row(r.order, r.layout, f"{r.max_value:,}", needs, format_beside(r.next_needed_bytes, budget),
                      str(len(r.probes)))
    out.print(table)
    best = max(reversed(results), key=lambda r: r.max_value)  # on a tie, the chosen strategy
    if best.max_value:
        bound = " ".join(f"--dim {k}={v}" for k, v in {**dims, dim: best.max_value}.items())
        out.print(f"plan it: roam optimize {model} -o plan.json {bound} --order {best.order} --layout {best.layout}",
                  highlight=False)

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
                   "(extra FLOPs as a count or a share of the step; on a rank step the extra price, gathers again "
                   "included; repeatable).")
@click.option("--dim", "dims", multiple=True, metavar="NAME=N", help="Bind a symbolic dimension (repeatable).")
@click.option("--layout", "layout_strategy", default=layout.STRATEGIES[0], show_default=True,
              type=click.Choice(layout.STRATEGIES), help="Layout strategy of every point's plan (optimize's default).")
@click.option("--time-limit", type=SECONDS, default=None,
              help="Seconds for the whole sweep, shared by its plans (default: 60 per point).")
@click.option("--solver", type=click.Choice(milp.SOLVERS), default="cbc", show_default=True,
              help="MILP solver of the ordering, layout and recompute programs.")
@click.option("--jobs", type=JOBS, default=os.cpu_count() or 1, show_default=True, help="Parallel solver processes.")
@click.option("--offload", type=click.Choice(SLOW_TIERS), default=None,
              help="The device-memory / estimated-time front with a slower tier instead, the fixed policies "
                   "(save_on_cpu, ZeRO-Offload, recompute only...) beside it.")
@click.option("--device", "device_profile", default=None, metavar="PROFILE",
              help=f"Device profile of --offload's estimates [default: {cost_profile.DEFAULT}], or of a rank "
                   f"step's communication [default: {cost_profile.DEFAULT_SHARDED}].")
@click.option("--json", "as_json", is_flag=True, help="Print front.json's points as JSON.")
@click.pass_obj
def tradeoff(obj, model, front_path, points, plans_dir, plot_dir, marks, dims, layout_strategy, time_limit, solver,
             jobs, offload, device_profile, as_json):
    """The memory / extra-FLOPs front of the training step MODEL: plans from keeping every
    forward value through `--recompute free` to the most recomputation roam can plan, each
    verified; dominated plans dropped, so that less memory always costs more FLOPs. On a rank
    step (roam shard) a parameter gathered again costs its communication too, on --device's
    interconnect, and each point says what the rank sends per step.

    \b
    Examples:
      roam tradeoff full_step.onnx -o front.json --plot pictures/
      roam tradeoff full_step.onnx -o front.json --points 12 --plans plans/ --time-limit 600
      roam tradeoff full_step.onnx -o front.json --plot pictures/ --mark 'PyTorch eager=3.46GiB' \\
          --mark 'checkpointing=2.32GiB@23.3%'
      roam tradeoff full_step.onnx -o front.json --offload host --device pcie-gen5-gpu
      roam tradeoff rank.onnx -o front.json --device infiniband-ndr-gpu --plot pictures/
    """
    check_output_path(front_path, [model])
    milp.check_solver(solver)
    if offload is not None:
        if plans_dir or plot_dir or marks:
            raise RoamError("--offload's front is written as front.json and printed: leave out --plans, --plot and --mark")
        if device_profile is not None:
            cost_profile.load(device_profile)
        options = pipeline.Options(dims=parse_pairs(dims, "--dim", True), layout=layout_strategy,
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
        cost_profile.load(device_profile)
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
    # each point planned as optimize plans it: its default layout too (the first-fit of Options, before)
    options = pipeline.Options(dims=parse_pairs(dims, "--dim", True), layout=layout_strategy, time_limit=time_limit,
                               jobs=jobs, solver=solver, device=device_profile)
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
    ranked = any("sent_bytes" in p for p in front["points"])  # a rank step: its communication beside
    columns = ("point", "persistent + arena", "arena", "extra FLOPs", "% of the step",
               *(("price, % of the step", "sent per step", "exposed") if ranked else ()), "nodes added", "verified")
    for column in columns:
        table.add_column(column, justify="left" if column == "point" else "right")
    for p in front["points"]:
        communication = ((f"{p['price_pct']:.3f}", format_bytes(p["sent_bytes"]),
                          report_mod.format_seconds(p["exposed_seconds"])) if ranked else ())
        table.add_row(p["label"], format_bytes(p["total_bytes"]), format_bytes(p["arena_bytes"]), f"{p['extra_flops']:,}",
                      f"{p['extra_flops_pct']:.3f}", *communication, str(p["nodes_added"]),
                      "yes" if p["verified"] else "NO")
    out.print(table)
    if front["dominated"]:
        out.print(f"{len(front['dominated'])} dominated plans dropped (in front.json's `dominated`): another plan "
                  "needs no more memory at no higher price", highlight=False)
