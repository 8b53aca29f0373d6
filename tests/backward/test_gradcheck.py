"""`roam gradcheck`: a two-layer tanh network whose training graph roam's backward writes, checked
as it is, with one rule broken, with a Dropout, as a full step, and on the README's sample (ONNX
Runtime's artifacts); and its refusals."""

import numpy as np
import pytest
from onnx import TensorProto
from conftest import SAMPLE, roam
from onnx_builder import model, node, save

from roam_cli.backward import rules
from roam_cli.backward.step import build as roam_backward
from roam_cli.frontend import training_graph


def mlp(dropout: bool = False):
    """x [4, 3] -> MatMul fc1.weight [3, 5] -> Tanh (-> Dropout 0.5) -> MatMul fc2.weight [5, 2] -> mean of squares."""
    rng = np.random.default_rng(1)
    nodes = [node("MatMul", ["x", "fc1.weight"], ["h"]), node("Tanh", ["h"], ["a"])]
    # fc1 large enough that tanh' (1 - tanh^2) is well below 1 on the drawn x (0.1 N(0, 1))
    inits = {"fc1.weight": 4 * rng.standard_normal([3, 5]).astype(np.float32), "fc2.weight": rng.standard_normal([5, 2]).astype(np.float32)}
    if dropout:
        inits |= {"ratio": np.array(0.5, np.float32), "training": np.array(True)}
        nodes.append(node("Dropout", ["a", "ratio", "training"], ["d", "d.mask"]))
    nodes += [node("MatMul", ["d" if dropout else "a", "fc2.weight"], ["y"]), node("Mul", ["y", "y"], ["square"]),
              node("ReduceMean", ["square"], ["loss"], keepdims=0)]
    return model(nodes, [("x", [4, 3])], [("loss", [])], initializers=inits)


def training(tmp_path, forward, **options):
    save(forward, tmp_path / "forward.onnx")
    optimizer = None if options.get("in_graph") else tmp_path / "optimizer.onnx"  # roam's backward writes none
    training_graph.make(tmp_path / "forward.onnx", tmp_path / "train.onnx", loss="none", backward=roam_backward,
                        optimizer_path=optimizer, **options)
    return tmp_path / "train.onnx"


def checked(path, *args):
    r = roam("gradcheck", path, "--json", *args)
    return r, {p["name"]: p for p in r.json()["parameters"]} if r.out else {}


def test_a_correct_backward_passes_in_float64_and_as_run(tmp_path):
    r, found = checked(training(tmp_path, mlp()))
    assert r.code == 0, r.err
    assert set(found) == {"fc1.weight", "fc2.weight"}
    for p in found.values():  # float64 differences good to ~1e-9 here; float32 to a few ulps
        assert p["rule_error"] < 1e-7 and p["float32_error"] < 1e-5, p
    assert r.json()["passed"] and r.json()["synthesised"] == ["x"]


def test_a_broken_rule_is_named_by_the_parameter_it_feeds(tmp_path, monkeypatch):
    # Tanh's gradient passed through unchanged (1 where it is 1 - tanh^2): fc2.weight's gradient, taken after
    # the Tanh, is still right; fc1.weight's, taken through it, is wrong
    monkeypatch.setitem(rules.RULES, "Tanh", (lambda g: g.give(0, g.dy()), (0,)))
    r, found = checked(training(tmp_path, mlp()))
    assert r.code == 1, r.err
    assert found["fc2.weight"]["rule_error"] < 1e-7 and found["fc1.weight"]["rule_error"] > 1e-2
    r = roam("gradcheck", tmp_path / "train.onnx")
    assert r.code == 1 and len(r.err.strip().splitlines()) == 1
    assert "1 of 2 gradients" in r.err and "'fc1.weight'" in r.err and "a backward rule is wrong" in r.err


def test_a_dropout_mask_is_held_for_every_run(tmp_path):
    r, found = checked(training(tmp_path, mlp(dropout=True)))
    assert r.code == 0, r.err
    assert r.json()["dropouts_fixed"] == 1
    assert all(p["rule_error"] < 1e-7 for p in found.values())


def test_a_full_step_is_checked_without_its_update(tmp_path):
    r, found = checked(training(tmp_path, mlp(), in_graph=True))
    assert r.code == 0, r.err
    assert set(found) == {"fc1.weight", "fc2.weight"}


