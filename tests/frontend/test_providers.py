"""roam's one place for the installed ONNX Runtime (roam_cli/frontend/providers.py): which package,
two packages over each other refused, a node without a kernel named, external weights located."""

import importlib.metadata
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx_builder import model, node

from roam_cli.core.errors import RoamError
from roam_cli.frontend import providers


class Dist:
    def __init__(self, name):
        self.metadata = {"Name": name}


def test_the_package_is_the_modules_own():
    assert providers.PACKAGE in providers.RUNTIME_PACKAGES
    assert providers.TRAINING_OPS == providers.PACKAGE.startswith("onnxruntime-training")


def test_two_runtimes_installed_over_each_other_are_refused(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "distributions",
                        lambda: [Dist("onnx"), Dist("onnxruntime"), Dist("onnxruntime_training_cpu")])
    with pytest.raises(RoamError, match="onnxruntime and onnxruntime-training-cpu are installed in one environment"):
        providers.one_runtime()
    monkeypatch.setattr(importlib.metadata, "distributions", lambda: [Dist("onnxruntime"), Dist("onnxruntime-genai")])
    providers.one_runtime()  # one runtime beside a package that does not ship the module


@pytest.mark.skipif(providers.TRAINING_OPS or not hasattr(providers._pybind_state, "get_all_opkernel_def"),
                    reason="onnxruntime-training: every op roam meets runs, nothing to refuse")
def test_a_node_without_a_kernel_is_named_with_its_op_and_the_fix():
    m = model([node("Relu", ["x"], ["a"]), node("ReluGrad", ["a", "x"], ["y"], name="the_grad", domain="com.microsoft")],
              [("x", [4])], [("y", [4])])
    with pytest.raises(RoamError, match=r"m.onnx: node .the_grad. is com.microsoft:ReluGrad, .* .roam lower."):
        providers.check_runs(m, "m.onnx")
    providers.check_runs(model([node("Relu", ["x"], ["y"])], [("x", [4])], [("y", [4])]), "m.onnx")


@pytest.mark.parametrize("by_folder", [True, False])
def test_external_weights_are_located_as_the_runtime_finds_them(monkeypatch, tmp_path, by_folder):
    m = model([node("Add", ["x", "w"], ["y"])], [("x", [4])], [("y", [4])])
    w = m.graph.initializer.add()
    w.CopyFrom(onnx.numpy_helper.from_array(np.ones(4, np.float32), "w"))
    w.data_location = onnx.TensorProto.EXTERNAL
    w.external_data.add(key="location", value="m.data")
    monkeypatch.setattr(providers, "FINDS_WEIGHTS_BY_FOLDER", by_folder)
    config = providers.locate_weights(m, tmp_path)
    location = w.external_data[0].value
    if by_folder:  # onnxruntime >= 1.20: the folder, the location as written
        assert config == {providers.WEIGHTS_FOLDER: str(tmp_path.resolve())} and location == "m.data"
    else:  # 1.19: absolute locations
        assert config == {} and Path(location) == tmp_path.resolve() / "m.data"
