"""End to end through the command line: optimize, verify, report, the annotated model, bad inputs."""

import copy
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import SAMPLE, roam
from onnx_builder import model, node, save
from test_hostile import main_in_process

from roam_cli.frontend.synthetic import synthetic_feeds


def test_optimize_verify_report_on_the_sample(sample_plan):
    model_path, plan_path, plan, _ = sample_plan
    assert plan["format"] == "roam-plan" and plan["version"] == 1
    assert len(plan["order"]) == 229 == len(set(plan["order"]))
    assert all(t["offset"] + t["bytes"] <= plan["arena_bytes"] for t in plan["tensors"] if t["offset"] is not None)
    kinds = {t["kind"] for t in plan["tensors"]}
    assert {"parameter", "gradient_buffer", "activation", "gradient", "view"} <= kinds
    # 28 parameters and 28 gradient buffers of equal size: 136,960 floats each, aligned per tensor
    params = sum(t["bytes"] for t in plan["tensors"] if t["kind"] == "parameter")
    buffers = sum(t["bytes"] for t in plan["tensors"] if t["kind"] == "gradient_buffer")
    assert params == buffers >= 136_960 * 4
    r = roam("verify", model_path, plan_path)
    assert r.code == 0 and r.out.startswith("plan OK"), r.err
    r = roam("report", plan_path)
    assert r.code == 0 and "fragmentation" in r.out and "largest tensors live at the peak" in r.out
    summary = roam("report", plan_path, "--format", "json").json()
    assert summary["peak_live_bytes"] == plan["peak_live_bytes"]
    assert summary["total_bytes"] == plan["persistent_bytes"] + plan["arena_bytes"]


def test_annotated_model_runs_and_matches_the_original(runnable_plan):
    model_path, _, plan, annotated_path = runnable_plan
    annotated = onnx.load(str(annotated_path))
    onnx.checker.check_model(annotated)
    assert [n.name for n in annotated.graph.node] == plan["order"]
    meta = {kv.key: kv.value for kv in annotated.metadata_props}
    assert int(meta["roam.arena_bytes"]) == plan["arena_bytes"]
    assert {kv.key for kv in annotated.graph.node[0].metadata_props} == {"roam.step"}
    results = []
    for path in (model_path, annotated_path):
        m = onnx.load(str(path))
        for n in m.graph.node:  # a seeded Dropout draws the same mask in any order
            if n.op_type == "Dropout":
                n.attribute.append(onnx.helper.make_attribute("seed", 7))
        options = ort.SessionOptions()
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
        session = ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
        feeds = synthetic_feeds(session, seed=1)
        outputs = session.run(None, feeds)
        # InPlaceAccumulatorV2 writes the gradients into the fed buffers: compare those too (lowered,
        # the 28 new buffers are outputs)
        results.append(outputs + [feeds[k] for k in sorted(feeds) if k.endswith(".accumulation.buffer")])
    assert len(results[0]) == 29 + 28 + (0 if len(plan["order"]) == 229 else 28)
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def corrupt(plan: dict) -> dict:
    """Move one transient tensor onto another that is live at the same step."""
    bad = copy.deepcopy(plan)
    placed = [t for t in bad["tensors"] if t["offset"] is not None and t["bytes"]]
    for a in placed:
        for b in placed:
            if a is not b and a["offset"] != b["offset"] and a["first_step"] <= b["last_step"] and b["first_step"] <= a["last_step"]:
                a["offset"] = b["offset"]
                return bad
    raise AssertionError("no two live tensors")


def test_verify_rejects_overlap_and_lies(sample_plan, tmp_path):
    model_path, _, plan, _ = sample_plan
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(corrupt(plan)))
    r = roam("verify", model_path, bad)
    assert r.code == 1 and "overlaps" in r.err and len(r.err.strip().splitlines()) == 1
    lying = copy.deepcopy(plan)
    lying["order"][0], lying["order"][-1] = lying["order"][-1], lying["order"][0]
    bad.write_text(json.dumps(lying))
    r = roam("verify", model_path, bad)
    assert r.code == 1 and "before it is produced" in r.err
    short = copy.deepcopy(plan)
    t = next(t for t in short["tensors"] if t["offset"] is not None and t["last_step"] > t["first_step"])
    t["last_step"] = t["first_step"]
    bad.write_text(json.dumps(short))
    r = roam("verify", model_path, bad)
    assert r.code == 1 and "is used over" in r.err


