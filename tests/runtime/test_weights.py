"""The weights in and out of `roam train`: a step roam made from an export starts from the export's
weights and writes them back under their PyTorch names (--save-weights) or into the export
(--save-model), a folded weight in PyTorch's layout and its constant made again from it."""

import json
import struct

import numpy as np
import onnx
import pytest
from conftest import roam
from onnx import numpy_helper
from onnx_builder import save
from test_recover import dynamo_tied_lm

from roam_cli.core.errors import RoamError
from roam_cli.runtime import weights

IDS = np.array([[0, 1, 2, 3], [4, 3, 2, 1]])
LABELS = np.array([[1, 2, 3, 4], [0, 0, 1, 1]])


def trained(tmp_path, learning_rate, *extra):
    """The hand-built GPT-2-like export (tied head, a folded Linear) made a full SGD step, planned, and
    trained one step; the `roam train --json` figures."""
    m, table, fc = dynamo_tied_lm()
    save(m, tmp_path / "lm.onnx")
    r = roam("make-training-graph", tmp_path / "lm.onnx", "-o", tmp_path / "step.onnx", "--loss", "cross-entropy",
             "--in-graph-optimizer", "--optimizer", "sgd")
    assert r.code == 0, r.err
    assert roam("optimize", tmp_path / "step.onnx", "-o", tmp_path / "plan.json").code == 0
    np.savez(tmp_path / "batch.npz", ids=IDS, labels=LABELS, learning_rate=np.array([learning_rate], np.float32))
    r = roam("train", tmp_path / "step.onnx", "--plan", tmp_path / "plan.json", "--steps", 1, "--inputs",
             tmp_path / "batch.npz", "--json", *extra)
    assert r.code == 0, r.err
    return json.loads(r.out), table, fc


def test_the_step_starts_from_the_exports_weights_and_writes_them_back_unchanged_at_learning_rate_zero(tmp_path):
    figures, table, fc = trained(tmp_path, 0.0, "--save-weights", tmp_path / "w.npz", "--save-model",
                                 tmp_path / "trained.onnx")
    assert figures["weights_from"].endswith("lm.onnx") and figures["synthesised_inputs"] == []
    with np.load(tmp_path / "w.npz") as w:
        assert sorted(w.files) == ["fc.weight", "lm_head.weight", "wte.weight"]  # the tie under both names
        np.testing.assert_array_equal(w["fc.weight"], fc)  # PyTorch's [out, in], not the export's transpose
        np.testing.assert_array_equal(w["lm_head.weight"], table)
        np.testing.assert_array_equal(w["wte.weight"], table)
    original = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(tmp_path / "lm.onnx")).graph.initializer}
    written = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(tmp_path / "trained.onnx")).graph.initializer}
    assert written.keys() == original.keys()
    for name in original:
        np.testing.assert_array_equal(written[name], original[name])


def test_a_trained_folded_weight_goes_back_in_pytorchs_layout_and_its_constant_is_made_again(tmp_path):
    trained(tmp_path, 0.5, "--save-weights", tmp_path / "w.npz", "--save-model", tmp_path / "trained.onnx")
    with np.load(tmp_path / "w.npz") as w:
        fc, table = w["fc.weight"], w["lm_head.weight"]
    _, table0, fc0 = dynamo_tied_lm()
    assert np.abs(fc - fc0).max() > 1e-4 and np.abs(table - table0).max() > 1e-4  # SGD moved both
    written = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(tmp_path / "trained.onnx")).graph.initializer}
    np.testing.assert_array_equal(written["val_4"], fc.T)
    np.testing.assert_array_equal(written["val_9"], table.T)  # the tied head: the embedding, transposed
    np.testing.assert_array_equal(written["lm_head.weight"], table)