def test_a_bf16_step_is_checked_as_the_cpu_runs_it_against_its_roundoff(tmp_path):
    path = training(tmp_path, mlp(), in_graph=True, precision="bf16")
    assert roam("emulate", path, "-o", tmp_path / "cpu.onnx").code == 0
    r, found = checked(tmp_path / "cpu.onnx")
    assert r.code == 0, r.err
    assert (r.json()["tolerance"], r.json()["float32_tolerance"]) == (2.0**-8, 10 * 2.0**-8)
    assert "bfloat16" in r.json()["notes"][0]
    assert set(found) == {"fc1.weight", "fc2.weight"} and all(p["rule_error"] < 2.0**-8 for p in found.values())
    r = roam("gradcheck", path)  # as it is, bf16 arithmetic the CPU provider lacks
    assert r.code == 2 and "roam emulate" in r.err, r.err


def test_the_readme_sample_onnx_runtime_artifacts(tmp_path):
    r, found = checked(SAMPLE)
    assert r.code == 0, r.err
    assert len(found) == 28 and r.json()["dropouts_fixed"] == 7
    assert max(p["rule_error"] for p in found.values()) < 1e-6


@pytest.mark.parametrize("args, message", [
    (["--tolerance", "nan"], "--tolerance nan: a fraction"),
    (["--float32-tolerance", "0"], "--float32-tolerance 0.0: a fraction"),
    (["--loss", "h"], "'h' is not a scalar floating output"),
])
def test_bad_options_are_one_line(tmp_path, args, message):
    r = roam("gradcheck", training(tmp_path, mlp()), *args)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and message in r.err, r.err


def test_inputs_of_another_model_or_a_graph_without_gradients_are_refused(tmp_path):
    path = training(tmp_path, mlp())
    np.savez(tmp_path / "batch.npz", pixels=np.zeros([4, 3], np.float32))
    r = roam("gradcheck", path, "--inputs", tmp_path / "batch.npz")
    assert r.code == 2 and "'pixels' is not an input" in r.err, r.err
    np.savez(tmp_path / "batch.npz", x=np.zeros([4, 2], np.float32))
    r = roam("gradcheck", path, "--inputs", tmp_path / "batch.npz")
    assert r.code == 2 and "'x' is float32[4, 2], the model takes float32[4, 3]" in r.err, r.err
    r = roam("gradcheck", tmp_path / "forward.onnx")
    assert r.code == 2 and "computes no gradient" in r.err, r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["batch.npz", "forward.onnx", "train.onnx"]  # nothing written


def test_the_float64_run_gathers_elements_with_indices_shorter_than_the_data():
    """GatherElements whose indices are shorter than the data on the other axis (torch.gather's
    form, DeBERTa's): the reference evaluator, which runs the float64 graphs ONNX Runtime cannot,
    gathers it as ONNX states it (it stopped with an internal error), negative indices included."""
    from onnx.reference import ReferenceEvaluator

    from roam_cli.gradcheck import reference_ops

    m = model([node("GatherElements", ["data", "index"], ["y"], axis=1)], [("data", [3, 4]), ("index", [2, 2])],
              [("y", [2, 2])])
    data = np.arange(12, dtype=np.float64).reshape(3, 4)  # rows [0 1 2 3], [4 5 6 7], [8 9 10 11]
    index = np.array([[3, 0], [-1, 1]], np.int64)
    (y,) = ReferenceEvaluator(m, new_ops=reference_ops()).run(None, {"data": data, "index": index})
    assert y.tolist() == [[3.0, 0.0], [7.0, 5.0]]


def test_the_float64_run_computes_erf_and_gelu_in_float64():
    """onnx's reference Erf rounds to float32 (and its Gelu is a function of that Erf): the float64
    run's differences carried float32's noise, and graphs with GELU failed the check (BERT's 1.3e-3)."""
    import math

    from onnx.reference import ReferenceEvaluator

    from roam_cli.gradcheck import reference_ops

    m = model([node("Erf", ["x"], ["e"]), node("Gelu", ["x"], ["g"]), node("Gelu", ["x"], ["t"], approximate="tanh")],
              [("x", [2], TensorProto.DOUBLE)], [(n, [2], TensorProto.DOUBLE) for n in "egt"])
    m.opset_import[0].version = 20  # Gelu's
    x = np.array([0.3, -1.7])
    e, g, t = ReferenceEvaluator(m, new_ops=reference_ops()).run(None, {"x": x})
    assert e.dtype == np.float64 and e.tolist() == [math.erf(0.3), math.erf(-1.7)]
    assert g.tolist() == [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x]
    assert t.tolist() == [0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))) for v in x]


