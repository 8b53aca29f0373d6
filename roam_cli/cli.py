"""The `roam` command line: parses, calls, prints. Exit codes: 0 ok, 1 check failed, 2 bad input."""

import hashlib
import json
import os
import sys
from pathlib import Path

import click
from rich.console import Console

from roam_cli import __version__, annotate, layout, order, pipeline, plan as plan_io, report as report_mod
from roam_cli.errors import CheckFailed, RoamError
from roam_cli.fileio import check_output_path
from roam_cli.units import format_bytes

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
@click.option("--order", "order_strategy", default="original", show_default=True, type=click.Choice(order.STRATEGIES))
@click.option("--layout", "layout_strategy", default=None, type=click.Choice(layout.STRATEGIES),
              help=f"Layout strategy [default: {layout.STRATEGIES[0]}].")
@click.option("--shapes-from-run", is_flag=True, help="Run the graph once in ONNX Runtime to learn shapes static inference cannot.")
@click.option("--inplace", "inplace", multiple=True, metavar="OUTPUT=STATE",
              help="Declare that graph output OUTPUT replaces input STATE in place (repeatable).")
@click.option("--loss", default=None, help="Name of the loss tensor (default: the first scalar float output).")
@click.option("--time-limit", type=float, default=None, help="Seconds the solvers may use in all.")
@click.option("--jobs", type=int, default=os.cpu_count() or 1, show_default=True, help="Parallel solver processes.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan's summary as JSON.")
@click.pass_obj
def optimize(obj, model, plan_path, annotated_model, dims, alignment, order_strategy, layout_strategy,
             shapes_from_run, inplace, loss, time_limit, jobs, as_json):
    """Plan MODEL: choose the order and the arena layout, write the plan.

    \b
    Examples:
      roam optimize training_model.onnx -o plan.json
      roam optimize model.onnx -o plan.json --dim batch=8 --annotated-model planned.onnx
    """
    check_output_path(plan_path, [model])
    if annotated_model is not None:
        check_output_path(annotated_model, [model, plan_path])
    options = pipeline.Options(
        dims=parse_pairs(dims, "--dim", True), alignment=alignment, order=order_strategy,
        layout=layout_strategy or layout.STRATEGIES[0], shapes_from_run=shapes_from_run,
        inplace=parse_pairs(inplace, "--inplace", False), loss=loss, time_limit=time_limit, jobs=jobs)
    with Progress(obj["quiet"]) as progress:
        result = pipeline.run(model, plan_path, options, progress)
    plan = result.plan
    if result.imported.renamed and annotated_model is None:
        annotated_model = plan_path.with_name(plan_path.stem + ".annotated.onnx")
        check_output_path(annotated_model, [model, plan_path])
        result.notes.append(f"the plan refers to {annotated_model}, which carries the generated node names")
    if annotated_model is not None:
        proto = annotate.annotate(result.imported.model, result.imported.graph, plan, model, annotated_model)
        data = proto.SerializeToString()
        annotate.write(proto, annotated_model)
        if result.imported.renamed:
            plan["model"]["path"] = Path(os.path.relpath(annotated_model.resolve(), plan_path.resolve().parent)).as_posix()
            plan["model"]["sha256"] = hashlib.sha256(data).hexdigest()
    plan_io.write(plan, plan_path)
    if as_json:
        click.echo(json.dumps(report_mod.summarize(plan), indent=1))
        return
    if obj["verbose"]:
        for note in result.notes:
            err.print(f"note: {note}")
    elif not obj["quiet"]:
        for note in result.notes:
            if "external data" in note or "refers to" in note:
                err.print(f"note: {note}")
    if not obj["quiet"]:
        frag = plan["arena_bytes"] / plan["peak_live_bytes"] - 1 if plan["peak_live_bytes"] else 0.0
        out.print(f"wrote {plan_path}: {len(plan['order'])} nodes, arena {format_bytes(plan['arena_bytes'])} "
                  f"(peak live {format_bytes(plan['peak_live_bytes'])}, fragmentation {frag:.2%}), "
                  f"persistent {format_bytes(plan['persistent_bytes'])}")


@cli.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path))
@click.option("--shapes-from-run", is_flag=True, help="Learn shapes by running the graph (as optimize did).")
@click.pass_obj
def verify(obj, model, plan_path, shapes_from_run):
    """Check PLAN against MODEL independently of the planners.

    Order is a topological permutation of all nodes, every transient tensor is placed for
    its whole life, no two live tensors overlap, the arena covers every tensor.

    \b
    Example:
      roam verify training_model.onnx plan.json
    """
    from roam_cli.onnx_import import import_model
    from roam_cli.verify import Violation, verify as check

    plan = plan_io.read(plan_path)
    imported = import_model(model, plan.get("dims", {}), shapes_from_run)
    try:
        summary = check(imported.graph, imported.sha256, plan)
    except Violation as v:
        raise CheckFailed(f"plan invalid: {v}") from None
    if not obj["quiet"]:
        out.print(f"plan OK: {summary.nodes} nodes in topological order, {summary.placed} tensors placed, "
                  f"no overlaps, arena {format_bytes(summary.arena)} (peak live {format_bytes(summary.peak_live)})")


@cli.command()
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--top", default=10, show_default=True, help="How many of the tensors live at the peak to list.")
def report(plan_path, fmt, top):
    """Show what PLAN costs: persistent, peak, arena, fragmentation, tensors at the peak.

    \b
    Example:
      roam report plan.json
    """
    summary = report_mod.summarize(plan_io.read(plan_path), top)
    if fmt == "json":
        click.echo(json.dumps(summary, indent=1))
    else:
        report_mod.render_table(summary, out)


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
