"""The ordering strategies end to end: the baselines (original, ORT's default order checked
against ONNX Runtime itself, XLA-style greedy), ilp-global, and roam's guarantees."""

import json
import random
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import SAMPLE, roam
from onnx_builder import model, node, save
from order_cases import random_graph

from roam_cli import order, pipeline
from roam_cli.core import memory
from roam_cli.frontend.onnx_import import import_model
from roam_cli.frontend.providers import TRAINING_OPS
from roam_cli.order import bounds, ideals, ort as ort_mod, roam as roam_mod, tails
from roam_cli.order.greedy import dfs_schedule, list_schedule
from roam_cli.order.ort import installed_training_build, ort_default
from roam_cli.order.problem import Buffer, Problem, from_memory_model, is_topological, peak, reachability


def shape_graph():
    # a = Relu(x); s = Shape(a); b = Relu(x); c = a + b; d = Sigmoid(c); r = Reshape(d, s)
    return model([node("Relu", ["x"], ["a"]), node("Shape", ["a"], ["s"]), node("Relu", ["x"], ["b"]),
                  node("Add", ["a", "b"], ["c"]), node("Sigmoid", ["c"], ["d"]), node("Reshape", ["d", "s"], ["r"])],
                 [("x", [4, 4])], [("r", [4, 4])])


def test_ort_order_is_a_reverse_dfs_with_shape_ops_moved_after_their_input(tmp_path):
    graph = import_model(save(shape_graph(), tmp_path / "m.onnx")).graph
    mm = memory.build(graph)
    # from the leaf r: inputs d (4) then s (1) are pushed, so d's cone is walked first, its
    # inputs a (0) and b (2) pushed in index order: b, a, c, d, then s, r. Shape moves up to
    # right after a, its input's producer.
    op_types = [n.op_type for n in graph.nodes]
    assert ort_default(list(mm.run_preds), op_types, training_build=True) == [2, 0, 1, 3, 4, 5]
    assert ort_default(list(mm.run_preds), op_types, training_build=False) == [2, 0, 3, 4, 1, 5]  # post-order


def test_the_training_build_read_from_metadata_is_the_runtime_s_own():
    # the order stage reads it without importing onnxruntime (which imports torch in a training build)
    assert installed_training_build() == TRAINING_OPS


def profiled_order(path: str, tmp_path, x: np.ndarray, execution_order=ort.ExecutionOrder.DEFAULT) -> list[str]:
    """The nodes ONNX Runtime ran, in the order its profiler saw them (no graph optimisations)."""
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "profile")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.execution_order = execution_order
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    session.run(None, {"x": x})
    events = json.loads(open(session.end_profiling()).read())
    return [e["name"].removesuffix("_kernel_time") for e in events if e.get("cat") == "Node"
            and e["name"].endswith("_kernel_time")]


def test_ort_order_matches_onnx_runtime_profiling(tmp_path):
    path = save(shape_graph(), tmp_path / "m.onnx")
    graph = import_model(path).graph
    ran = profiled_order(path, tmp_path, np.ones((4, 4), np.float32))
    mm = memory.build(graph)
    assert [graph.nodes[i].name for i in ort_default(list(mm.run_preds), [n.op_type for n in graph.nodes])] == ran


def size_late_graph():
    # a = -x; b = -a; c = -b; s = Size(a); f = float(s); y = c * f; h = Shape(x); r = Reshape(y, h):
    # the file runs Size and Shape late, where their outputs are read
    return model([node("Neg", ["x"], ["a"]), node("Neg", ["a"], ["b"]), node("Neg", ["b"], ["c"]),
                  node("Size", ["a"], ["s"]), node("Cast", ["s"], ["f"], to=onnx.TensorProto.FLOAT),
                  node("Mul", ["c", "f"], ["y"]), node("Shape", ["x"], ["h"]), node("Reshape", ["y", "h"], ["r"])],
                 [("x", [4, 64])], [("r", [4, 64])])