def test_verify_checks_an_output_written_over_an_input(tmp_path):
    # a = Relu(x); b = Neg(a), a's only reader: b is written over a. c = MatMul(b, w).
    m = model([node("Relu", ["x"], ["a"]), node("Neg", ["a"], ["b"]), node("MatMul", ["b", "w"], ["c"])],
              [("x", [16, 16])], [("c", [16, 16])], initializers={"w": np.eye(16, dtype=np.float32)})
    path = save(m, tmp_path / "m.onnx")
    assert roam("optimize", path, "-o", tmp_path / "plan.json").code == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    b = next(t for t in plan["tensors"] if t["name"] == "b")
    assert b["written_over"] == "a" and b["alias_of"] == "a" and b["offset"] is None
    assert roam("verify", path, tmp_path / "plan.json").code == 0

    def refused(edit, says: str):
        forged = copy.deepcopy(plan)
        edit({t["name"]: t for t in forged["tensors"]})
        (tmp_path / "forged.json").write_text(json.dumps(forged))
        r = roam("verify", path, tmp_path / "forged.json")
        assert r.code == 1 and says in r.err and len(r.err.strip().splitlines()) == 1, r.err

    def matmul_over_b(t):  # MatMul writes its output from all of a row: not over its input
        t["c"] |= {"alias_of": "a", "written_over": "b", "kind": "inplace", "offset": None}

    refused(matmul_over_b, "does not write elementwise over an input")

    def over_w(t):  # w is not in the storage b shares
        t["b"]["written_over"] = "w"

    refused(over_w, "not an input of node")


def test_unnamed_nodes_get_stable_names_and_the_plan_names_the_annotated_model(tmp_path):
    m = model([node("Relu", ["x"], ["a"], name=""), node("Relu", ["a"], ["b"], name="")], [("x", [8])], [("b", [8])])
    path = save(m, tmp_path / "m.onnx")
    r = roam("optimize", path, "-o", tmp_path / "plan.json")
    assert r.code == 0, r.err
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["order"] == ["Relu_0", "Relu_1"]
    assert plan["model"]["path"] == "plan.annotated.onnx"
    assert roam("verify", tmp_path / "plan.annotated.onnx", tmp_path / "plan.json").code == 0


def test_optimize_says_it_wrote_the_annotated_model(tmp_path):
    m = model([node("Relu", ["x"], ["a"], name="r0"), node("Relu", ["a"], ["b"], name="r1")], [("x", [8])], [("b", [8])])
    path = save(m, tmp_path / "m.onnx")
    r = roam("optimize", path, "-o", tmp_path / "plan.json", "--annotated-model", tmp_path / "planned.onnx")
    assert r.code == 0 and f"wrote {tmp_path / 'planned.onnx'}: the graph in the plan's order" in r.out, r.out


def test_model_with_absent_external_data_still_plans(tmp_path):
    m = model([node("MatMul", ["x", "w"], ["y"])], [("x", [4, 64])], [("y", [4, 64])],
              initializers={"w": np.ones((64, 64), np.float32)})
    onnx.save(m, str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=0)
    (tmp_path / "m.data").unlink()
    r = roam("optimize", tmp_path / "m.onnx", "-o", tmp_path / "plan.json")
    assert r.code == 0, r.err
    assert "external data file m.data is absent" in r.err
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert next(t for t in plan["tensors"] if t["name"] == "w")["bytes"] == 64 * 64 * 4
    # shapes are all known statically, so the run (which would need the absent weights) is not made
    r = roam("optimize", tmp_path / "m.onnx", "-o", tmp_path / "p2.json", "--shapes-from-run")
    assert r.code == 0, r.err
    assert json.loads((tmp_path / "p2.json").read_text())["tensors"] == plan["tensors"]


def cyclic(tmp_path):
    m = model([node("Relu", ["b"], ["a"]), node("Relu", ["a"], ["b"])], [("x", [4])], [("b", [4])])
    return save(m, tmp_path / "cycle.onnx")


def symbolic(tmp_path):
    m = model([node("Relu", ["x"], ["y"])], [("x", ["batch", 4])], [("y", ["batch", 4])])
    return save(m, tmp_path / "sym.onnx")


