"""`roam execute`: ORT follows the plan's order, the arena replay reproduces a plain run, and a
plan whose live tensors overlap is caught by its numbers."""

import copy
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import roam
from onnx_builder import model, node, save

from roam_cli import pair
from roam_cli.core.errors import CheckFailed, RoamError
from roam_cli.frontend.providers import RUNTIME, TRAINING_OPS
from roam_cli.frontend.onnx_import import import_model
from roam_cli.runtime.execute import (
    difference,
    execute_graph,
    extended_bytes,
    make_feeds,
    order_agreement,
    seed_random_ops,
)
from roam_cli.runtime.replay import replay


def test_sample_plan_runs_in_plan_order_and_replays_exactly(runnable_plan):
    """The sample as the installed runtime runs it: fused (229 nodes) or lowered (roam lower)."""
    model_path, plan_path, plan, _ = runnable_plan
    nodes = len(plan["order"])
    r = roam("execute", model_path, "--plan", plan_path, "--json")
    assert r.code == 0, r.err
    result = r.json()
    assert result["failures"] == []
    assert result["order"]["plan_nodes"] == nodes and result["order"]["agreement"] >= 0.999
    # every graph output, and the 28 gradient buffers: InPlaceAccumulatorV2 writes into them (fused),
    # lowered it writes them as outputs <buffer>.out
    fused = {"graph_outputs": 29, "inputs_updated_in_place": 28}
    assert result["compared"] == (fused if nodes == 229 else {"graph_outputs": 57, "inputs_updated_in_place": 0})
    replayed = result["replay"]
    assert replayed["tensors"] == 57 and replayed["passed"] and replayed["max_rel"] <= 1e-5
    assert replayed["nodes"] == nodes and replayed["sessions"] < nodes  # two layers share their sessions
    # the loss and the 28 update flags are bitwise equal; gradient sums that ORT's default level
    # fuses differently (or GatherGrad's threads add up in another order) may differ in the last bits
    assert all("_grad.accumulation.buffer" in t["name"] for t in replayed["not_bitwise"])
    for key in ("original_order", "plan_order"):
        figures = result["ort_arena_bytes"][key]
        assert figures["same_as_requested"] > 0 and figures["next_power_of_two"] >= figures["same_as_requested"]
    assert result["plan"]["arena_bytes"] == plan["arena_bytes"]


def clobber(plan: dict) -> tuple[dict, str, str]:
    """Move a tensor produced while a longer-lived one is live onto it: the victim is read after
    the clobber, so its readers see the wrong bytes."""
    bad = copy.deepcopy(plan)
    placed = [t for t in bad["tensors"] if t["offset"] is not None and t["bytes"] >= 1024]
    for victim in sorted(placed, key=lambda t: t["first_step"] - t["last_step"]):
        for other in placed:
            if victim["first_step"] < other["first_step"] < victim["last_step"] \
                    and victim["offset"] + other["bytes"] <= bad["arena_bytes"]:
                other["offset"] = victim["offset"]
                return bad, victim["name"], other["name"]
    raise AssertionError("no tensor is produced while another is live")


def test_overlapping_plan_is_rejected_by_verify_and_by_execute_before_it_runs(runnable_plan, tmp_path):
    model_path, _, plan, _ = runnable_plan
    bad, _, culprit = clobber(plan)
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    r = roam("verify", model_path, tmp_path / "bad.json")
    assert r.code == 1 and "overlaps" in r.err and culprit in r.err
    # execute verifies the pair before it runs anything
    r = roam("execute", model_path, "--plan", tmp_path / "bad.json", "--json")
    assert r.code == 1 and len(r.err.strip().splitlines()) == 1 and "the plan does not hold" in r.err, r.err
    assert culprit in r.err and r.out == ""


@pytest.mark.slow  # 8 s: the whole sample replayed node by node
def test_overlapping_plan_past_verify_is_caught_by_the_replay(runnable_plan):
    model_path, _, plan, _ = runnable_plan
    bad, _, _ = clobber(plan)
    with pair.planned_graph(Path(model_path), bad) as imported:
        try:
            result = execute_graph(imported, Path(model_path), bad, "cpu", None, 0, None)
        except CheckFailed as e:  # the clobbered tensor was an index a kernel then refused
            assert "replay failed at step" in str(e)
            return
    assert result["annotated_run"]["passed"]  # ORT's own allocator never saw the bad offsets
    assert not result["replay"]["passed"] and result["replay"]["not_bitwise"]