def test_the_order_that_runs_has_shape_and_size_right_after_their_input(tmp_path):
    graph = import_model(save(size_late_graph(), tmp_path / "m.onnx")).graph
    mm = memory.build(graph)
    assert mm.eager == {3: 0, 6: None}  # Size(a) with a's producer; Shape(x) of a graph input: at the start
    # ORT's PRIORITY_BASED takes Shape/Size first among the ready nodes: 6 and 0 are ready at the
    # start (6 first), 3 as soon as 0 ran, then the rest in file order
    assert order.runs(mm, list(range(8))) == [6, 0, 3, 1, 2, 4, 5, 7]
    assert order.original(mm) == [6, 0, 3, 1, 2, 4, 5, 7]
    # several on one producer keep their order, and one reading another's output follows it at once
    assert ort_mod.priority_based([0, 1, 2, 3, 4], {2: 0, 3: 0, 4: 2}) == [0, 2, 4, 3, 1]
    # the ordering problem counts s with a's producer and a's read by Size there, so where an
    # order puts Size does not move its peak, which is the peak of the order that runs
    problem = from_memory_model(mm)
    assert peak(problem, list(range(8))) == peak(problem, order.runs(mm, list(range(8)))) \
        == order.peak_of(mm, order.runs(mm, list(range(8))))
    for strategy in order.STRATEGIES:
        found, _ = order.solve(mm, strategy, op_types=[n.op_type for n in graph.nodes], time_limit=5)
        assert order.runs(mm, found) == found, strategy


def test_the_order_that_runs_is_onnx_runtime_s_priority_based_order(tmp_path):
    path = save(size_late_graph(), tmp_path / "m.onnx")
    graph = import_model(path).graph
    ran = profiled_order(path, tmp_path, np.ones((4, 64), np.float32), ort.ExecutionOrder.PRIORITY_BASED)
    mm = memory.build(graph)
    assert [graph.nodes[i].name for i in order.runs(mm, list(range(len(graph.nodes))))] == ran


def test_verify_refuses_an_order_with_size_where_onnx_runtime_does_not_run_it(tmp_path):
    path = save(size_late_graph(), tmp_path / "m.onnx")
    assert roam("optimize", path, "-o", tmp_path / "plan.json").code == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["order"][:3] == ["h_node", "a_node", "s_node"]
    assert roam("verify", path, tmp_path / "plan.json").code == 0
    plan["order"] = ["h_node", "a_node", "b_node", "s_node", "c_node", "f_node", "y_node", "r_node"]
    (tmp_path / "late.json").write_text(json.dumps(plan))
    r = roam("verify", path, tmp_path / "late.json")
    assert r.code == 1 and "Size node 's_node' is at step 3, after 'b_node'" in r.err, r.err
    assert "not the order that runs" in r.err and len(r.err.strip().splitlines()) == 1


def test_list_scheduler_prefers_nodes_that_free_memory():
    # 0 makes A (10), read by 1 and 2, which allocate 1 each: neither can free A alone, so the
    # tie goes to file order
    problem = Problem(((), (0,), (0,)),
                      (Buffer(10, (0,), (1, 2)), Buffer(1, (1,), (), True), Buffer(1, (2,), (), True)))
    assert list_schedule(problem) == [0, 1, 2]
    problem = Problem(((), (0,), (0,)), (Buffer(10, (0,), (2,)), Buffer(5, (1,), (), True), Buffer(1, (2,), (), True)))
    assert list_schedule(problem) == [0, 2, 1]  # 2 frees 10 for 1: run it before 1 allocates 5


def test_dfs_scheduler_finishes_the_bigger_cone_first():
    # two independent chains joined at the end: the cone of 1 holds 11 bytes, the cone of 3 101
    problem = Problem(((), (0,), (), (2,), (1, 3)),
                      (Buffer(10, (0,), (1,)), Buffer(1, (1,), (4,)), Buffer(100, (2,), (3,)), Buffer(1, (3,), (4,))))
    assert dfs_schedule(problem) == [2, 3, 0, 1, 4]


