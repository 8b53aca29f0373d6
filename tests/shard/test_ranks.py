"""`roam train --ranks N`: a rank step on N processes over MPI (runtime/ranks.py, rank.py,
collectives.py, shards.py), on the hand-made linear step of tests/rank_steps.py.

The runs need MPI (pip install mpich mpi4py onnxruntime-extensions, the `mpi` extra): without it
they skip; the layout's arithmetic and the refusals made before any process starts run anyway."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import ROOT, roam
from rank_steps import expected_steps, linear_step

from roam_cli.core.collectives import SHARDING_KEY
from roam_cli.core.errors import RoamError
from roam_cli.frontend.providers import check_runs
from roam_cli.runtime import collectives, ranks, shards

MPI_MISSING = collectives.missing() or (None if ranks.mpiexec() else "no mpiexec")
needs_mpi = pytest.mark.skipif(MPI_MISSING is not None, reason=f"needs MPI ({MPI_MISSING}): {collectives.INSTALL}")

X = np.array([[1, 2, 0], [0, 1, -1], [2, 0, 1], [1, -1, 1]], np.float32)  # the global batch: 4 rows
Y = np.array([1, 0, 2, -1], np.float32)
W, C, LR = np.array([0.5, -0.25, 0.125], np.float32), np.array([0.25], np.float32), 0.05


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    """The rank steps of 2 and 4 ranks (2 and 1 rows each), their plans, and the global batch and weights."""
    d = tmp_path_factory.mktemp("ranks")
    np.savez(d / "inputs.npz", x=X, y=Y, w=W, c=C, learning_rate=np.float32(LR))
    for n in (2, 4):
        linear_step(d / f"rank{n}.onnx", len(Y) // n, n)
        r = roam("optimize", d / f"rank{n}.onnx", "-o", d / f"rank{n}.plan.json")
        assert r.code == 0, r.err
    return d


def test_a_shard_is_the_ranks_slice_of_the_flattened_padded_parameter():
    # 5 elements over 2 ranks: shards of ceil(5 / 2) = 3, the last one padded with a zero
    p = np.arange(1, 6, dtype=np.float32).reshape(5, 1)
    layout = shards.Sharding(2, {"p": ((5, 1), 3)}, {"p.m": "p"}, (), ("x",))
    assert layout.of_rank("p", p, 0).tolist() == [1, 2, 3]
    assert layout.full_shape("p.m", (3,)) == (5, 1) and layout.full_shape("x", (2, 7)) == (4, 7)
    assert layout.of_rank("p.m", p, 1).tolist() == [4, 5, 0]
    assert layout.of_rank("x", np.arange(8).reshape(4, 2), 1).tolist() == [[4, 5], [6, 7]]  # rows 2 and 3
    rank_shards = [np.array([1, 2, 3], np.float32), np.array([4, 5, 0], np.float32)]
    assert layout.whole("p", rank_shards).tolist() == [[1], [2], [3], [4], [5]]


def test_a_layout_whose_shards_are_not_ceil_numel_over_ranks_is_refused():
    bad = json.dumps({"ranks": 2, "parameters": {"p": {"shape": [5], "numel": 5, "shard": 2}}})
    with pytest.raises(RoamError, match="ceil"):
        shards.read({SHARDING_KEY: bad}, "step.onnx")


def test_without_mpi_the_run_is_refused_saying_what_to_install(steps, monkeypatch):
    monkeypatch.setattr(collectives, "missing", lambda: "mpi4py is not installed")
    plan = json.loads((steps / "rank2.plan.json").read_text())
    with pytest.raises(RoamError, match=r"mpi4py is not installed: pip install mpich mpi4py onnxruntime-extensions"):
        ranks.check(steps / "rank2.onnx", plan, 2)


def test_a_wrong_world_size_or_a_plan_for_another_layout_is_refused_in_one_line(steps, tmp_path):
    r = roam("train", steps / "rank2.onnx", "--plan", steps / "rank2.plan.json", "--ranks", 4)
    assert r.code == 2 and r.err.count("\n") == 1 and "--ranks 4, but" in r.err and "one of 2 ranks" in r.err
    plan = json.loads((steps / "rank2.plan.json").read_text())
    plan.setdefault("sharding", {})["ranks"] = 4
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    r = roam("train", steps / "rank2.onnx", "--plan", tmp_path / "plan.json", "--ranks", 2)
    assert r.code == 2 and r.err.count("\n") == 1 and "made for a layout of 4 ranks" in r.err
    r = roam("train", steps / "rank2.onnx", "--plan", steps / "rank2.plan.json")  # a rank step alone
    assert r.code == 2 and r.err.count("\n") == 1 and "--ranks 2" in r.err


def test_a_rank_step_in_one_process_is_refused_as_a_rank_step_not_as_ops_the_runtime_lacks(steps, tmp_path):
    """Its collectives run only over MPI, in any ONNX Runtime build: calibrating, executing or training
    it in one process is refused in one line naming the ranks and the command that runs it."""
    said = "rank2.onnx is a rank step of 2 ranks (roam shard): its collectives run under `roam train --ranks 2`"
    for args in (("optimize", steps / "rank2.onnx", "--workspace", "calibrate", "-o", tmp_path / "plan.json"),
                 ("execute", steps / "rank2.onnx", "--plan", steps / "rank2.plan.json"),
                 ("train", steps / "rank2.onnx", "--plan", steps / "rank2.plan.json")):
        r = roam(*args)
        assert r.code == 2 and r.err.count("\n") == 1 and said in r.err and "fused" not in r.err, (args, r.err)
    assert not (tmp_path / "plan.json").exists()
    bare = onnx.load(str(steps / "rank2.onnx"))
    del bare.metadata_props[:]  # collectives without the record of a layout
    with pytest.raises(RoamError, match=r"node 'w.gathered_node' is com.microsoft:AllGather, a collective, which runs"):
        check_runs(bare, "bare.onnx")


@needs_mpi
def test_the_plan_of_the_four_rank_step_is_refused_for_the_two_rank_one(steps, tmp_path):
    # refused by the launcher (a plan that records its layout) or by every rank (the pair check), which
    # then ends the others: one line either way, nothing written
    r = roam("train", steps / "rank2.onnx", "--plan", steps / "rank4.plan.json", "--ranks", 2,
             "--save-weights", tmp_path / "trained.npz")
    assert r.code == 2 and r.err.count("\n") == 1 and not (tmp_path / "trained.npz").exists(), r.err


@needs_mpi
def test_two_ranks_gather_and_reduce_scatter_by_hand(tmp_path):
    run = subprocess.run([ranks.mpiexec(), "-n", "2", sys.executable, str(ROOT / "tests" / "collective_values.py"),
                          str(tmp_path)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    got = [np.load(tmp_path / f"rank{r}.npz") for r in (0, 1)]
    for g in got:  # rank r gave a = [r+1, 10(r+1)] and m = [[r], [r+100]]
        assert g["gathered"].tolist() == [1, 10, 2, 20]
        assert g["gathered_columns"].tolist() == [[0, 1], [100, 101]]
    # b = [0, 1, 2, 3] * (r + 1): the sum over ranks is [0, 3, 6, 9], rank 0 holds its first half
    assert got[0]["sum"].tolist() == [0, 3] and got[1]["sum"].tolist() == [6, 9]
    assert got[0]["mean"].tolist() == [0, 1.5] and got[1]["mean"].tolist() == [3, 4.5]


@needs_mpi
@pytest.mark.parametrize("n", [2, 4])
def test_n_ranks_train_as_the_whole_step_does_every_request_at_its_plan_offset(steps, tmp_path, n):
    r = roam("train", steps / f"rank{n}.onnx", "--plan", steps / f"rank{n}.plan.json", "--ranks", n, "--steps", 3,
             "--inputs", steps / "inputs.npz", "--compare", "--save-weights", tmp_path / "trained.npz", "--json")
    assert r.code == 0, r.err
    result = r.json()
    losses, w, c = expected_steps(X, Y, W, C, LR, 3)
    assert losses[0] == pytest.approx(1.37109375)  # by hand: the residuals are [-0.75, 0, -1, 1.875]
    assert [s["outputs"]["loss"] for s in result["per_step"]] == pytest.approx(losses, rel=1e-6)
    trained = np.load(tmp_path / "trained.npz")
    np.testing.assert_allclose(trained["w"], w, rtol=1e-6)
    np.testing.assert_allclose(trained["c"], c, rtol=1e-6)
    assert result["compare"]["bit_equal"]
    for rank in result["per_rank"]:
        assert sorted(rank["collective_outputs"]["at_plan_offset"]) == sorted(rank["collective_outputs"]["planned"]) \
            == ["c.gathered", "c.grad.shard", "w.gathered", "w.grad.shard"]
    for step in result["per_step"][1:]:
        for m in step["memory"]:
            assert m["served_at_plan_offset"] == m["requests"] == m["planned_requests"] and m["unplanned"] == 0


@needs_mpi
def test_ranks_started_from_a_source_tree_import_the_roam_that_launched_them(steps, tmp_path):
    # a clone's root, where the README's set-up leaves a user: a `roam_cli` there that is not the
    # installed one (here one that cannot be imported) must not shadow it in the ranks
    (tmp_path / "roam_cli").mkdir()
    (tmp_path / "roam_cli" / "__init__.py").write_text("raise ImportError('the source tree, not the install')\n")
    launcher = Path(sys.executable).parent / "roam"  # the console script pip installed: no folder on its path
    proc = subprocess.run([launcher, "train", steps / "rank2.onnx", "--plan", steps / "rank2.plan.json", "--ranks", "2",
                           "--steps", "2", "--inputs", steps / "inputs.npz"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def start_long_run(steps, tmp_path, timeout, ranks=2, count=1000000):
    """A run of `count` steps, its run folder in tmp_path; returns (process, the folder) once every
    rank has finished 3 steps."""
    out = tmp_path / "trained.npz"
    proc = subprocess.Popen([sys.executable, "-m", "roam_cli", "train", steps / f"rank{ranks}.onnx", "--plan",
                             steps / f"rank{ranks}.plan.json", "--ranks", str(ranks), "--steps", str(count), "--timeout",
                             str(timeout),
                             "--save-weights", out], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        folders = list(tmp_path.glob("roam-ranks-*"))
        lines = [f.read_text().count("\n") for f in folders[0].glob("rank*.steps")] if folders else []
        if len(lines) == ranks and min(lines) >= 3:
            return proc, folders[0]
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    proc.kill()
    pytest.fail("the ranks did not start within 60 s")


def pids(folder: Path, ranks: int = 2) -> list[int]:
    return [json.loads((folder / f"rank{r}.status").read_text())["pid"] for r in range(ranks)]


def gone(pid: int) -> bool:
    """The process has ended: no such process, or one dead and not yet reaped (a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2] == "Z"


