import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx
import pytest

from roam_cli.frontend.providers import RUNTIME, TRAINING_OPS
from roam_cli.lower import lower_model

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the benchmarks package: some tests build their inputs with it
SAMPLE = ROOT / "sample_models" / "gpt2_tiny" / "training_model.onnx"


# The interpreter whose onnxruntime is today's (no training build): this one, else none (the
# onnxruntime-training environment skips; CI's other environments run those tests).
TODAYS_ONNXRUNTIME = None if TRAINING_OPS else sys.executable
needs_todays_onnxruntime = pytest.mark.skipif(TODAYS_ONNXRUNTIME is None, reason=f"needs today's onnxruntime (no "
                                              f"training build); this is {RUNTIME}")

# The one marker for tests that run ORT's fused training ops: onnxruntime-training installed
# (roam's own detection), else skipped with the reason.
needs_ort_training = pytest.mark.skipif(not TRAINING_OPS, reason=f"needs onnxruntime-training (runs ORT's fused "
                                        f"training ops); this is {RUNTIME}")


def in_runnable_form(m: onnx.ModelProto) -> onnx.ModelProto:
    """`m` in the form the installed ONNX Runtime runs: as it is on onnxruntime-training, lowered to
    standard ONNX (roam lower) on any other."""
    return m if TRAINING_OPS else lower_model(m)


def runnable(path: Path, folder: Path) -> Path:
    """in_runnable_form of the model at `path`: `path` itself, or the lowered model in `folder`."""
    if TRAINING_OPS:
        return path
    out = folder / path.name
    onnx.save(lower_model(onnx.load(path)), out)
    return out


class Run:
    def __init__(self, proc):
        self.code, self.out, self.err = proc.returncode, proc.stdout, proc.stderr

    def json(self):
        return json.loads(self.out)


def roam(*args, cwd=None, env: dict | None = None) -> Run:
    """Run the CLI as a user would: a process of its own, with real exit code and streams, forked
    from one that has imported roam already (a short command's time is mostly its imports: half a
    second, some 300 times a run); `env` over this process's environment."""
    with tempfile.TemporaryDirectory(prefix="roam-cli-") as folder:
        out, err = Path(folder) / "out", Path(folder) / "err"
        child = FORKS.Process(target=run_cli, args=([str(a) for a in args], str(cwd or os.getcwd()),
                                                     {**os.environ, "COLUMNS": "200", **(env or {})}, str(out), str(err)))
        child.start()
        child.join()
        with contextlib.suppress(ProcessLookupError):  # what it started and left behind, as a user's shell would
            os.killpg(child.pid, signal.SIGKILL)
        return Run(subprocess.CompletedProcess(args, child.exitcode, out.read_text(), err.read_text()))


def run_cli(args: list[str], cwd: str, env: dict, out: str, err: str) -> None:
    """`python -m roam_cli ARGS` in this (forked) process, its streams into the files `out` and `err`;
    a process group of its own, as a command a shell starts."""
    os.setpgid(0, 0)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, out, os.O_WRONLY | os.O_CREAT),
                            (2, err, os.O_WRONLY | os.O_CREAT)):
        os.dup2(os.open(path, flags), fd)
    import roam_cli.__main__
    sys.argv = [roam_cli.__main__.__file__, *args]  # as -m sets it: click names the program from it
    code = 0
    try:
        roam_cli.__main__.main()
    except SystemExit as e:  # as the interpreter ends on it
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# Forks for `roam`, from a server that has imported what the CLI loads (and nothing else: no ONNX
# Runtime session, no thread but the interpreter's). Not roam_cli.cli itself: it sizes its console
# by the stdout it finds, which is the fork's.
FORKS = multiprocessing.get_context("forkserver")


FORKS.set_forkserver_preload(["click", "rich.console", "rich.table", "onnx", "onnxruntime", "numpy", "roam_cli.pipeline",
                              "roam_cli.outputs.report", "roam_cli.verify", "roam_cli.runtime.train"])


def planned(model: Path, d: Path) -> tuple:
    r = roam("optimize", model, "-o", d / "plan.json", "--annotated-model", d / "annotated.onnx")
    assert r.code == 0, r.err
    return model, d / "plan.json", json.loads((d / "plan.json").read_text()), d / "annotated.onnx"


@pytest.fixture(scope="session")
def sample_plan(tmp_path_factory):
    """The sample model planned once: (model path, plan path, plan dict, annotated model path)."""
    return planned(SAMPLE, tmp_path_factory.mktemp("sample"))


@pytest.fixture(scope="session")
def runnable_plan(sample_plan, tmp_path_factory):
    """sample_plan for the sample in the form the installed ONNX Runtime runs (`runnable`)."""
    if TRAINING_OPS:
        return sample_plan
    d = tmp_path_factory.mktemp("runnable")
    return planned(runnable(SAMPLE, d), d)
