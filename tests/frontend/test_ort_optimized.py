"""`optimize --ort-optimized`: roam plans the graph ONNX Runtime runs after its graph
optimisations, the annotated model is that graph, and sessions run it without optimising again."""

import hashlib
import json

import onnx
import onnxruntime as ort
import pytest
from conftest import SAMPLE, roam, runnable
from onnx_builder import model, node, save

from roam_cli import pipeline
from roam_cli.frontend import ort_optimize


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """The sample in the form the installed ONNX Runtime runs (fused, or lowered), and its nodes."""
    path = runnable(SAMPLE, tmp_path_factory.mktemp("source"))
    return path, len(onnx.load(str(path)).graph.node)


@pytest.fixture(scope="module")
def ort_plan(tmp_path_factory, source):
    """The sample planned after ORT's extended optimisations for the CPU (the option given bare)."""
    d = tmp_path_factory.mktemp("ort")
    r = roam("optimize", source[0], "-o", d / "plan.json", "--ort-optimized")
    assert r.code == 0, r.err
    return d / "plan.json", json.loads((d / "plan.json").read_text()), d / "plan.annotated.onnx", r.out


def test_the_annotated_model_is_orts_graph_in_planned_order(ort_plan, runnable_plan, source):
    plan_path, plan, annotated_path, _ = ort_plan
    path, nodes = source
    annotated = onnx.load(str(annotated_path))
    onnx.checker.check_model(annotated)
    assert [n.name for n in annotated.graph.node] == plan["order"]
    assert len(plan["order"]) < nodes
    meta = {kv.key: kv.value for kv in annotated.metadata_props}
    assert meta["roam.ort_optimized"] == "extended/cpu"
    assert plan["ort_optimized"] == {"level": "extended", "provider": "cpu", "onnxruntime": ort.__version__}
    sha = hashlib.sha256(annotated_path.read_bytes()).hexdigest()
    assert plan["model"] == plan["annotated_model"] == {"path": "plan.annotated.onnx", "sha256": sha}
    assert plan["source_model"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    # before: the sample as written, planned with the same (default) options as runnable_plan
    _, _, plain, _ = runnable_plan
    effect = plan["stats"]["ort_optimization"]
    assert effect["before"] == {"nodes": nodes, "peak_live_bytes": plain["peak_live_bytes"],
                                "arena_bytes": plain["arena_bytes"]}
    assert effect["after"] == {"nodes": len(plan["order"]), "peak_live_bytes": plan["peak_live_bytes"],
                               "arena_bytes": plan["arena_bytes"]}
    assert {"ort_optimize", "plan_unoptimized"} <= set(plan["stats"]["seconds"])
    assert sorted(p.name for p in plan_path.parent.iterdir()) == ["plan.annotated.onnx", "plan.json"]


def test_verify_passes_on_both_members(ort_plan, source):
    plan_path, plan, annotated_path, _ = ort_plan
    for path in (annotated_path, source[0]):  # the source is optimised again, the same way
        r = roam("verify", path, plan_path)
        assert r.code == 0 and r.out.startswith(f"plan OK: {len(plan['order'])} nodes"), (path, r.err)


def test_execute_follows_the_plan_with_nothing_folded_or_added(ort_plan):
    plan_path, plan, annotated_path, _ = ort_plan
    r = roam("execute", annotated_path, "--plan", plan_path, "--json")
    assert r.code == 0, r.err
    result = r.json()
    assert result["order"]["agreement"] == 1.0 and result["order"]["ran"] == len(plan["order"])
    assert result["order"]["not_run"] == 0 and result["order"]["added_by_ort"] == 0
    assert result["annotated_run"]["passed"] and result["replay"]["passed"] and result["failures"] == []


def test_report_says_what_orts_optimisations_changed(ort_plan, source):
    plan_path, plan, _, optimize_out = ort_plan
    before, after = plan["stats"]["ort_optimization"]["before"], plan["stats"]["ort_optimization"]["after"]
    line = f"ORT optimisations (extended, cpu): {source[1]} → {after['nodes']} nodes, peak live"
    assert line in optimize_out.replace("\n", " ")
    assert line in roam("report", plan_path).out and line in roam("report", plan_path, "--format", "markdown").out
    summary = roam("report", plan_path, "--json").json()
    assert summary["ort_optimization"] == {**plan["ort_optimized"], "before": before, "after": after}


def test_sessions_of_an_ort_optimised_model_optimise_nothing(ort_plan):
    _, _, annotated_path, _ = ort_plan
    assert ort_optimize.planned_optimizations(onnx.load(str(annotated_path))) == \
        (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, [])
    assert ort_optimize.planned_optimizations(onnx.load(str(SAMPLE))) == \
        (ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, ort_optimize.FUSIONS + ["CommonSubexpressionElimination",
                                                                              "CastElimination"])
    assert set(pipeline.ORT_LEVELS) == set(ort_optimize.LEVELS)


def test_a_session_of_a_planned_model_keeps_a_cast_to_its_input_s_type(tmp_path):
    """ORT's basic level drops a float -> float Cast, whose output then lives as long as its own
    readers in the input's buffer, past the input's planned life: the planned session keeps it."""
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT, name="copy"),
                               helper.make_node("Relu", ["y"], ["z"], name="relu")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    level, disabled = ort_optimize.planned_optimizations(model)
    for keep, cast_nodes in ((True, 1), (False, 0)):
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        options.optimized_model_filepath = str(tmp_path / f"{keep}.onnx")
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"],
                             disabled_optimizers=disabled if keep else [n for n in disabled if n != "CastElimination"])
        ran = onnx.load(str(tmp_path / f"{keep}.onnx"))
        assert sum(n.op_type == "Cast" for n in ran.graph.node) == cast_nodes