def test_repair_gives_the_peak_step_its_least_bytes():
    # x (10) is read by s and c; s turns it into a 1-byte shape for d; a (100) is read by c. The
    # list scheduler runs s early (it allocates least) and carries S through c's step.
    problem = Problem(((), (0,), (), (0, 2), (1, 3)),
                      (Buffer(10, (0,), (1, 3)), Buffer(1, (1,), (4,)), Buffer(100, (2,), (3,)), Buffer(1, (3,), (4,))))
    assert list_schedule(problem) == [0, 1, 2, 3, 4] and peak(problem, [0, 1, 2, 3, 4]) == 112
    assert roam_mod.repair(problem, [0, 1, 2, 3, 4], bounds.Bound(problem, *reachability(problem))) == ([0, 2, 3, 1, 4], 1)
    assert peak(problem, [0, 2, 3, 1, 4]) == 111 == bounds.lower_bound(problem, [0, 2, 3, 1, 4])


@pytest.mark.slow  # 7 s: every strategy, ILP included; test_order_rules and test_properties check the orders in the default run
def test_every_strategy_returns_a_topological_order_and_roam_is_never_worse():
    graph = import_model(SAMPLE).graph
    mm = memory.build(graph)
    ops = [n.op_type for n in graph.nodes]
    measured = order.baselines(mm, ops)
    assert list(measured) == ["original", "ort", "greedy"]
    problem = from_memory_model(mm)
    for strategy in order.STRATEGIES:
        found, stats = order.solve(mm, strategy, op_types=ops, time_limit=5, measured=measured)
        assert is_topological(problem, found), strategy
        if strategy == "roam":
            assert order.peak_of(mm, found) <= min(b["peak_live_bytes"] for b in measured.values())
            assert stats["proven_optimal"] and stats["reduced_nodes"] < mm.num_nodes
    with pytest.raises(ValueError):
        order.solve(mm, "alphabetical")


def test_roam_never_returns_worse_than_a_baseline_it_was_given():
    graph = random_graph(random.Random(3), 40)
    mm = memory.build(graph)
    ops = [n.op_type for n in graph.nodes]
    measured = order.baselines(mm, ops)
    best = min(measured.values(), key=lambda b: b["peak_live_bytes"])
    found, _ = order.solve(mm, "roam", op_types=ops, time_limit=5, measured=measured)
    assert order.peak_of(mm, found) <= best["peak_live_bytes"]


def test_parallel_leaves_give_the_same_order_as_one_process():
    graph = random_graph(random.Random(39), 80)
    problem = from_memory_model(memory.build(graph))
    messages = []
    one, stats = roam_mod.order(problem, {}, deadline=float("inf"), jobs=1, progress=messages.append)
    two, _ = roam_mod.order(problem, {}, deadline=float("inf"), jobs=2)
    assert stats.leaves_solved > 1 and one == two
    assert any(m.startswith("roam: tree level 0") for m in messages)
    assert peak(problem, one) <= min(peak(problem, s(problem)) for s in (list_schedule, dfs_schedule))


def test_optimize_records_the_baselines_measured_in_the_same_run(sample_plan):
    _, _, plan, _ = sample_plan
    stats = plan["stats"]["order"]
    assert stats["strategy"] == "roam"
    assert [b["strategy"] for b in stats["baselines"]] == ["original", "ort", "greedy"]
    assert plan["peak_live_bytes"] <= min(b["peak_live_bytes"] for b in stats["baselines"])


