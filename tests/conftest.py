import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from roam_cli.frontend.providers import RUNTIME, TRAINING_OPS
from roam_cli.lower import lower_model

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the benchmarks package: some tests build their inputs with it
SAMPLE = ROOT / "sample_models" / "gpt2_tiny" / "training_model.onnx"
ORT131 = Path("/work/venvs/ort131/bin/python")  # a separate environment with today's onnxruntime


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


def roam(*args, cwd=None) -> Run:
    """Run the CLI as a user would: a separate process, real exit code and streams."""
    proc = subprocess.run([sys.executable, "-m", "roam_cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "COLUMNS": "200"})
    return Run(proc)


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
