"""The plan and the model files it belongs to: the source model and the annotated model are a
pair, every command that takes a model and a plan accepts either and refuses any other file."""

import hashlib
import json

import onnx
import pytest
from conftest import roam
from onnx_builder import model, node, save

from roam_cli import pair
from roam_cli.core import annotate


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_plan_names_both_members_of_its_pair(sample_plan):
    model_path, plan_path, plan, annotated_path = sample_plan
    assert plan["source_model"]["sha256"] == sha(model_path) == plan["model"]["sha256"]
    assert plan["annotated_model"] == {"path": "annotated.onnx", "sha256": sha(annotated_path)}
    assert (plan_path.parent / plan["source_model"]["path"]).resolve() == model_path.resolve()


def test_the_annotated_models_plan_digest_does_not_cover_the_pair(sample_plan):
    _, _, plan, annotated_path = sample_plan
    meta = {kv.key: kv.value for kv in onnx.load(str(annotated_path)).metadata_props}
    assert meta["roam.plan_digest"] == annotate.plan_digest(plan)
    assert annotate.plan_digest({**plan, "annotated_model": None, "source_model": None}) == meta["roam.plan_digest"]


def test_membership_from_the_plan_alone():
    plan = {"model": {"path": "m.onnx", "sha256": "a" * 64},
            "source_model": {"path": "m.onnx", "sha256": "a" * 64},
            "annotated_model": {"path": "p.onnx", "sha256": "b" * 64}}
    assert pair.member(plan, "a" * 64) == "source_model"
    assert pair.member(plan, "b" * 64) == "annotated_model"
    assert pair.member(plan, "c" * 64) is None
    assert pair.refusal(plan, "c" * 64) == ("the plan was made for another model (sha256 aaaaaaaaaaaa... (m.onnx) "
                                           "or bbbbbbbbbbbb... (p.onnx); this file is cccccccccccc...)")
    old = {"model": plan["model"]}  # a plan from before the pair was recorded
    assert pair.member(old, "a" * 64) == "model" and pair.member(old, "b" * 64) is None
    assert pair.source(old) == pair.source(plan) == plan["model"]


@pytest.mark.slow  # 8 s; test_ort_optimized verifies and executes annotated models in the default run
def test_verify_and_execute_accept_the_annotated_model(runnable_plan):
    _, plan_path, plan, annotated_path = runnable_plan
    r = roam("verify", annotated_path, plan_path)
    assert r.code == 0 and r.out.startswith(f"plan OK: {len(plan['order'])} nodes"), r.err
    r = roam("execute", annotated_path, "--plan", plan_path, "--json")
    assert r.code == 0, r.err
    assert r.json()["order"]["agreement"] == 1.0 and r.json()["failures"] == []


def third_graph(tmp_path):
    return save(model([node("Relu", ["x"], ["y"])], [("x", [8])], [("y", [8])]), tmp_path / "third.onnx")


@pytest.mark.parametrize("command, code", [
    (("verify", "{m}", "{p}"), 1),
    (("execute", "{m}", "--plan", "{p}"), 2),
    (("plot", "{p}", "-o", "{d}", "--model", "{m}"), 2),
])
def test_a_graph_outside_the_pair_is_refused_in_one_line(sample_plan, tmp_path, command, code):
    model_path, plan_path, plan, annotated_path = sample_plan
    third = third_graph(tmp_path)
    r = roam(*(a.format(m=third, p=plan_path, d=tmp_path) for a in command))
    assert r.code == code and len(r.err.strip().splitlines()) == 1, r.err
    assert "the plan was made for another model" in r.err
    for expected in (sha(model_path), sha(annotated_path), sha(tmp_path / "third.onnx")):
        assert expected[:12] in r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["third.onnx"]  # nothing written


def test_a_plan_from_before_the_pair_still_verifies_against_its_model(sample_plan, tmp_path):
    model_path, _, plan, annotated_path = sample_plan
    old = {k: v for k, v in plan.items() if k not in ("source_model", "annotated_model")}
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert roam("verify", model_path, tmp_path / "old.json").code == 0
    r = roam("verify", annotated_path, tmp_path / "old.json")  # an old plan names only `model`
    assert r.code == 1 and "the plan was made for another model" in r.err
    assert "source model" not in roam("report", tmp_path / "old.json").out


def test_renamed_nodes_the_annotated_model_is_the_plans_model_and_both_members_pass(tmp_path):
    m = model([node("Relu", ["x"], ["a"], name=""), node("Neg", ["a"], ["b"], name="")], [("x", [8])], [("b", [8])])
    source = tmp_path / "m.onnx"
    save(m, source)
    assert roam("optimize", source, "-o", tmp_path / "plan.json").code == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    annotated = tmp_path / "plan.annotated.onnx"
    assert plan["model"] == plan["annotated_model"] == {"path": "plan.annotated.onnx", "sha256": sha(annotated)}
    assert plan["source_model"] == {"path": "m.onnx", "sha256": sha(source)}
    for path in (source, annotated):
        r = roam("verify", path, tmp_path / "plan.json")
        assert r.code == 0 and r.out.startswith("plan OK: 2 nodes"), (path, r.err)
        r = roam("execute", path, "--plan", tmp_path / "plan.json", "--json")
        assert r.code == 0 and r.json()["order"]["agreement"] == 1.0, (path, r.err)


def test_report_shows_the_pair(sample_plan):
    model_path, plan_path, _, annotated_path = sample_plan
    short = sha(model_path)[:12], sha(annotated_path)[:12]
    table = roam("report", plan_path).out
    assert "source model" in table and "annotated model" in table and all(s in table for s in short)
    markdown = roam("report", plan_path, "--format", "markdown").out
    assert f"| **annotated model** | annotated.onnx (sha256 {short[1]}) |" in markdown
    summary = roam("report", plan_path, "--json").json()
    assert summary["pair"]["annotated_model"] == {"path": "annotated.onnx", "sha256": sha(annotated_path)}
    assert summary["pair"]["source_model"]["sha256"] == sha(model_path)
