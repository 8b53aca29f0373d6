"""Faults: a MILP solver that is missing, killed, hung, or lying; Ctrl-C; failing writes.

Whatever CBC does, roam falls back to the best heuristic result, exits 0 with a valid plan and
says what happened. The faults are real processes: a fake `cbc` executable stands in for PuLP's
bundled one (`pulp.PULP_CBC_CMD.pulp_cbc_path`, which both the ordering and the layout ILPs run)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pulp
import pytest
from conftest import SAMPLE
from onnx_builder import model, node, save
from small_models import small_training_step
from test_hostile import main_in_process

from roam_cli import pipeline
from roam_cli.core import fileio
from roam_cli.core.errors import RoamError
from roam_cli.frontend.onnx_import import import_model
from roam_cli.layout.ilp import solve_ilp
from roam_cli.verify import verify

# Shell scripts that behave like a broken CBC. Every one is called with CBC's arguments:
# MODEL.mps ... -solution FILE.
FAKE_CBC = {
    "killed": "kill -9 $$",
    "crashes": "echo 'cbc: internal error' >&2; exit 3",
    "hangs": "while :; do sleep 1; done",  # ignores its -sec limit, as CBC sometimes does
    "infeasible": 'while [ $# -gt 0 ]; do [ "$1" = -solution ] && echo "Infeasible - objective value 0" > "$2"; '
                  "shift; done",
    # claims an optimum and gives every column the value 7
    "lies": 'mps=$1; while [ $# -gt 0 ]; do if [ "$1" = -solution ]; then '
            'echo "Optimal - objective value 0" > "$2"; '
            "awk '/^COLUMNS/{c=1;next} /^RHS/{c=0} c && $1 != \"MARKER\" {print $1}' \"$mps\" | sort -u | "
            "awk '{print NR-1, $1, 7, 0}' >> \"$2\"; fi; shift; done",
}
FAULTS = ["missing", *FAKE_CBC]
FAILURE_WORDS = ("fail", "error", "not available", "not found", "missing", "killed", "infeasible")


def write_fake_cbc(folder: Path, fault: str) -> Path:
    """The fake's path (absent for "missing"); each call appends a line to `<path>.calls`."""
    path = folder / "cbc-bin" / fault
    if fault != "missing":
        path.parent.mkdir(exist_ok=True)
        path.write_text(f'#!/bin/sh\necho call >> "$0.calls"\n{FAKE_CBC[fault]}\n')
        path.chmod(0o755)
    return path


def calls(fake: Path) -> int:
    record = fake.with_name(fake.name + ".calls")
    return len(record.read_text().splitlines()) if record.exists() else 0


def install_fake_cbc(monkeypatch, tmp_path: Path, fault: str) -> Path:
    path = write_fake_cbc(tmp_path, fault)
    monkeypatch.setattr(pulp.PULP_CBC_CMD, "pulp_cbc_path", str(path))
    return path


def failure_noted(stats: dict) -> bool:
    text = json.dumps(stats).lower()
    return any(word in text for word in FAILURE_WORDS)


def wide_model(width: int = 24):
    """`width` independent branches: the ordering leaf is too wide to enumerate, so the roam
    strategy hands it to the ILP."""
    nodes = []
    for k in range(width):
        nodes += [node("Relu", ["x"], [f"a{k}"]), node("Mul", [f"a{k}", f"a{k}"], [f"b{k}"]),
                  node("ReduceSum", [f"b{k}"], [f"s{k}"], keepdims=0)]
    nodes.append(node("Sum", [f"s{k}" for k in range(width)], ["total"]))
    return model(nodes, [("x", [1024])], [("total", [])])


def plan_with(path: Path, order_strategy: str, time_limit: float = 10) -> dict:
    result = pipeline.run(path, path.with_suffix(".json"),
                          pipeline.Options(order=order_strategy, layout="first-fit", time_limit=time_limit))
    verify(result.imported.graph, result.imported.sha256, result.plan)
    return result.plan


