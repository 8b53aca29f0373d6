import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from roam_cli.frontend.providers import RUNTIME, TRAINING_OPS

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_models" / "gpt2_tiny" / "training_model.onnx"
ORT131 = Path("/work/venvs/ort131/bin/python")  # a separate environment with today's onnxruntime


# The one marker for tests that run ORT's fused training ops: onnxruntime-training installed
# (roam's own detection), else skipped with the reason.
needs_ort_training = pytest.mark.skipif(not TRAINING_OPS, reason=f"needs onnxruntime-training (runs ORT's fused "
                                        f"training ops); this is {RUNTIME}")


def runnable(path: Path, folder: Path) -> Path:
    """`path` in the form the installed ONNX Runtime runs: as it is on onnxruntime-training,
    lowered to standard ONNX (roam lower) in `folder` on any other."""
    if TRAINING_OPS:
        return path
    lower = pytest.importorskip("roam_cli.lower", reason=f"{RUNTIME} runs standard graphs only, and roam lower "
                                "is not here")
    out = folder / path.name
    onnx.save(lower.lower_model(onnx.load(path)), out)
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


@pytest.fixture(scope="session")
def sample_plan(tmp_path_factory):
    """The sample model planned once: (model path, plan path, plan dict)."""
    d = tmp_path_factory.mktemp("sample")
    r = roam("optimize", SAMPLE, "-o", d / "plan.json", "--annotated-model", d / "annotated.onnx")
    assert r.code == 0, r.err
    return SAMPLE, d / "plan.json", json.loads((d / "plan.json").read_text()), d / "annotated.onnx"
