"""An install where the C extensions did not build (they are optional, setup.py): the planner
still plans and verifies, with the layout and order searches' and the minimum cut's Python
references, and the runtime allocator
says why it is missing. The extensions are made unimportable in a child process."""

import subprocess
import sys

from conftest import ROOT, SAMPLE

WITHOUT = ("import sys; sys.modules['roam_cli.layout._search'] = None; sys.modules['roam_cli.runtime._planalloc'] = None; "
           "sys.modules['roam_cli.order._ideals'] = None; sys.modules['roam_cli.solvers._maxflow'] = None; "
           "sys.argv = ['roam'] + sys.argv[1:]; from roam_cli.__main__ import main; main()")


def roam_without(*args):
    return subprocess.run([sys.executable, "-c", WITHOUT, *map(str, args)], capture_output=True, text=True, cwd=ROOT)


def test_plan_and_verify_without_the_c_extensions(tmp_path):
    r = roam_without("optimize", SAMPLE, "-o", tmp_path / "plan.json", "--layout", "roam")
    assert r.returncode == 0, r.stderr
    r = roam_without("verify", SAMPLE, tmp_path / "plan.json")
    assert r.returncode == 0 and "plan OK" in r.stdout, r.stderr


def test_the_runtime_allocator_says_why_it_is_missing(tmp_path):
    r = roam_without("make-training-graph", SAMPLE, "-o", tmp_path / "step.onnx", "--in-graph-optimizer")
    assert r.returncode == 0, r.stderr
    assert roam_without("optimize", tmp_path / "step.onnx", "-o", tmp_path / "plan.json").returncode == 0
    r = roam_without("train", tmp_path / "step.onnx", "--plan", tmp_path / "plan.json", "--steps", "1")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "cannot be imported" in lines[0] and "--allocator ort" in lines[0], r.stderr
    r = roam_without("train", tmp_path / "step.onnx", "--plan", tmp_path / "plan.json", "--steps", "1",
                     "--allocator", "ort")
    assert r.returncode == 0, r.stderr