def truncated(tmp_path):
    data = SAMPLE.read_bytes()
    (tmp_path / "trunc.onnx").write_bytes(data[: len(data) // 2])
    return tmp_path / "trunc.onnx"


def not_onnx(tmp_path):
    (tmp_path / "text.onnx").write_text("this is not a model\n" * 10)
    return tmp_path / "text.onnx"


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing.onnx", "no such file"),
    (not_onnx, "not"),
    (truncated, "not a valid ONNX model"),
    (cyclic, "cycle"),
    (symbolic, "--dim batch=N"),
])
def test_bad_model_exits_2_with_one_line_and_no_output(tmp_path, make, message):
    path = make(tmp_path)
    out = tmp_path / "plan.json"
    r = roam("optimize", path, "-o", out)
    assert r.code == 2 and message in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert "Traceback" not in r.err and not out.exists()


def test_unwritable_output_and_output_equal_to_input(tmp_path):
    r = roam("optimize", SAMPLE, "-o", tmp_path / "no" / "dir" / "plan.json")
    assert r.code == 2 and "does not exist" in r.err
    copy_of_model = tmp_path / "m.onnx"
    copy_of_model.write_bytes(SAMPLE.read_bytes())
    r = roam("optimize", copy_of_model, "-o", copy_of_model)
    assert r.code == 2 and "same file" in r.err
    assert copy_of_model.read_bytes() == SAMPLE.read_bytes()
    r = roam("optimize", SAMPLE, "-o", tmp_path / "p.json", "--annotated-model", tmp_path / "p.json")
    assert r.code == 2 and "same file" in r.err and not (tmp_path / "p.json").exists()


def test_existing_output_is_not_clobbered_by_a_failed_run(tmp_path):
    out = tmp_path / "plan.json"
    out.write_text("precious")
    r = roam("optimize", cyclic(tmp_path), "-o", out)
    assert r.code == 2 and out.read_text() == "precious"
    assert [p.name for p in tmp_path.iterdir()] == sorted(["plan.json", "cycle.onnx"]) or len(list(tmp_path.iterdir())) == 2


def test_usage_errors_exit_2(tmp_path):
    r = roam("optimize", SAMPLE)
    assert r.code == 2 and "Missing option" in r.err
    r = roam("optimize", SAMPLE, "-o", tmp_path / "p.json", "--dim", "batch")
    assert r.code == 2 and "NAME=VALUE" in r.err
    r = roam("report", tmp_path / "nothing.json")
    assert r.code == 2 and "no such plan file" in r.err
    r = roam("report", tmp_path)
    assert r.code == 2 and "a directory, not a plan file" in r.err
    (tmp_path / "x.json").write_text("{}")
    assert roam("report", tmp_path / "x.json").code == 2


def test_a_dim_the_model_lacks_is_refused_naming_the_dims_it_has(tmp_path):
    path = symbolic(tmp_path)
    message = ("roam: error: --dim nodim: no input of the model has a symbolic dimension 'nodim' "
               "(its symbolic dimensions: batch)\n")
    expected = (2, message)
    assert main_in_process(["optimize", str(path), "-o", str(tmp_path / "plan.json"),
                            "--dim", "batch=2", "--dim", "nodim=4"]) == expected
    assert main_in_process(["max-batch", str(path), "--budget", "1GiB", "--dim", "nodim=4"]) == expected
    code, err = main_in_process(["optimize", str(SAMPLE), "-o", str(tmp_path / "plan.json"), "--dim", "batch=4"])
    assert code == 2 and err.endswith("has a symbolic dimension 'batch' (its symbolic dimensions: none)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sym.onnx"]