@pytest.mark.parametrize("solver", ["cbc", "highs"])
def test_ilp_global_on_the_command_line(tmp_path, solver):
    if solver == "highs":
        pytest.importorskip("highspy")
    path = save(shape_graph(), tmp_path / "m.onnx")
    r = roam("optimize", path, "-o", tmp_path / "p.json", "--order", "ilp-global", "--solver", solver,
             "--time-limit", "20", "--jobs", "1", "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)  # stdout is only the JSON summary (HiGHS prints no banner into it)
    assert json.loads((tmp_path / "p.json").read_text())["stats"]["order"]["status"] == "optimal"


def test_bad_order_options_are_refused_in_one_line(tmp_path):
    path = save(shape_graph(), tmp_path / "m.onnx")
    for bad, message in ((["--time-limit", "0"], "--time-limit"), (["--jobs", "0"], "--jobs"),
                         (["--order", "fastest"], "--order")):
        r = roam("optimize", path, "-o", tmp_path / "q.json", *bad)
        assert r.code == 2 and message in r.err and len(r.err.strip().splitlines()) == 1
        assert not (tmp_path / "q.json").exists()


def test_a_tail_runs_where_its_peak_fits():
    # Spine 0 -> 1 -> 2 -> 3; x (100,000 bytes, from 0) is read by 2. The tail 4 hangs off 1: it
    # reads d (1,000 bytes, from 1) and makes s (50,000), read by nobody. Run right after 1, its
    # step holds x, d and s (151,000); run after 2 (x freed), 51,000, and 2's step 101,000 is the
    # best order's peak. With a tail being a node without descendants, 3 is a tail too.
    problem = Problem(((), (0,), (1,), (2,), (1,)),
                      (Buffer(100_000, (0,), (2,)), Buffer(1_000, (1,), (4,)), Buffer(50_000, (4,), ())))
    reference = [0, 1, 4, 2, 3]
    assert peak(problem, reference) == 151_000
    _, desc = reachability(problem)
    placement = tails.Tails(problem, reference, desc, tail_descendants=1)
    assert placement.spine == [0, 1, 2] and sorted(placement.tails) == [[3], [4]]
    assert placement.schedule(101_000) == ([0, 1, 2, 3, 4], 101_000)
    assert placement.schedule(160_000) == ([0, 1, 4, 2, 3], 151_000)  # fits at once under a high target
    assert placement.schedule(140_000, cutoff=120_000) == ([0, 1, 2, 3, 4], 101_000)
    order_, best = tails.improve(problem, reference, desc, 100_000, 151_000, tail_descendants=1)
    assert best == 101_000 == peak(problem, order_) and is_topological(problem, order_)
    # a gap that the reference's 151,000 is within (100,000 + 60 %): nothing is scheduled
    assert tails.improve(problem, reference, desc, 100_000, 151_000, tail_descendants=1, gap=0.6) == (reference, 151_000)


def test_scalars_every_update_reads_join_no_tails():
    # Spine 0 (X, 100,000 B, read by 2 and 3); s (1: 256 B, a step counter made from nothing), read
    # by both updates; with 3 (allocating nothing) the tails: g1 (2) -> u1 (4) and 3 -> g2 (5) -> u2
    # (6), each gradient 10,000 B. With s a tail node (few descendants) the two updates would be
    # one tail, placed whole; s is a scalar: each update is a tail of its own.
    problem = Problem(((), (), (0,), (0,), (1, 2), (3,), (1, 5)),
                      (Buffer(100_000, (0,), (2, 3)), Buffer(256, (1,), (4, 6)), Buffer(10_000, (2,), (4,)),
                       Buffer(10_000, (5,), (6,))))
    reference = list(range(7))
    _, desc = reachability(problem)
    placement = tails.Tails(problem, reference, desc, tail_descendants=3)
    assert sorted(placement.tails) == [[2, 4], [3, 5, 6]] and 1 in placement.spine


def test_a_scalar_the_reference_computes_late_runs_first_so_the_tail_reading_it_need_not_wait():
    # Spine 0 (X, 100,000 B, read by 2), 1 (g, 60,000, read by the tail 4), 2 (Y, 100,000, read by
    # 5), 3 (s, 1 B: a step counter, read by 4). The reference computes s last, so 4 (the update,
    # 1 B nobody reads) waits for it and g is held through 2's step: X + g + Y = 260,000. With s
    # first, 4 runs right after 1 (s + X + g + its byte = 160,002) and 2's step holds X + Y: 200,000.
    problem = Problem(((), (), (0,), (), (1, 3), (2,)),
                      (Buffer(100_000, (0,), (2,)), Buffer(60_000, (1,), (4,)), Buffer(100_000, (2,), (5,)),
                       Buffer(1, (3,), (4,)), Buffer(1, (4,), ())))
    reference = [0, 1, 2, 5, 3, 4]
    assert peak(problem, reference) == 260_000
    _, desc = reachability(problem)
    assert tails.Tails(problem, reference, desc, tail_descendants=1).schedule(300_000)[1] == 260_000
    first = tails.Tails(problem, reference, desc, tail_descendants=1, scalars_first=True)
    assert first.spine == [3, 0, 1, 2]
    assert first.schedule(200_000) == ([3, 0, 1, 4, 2, 5], 200_000)
    order_, best = tails.improve(problem, reference, desc, 100_000, 260_000, tail_descendants=1)
    assert best == 200_000 == peak(problem, order_) and is_topological(problem, order_)


@pytest.mark.skipif(ideals._ideals is None, reason="the C extension did not build: the reference's leaves run into their clocks")
def test_the_sample_full_step_is_proven_optimal_within_the_leaf_budgets(tmp_path):
    # 724 nodes, proven along the division tree's leaves by a budget of visited sets, not a clock,
    # so the proof is the same every run. The optimum is ONNX Runtime's: the two Shape nodes reading
    # the embedding tables (graph inputs) run at the start, where its priority-based order puts
    # them, and their 256 B each live until the backward reads them. The order problem counts a
    # Shape's output from its input's producer's step, the plan from the next, where ORT runs it:
    # at the peak (the loss's gradient) one of them, 256 B, is the difference.
    step = tmp_path / "step.onnx"
    assert roam("make-training-graph", SAMPLE, "-o", step, "--in-graph-optimizer").code == 0
    proven = pipeline.run(step, tmp_path / "proven.json", pipeline.Options(layout="roam", gap=0.0, time_limit=600)).plan
    assert proven["stats"]["order"]["proven_optimal"]
    assert proven["peak_live_bytes"] + 256 == proven["stats"]["order"]["lower_bound_bytes"] == 932_352
    # the default --gap stops within 0.1 % of the bound
    default = pipeline.run(step, tmp_path / "default.json", pipeline.Options(layout="roam")).plan
    assert default["stats"]["order"]["gap"] == 0.001
    assert 932_096 <= default["peak_live_bytes"] <= 932_352 * 1.001


def test_the_search_stops_once_the_peak_reaches_a_target():
    # the repair case above: the list order peaks at 112 B, the best at 111 B (x, a, c, s, d)
    problem = Problem(((), (0,), (), (0, 2), (1, 3)),
                      (Buffer(10, (0,), (1, 3)), Buffer(1, (1,), (4,)), Buffer(100, (2,), (3,)), Buffer(1, (3,), (4,))))

    def search(target):
        stats = roam_mod.Stats()
        found = roam_mod.Search(problem, bounds.Bound(problem, *reachability(problem)), [0, 1, 2, 3, 4],
                                time.perf_counter() + 60, 1, None, stats, lambda m: None, 0.0, target).run()
        return found, peak(problem, found), stats.at_target

    assert search(None) == ([0, 2, 3, 1, 4], 111, False)
    assert search(112) == ([0, 1, 2, 3, 4], 112, True)  # the start fits 112 B: nothing is searched
    assert search(111) == ([0, 2, 3, 1, 4], 111, False)  # the repair's 111 B meets the bound: proven first
