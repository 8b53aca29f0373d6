"""`roam train --inputs FOLDER | TOKENS.bin [--shuffle]`: data read from disk a batch at a time, the
same batches an .npz of them gives, epochs, shuffling, token windows with labels shifted by one."""

import io
import json

import numpy as np
import pytest
from conftest import SAMPLE, roam

from roam_cli.core.errors import RoamError
from roam_cli.runtime import data

EXPORT = SAMPLE.parent / "model.onnx"
INT64 = np.dtype(np.int64)


def test_token_windows_by_hand(tmp_path):
    """21 tokens 0..20, windows of 4: 5 windows (the last token only ever a label), 2 a batch."""
    np.arange(21, dtype=np.uint16).tofile(tmp_path / "tokens.bin")
    tokens = data.Flat(tmp_path / "tokens.bin", np.dtype(np.uint16), 0, (21,))
    ids = data.TokenWindows("ids", tokens, (2, 4), 4, 0, INT64, False, 0)
    labels = data.TokenWindows("labels", tokens, (8,), 4, 1, INT64, False, 0)
    assert ids.per_epoch == 2
    assert ids.batch(1).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]] and ids.batch(1).dtype == INT64
    assert labels.batch(1).tolist() == [1, 2, 3, 4, 5, 6, 7, 8]  # flattened [batch * seq], as the loss reads them
    assert ids.batch(2).tolist() == [[8, 9, 10, 11], [12, 13, 14, 15]]
    assert ids.batch(3).tolist() == ids.batch(1).tolist()  # epoch 2: window 4 (16..19) is left over