@pytest.mark.parametrize("command", [
    ["optimize", str(SAMPLE), "-o", "{d}/plan.json", "--budget", "{budget}"],
    ["optimize", str(SAMPLE), "-o", "{d}/plan.json", "--recompute", "budget", "--budget", "{budget}"],
    ["report", "{d}/old.json", "--budget", "{budget}"],
    ["plot", "{d}/old.json", "-o", "{d}/pictures", "--budget", "{budget}"],
    ["max-batch", str(SAMPLE), "--budget", "{budget}"],
])
@pytest.mark.parametrize("budget", ["0", "0.5B", "0GiB"])
def test_a_budget_of_nothing_is_refused(tmp_path, command, budget):
    (tmp_path / "old.json").write_text("{}")
    code, err = main_in_process([a.format(d=tmp_path, budget=budget) for a in command])
    assert (code, err) == (2, f"roam: error: Invalid value for '--budget': must be at least 1 byte, got {budget!r}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]


@pytest.mark.parametrize("command, option, bad", [
    (["optimize", str(SAMPLE), "-o", "{d}/plan.json"], "--jobs", "0"),
    (["optimize", str(SAMPLE), "-o", "{d}/plan.json"], "--time-limit", "-1"),
    (["optimize", str(SAMPLE), "-o", "{d}/plan.json"], "--time-limit", "nan"),
    (["optimize", str(SAMPLE), "-o", "{d}/plan.json"], "--time-limit", "inf"),
    (["optimize", str(SAMPLE), "-o", "{d}/plan.json"], "--time-limit", "soon"),
    (["train", str(SAMPLE), "--plan", "{d}/old.json"], "--timeout", "nan"),
    (["optimize", str(SAMPLE), "-o", "{d}/plan.json"], "--gap", "-0.1"),
    (["optimize", str(SAMPLE), "-o", "{d}/plan.json"], "--gap", "2"),
    (["max-batch", str(SAMPLE), "--budget", "1GiB"], "--jobs", "0"),
    (["max-batch", str(SAMPLE), "--budget", "1GiB"], "--time-limit", "0"),
    (["layout-csv", "{d}/old.json", "-o", "{d}/out.csv"], "--jobs", "-2"),
    (["layout-csv", "{d}/old.json", "-o", "{d}/out.csv"], "--time-limit", "0"),
    (["layout-csv", "{d}/old.json", "-o", "{d}/out.csv"], "--capacity", "-1"),
    (["layout-csv", "{d}/old.json", "-o", "{d}/out.csv"], "--capacity", "0"),
    (["report", "{d}/old.json"], "--top", "-3"),
])
def test_counts_and_seconds_out_of_range_are_refused(tmp_path, command, option, bad):
    (tmp_path / "old.json").write_text("{}")
    code, err = main_in_process([a.format(d=tmp_path) for a in command] + [option, bad])
    assert code == 2 and err.startswith(f"roam: error: Invalid value for '{option}': {bad}") and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]


def test_the_gap_stops_the_order_within_it_and_the_layout_within_a_tenth_of_it(tmp_path):
    code, err = main_in_process(["optimize", str(SAMPLE), "-o", str(tmp_path / "plan.json"), "--gap", "0.05"])
    assert code == 0, err
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["stats"]["order"]["gap"] == 0.05 and plan["stats"]["layout"]["gap"] == pytest.approx(0.005)
    assert plan["arena_bytes"] <= plan["peak_live_bytes"] * 1.005


@pytest.mark.parametrize("command", ["verify", "execute", "train"])
def test_commands_that_take_a_plan_s_model_say_which(command):
    from click.testing import CliRunner

    from roam_cli.cli import cli

    text = " ".join(CliRunner().invoke(cli, [command, "--help"]).output.split())
    assert "MODEL is either file of the plan's pair: the" in text and "or the annotated model it wrote" in text


def test_version_and_help():
    assert roam("--version").out.strip() == "roam, version 0.1.0"
    r = roam("optimize", "--help")
    assert r.code == 0 and "Examples" in r.out


def test_a_size_that_reads_as_the_budget_says_by_how_much_it_differs():
    from roam_cli.core.units import format_beside

    budget = 80 * 2**30
    assert format_beside(budget + 3 * 2**20, budget) == "80.00 GiB (+3.00 MiB)"
    assert format_beside(budget - 512, budget) == "80.00 GiB (-512 B)"
    assert format_beside(budget, budget) == "80.00 GiB" and format_beside(81 * 2**30, budget) == "81.00 GiB"


def test_tables_piped_without_columns_are_not_cut(sample_plan):
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = subprocess.run([sys.executable, "-m", "roam_cli", "report", str(sample_plan[1])], capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 0 and "…" not in proc.stdout and max(map(len, proc.stdout.splitlines())) > 80, proc.stdout
