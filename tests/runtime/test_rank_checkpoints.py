"""`roam train --ranks N --checkpoint-dir`: each rank writes its part; a checkpoint of N ranks resumes
on M ranks and on one process (re-sharded on load), a single process's on N ranks; `--restarts`
starts a group that lost a rank again from its newest checkpoint and ends as a run never interrupted.

The whole step is the README sample's export at a global batch of 4 sequences: 4 ranks of 1 row
(`rank4`, sharded from the step of batch 1), 2 ranks of 2 (`rank2`, from batch 2), one process
(`step4`)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import SAMPLE, roam

from roam_cli.runtime import collectives, ranks

EXPORT = SAMPLE.parent / "model.onnx"
MPI_MISSING = collectives.missing() or (None if ranks.mpiexec() else "no mpiexec")
pytestmark = pytest.mark.skipif(MPI_MISSING is not None, reason=f"needs MPI ({MPI_MISSING}): {collectives.INSTALL}")
NOISE = 1e-6  # float32 sums in another order: the measured differences are 7e-8 and 1e-7 relative


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    d = tmp_path_factory.mktemp("rank-checkpoints")
    for batch in (1, 2, 4):
        r = roam("make-training-graph", EXPORT, "-o", d / f"step{batch}.onnx", "--loss", "cross-entropy",
                 "--in-graph-optimizer", "--dim", f"batch={batch}")
        assert r.code == 0, r.err
    for n, batch in ((4, 1), (2, 2)):
        assert roam("shard", d / f"step{batch}.onnx", "--ranks", n, "-o", d / f"rank{n}.onnx").code == 0
    for name in ("rank4", "rank2", "step4", "step2"):
        r = roam("optimize", d / f"{name}.onnx", "-o", d / f"{name}.plan.json")
        assert r.code == 0, r.err
    return d


def train(steps, name, *args):
    argv = ["train", steps / f"{name}.onnx", "--plan", steps / f"{name}.plan.json"]
    if name.startswith("rank"):
        argv += ["--ranks", name[4:]]
    return roam(*argv, *map(str, args))


def loaded(path) -> dict:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def relative(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float(np.max(np.abs(a[k] - b[k])) / np.max(np.abs(a[k]))) for k in a)


@pytest.fixture(scope="module")
def uninterrupted(steps, tmp_path_factory):
    """6 steps on 4 ranks, a checkpoint after step 3: (its folder, the trained weights, the losses)."""
    d = tmp_path_factory.mktemp("uninterrupted")
    r = train(steps, "rank4", "--steps", 6, "--checkpoint-dir", d / "ck", "--checkpoint-every", 3,
              "--save-weights", d / "trained.npz", "--json")
    assert r.code == 0, r.err
    manifest = json.loads((d / "ck" / "step-3" / "manifest.json").read_text())
    assert manifest["ranks"] == 4 and [p["file"] for p in manifest["parts"]] == [f"rank{r}.npz" for r in range(4)]
    # each rank's part holds its shard: a 64 x 64 position table is 4,096 elements, 1,024 a rank
    with np.load(d / "ck" / "step-3" / "rank2.npz") as part:
        assert part["transformer.wpe.weight"].shape == (1024,)
    assert manifest["sharded"]["transformer.wpe.weight"] == [64, 64]
    return d, loaded(d / "trained.npz"), [s["outputs"]["loss"] for s in r.json()["per_step"]]


@pytest.mark.parametrize("name", ["rank2", "step4"])
def test_a_four_rank_checkpoint_resumes_on_two_ranks_and_on_one_process(steps, uninterrupted, tmp_path, name):
    d, trained, losses = uninterrupted
    shutil.copytree(d / "ck" / "step-3", tmp_path / "ck" / "step-3")
    r = train(steps, name, "--steps", 6, "--checkpoint-dir", tmp_path / "ck", "--resume", "--save-weights",
              tmp_path / "trained.npz", "--json")
    assert r.code == 0, r.err
    result = r.json()
    assert result["resumed"]["step"] == 3 and result["resumed"]["ranks"] == 4
    assert [s["step"] for s in result["per_step"]] == [4, 5, 6]
    assert [s["outputs"]["loss"] for s in result["per_step"]] == pytest.approx(losses[3:], rel=NOISE)
    assert relative(trained, loaded(tmp_path / "trained.npz")) < NOISE


def test_a_single_process_checkpoint_resumes_on_two_ranks(steps, uninterrupted, tmp_path):
    _, trained, _ = uninterrupted
    assert train(steps, "step4", "--steps", 3, "--checkpoint-dir", tmp_path / "ck").code == 0
    r = train(steps, "rank2", "--steps", 6, "--checkpoint-dir", tmp_path / "ck", "--resume", "--save-weights",
              tmp_path / "trained.npz")
    assert r.code == 0, r.err
    assert f"resumed from {tmp_path / 'ck' / 'step-3'} after step 3" in r.out
    assert relative(trained, loaded(tmp_path / "trained.npz")) < NOISE


def test_a_checkpoint_of_another_global_batch_is_refused(steps, uninterrupted, tmp_path):
    """Two sequences a step on one process are not the four of the 4-rank run: another run."""
    shutil.copytree(uninterrupted[0] / "ck" / "step-3", tmp_path / "ck" / "step-3")
    r = train(steps, "step2", "--steps", 6, "--checkpoint-dir", tmp_path / "ck", "--resume")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    assert "is not of this run: its input 'input_ids' was <i8 [4, 32], this run's is <i8 [2, 32]" in r.err


def test_restarts_need_ranks_and_checkpoints(steps, tmp_path):
    r = train(steps, "rank2", "--steps", 2, "--restarts", 1)
    assert r.code == 2 and "--restarts starts the ranks again from their newest checkpoint: name --checkpoint-dir" in r.err
    r = train(steps, "step4", "--steps", 2, "--checkpoint-dir", tmp_path / "ck", "--restarts", 1)
    assert r.code == 2 and "--restarts starts a group of --ranks again" in r.err
    assert not (tmp_path / "ck").exists()


def killed_and_restarted(steps, tmp_path, kills: int, seed: int) -> tuple[str, dict]:
    """A 30-step run on 4 ranks, a checkpoint every 2 steps, `--restarts kills`; a random rank of 1–3
    SIGKILLed `kills` times, each once there is a checkpoint, at a random moment of a step or of a
    checkpoint's write. Returns
    its output and its trained weights."""
    rng = np.random.default_rng(seed)
    proc = subprocess.Popen([sys.executable, "-m", "roam_cli", "train", steps / "rank4.onnx", "--plan",
                             steps / "rank4.plan.json", "--ranks", "4", "--steps", "30", "--checkpoint-dir",
                             tmp_path / "ck", "--checkpoint-every", "2", "--restarts", str(kills), "--save-weights",
                             tmp_path / "trained.npz"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    for _ in range(kills):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the ranks of this start past their first step, a checkpoint made
            folders = list(tmp_path.glob("roam-ranks-*"))
            lines = [f.read_text().count("\n") for f in folders[0].glob("rank*.steps")] if folders else []
            if len(lines) == 4 and min(lines) >= 1 and list(tmp_path.glob("ck/step-*")):
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        time.sleep(rng.uniform(0, 0.2))
        status = json.loads((folders[0] / f"rank{rng.integers(1, 4)}.status").read_text())
        os.kill(status["pid"], signal.SIGKILL)
        while folders[0].exists():  # this group ended: the next kill is of the restarted one
            time.sleep(0.02)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return out, loaded(tmp_path / "trained.npz")


@pytest.fixture(scope="module")
def thirty_steps(steps, tmp_path_factory):
    d = tmp_path_factory.mktemp("thirty")
    assert train(steps, "rank4", "--steps", 30, "--save-weights", d / "trained.npz").code == 0
    return loaded(d / "trained.npz")


def test_a_rank_killed_under_restarts_starts_the_group_again_and_ends_bit_equal(steps, thirty_steps, tmp_path):
    out, trained = killed_and_restarted(steps, tmp_path, kills=1, seed=1)
    assert "died" in out and "every rank was stopped; restart 1 of 1" in out and "resumed from" in out
    assert all(trained[k].tobytes() == thirty_steps[k].tobytes() for k in thirty_steps)
    assert not list(tmp_path.glob("ck/.step-*")) and not list(tmp_path.glob("roam-*"))


@pytest.mark.slow
def test_ranks_killed_at_five_random_moments_under_restarts_end_bit_equal(steps, thirty_steps, tmp_path):
    out, trained = killed_and_restarted(steps, tmp_path, kills=5, seed=5)
    assert out.count("every rank was stopped; restart ") == 5
    assert all(trained[k].tobytes() == thirty_steps[k].tobytes() for k in thirty_steps)