def test_safetensors_holds_each_tensor_at_its_offsets_with_the_ties_in_its_metadata(tmp_path):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([7], np.int64)
    raw = weights.weights_bytes(tmp_path / "w.safetensors", {"a.weight": a, "b": b}, {"head.weight": "a.weight"})
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    assert (8 + n) % 8 == 0
    assert header["a.weight"] == {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}
    assert header["b"] == {"dtype": "I64", "shape": [1], "data_offsets": [24, 32]}
    assert header["head.weight"] == {"dtype": "F32", "shape": [2, 3], "data_offsets": [32, 56]}  # the tie, again
    assert json.loads(header["__metadata__"]["tied"]) == {"head.weight": "a.weight"}
    body = raw[8 + n:]
    np.testing.assert_array_equal(np.frombuffer(body[:24], "<f4").reshape(2, 3), a)
    assert np.frombuffer(body[24:32], "<i8").tolist() == [7]
    np.testing.assert_array_equal(np.frombuffer(body[32:56], "<f4").reshape(2, 3), a)


def test_save_options_refuse_in_one_line_and_write_nothing(tmp_path):
    trained(tmp_path, 0.0)
    r = roam("train", tmp_path / "step.onnx", "--plan", tmp_path / "plan.json", "--steps", 1, "--save-weights",
             tmp_path / "w.bin")
    assert r.code == 2 and "write .safetensors or .npz" in r.err and len(r.err.strip().splitlines()) == 1
    step = onnx.load(str(tmp_path / "step.onnx"))
    del step.metadata_props[:]  # a step that does not say where its weights came from
    save(step, tmp_path / "anonymous.onnx")
    assert roam("optimize", tmp_path / "anonymous.onnx", "-o", tmp_path / "plan2.json").code == 0
    r = roam("train", tmp_path / "anonymous.onnx", "--plan", tmp_path / "plan2.json", "--steps", 1, "--save-model",
             tmp_path / "m.onnx")
    assert r.code == 2 and "does not record the inference export" in r.err and len(r.err.strip().splitlines()) == 1
    assert not (tmp_path / "m.onnx").exists() and not (tmp_path / "w.bin").exists()


def test_no_output_is_written_over_the_export_its_data_or_the_inputs(tmp_path):
    trained(tmp_path, 0.0)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    train = ("train", tmp_path / "step.onnx", "--plan", tmp_path / "plan.json", "--steps", 1)
    for option, path, said in (("--save-model", "lm.onnx", "the export input"),  # the export the weights come from
                               ("--save-weights", "batch.npz", "same file as input"),  # --inputs
                               ("--save-model", "step.onnx", "same file as input")):
        r = roam(*train, "--inputs", tmp_path / "batch.npz", option, tmp_path / path)
        assert r.code == 2 and said in r.err and len(r.err.strip().splitlines()) == 1, r.err
    # an export whose weights are external data: neither the data file nor a model whose own data
    # file would be it may be an output
    m, _, _ = dynamo_tied_lm()
    onnx.save_model(m, str(tmp_path / "ext.onnx"), save_as_external_data=True, location="ext.onnx.data",
                    size_threshold=0)
    for out in ("ext.onnx.data", "ext.onnx"):
        r = roam("make-training-graph", tmp_path / "ext.onnx", "-o", tmp_path / out, "--loss", "cross-entropy")
        assert r.code == 2 and "same file as" in r.err and len(r.err.strip().splitlines()) == 1, r.err
    r = roam("make-training-graph", tmp_path / "ext.onnx", "-o", tmp_path / "ext.onnx.data", "--loss", "cross-entropy")
    assert "the external data of input" in r.err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name in before} == before


