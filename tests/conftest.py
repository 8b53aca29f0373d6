import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_models" / "gpt2_tiny" / "training_model.onnx"
ORT131 = Path("/work/venvs/ort131/bin/python")  # a separate environment with today's onnxruntime


def has_training_ops() -> bool:
    """Whether the installed onnxruntime is onnxruntime-training (it runs the com.microsoft
    training ops: the fused graphs' gradients and accumulators)."""
    try:
        return importlib.util.find_spec("onnxruntime.training") is not None
    except ImportError:  # no onnxruntime at all
        return False


needs_ort_training = pytest.mark.skipif(not has_training_ops(),
                                        reason="needs onnxruntime-training (runs ORT's fused training ops)")


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
