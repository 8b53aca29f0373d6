"""roam report: live curves, the strategies table from baselines, formats, budgets, help."""

import copy

import pytest
from click.testing import CliRunner
from conftest import roam

from roam_cli.cli import cli
from roam_cli.outputs.report import arena_floor, live_curve, order_bound, order_bound_line, render_markdown, strategy_rows, summarize


def test_live_curve_counts_first_and_last_steps_inclusive():
    assert live_curve([(0, 1, 10), (1, 3, 5), (3, 3, 7)], 5) == [10, 15, 5, 12, 0]
    assert live_curve([], 2) == [0, 0]


def test_fragmentation_counts_the_kernel_scratch_in_the_arena_as_live():
    # a [0, 1] and b [1, 2], 256 B each; 512 B of scratch at step 2 beside b: 768 B at step 2
    tensors = [{"first_step": 0, "last_step": 1, "bytes": 256, "offset": 0},
               {"first_step": 1, "last_step": 2, "bytes": 256, "offset": 256},
               {"first_step": 0, "last_step": 2, "bytes": 4096, "offset": 0, "tier": "host"}]
    plan = {"order": ["n0", "n1", "n2"], "tensors": tensors, "peak_live_bytes": 512,
            "workspace": [{"node": "n2", "step": 2, "bytes": 512, "offset": 512}]}
    assert arena_floor(plan) == 768
    assert arena_floor({**plan, "workspace": []}) == 512


def plan_with(stats_extra: dict, order="roam", layout="search") -> dict:
    """The fields strategy_rows reads: this plan (roam + search) peaks at 800 with arena 900."""
    return {"peak_live_bytes": 800, "arena_bytes": 900,
            "stats": {"order": {"strategy": order}, "layout": {"strategy": layout},
                      "seconds": {"order": 1.5, "layout": 0.5}, **stats_extra}}


def rows_by_pair(plan):
    return {(r["order"], r["layout"]): r for r in strategy_rows(plan)}


def test_strategies_are_compared_with_the_original_order():
    plan = plan_with({"baselines": [
        {"order": "original", "layout": "search", "peak_live_bytes": 1000, "arena_bytes": 1200, "seconds": 0.1},
        {"order": "original", "layout": "first-fit", "peak_live_bytes": 1000, "arena_bytes": 1500}]})
    rows = rows_by_pair(plan)
    own = rows[("roam", "search")]
    assert own["this_plan"] and own["seconds"] == 2.0
    assert own["peak_vs_original"] == pytest.approx(0.2)  # 800 vs 1000
    assert own["arena_vs_original"] == pytest.approx(0.25)  # 900 vs 1200: the same layout's original row
    assert own["fragmentation"] == pytest.approx(900 / 800 - 1)
    ff = rows[("original", "first-fit")]
    assert ff["arena_vs_original"] == pytest.approx(-0.25) and not ff["this_plan"]
    assert list(rows)[0] == ("roam", "search")  # the plan's own row first


def test_arenas_are_compared_with_the_pytorch_like_baseline_when_measured():
    plan = plan_with({"baselines": [
        {"order": "original", "layout": "search", "peak_live_bytes": 1000, "arena_bytes": 1200},
        {"order": "original", "layout": "pytorch", "peak_live_bytes": 1000, "arena_bytes": 1800}]})
    rows = rows_by_pair(plan)
    assert rows[("original", "pytorch")]["arena_reference"]
    assert rows[("roam", "search")]["arena_vs_original"] == pytest.approx(0.5)  # 900 vs 1800
    assert rows[("original", "search")]["arena_vs_original"] == pytest.approx(1 / 3)


def test_order_and_layout_baselines_in_either_shape():
    plan = plan_with({})
    plan["stats"]["order"]["baselines"] = [{"strategy": "original", "peak_live_bytes": 1600, "seconds": 0.01},
                                           {"strategy": "roam", "peak_live_bytes": 800, "seconds": 1.5}]
    plan["stats"]["layout"]["baselines"] = {"first-fit": {"arena_bytes": 1000, "seconds": 0.2}, "search": 900}
    rows = rows_by_pair(plan)
    assert set(rows) == {("roam", "search"), ("original", None), ("roam", "first-fit")}
    assert rows[("original", None)]["arena_bytes"] is None
    assert rows[("original", None)]["arena_vs_original"] is None  # no original arena was measured
    assert rows[("roam", "search")]["peak_vs_original"] == pytest.approx(0.5)
    assert rows[("roam", "first-fit")]["peak_live_bytes"] == 800  # a layout does not change the peak
    assert rows[("roam", "first-fit")]["fragmentation"] == pytest.approx(0.25)


def test_a_plan_without_baselines_shows_its_own_row():
    (row,) = strategy_rows(plan_with({}, order="original", layout="first-fit"))
    assert row["this_plan"] and row["peak_vs_original"] == 0.0 and row["arena_vs_original"] == 0.0


