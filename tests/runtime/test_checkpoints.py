"""`roam train --checkpoint-dir --resume`: a run killed at any moment and resumed ends bit for bit
where a run never interrupted does; corrupt, partial and foreign checkpoints, and a full disk."""

import errno
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import SAMPLE, roam

from roam_cli.core.errors import CheckFailed
from roam_cli.runtime import checkpoints


EXPORT = SAMPLE.parent / "model.onnx"


@pytest.fixture(scope="module")
def step(tmp_path_factory):
    """The README sample's inference export made a full step (standard ONNX, no random op), planned."""
    d = tmp_path_factory.mktemp("step")
    r = roam("make-training-graph", EXPORT, "-o", d / "step.onnx", "--loss", "cross-entropy", "--in-graph-optimizer",
             "--dim", "batch=2")
    assert r.code == 0, r.err
    assert roam("optimize", d / "step.onnx", "-o", d / "plan.json").code == 0
    return d


def train(step, *args):
    return roam("train", step / "step.onnx", "--plan", step / "plan.json", *map(str, args))


def weights(path) -> dict:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def bit_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)


@pytest.fixture(scope="module")
def uninterrupted(step, tmp_path_factory):
    """The state after 1 to 12 steps of a run never interrupted: its checkpoints (one per step)."""
    d = tmp_path_factory.mktemp("whole")
    r = train(step, "--steps", 12, "--checkpoint-dir", d, "--checkpoint-every", 1, "--checkpoint-keep", 12)
    assert r.code == 0, r.err
    return {k: weights(d / f"step-{k}" / "rank0.npz") for k in range(1, 13)}


def test_a_run_resumed_from_its_checkpoint_ends_as_one_never_interrupted(step, uninterrupted, tmp_path):
    assert train(step, "--steps", 5, "--checkpoint-dir", tmp_path, "--checkpoint-every", 2).code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2", "step-4", "step-5"]  # every 2, and the last
    r = train(step, "--steps", 9, "--checkpoint-dir", tmp_path, "--checkpoint-every", 2, "--resume", "--json")
    assert r.code == 0, r.err
    assert r.json()["resumed"]["step"] == 5 and [s["step"] for s in r.json()["per_step"]] == [6, 7, 8, 9]
    assert bit_equal(weights(tmp_path / "step-9" / "rank0.npz"), uninterrupted[9])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-5", "step-6", "step-8", "step-9"][-3:]  # keep 3


def test_a_run_killed_at_random_moments_and_resumed_each_time_ends_bit_equal(step, uninterrupted, tmp_path):
    """SIGKILL at five moments (some inside a checkpoint's write: one every step), each time resumed."""
    rng = np.random.default_rng(4)
    argv = [sys.executable, "-m", "roam_cli", "train", step / "step.onnx", "--plan", step / "plan.json", "--steps", 12,
            "--checkpoint-dir", tmp_path, "--checkpoint-every", 1, "--resume"]
    for _ in range(5):
        proc = subprocess.Popen(list(map(str, argv)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(rng.uniform(1.0, 2.5))  # after the imports (about 1 s): the steps and their checkpoints
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert train(step, *argv[7:]).code == 0
    done = sorted(int(p.name[5:]) for p in tmp_path.iterdir() if p.name.startswith("step-"))
    assert done[-1] == 12 and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert bit_equal(weights(tmp_path / "step-12" / "rank0.npz"), uninterrupted[12])


def test_a_corrupt_or_partial_newest_checkpoint_is_passed_over_and_said(step, uninterrupted, tmp_path):
    assert train(step, "--steps", 6, "--checkpoint-dir", tmp_path, "--checkpoint-every", 2).code == 0
    state = tmp_path / "step-6" / "rank0.npz"
    state.write_bytes(state.read_bytes()[:-100])  # truncated
    (tmp_path / "step-7").mkdir()  # a folder without its manifest: a write that never finished
    (tmp_path / ".step-8.part").mkdir()  # one being written when the process died
    r = train(step, "--steps", 8, "--checkpoint-dir", tmp_path, "--checkpoint-every", 2, "--resume")
    assert r.code == 0, r.err
    assert f"resumed from {tmp_path / 'step-4'} after step 4 (passed over: step-7 (its manifest:" in r.out
    assert "step-6 (rank0.npz does not match its checksum)" in r.out
    assert bit_equal(weights(tmp_path / "step-8" / "rank0.npz"), uninterrupted[8])


@pytest.mark.parametrize("change, said", [(("--seed", 1), "its run used --seed 0, this one 1"),
                                          (("--learning-rate", 0.5), None)])
def test_a_checkpoint_of_another_run_is_refused(step, tmp_path, change, said):
    assert train(step, "--steps", 2, "--checkpoint-dir", tmp_path).code == 0
    r = train(step, "--steps", 3, "--checkpoint-dir", tmp_path, "--resume", *change)
    if said is None:  # the learning rate is the option's, not the run's state: a schedule may change it
        assert r.code == 0, r.err
        return
    assert r.code == 2 and said in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_a_checkpoint_of_another_step_is_refused(step, tmp_path):
    assert train(step, "--steps", 2, "--checkpoint-dir", tmp_path).code == 0
    manifest = json.loads((tmp_path / "step-2" / "manifest.json").read_text())
    manifest["step_sha256"] = "0" * 64
    (tmp_path / "step-2" / "manifest.json").write_text(json.dumps(manifest))
    r = train(step, "--steps", 3, "--checkpoint-dir", tmp_path, "--resume")
    assert r.code == 2 and "is not of this run: it is of another step (sha256 000000000000..." in r.err, r.err


def test_a_full_disk_while_writing_leaves_the_previous_checkpoint_and_exits_1(tmp_path, monkeypatch):
    run = checkpoints.Run("a" * 64, 1, 0, None)
    checkpoints.write(tmp_path, 1, run, {"w": np.ones(3, np.float32)}, keep=3, inputs={})

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(np, "savez", full)
    with pytest.raises(CheckFailed, match=r"cannot write checkpoint .*step-2: No space left on device; step-1 is intact"):
        checkpoints.write(tmp_path, 2, run, {"w": np.zeros(3, np.float32)}, keep=3, inputs={})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-1"]
    found, passed = checkpoints.newest(tmp_path, run)
    assert found.step == 1 and np.array_equal(found.state({})["w"], np.ones(3, np.float32)) and passed == []


def test_a_step_with_dropout_resumed_is_said_not_to_be_bit_equal(tmp_path):
    """ONNX Runtime keeps a random op's generator inside its kernel: a resumed session starts it again."""
    assert roam("make-training-graph", SAMPLE, "-o", tmp_path / "step.onnx", "--in-graph-optimizer").code == 0
    assert roam("optimize", tmp_path / "step.onnx", "-o", tmp_path / "plan.json").code == 0
    run = ("train", tmp_path / "step.onnx", "--plan", tmp_path / "plan.json", "--checkpoint-dir", tmp_path / "ck")
    assert roam(*run, "--steps", 2).code == 0
    r = roam(*run, "--steps", 3, "--resume")
    assert r.code == 0 and "warning: the step has 7 random ops (Dropout): their random streams start again" in r.out, r.out


def test_resume_needs_the_folder_and_the_ranks_are_not_checkpointed_yet(step, tmp_path):
    r = train(step, "--resume")
    assert r.code == 2 and "--checkpoint-dir" in r.err
    (tmp_path / "file").write_text("")
    r = train(step, "--checkpoint-dir", tmp_path / "file")
    assert r.code == 2 and "not a directory" in r.err, r.err