def test_a_shuffled_epoch_reads_every_example_once_in_an_order_of_the_seed(tmp_path):
    np.save(tmp_path / "0.npy", np.arange(7)[:, None])  # 12 examples in two shards, 3 a batch
    np.save(tmp_path / "1.npy", np.arange(7, 12)[:, None])
    parts = [data.npy_rows(tmp_path / "0.npy"), data.npy_rows(tmp_path / "1.npy")]
    batches = data.Batches("x", parts, (3, 1), INT64, True, 5)
    epoch = [batches.batch(k).ravel().tolist() for k in range(1, 5)]
    assert sorted(sum(epoch, [])) == list(range(12)) and epoch != [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    again = data.Batches("x", parts, (3, 1), INT64, True, 5)
    assert [again.batch(k).ravel().tolist() for k in range(1, 5)] == epoch  # the seed's order
    assert [batches.batch(k).ravel().tolist() for k in range(5, 9)] != epoch  # another epoch, another order
    plain = data.Batches("x", parts, (3, 1), INT64, False, 5)
    assert plain.batch(3).ravel().tolist() == [6, 7, 8]  # across the shards' boundary


@pytest.fixture(scope="module")
def step(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    assert roam("make-training-graph", EXPORT, "-o", d / "step.onnx", "--loss", "cross-entropy",
                "--in-graph-optimizer", "--dim", "batch=4").code == 0
    assert roam("optimize", d / "step.onnx", "-o", d / "plan.json").code == 0
    return d


def losses(step, inputs, *args):
    r = roam("train", step / "step.onnx", "--plan", step / "plan.json", "--inputs", inputs, *map(str, args), "--json")
    assert r.code == 0, r.err
    return [s["outputs"]["loss"] for s in r.json()["per_step"]]


def test_a_folder_of_shards_trains_as_the_npz_of_its_batches(step, tmp_path):
    rng = np.random.default_rng(0)
    ids, labels = rng.integers(0, 100, (2, 22, 32))  # 22 examples: 5 batches of 4 an epoch, 2 left over
    (tmp_path / "folder" / "labels").mkdir(parents=True)
    np.save(tmp_path / "folder" / "input_ids.npy", ids)
    np.save(tmp_path / "folder" / "labels" / "0.npy", labels[:9])
    np.save(tmp_path / "folder" / "labels" / "1.npy", labels[9:])
    np.savez(tmp_path / "batches.npz", input_ids=ids[:20].reshape(5, 4, 32), labels=labels[:20].reshape(5, 4, 32))
    assert losses(step, tmp_path / "folder", "--steps", 7) == losses(step, tmp_path / "batches.npz", "--steps", 7)


def test_a_token_file_trains_on_windows_with_labels_shifted_by_one(step, tmp_path):
    tokens = np.random.default_rng(1).integers(0, 100, 4 * 32 * 3 + 1).astype(np.uint16)  # 3 batches exactly
    tokens.tofile(tmp_path / "tokens.bin")
    windows = tokens[:-1].reshape(12, 32).astype(np.int64)
    np.savez(tmp_path / "windows.npz", input_ids=windows.reshape(3, 4, 32),
             labels=tokens[1:].reshape(12, 32).astype(np.int64).reshape(3, 4, 32))
    assert losses(step, tmp_path / "tokens.bin", "--steps", 4) == losses(step, tmp_path / "windows.npz", "--steps", 4)


def test_a_run_on_shuffled_data_resumed_ends_bit_equal(step, tmp_path):
    np.random.default_rng(2).integers(0, 100, 4 * 32 * 5 + 1).astype(np.uint16).tofile(tmp_path / "tokens.bin")
    common = ["--inputs", tmp_path / "tokens.bin", "--shuffle", "--checkpoint-every", 3, "--checkpoint-keep", 10]
    r = roam("train", step / "step.onnx", "--plan", step / "plan.json", "--steps", 8, "--checkpoint-dir",
             tmp_path / "whole", *common)
    assert r.code == 0, r.err
    r = roam("train", step / "step.onnx", "--plan", step / "plan.json", "--steps", 3, "--checkpoint-dir",
             tmp_path / "parts", *common)
    assert r.code == 0, r.err
    r = roam("train", step / "step.onnx", "--plan", step / "plan.json", "--steps", 8, "--checkpoint-dir",
             tmp_path / "parts", "--resume", *common)
    assert r.code == 0, r.err
    assert (tmp_path / "whole" / "step-8" / "rank0.npz").read_bytes() == (tmp_path / "parts" / "step-8" / "rank0.npz").read_bytes()


def npy_bytes(a: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, a)
    return buffer.getvalue()


@pytest.mark.parametrize("make, said", [
    (lambda d: np.save(d / "x" / "nonsense.npy", np.zeros((4, 32), np.int64)), "'nonsense' is not an input of the model"),
    (lambda d: np.save(d / "x" / "input_ids.npy", np.zeros((9, 32), np.int32)),
     "'input_ids' is int32[9, 32], the model takes int64[examples, 32]"),
    (lambda d: np.save(d / "x" / "input_ids.npy", np.zeros((3, 32), np.int64)),
     "3 examples of 'input_ids', fewer than one batch (4 rows)"),
    (lambda d: (d / "x" / "input_ids.npy").write_bytes(b"not an array"), "not a readable .npy array"),
    (lambda d: None, "no NAME.npy nor NAME/ of .npy shards in the folder"),
    (lambda d: np.save(d / "x" / "input_ids.npy", np.zeros((8, 32), np.int64, order="F")), "a Fortran-ordered array"),
    (lambda d: (d / "x" / "input_ids.npy").write_bytes(
        npy_bytes(np.zeros((8, 32), np.int64))[:-100]),
     "shorter than its header says"),
])
def test_a_folder_that_does_not_fit_the_step_is_refused_in_one_line(step, tmp_path, make, said):
    (tmp_path / "x").mkdir()
    make(tmp_path)
    r = roam("train", step / "step.onnx", "--plan", step / "plan.json", "--inputs", tmp_path / "x")
    assert r.code == 2 and said in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_a_token_file_for_a_step_without_labels_is_refused():
    specs = {"x": (np.dtype(np.float32), (4, 3)), "y": (np.dtype(np.float32), (4,))}
    with pytest.raises(RoamError, match="a token file feeds a step with one integer ids input and 'labels'"):
        data.token_windows(SAMPLE, specs, {"x", "y"}, False, 0)


def test_log_appends_a_json_line_per_step_and_a_resumed_run_goes_on_appending(step, tmp_path):
    args = ["train", step / "step.onnx", "--plan", step / "plan.json", "--log", tmp_path / "run.log",
            "--checkpoint-dir", tmp_path / "ck"]
    assert roam(*args, "--steps", 2).code == 0
    assert roam(*args, "--steps", 4, "--resume").code == 0
    lines = [json.loads(line) for line in (tmp_path / "run.log").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3, 4]
    assert all(set(line) == {"step", "time", "seconds", "outputs"} and line["outputs"]["loss"] > 0 for line in lines)
    r = roam("train", step / "step.onnx", "--plan", step / "plan.json", "--log", tmp_path / "no.log", "--steps", 0)
    assert r.code == 2 and not (tmp_path / "no.log").exists()  # refused before its first step: no file