@needs_mpi
def test_a_rank_killed_during_a_step_ends_every_rank_naming_it(steps, tmp_path):
    proc, folder = start_long_run(steps, tmp_path, timeout=30)
    ids = pids(folder)
    killed = time.monotonic()
    os.kill(ids[1], signal.SIGKILL)
    err = proc.communicate(timeout=30)[1]
    seconds = time.monotonic() - killed
    assert proc.returncode == 1 and err.count("\n") == 1, err
    assert err.startswith("roam: rank 1 died in step ") and "killed by signal 9" in err
    assert seconds < 30 and all(gone(pid) for pid in ids)
    assert not (tmp_path / "trained.npz").exists() and not folder.exists()


@needs_mpi
@pytest.mark.slow  # 4 ranks on a loaded machine: under two CPU hogs, 2 of about 22 kills were named wrong
@pytest.mark.parametrize("killed", [2, 3])
def test_of_four_ranks_the_one_killed_is_named_from_the_launchers_record(steps, tmp_path, killed):
    proc, folder = start_long_run(steps, tmp_path, timeout=30, ranks=4)
    ids = pids(folder, 4)
    os.kill(ids[killed], signal.SIGKILL)
    err = proc.communicate(timeout=30)[1]
    assert proc.returncode == 1 and err.startswith(f"roam: rank {killed} died in step ") and err.count("\n") == 1, err
    assert all(gone(pid) for pid in ids) and not folder.exists()