def test_reproducible_runs_give_the_same_plan_and_annotated_model(tmp_path, source):
    runs = [tmp_path / f"run{k}" for k in range(2)]
    for folder in runs:
        folder.mkdir()
        r = roam("optimize", source[0], "-o", folder / "p.json", "--ort-optimized", "basic", "--reproducible")
        assert r.code == 0, r.err
    for name in ("p.json", "p.annotated.onnx"):
        assert (runs[0] / name).read_bytes() == (runs[1] / name).read_bytes(), name
    stats = json.loads((runs[0] / "p.json").read_text())["stats"]
    assert stats["seconds"] == {} and stats["ort_optimization"]["before"]["nodes"] == source[1]


def external(tmp_path, path):
    """The model at `path` with its initializers of 1 KiB and more in m.data."""
    (tmp_path / "src").mkdir()
    onnx.save(onnx.load(str(path)), str(tmp_path / "src" / "m.onnx"), save_as_external_data=True,
              location="m.data", size_threshold=1024)
    return tmp_path / "src" / "m.onnx"


@pytest.mark.slow  # 10 s: ORT optimises and executes; the in-file member's run is in the default run
def test_external_weights_stay_external_and_move_beside_the_annotated_model(tmp_path, source):
    source = external(tmp_path, source[0])
    r = roam("optimize", source, "-o", tmp_path / "plan.json", "--ort-optimized", "basic",
             "--annotated-model", tmp_path / "planned.onnx")
    assert r.code == 0, r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "planned.onnx", "planned.onnx.data", "src"]
    annotated = onnx.load(str(tmp_path / "planned.onnx"), load_external_data=False)
    locations = {kv.value for t in annotated.graph.initializer for kv in t.external_data if kv.key == "location"}
    assert locations == {"planned.onnx.data"}
    for path in (tmp_path / "planned.onnx", source):
        assert roam("verify", path, tmp_path / "plan.json").code == 0, path
    r = roam("execute", tmp_path / "planned.onnx", "--plan", tmp_path / "plan.json", "--json")
    assert r.code == 0 and r.json()["order"]["agreement"] == 1.0, r.err


def test_a_model_without_its_weights_cannot_be_optimised(tmp_path, source):
    source = external(tmp_path, source[0])
    (tmp_path / "src" / "m.data").unlink()
    r = roam("optimize", source, "-o", tmp_path / "plan.json", "--ort-optimized")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    assert "--ort-optimized needs the weights" in r.err and "m.data is absent" in r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_the_source_is_refused_when_another_onnxruntime_made_the_plan(ort_plan, tmp_path, source):
    _, plan, _, _ = ort_plan
    (tmp_path / "plan.json").write_text(json.dumps({**plan, "ort_optimized": {**plan["ort_optimized"],
                                                                               "onnxruntime": "0.1.0"}}))
    r = roam("verify", source[0], tmp_path / "plan.json")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "give the annotated model" in r.err, r.err


@pytest.mark.parametrize("args, message", [
    (["--ort-optimized", "fastest"], "'fastest' is not one of 'basic', 'extended'"),
    (["--provider", "cpu"], "give --ort-optimized too"),
    pytest.param(["--ort-optimized", "--provider", "cuda"], "CUDA is not available",
                 marks=pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="has CUDA")),
])
def test_bad_ort_options_are_one_line_and_write_nothing(tmp_path, args, message):
    m = save(model([node("Relu", ["x"], ["y"])], [("x", [8])], [("y", [8])]), tmp_path / "m.onnx")
    r = roam("optimize", m, "-o", tmp_path / "plan.json", *args)
    assert r.code == 2 and message in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