def test_replay_binds_views_and_in_place_updates_to_the_planned_storage(tmp_path):
    # a = -x; r = a viewed as 2x2; w.new = w + r replaces w in place; o = relu(r)
    m = model([node("Neg", ["x"], ["a"]), node("Reshape", ["a", "s"], ["r"]), node("Add", ["w", "r"], ["w.new"]),
               node("Relu", ["r"], ["o"])],
              [("x", [4]), ("w", [2, 2])], [("o", [2, 2]), ("w.new", [2, 2])],
              initializers={"s": np.array([2, 2], np.int64)})
    path = save(m, tmp_path / "m.onnx")
    assert roam("optimize", path, "-o", tmp_path / "plan.json").code == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    kinds = {t["name"]: (t["kind"], t.get("alias_of")) for t in plan["tensors"]}
    assert kinds["r"] == ("view", "a") and kinds["w.new"] == ("inplace", "w")
    imported = import_model(path)
    sources = {"x": np.array([1, -2, 3, -4], np.float32), "w": np.ones((2, 2), np.float32),
               "s": np.array([2, 2], np.int64)}
    out = replay(imported.model, imported.graph, plan, sources, "cpu", ["o", "w.new", "w"])
    np.testing.assert_array_equal(out.values["o"], [[0, 2], [0, 4]])
    np.testing.assert_array_equal(out.values["w.new"], [[0, 3], [-2, 5]])
    np.testing.assert_array_equal(out.values["w"], out.values["w.new"])  # written into w's own buffer
    np.testing.assert_array_equal(sources["w"], np.ones((2, 2)))  # the caller's arrays are left alone
    assert out.nodes == 4 and out.sessions == 4


def test_order_agreement_counts_pairs_in_plan_order():
    # plan a..e; ORT ran b before a and d before c, created X and folded e away
    r = order_agreement(["a", "b", "c", "d", "e"], ["b", "a", "X", "d", "c"])
    assert (r["pairs"], r["inversions"], r["agreement"]) == (6, 2, pytest.approx(4 / 6))
    assert (r["ran"], r["not_run"], r["added_by_ort"], r["first_out_of_order"]) == (4, 1, 1, ["b", "a"])
    assert order_agreement(["a", "b", "c"], ["a", "b", "c"])["agreement"] == 1.0


def test_difference_is_relative_to_the_largest_reference_magnitude():
    assert difference(np.array([1, 2, -4], np.float32), np.array([1, 2.5, -4], np.float32)) == (0.5, 0.125, False)
    assert difference(np.array([np.nan, 1.0]), np.array([np.nan, 1.0])) == (0.0, 0.0, True)
    assert difference(np.array([np.nan, 1.0]), np.array([0.0, 1.0]))[1] == float("inf")
    assert difference(np.zeros(2), np.zeros(3))[1] == float("inf")
    assert difference(np.array([True, False]), np.array([True, True]))[:2] == (1.0, 1.0)


def test_ort_arena_bytes_sum_the_device_arenas_extensions():
    log = "\n".join([
        "[I:onnxruntime:Default, bfc_arena.cc:29 BFCArena] Creating BFCArena for Cpu with following configs",
        "[I:onnxruntime:Default, bfc_arena.cc:347 AllocateRawInternal] Extending BFCArena for Cpu. bin_num:0",
        "[I:onnxruntime:Default, bfc_arena.cc:206 Extend] Extended allocation by 1048576 bytes.",
        "[I:onnxruntime:Default, bfc_arena.cc:209 Extend] Total allocated bytes: 1048576",
        "[I:onnxruntime:Default, bfc_arena.cc:347 AllocateRawInternal] Extending BFCArena for Cuda. bin_num:3",
        "[I:onnxruntime:Default, bfc_arena.cc:206 Extend] Extended allocation by 4096 bytes.",
        "[I:onnxruntime:Default, bfc_arena.cc:347 AllocateRawInternal] Extending BFCArena for Cpu. bin_num:11",
        "[I:onnxruntime:Default, bfc_arena.cc:206 Extend] Extended allocation by 2097152 bytes.",
        "[I:onnxruntime:Default, bfc_arena.cc:209 Extend] Total allocated bytes: 3145728",
    ])
    assert extended_bytes(log, "Cpu") == 3 * 2**20 and extended_bytes(log, "Cuda") == 4096
    assert extended_bytes("no arena here", "Cpu") is None