def running(fake: Path) -> list[int]:
    """Processes running the fake (a CBC left behind holds a CPU until its own limit)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if str(fake) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(pid))
        except OSError:
            continue
    return pids


# ---- the ordering ILP -------------------------------------------------------------------------

@pytest.mark.parametrize("fault", FAULTS)
def test_global_ilp_order_falls_back_to_the_original_order(monkeypatch, tmp_path, fault):
    path = Path(save(small_training_step(), tmp_path / "m.onnx"))
    original = plan_with(path, "original")
    fake = install_fake_cbc(monkeypatch, tmp_path, fault)
    plan = plan_with(path, "ilp-global", time_limit=4)  # a hung CBC is stopped at 2 s, the order's half
    assert plan["order"] == original["order"]  # the ILP's warm start
    assert plan["stats"]["order"]["status"] != "optimal"
    assert fault == "missing" or calls(fake) == 1
    assert running(fake) == []


@pytest.mark.parametrize("fault", ["missing", "killed", "lies"])
def test_roam_order_needs_no_solver(monkeypatch, tmp_path, fault):
    # the leaves are the down-set search's: a broken CBC changes nothing and is never started
    path = Path(save(wide_model(), tmp_path / "m.onnx"))
    healthy = plan_with(path, "roam", time_limit=60)
    fake = install_fake_cbc(monkeypatch, tmp_path, fault)
    plan = plan_with(path, "roam", time_limit=60)
    assert fault == "missing" or calls(fake) == 0
    assert plan["order"] == healthy["order"]
    assert plan["peak_live_bytes"] <= min(b["peak_live_bytes"] for b in plan["stats"]["order"]["baselines"])


@pytest.mark.parametrize("fault", ["killed", "infeasible"])
def test_order_stats_say_the_solver_failed(monkeypatch, tmp_path, fault):
    path = Path(save(small_training_step(), tmp_path / "m.onnx"))
    install_fake_cbc(monkeypatch, tmp_path, fault)
    assert failure_noted(plan_with(path, "ilp-global")["stats"]["order"])


# ---- the layout ILP ---------------------------------------------------------------------------

BUFFERS = [(0, 3, 512), (1, 4, 256), (2, 5, 768), (0, 2, 256), (3, 6, 512), (1, 6, 256)]
WARM = [0, 512, 768, 1536, 0, 1536]  # a valid layout 1792 bytes high


@pytest.mark.parametrize("fault", [f for f in FAULTS if f != "hangs"])
def test_layout_ilp_reports_solver_faults_and_keeps_the_incumbent(monkeypatch, tmp_path, fault):
    fake = install_fake_cbc(monkeypatch, tmp_path, fault)
    offsets, info = solve_ilp(BUFFERS, upper=1792, lower=0, warm=WARM, time_limit=2)
    assert offsets is None and failure_noted(info), info
    assert fault == "missing" or calls(fake) == 1


def test_layout_ilp_does_not_wait_for_a_hung_solver(monkeypatch, tmp_path):
    fake = install_fake_cbc(monkeypatch, tmp_path, "hangs")
    done = []
    worker = threading.Thread(target=lambda: done.append(solve_ilp(BUFFERS, upper=1792, lower=0, warm=WARM,
                                                                   time_limit=1)), daemon=True)
    worker.start()
    worker.join(timeout=5)  # the limit (1 s) plus a grace: generous for a loaded machine
    hung = worker.is_alive()
    for pid in running(fake):  # release the thread: end our own fake
        os.kill(pid, signal.SIGKILL)
    worker.join(timeout=5)
    assert not hung


# ---- the command line ------------------------------------------------------------------------

def roam_with_fake_cbc(fake: Path, *args) -> subprocess.CompletedProcess:
    """`roam ARGS` in a real process whose PuLP runs `fake` as CBC."""
    code = ("import sys, pulp; pulp.PULP_CBC_CMD.pulp_cbc_path = sys.argv[1]; sys.argv[1:2] = []; "
            "from roam_cli.cli import main; main()")
    return subprocess.run([sys.executable, "-c", code, str(fake), *map(str, args)], capture_output=True, text=True)


@pytest.mark.parametrize("fault", ["missing", "killed"])
def test_cli_exits_0_with_a_valid_plan_when_cbc_fails(tmp_path, fault):
    path = Path(save(small_training_step(), tmp_path / "m.onnx"))
    fake = write_fake_cbc(tmp_path, fault)
    proc = roam_with_fake_cbc(fake, "optimize", path, "-o", tmp_path / "plan.json", "--order", "ilp-global",
                              "--time-limit", 10)
    assert proc.returncode == 0, proc.stderr
    assert fault == "missing" or calls(fake) == 1
    imported = import_model(path)
    verify(imported.graph, imported.sha256, json.loads((tmp_path / "plan.json").read_text()))
    report = subprocess.run([sys.executable, "-m", "roam_cli", "report", tmp_path / "plan.json"], capture_output=True,
                            text=True, env={**os.environ, "COLUMNS": "200"})
    assert "fell back" in report.stdout and "order: cbc failed" in report.stdout, report.stdout


# ---- Ctrl-C ----------------------------------------------------------------------------------

def group(pgid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every process running in process group `pgid` (not one that has
    ended and waits to be reaped: a zombie runs nothing, and init reaps it when it gets to it)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append((int(pid), Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")))
        except (OSError, ValueError, IndexError):
            continue
    return found


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """`roam optimize` interrupted with Ctrl-C (SIGINT to its process group, as a terminal sends
    it) as soon as CBC runs on the global ILP of a wide graph, which runs for minutes. Returns (process, stderr, output folder, processes in the group
    before the interrupt, processes left in it a moment after roam exited)."""
    d = tmp_path_factory.mktemp("ctrl-c")
    path = Path(save(wide_model(), d / "m.onnx"))
    out = d / "out"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "roam_cli", "optimize", path, "-o", out / "plan.json",
                             "--annotated-model", out / "m.onnx", "--order", "ilp-global", "--jobs", "1",
                             "--time-limit", "600"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            # as a foreground job gets it: a shell starts background jobs (and so a CI
                            # runner may start pytest) with SIGINT ignored, which the child would inherit
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not any("cbc" in c for _, c in group(proc.pid)) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    before = group(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    time.sleep(1.0)
    left = group(proc.pid)
    for pid, _ in left:  # our own process group: leave no CBC running
        os.kill(pid, signal.SIGKILL)
    return proc, stderr, out, before, left


def test_ctrl_c_exits_130_with_one_line_and_no_output(interrupted):
    proc, stderr, out, before, _ = interrupted
    assert any("cbc" in c for _, c in before), "CBC never started"
    assert proc.returncode == 130, stderr
    assert [line for line in stderr.splitlines() if line.strip()] == ["roam: interrupted"]
    assert list(out.iterdir()) == []  # no plan, no annotated model, no temporary file


def test_ctrl_c_leaves_no_solver_running(interrupted):
    assert interrupted[4] == []


def test_ctrl_c_while_the_modules_load_is_one_line_and_exit_130():
    """The interrupt lands while `roam_cli.cli` imports rich (a real terminal's Ctrl-C in the
    first second)."""
    code = ("import sys\n"
            "class Interrupt:\n"
            "    def find_spec(self, name, *args):\n"
            "        if name == 'rich':\n"
            "            raise KeyboardInterrupt\n"
            "sys.meta_path.insert(0, Interrupt())\n"
            "sys.argv = ['roam', '--help']\n"
            "from roam_cli.__main__ import main\n"
            "main()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (proc.returncode, proc.stderr) == (130, "roam: interrupted\n")


def test_a_sigterm_that_an_import_turned_into_an_import_error_is_a_termination(tmp_path):
    """A signal while a C extension initialises reaches roam as an ImportError ("initialization
    failed") raised from roam's Stopped: that is the signal, not an internal error."""
    code = ("import signal, sys\n"
            "from roam_cli.core.errors import Stopped\n"
            "class Terminate:\n"
            "    def find_spec(self, name, *args):\n"
            "        if name == 'roam_cli.gradcheck':\n"
            "            try:\n"
            "                raise Stopped(signal.SIGTERM)\n"
            "            except Stopped as e:\n"
            "                raise ImportError('initialization failed') from e\n"
            "sys.meta_path.insert(0, Terminate())\n"
            f"sys.argv = ['roam', 'gradcheck', {str(SAMPLE)!r}]\n"
            "from roam_cli.__main__ import main\n"
            "main()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (proc.returncode, proc.stderr) == (143, "roam: terminated\n")


# ---- output safety ---------------------------------------------------------------------------

def test_an_interrupt_while_writing_leaves_every_output_as_it_was(monkeypatch, tmp_path):
    plan, annotated = tmp_path / "plan.json", tmp_path / "m.onnx"
    plan.write_text("old plan")
    real_fdopen = os.fdopen
    opened = []

    def fdopen(fd, *args, **kwargs):  # Ctrl-C while the second file is being written
        opened.append(fd)
        if len(opened) == 2:
            raise KeyboardInterrupt
        return real_fdopen(fd, *args, **kwargs)

    monkeypatch.setattr(os, "fdopen", fdopen)
    with pytest.raises(KeyboardInterrupt):
        fileio.write_all_atomic({annotated: b"new model", plan: "new plan"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]
    assert plan.read_text() == "old plan"


def test_a_full_disk_is_one_line_and_leaves_the_old_file(monkeypatch, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text("old plan")

    class FullDisk:
        def __init__(self, fd, mode):
            os.close(fd)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def write(self, data):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fdopen", FullDisk)
    with pytest.raises(RoamError, match="cannot write .*plan.json: No space left on device"):
        fileio.write_atomic(plan, "new plan")
    assert plan.read_text() == "old plan" and [p.name for p in tmp_path.iterdir()] == ["plan.json"]


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_outputs_get_the_mode_a_new_file_gets_under_the_umask(tmp_path, umask, mode):
    """Not mkstemp's 0600: a plan is as readable as any file the user makes. The umask is set
    before roam is imported, in a process of its own."""
    script = (f"import os; os.umask({umask:#o}); from roam_cli.core import fileio; "
              f"fileio.write_atomic({str(tmp_path / 'plan.json')!r}, '{{}}')")
    subprocess.run([sys.executable, "-c", script], check=True)
    assert (tmp_path / "plan.json").stat().st_mode & 0o777 == mode


def test_output_that_is_a_link_to_the_input_is_refused(tmp_path):
    path = Path(save(small_training_step(), tmp_path / "m.onnx"))
    original = path.read_bytes()
    (tmp_path / "symlink.json").symlink_to(path)
    os.link(path, tmp_path / "hardlink.json")
    for out in ("symlink.json", "hardlink.json"):
        code, err = main_in_process(["optimize", str(path), "-o", str(tmp_path / out)])
        assert code == 2 and "same file as input" in err, err
    code, err = main_in_process(["optimize", str(path), "-o", str(tmp_path / "plan.json"),
                                 "--annotated-model", str(tmp_path / "hardlink.json")])
    assert code == 2 and "same file as input" in err
    code, err = main_in_process(["optimize", str(path), "-o", str(tmp_path / "plan.json"),
                                 "--annotated-model", str(tmp_path / "plan.json")])
    assert code == 2 and "same file as output" in err and "--annotated-model" not in err, err
    assert path.read_bytes() == original and not (tmp_path / "plan.json").exists()


def test_a_worker_forked_under_roam_s_signal_handlers_ends_at_once_when_terminated():
    """A solver's forked worker, terminated by its parent (SIGTERM) while it feeds a queue: it must
    die at once, as it did before roam handled SIGTERM — raising inside the queue's lock left it
    waiting at its exit for ever, and `optimize --jobs 2` with it."""
    code = ("import multiprocessing as mp, os, signal, time\n"
            "from roam_cli.cli import stopper\n"
            "handler = stopper(os.getpid())\n"
            "signal.signal(signal.SIGINT, handler); signal.signal(signal.SIGTERM, handler)\n"
            "def work(q):\n"
            "    while True:\n"
            "        q.put(b'x' * 1000)\n"
            "ctx = mp.get_context('fork')\n"
            "q = ctx.Queue()\n"
            "p = ctx.Process(target=work, args=(q,), daemon=True)\n"
            "p.start()\n"
            "time.sleep(0.5)\n"
            "p.terminate()\n"
            "p.join(10)\n"
            "print(p.exitcode)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == str(-signal.SIGTERM), proc.stdout + proc.stderr
