"""`roam remat` and `layout-csv`: the solvers on other tools' problems."""

import json
import os
from pathlib import Path

import click

from roam_cli import layout
from roam_cli.cli import FRACTION, JOBS, SECONDS, ByteSize, cli, err, out
from roam_cli.core.errors import CheckFailed, RoamError
from roam_cli.core.fileio import check_output_path, write_atomic


@cli.command()
@click.argument("graph_path", metavar="GRAPH.json", type=click.Path(path_type=Path))
@click.argument("schedule_in", metavar="[SCHEDULE.json]", required=False, type=click.Path(path_type=Path))
@click.option("-o", "--output", "out_path", type=click.Path(path_type=Path), help="Schedule to write.")
@click.option("--budget", type=ByteSize(), default=None, help="Peak memory the schedule must fit, e.g. 12GiB.")
@click.option("--budget-fraction", type=FRACTION, default=None,
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
    if isinstance(found, poet_solve.NoSchedule):
        raise CheckFailed(found.message())
    poet.write(out_path, found.schedule, problem.T)
    summary = found.summary(problem)
    if as_json:
        out.print(json.dumps(summary), highlight=False, soft_wrap=True)
    elif not obj["quiet"]:
        out.print(f"wrote {out_path}: energy {summary['energy_joules']:.6g} J (compute "
                  f"{summary['compute_joules']:.6g}, paging {summary['paging_joules']:.6g}), peak RAM "
                  f"{summary['peak_ram_bytes']:g} of {problem.ram_budget:g} bytes, runtime {summary['runtime']:.6g} "
                  f"of {problem.runtime_budget:.6g}, {summary['status']}, {summary['seconds']:.1f} s"
                  + ("" if summary["found_by"] == "greedy" else f" (the greedy found none; {summary['found_by']})"),
                  highlight=False, soft_wrap=True)

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