def test_random_ops_get_seeds_by_name_whatever_the_node_order():
    def dropouts(names):
        return model([node("Dropout", ["x"], [f"y{k}"], name=n) for k, n in enumerate(names)],
                     [("x", [4])], [(f"y{k}", [4]) for k in range(len(names))])

    m1, m2 = dropouts(["d_b", "d_a"]), dropouts(["d_a", "d_b"])
    assert seed_random_ops(m1, 5) == seed_random_ops(m2, 5) == 2
    seeds = [{n.name: onnx.helper.get_attribute_value(n.attribute[0]) for n in m.graph.node} for m in (m1, m2)]
    assert seeds[0] == seeds[1] == {"d_a": 5, "d_b": 6}
    assert seed_random_ops(m1, 5) == 0  # a seed the model has is kept


def test_feeds_from_npz_must_match_the_inputs_and_the_rest_are_synthesised(tmp_path):
    specs = [("ids", "<i8", (2, 3)), ("x", "<f4", (4,))]
    np.savez(tmp_path / "ok.npz", ids=np.arange(6).reshape(2, 3))
    feeds, synthesised = make_feeds(specs, tmp_path / "ok.npz", seed=0)
    assert synthesised == 1 and feeds["ids"].tolist() == [[0, 1, 2], [3, 4, 5]] and feeds["x"].dtype == np.float32
    np.savez(tmp_path / "name.npz", nope=np.zeros(3))
    np.savez(tmp_path / "shape.npz", ids=np.zeros(3, np.int64))
    for path, message in ((tmp_path / "missing.npz", "missing.npz: no such file"),
                          (tmp_path / "name.npz", "'nope' is not an input of the model"),
                          (tmp_path / "shape.npz", "'ids' is int64[3], the model takes int64[2, 3]")):
        with pytest.raises(RoamError, match=message.replace("[", r"\[")):
            make_feeds(specs, path, seed=0)


@pytest.mark.parametrize("args, message, code", [
    pytest.param(["--provider", "cuda"], "CUDA is not available", 2,
                 marks=pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="has CUDA")),
    (["--inputs", "{d}/wrong_name.npz"], "'nope' is not an input of the model", 2),
    (["--plan", "{d}/other.json"], "the plan was made for another model", 2),
    (["--plan", "{d}/short.json"], "the plan does not hold for this model: node", 1),
])
def test_bad_execute_input_is_one_line(runnable_plan, tmp_path, args, message, code):
    model_path, plan_path, plan, _ = runnable_plan
    np.savez(tmp_path / "wrong_name.npz", nope=np.zeros(3))
    other = {field: plan[field] | {"sha256": "0" * 64} for field in ("model", "source_model", "annotated_model")}
    (tmp_path / "other.json").write_text(json.dumps(plan | other))
    (tmp_path / "short.json").write_text(json.dumps(plan | {"order": plan["order"][1:]}))
    args = [a.format(d=tmp_path) for a in args]
    if "--plan" not in args:
        args += ["--plan", plan_path]
    r = roam("execute", model_path, *args)
    assert r.code == code and message in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert "Traceback" not in r.err


def test_model_without_its_weights_is_refused(tmp_path):
    m = model([node("MatMul", ["x", "w"], ["y"])], [("x", [4, 64])], [("y", [4, 64])],
              initializers={"w": np.ones((64, 64), np.float32)})
    onnx.save(m, str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=0)
    assert roam("optimize", tmp_path / "m.onnx", "-o", tmp_path / "plan.json").code == 0
    (tmp_path / "m.data").unlink()
    r = roam("execute", tmp_path / "m.onnx", "--plan", tmp_path / "plan.json")
    assert r.code == 2 and "needs the weights, but external data file m.data is absent" in r.err, r.err


@pytest.mark.skipif(TRAINING_OPS, reason=f"{RUNTIME} runs ORT's fused training ops")
@pytest.mark.parametrize("command", [("execute", "{m}", "--plan", "{p}"),
                                     ("optimize", "{m}", "-o", "{d}/o.json", "--ort-optimized")])
def test_a_fused_graph_where_the_runtime_lacks_its_ops_is_one_line_naming_op_and_fix(sample_plan, tmp_path, command):
    model_path, plan_path, _, _ = sample_plan
    r = roam(*(a.format(m=model_path, p=plan_path, d=tmp_path) for a in command))
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    assert "com.microsoft:SoftmaxCrossEntropyLossGrad" in r.err and "roam lower" in r.err
    assert "onnxruntime-training" in r.err and "Traceback" not in r.err
    assert not (tmp_path / "o.json").exists()