def test_a_drawn_padding_mask_attends_everywhere(tmp_path):
    """A padding mask drawn as zeros masks every score: each is swamped by the mask's most negative
    float, the loss does not move with the scores, and the differences said the rules were wrong
    (GPT-2's false alarm). Drawn, an integer input named like a mask is all ones."""
    rng = np.random.default_rng(0)
    nodes = [node("MatMul", ["x", "w.weight"], ["scores"]), node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
             node("Sub", ["one", "m"], ["masked"]), node("Mul", ["masked", "lowest"], ["bias"]),
             node("Add", ["scores", "bias"], ["s"]), node("Softmax", ["s"], ["p"], axis=-1),
             node("Mul", ["p", "c"], ["pc"]), node("ReduceSum", ["pc"], ["loss"], keepdims=0)]
    inits = {"w.weight": rng.standard_normal([4, 4]).astype(np.float32), "one": np.array(1, np.float32),
             "lowest": np.array(np.finfo(np.float32).min, np.float32), "c": rng.standard_normal([2, 4]).astype(np.float32)}
    forward = model(nodes, [("x", [2, 4]), ("attention_mask", [1, 4], TensorProto.INT64)], [("loss", [])],
                    initializers=inits)
    step = training(tmp_path, forward)
    drawn = roam("gradcheck", step, "--json")
    assert drawn.code == 0, drawn.err
    assert drawn.json()["synthesised"] == ["x", "attention_mask"]
    zeros = tmp_path / "zeros.npz"
    np.savez(zeros, attention_mask=np.zeros([1, 4], np.int64))
    assert roam("gradcheck", step, "--inputs", zeros).code == 1  # given: as given


def kinked():
    """loss = w * Relu((x + e) - x): in float64 (1 + 2^-30) - 1 = 2^-30 > 0, Relu passes it and
    dloss/dw = 2^-30; in float32 1 + 2^-30 rounds to 1, Relu sees 0 and dloss/dw = 0. Every
    difference step along e (1e-6 or more, relative to max(|e|, 1)) crosses Relu's zero."""
    nodes = [node("Add", ["x", "e.weight"], ["h"]), node("Sub", ["h", "x"], ["d"]), node("Relu", ["d"], ["r"]),
             node("Mul", ["r", "w.weight"], ["y"]), node("ReduceSum", ["y"], ["loss"], keepdims=0)]
    inits = {"e.weight": np.array([2.0**-30], np.float32), "w.weight": np.array([3.0], np.float32)}
    return model(nodes, [("x", [1])], [("loss", [])], initializers=inits)


def test_a_gradient_at_a_kink_is_named_unchecked_and_a_branch_float32_takes_otherwise_is_named(tmp_path):
    train = training(tmp_path, kinked())
    np.savez(tmp_path / "x.npz", x=np.ones(1, np.float32))
    r, found = checked(train, "--inputs", tmp_path / "x.npz")
    # e: every difference crosses the kink (its rule unchecked, named), and float32's gradient (0, Relu
    # closed) is the other branch's (3); w: nothing it moves crosses an edge, its rule holds
    e, w = found["e.weight"], found["w.weight"]
    assert e["kink"] == "Relu 'r_node' (1 element)" and e["rule_error"] is None and e["float32_error"] == 1.0, found
    assert w["kink"] is None and w["rule_error"] < 1e-7, found
    assert r.json()["across_from_float64"] == [{"node": "Relu 'r_node'", "elements": 1}]
    assert r.code == 1 and "lies on the other side of an edge than float64 at 1 element of 1 node: Relu 'r_node'" \
        in r.err, r.err
    r = roam("gradcheck", train, "--inputs", tmp_path / "x.npz")
    assert "1 of 2 gradients not checked: every difference step crossed an edge (for 'e.weight'" in r.out, r.out