@needs_mpi
@pytest.mark.parametrize("stop, said", [(signal.SIGKILL, "mpiexec was killed by signal 9"),
                                        pytest.param(signal.SIGSTOP, "mpiexec is stopped (SIGSTOP",
                                                     marks=pytest.mark.slow)])
def test_mpiexec_killed_or_stopped_is_said_as_such(steps, tmp_path, stop, said):
    # stopped, mpiexec leaves its ranks training: the run is stopped once mpiexec was so for the timeout
    # (2 s), long before the ranks' millionth step
    proc, folder = start_long_run(steps, tmp_path, timeout=2)
    ids = pids(folder)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    mpiexec = next(int(c) for c in children if b"mpiexec" in Path(f"/proc/{c}/cmdline").read_bytes())
    os.kill(mpiexec, stop)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 1 and err.startswith(f"roam: {said}") and err.count("\n") == 1, err
    assert all(gone(pid) for pid in ids) and not folder.exists()


@needs_mpi
def test_a_hung_rank_is_named_and_every_rank_ended_at_the_timeout(steps, tmp_path):
    proc, folder = start_long_run(steps, tmp_path, timeout=3)
    ids = pids(folder)
    stopped = time.monotonic()
    os.kill(ids[0], signal.SIGSTOP)  # alive, but never again at a collective
    err = proc.communicate(timeout=60)[1]
    seconds = time.monotonic() - stopped
    assert proc.returncode == 1 and err.count("\n") == 1, err
    assert err.startswith("roam: rank 0 hung in step ") and "timeout (3 s)" in err
    assert 3 <= seconds < 10 and all(gone(pid) for pid in ids)
    assert not (tmp_path / "trained.npz").exists() and not folder.exists()