def test_the_order_line_says_how_far_the_order_can_be_from_optimal():
    open_plan = plan_with({})  # peaks at 800
    open_plan["stats"]["order"].update(lower_bound_bytes=640, proven_optimal=False)
    gap = order_bound(open_plan)
    assert gap == {"lower_bound_bytes": 640, "proven_optimal": False, "gap": pytest.approx(0.25)}  # 800 / 640 - 1
    assert order_bound_line(gap) == "within 25.0% of optimal (bound 640 B)"
    open_plan["stats"]["order"]["proven_optimal"] = True  # proven by the search, not by the bound
    assert order_bound_line(order_bound(open_plan)) == "proven optimal (bound 640 B)"
    met = plan_with({})
    met["stats"]["order"].update(lower_bound_bytes=800, proven_optimal=False)
    assert order_bound(met) == {"lower_bound_bytes": 800, "proven_optimal": True, "gap": 0.0}
    assert order_bound(plan_with({}, order="original")) is None  # no bound recorded: no line
    near = plan_with({})  # 800 against 799.7: a search stopped by --gap 0.1%
    near["stats"]["order"].update(lower_bound_bytes=799.7, proven_optimal=False, gap=0.001)
    assert order_bound_line(order_bound(near)) == ("within 0.038% of optimal (bound 799.7 B; "
                                                   "the search stopped within --gap 0.1%)")
    near["stats"]["order"]["gap"] = 0.0001  # stopped by its time limit, not by --gap
    assert order_bound_line(order_bound(near)) == "within 0.038% of optimal (bound 799.7 B)"


def test_markdown_report_and_budget_exit_codes(sample_plan, tmp_path):
    _, plan_path, plan, _ = sample_plan
    needed = plan["persistent_bytes"] + plan["arena_bytes"]
    md = roam("report", plan_path, "--format", "markdown")
    assert md.code == 0
    lines = md.out.splitlines()
    assert lines[0].startswith("## roam plan for")
    tables = "\n".join(l if l.startswith("|") else "" for l in lines).split("\n\n")
    tables = [t.splitlines() for t in tables if t.strip()]
    assert len(tables) == 4  # headline, strategies, classes, tensors at the peak
    for table in tables:
        assert len({row.count("|") for row in table}) == 1, table[0]
    bound = order_bound(plan)
    assert f"| **order** | {order_bound_line(bound)} |" in md.out and bound["lower_bound_bytes"] <= plan["peak_live_bytes"]
    own = f"| * {plan['stats']['order']['strategy']} | {plan['stats']['layout']['strategy']} |"
    assert "### Strategies measured in this run" in md.out and own in md.out
    fits = roam("report", plan_path, "--budget", needed, "--json")
    assert fits.code == 0 and fits.json()["budget"] == {"budget_bytes": needed, "needed_bytes": needed,
                                                        "fits": True, "headroom_bytes": 0}
    over = roam("report", plan_path, "--budget", needed - 1)
    assert over.code == 1 and "does NOT fit" in over.out and "1 B over" in over.err
    assert roam("report", plan_path, "--budget", "16 parsecs").code == 2


def test_summary_budget_and_markdown_of_a_plan_that_does_not_fit(sample_plan):
    _, _, plan, _ = sample_plan
    verdict = {"budget_bytes": 1024, "needed_bytes": 3072, "fits": False, "headroom_bytes": -2048}
    text = render_markdown(summarize(copy.deepcopy(plan), 3, verdict))
    assert "❌ does NOT fit the budget of 1.00 KiB: needs 3.00 KiB (persistent + arena), 2.00 KiB over" in text
    assert text.count("| `") == 3  # --top 3


def test_every_command_has_examples_in_its_help():
    runner = CliRunner()
    for command in cli.commands:
        r = runner.invoke(cli, [command, "--help"])
        assert r.exit_code == 0 and "Example" in r.output and f"roam {command} " in r.output, command


def test_verify_json(sample_plan):
    model_path, plan_path, plan, _ = sample_plan
    r = roam("verify", model_path, plan_path, "--json")
    placed = sum(1 for t in plan["tensors"] if t["offset"] is not None)
    assert r.code == 0 and r.json() == {"ok": True, "nodes": len(plan["order"]), "placed": placed,
                                        "arena_bytes": plan["arena_bytes"], "peak_live_bytes": plan["peak_live_bytes"]}


def test_the_order_line_says_when_the_search_stopped_because_the_plan_fit_the_budget():
    # --recompute budget: peak 110 B against a bound of 100 B, the search stopped at its target of
    # 120 B (the budget less the persistent bytes)
    stats = {"lower_bound_bytes": 100, "proven_optimal": False, "gap": 0.001, "target_bytes": 120,
             "stopped_at_target": True}
    b = order_bound({"peak_live_bytes": 110, "stats": {"order": stats}})
    assert b["stop_target_bytes"] == 120 and "stop_gap" not in b
    assert order_bound_line(b) == ("within 10.0% of optimal (bound 100 B; the search stopped once the peak fit the "
                                   "budget (at most 120 B besides the persistent bytes))")
    # a search that met its bound says so, whatever stopped it
    b = order_bound({"peak_live_bytes": 100, "stats": {"order": stats}})
    assert order_bound_line(b) == "proven optimal (bound 100 B)"