def test_the_export_a_step_takes_its_weights_from_is_an_input_of_every_command_reading_the_step(tmp_path):
    """The step holds no weights of its own: they are its export's, which no command reading the
    step may write over (it was once an output of optimize and shard like any other file)."""
    m, _, _ = dynamo_tied_lm()
    save(m, tmp_path / "lm.onnx")
    assert roam("make-training-graph", tmp_path / "lm.onnx", "-o", tmp_path / "step.onnx", "--loss", "cross-entropy",
                "--in-graph-optimizer").code == 0
    before = (tmp_path / "lm.onnx").read_bytes()
    step, lm = tmp_path / "step.onnx", tmp_path / "lm.onnx"
    for args in (("optimize", step, "-o", lm), ("optimize", step, "-o", tmp_path / "p.json", "--annotated-model", lm),
                 ("shard", step, "--ranks", "2", "-o", lm), ("lower", step, "-o", lm)):
        r = roam(*args)
        assert r.code == 2 and "the export input" in r.err and len(r.err.strip().splitlines()) == 1, (args, r.err)
    assert (tmp_path / "lm.onnx").read_bytes() == before and not (tmp_path / "p.json").exists()


def test_optimizer_settings_are_checked_before_any_work(tmp_path):
    m, _, _ = dynamo_tied_lm()
    save(m, tmp_path / "lm.onnx")
    for setting, said in (("eps=abc", "'abc' is not a float"), ("momentum=0.9", "adamw has beta1, beta2, convention, eps"),
                          ("convention=keras", "convention 'keras': choose onnxruntime or pytorch"),
                          ("beta1=7", "betas must lie in [0, 1)"), ("beta2=nan", "betas must lie in [0, 1)"),
                          ("eps=-1", "eps and weight_decay be finite and >= 0"),
                          ("weight_decay=-5", "eps and weight_decay be finite and >= 0"),
                          ("weight_decay=inf", "eps and weight_decay be finite and >= 0")):
        r = roam("make-training-graph", tmp_path / "lm.onnx", "-o", tmp_path / "s.onnx", "--loss", "cross-entropy",
                 "--in-graph-optimizer", "--optimizer-setting", setting)
        assert r.code == 2 and said in r.err and len(r.err.strip().splitlines()) == 1, r.err
    r = roam("make-training-graph", tmp_path / "lm.onnx", "-o", tmp_path / "s.onnx", "--loss", "cross-entropy",
             "--optimizer-setting", "eps=1e-8")
    assert r.code == 2 and "add --in-graph-optimizer" in r.err
    assert not (tmp_path / "s.onnx").exists()


def test_a_step_whose_export_cannot_be_read_is_trained_from_synthetic_weights_and_says_so(tmp_path):
    trained(tmp_path, 0.0)
    (tmp_path / "lm.onnx").unlink()  # moved away after the step was made
    r = roam("train", tmp_path / "step.onnx", "--plan", tmp_path / "plan.json", "--steps", 1, "--inputs",
             tmp_path / "batch.npz")
    assert r.code == 0 and "were synthesised" in r.out and "lm.onnx" in r.out
    r = roam("train", tmp_path / "step.onnx", "--plan", tmp_path / "plan.json", "--steps", 1, "--inputs",
             tmp_path / "batch.npz", "--json")
    figures = json.loads(r.out)
    assert figures["weights_from"] is None and "lm.onnx" in figures["weights_unread"]
    assert "fc.weight" in figures["synthesised_inputs"]
    r = roam("train", tmp_path / "step.onnx", "--plan", tmp_path / "plan.json", "--steps", 1, "--save-model",
             tmp_path / "m.onnx")
    assert r.code == 2 and "is not there" in r.err and not (tmp_path / "m.onnx").exists()


def test_the_weights_and_the_model_are_written_together_or_not_at_all(tmp_path):
    # the export to write the trained model into is gone by the end of the run: the weights, which
    # could be written, are not either
    gone = weights.Source(tmp_path / "gone.onnx", {}, {})
    with pytest.raises(RoamError, match="cannot read the weights of"):
        weights.save_trained(tmp_path / "w.npz", tmp_path / "trained.onnx", gone, {"w": np.ones(2, np.float32)})
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    written = weights.save_trained(tmp_path / "w.npz", None, gone, {"w": np.ones(2, np.float32)})
    assert written == {"saved_weights": str(tmp_path / "w.npz")}
    assert np.load(tmp_path / "w.npz")["w"].tolist() == [1, 1]