@needs_mpi
@pytest.mark.parametrize("stop, said, code", [(signal.SIGINT, "interrupted", 130), (signal.SIGTERM, "terminated", 143)])
def test_the_launcher_stopped_ends_every_rank_says_so_and_leaves_nothing(steps, tmp_path, stop, said, code):
    proc, folder = start_long_run(steps, tmp_path, timeout=30)
    ids = pids(folder)
    proc.send_signal(stop)
    err = proc.communicate(timeout=30)[1]
    assert (proc.returncode, err) == (code, f"roam: {said}\n")
    assert all(gone(pid) for pid in ids) and not folder.exists() and not (tmp_path / "trained.npz").exists()


@pytest.mark.parametrize("start_s", [ranks.START_S, 5.0])
def test_a_rank_starting_is_given_the_start_timeout_not_the_step_timeout(tmp_path, start_s):
    """Opening a large rank's session may take longer than a step's timeout: while starting, only a
    rank silent for the start timeout (START_S by default, --start-timeout) is hung (here rank 1,
    its heartbeat that + 1 s old)."""
    run = ranks.Run(tmp_path, 2, 10, timeout=3, start_timeout=start_s)
    assert run.start_hang(seconds=start_s - 1) == (True, None)  # nobody reported yet, within the start timeout
    starting, blame = run.start_hang(seconds=start_s + 1)
    assert starting and blame == f"rank 0 hung while starting (it never reported in {start_s:g} s; --start-timeout)"
    now = time.time()
    for r, (phase, age) in enumerate([("planned", 0), ("start", start_s / 2)]):
        (tmp_path / f"rank{r}.status").write_text(json.dumps({"pid": 1, "time": now - age, "phase": phase,
                                                              "entered": 0, "left": 0}))
    assert run.start_hang(seconds=200) == (True, None)  # rank 1 silent for half of it: a long call, not a hang
    (tmp_path / "rank1.status").write_text(json.dumps({"pid": 1, "time": now - start_s - 1, "phase": "start",
                                                       "entered": 0, "left": 0}))
    starting, blame = run.start_hang(seconds=200)
    assert starting and blame.startswith("rank 1 hung while starting (no heartbeat for " + f"{start_s + 1:.0f}.")
    (tmp_path / "rank1.status").write_text(json.dumps({"pid": 1, "time": now, "phase": "planned", "entered": 0,
                                                       "left": 0}))
    assert run.start_hang(seconds=200) == (False, None)  # every rank started: the step timeout counts now


def test_of_two_silent_ranks_the_stopped_one_is_blamed_though_the_other_is_silent_longer(tmp_path):
    """A rank blocked inside MPI (MPI_Init holds the interpreter) waiting for a stopped one stops
    beating too, and may have stopped first: the stopped process is the one to name."""
    stopped = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        while ranks.process_state(stopped.pid) not in ("T", "t"):
            time.sleep(0.01)
        run = ranks.Run(tmp_path, 2, 10, timeout=3, start_timeout=5)
        now = time.time()
        for r, (pid, age) in enumerate([(os.getpid(), 9), (stopped.pid, 6)]):
            (tmp_path / f"rank{r}.status").write_text(json.dumps({"pid": pid, "time": now - age, "phase": "start",
                                                                  "entered": 0, "left": 0}))
        assert run.start_hang(seconds=200)[1].startswith("rank 1 hung while starting (no heartbeat for 6.")
        (tmp_path / "rank1.status").write_text(json.dumps({"pid": stopped.pid, "time": now - 2, "phase": "start",
                                                           "entered": 0, "left": 0}))
        # stopped after rank 0 went quiet inside MPI_Init: not silent long enough yet, still the one named
        assert run.start_hang(seconds=200)[1].startswith("rank 1 hung while starting (no heartbeat for 2.")
        (tmp_path / "rank1.status").write_text(json.dumps({"pid": stopped.pid, "time": now - 6, "phase": "start",
                                                           "entered": 0, "left": 0}))
        (tmp_path / "rank0.status").unlink()  # rank 0 never reported, waiting for the stopped one: rank 1 named
        assert run.start_hang(seconds=200)[1].startswith("rank 1 hung while starting (stopped; no heartbeat for 6.")
        (tmp_path / "rank0.status").write_text(json.dumps({"pid": os.getpid(), "time": now - 9, "phase": "start",
                                                           "entered": 0, "left": 0}))
        os.kill(stopped.pid, signal.SIGCONT)
        while ranks.process_state(stopped.pid) in ("T", "t"):
            time.sleep(0.01)
        assert run.start_hang(seconds=200)[1].startswith("rank 0 hung while starting (no heartbeat for 9.")
    finally:
        stopped.kill()
        stopped.wait()
