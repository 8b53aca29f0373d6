"""Static shapes: the contrib-op rules agree with what ONNX Runtime computes; the run fallback."""

import copy

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import SAMPLE, needs_ort_training, roam
from onnx import helper
from onnx_builder import model, node, save

from roam_cli.core.errors import RoamError
from roam_cli.frontend.onnx_import import import_model
from roam_cli.frontend.shapes import matmul_shape
from roam_cli.frontend.synthetic import synthetic_feeds


@needs_ort_training  # the shape rules for ORT's fused ops, against ORT running them
def test_every_inferred_shape_matches_an_onnx_runtime_run_of_the_sample():
    imported = import_model(SAMPLE)
    probe = copy.deepcopy(imported.model)
    names = [o for n in probe.graph.node for o in n.output if o]
    have = {o.name for o in probe.graph.output}
    probe.graph.output.extend(helper.make_empty_tensor_value_info(x) for x in names if x not in have)
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    results = session.run(names, synthetic_feeds(session))
    contrib = {o for n in imported.graph.nodes if n.domain == "com.microsoft" for o in n.outputs}
    assert len(contrib) >= 60  # LayerNormalizationGrad, GatherGrad, FusedMatMul, ... are covered
    for name, value in zip(names, results):
        v = imported.graph.values[name]
        assert (v.shape, v.dtype) == (np.asarray(value).shape, helper.np_dtype_to_tensor_dtype(value.dtype)), name


@pytest.mark.parametrize("a, b, flags, expected", [
    ((2, 3, 4), (4, 5), {}, (2, 3, 5)),
    ((4, 3), (4, 5), {"trans_a": 1}, (3, 5)),
    ((2, 3, 4), (2, 5, 4), {"trans_b": 1}, (2, 3, 5)),
    ((3, 2, 4), (2, 4, 5), {"trans_batch_a": 1}, (2, 3, 5)),  # [3,2,4] -> [2,3,4]
    ((4,), (4, 5), {}, (5,)),
])
def test_fused_matmul_shapes(a, b, flags, expected):
    assert matmul_shape(a, b, **flags) == expected


def nonzero_model():
    # NonZero's output length depends on the data: static inference leaves it unknown.
    return model([node("NonZero", ["x"], ["idx"]), node("Cast", ["idx"], ["f"], to=onnx.TensorProto.FLOAT)],
                 [("x", [4, 6])], [("f", [2, None])])


def test_data_dependent_shape_needs_shapes_from_run(tmp_path):
    path = save(nonzero_model(), tmp_path / "nz.onnx")
    with pytest.raises(RoamError, match="idx.*--shapes-from-run"):
        import_model(path)
    graph = import_model(path, shapes_from_run=True).graph
    # synthetic float inputs are non-zero almost surely: all 24 positions, rank 2
    assert graph.values["idx"].shape == (2, 24) and graph.values["f"].shape == (2, 24)
    r = roam("optimize", path, "-o", tmp_path / "p.json", "--shapes-from-run")
    assert r.code == 0, r.err
    assert roam("verify", path, tmp_path / "p.json", "--shapes-from-run").code == 0


def test_shapes_from_run_refuses_a_model_whose_weights_are_absent(tmp_path):
    m = nonzero_model()
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((64, 64), np.float32), "w"))
    m.graph.node.append(node("MatMul", ["w", "w"], ["ww"]))
    m.graph.output.append(helper.make_tensor_value_info("ww", onnx.TensorProto.FLOAT, [64, 64]))
    onnx.save(m, str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=0)
    (tmp_path / "m.data").unlink()
    r = roam("optimize", tmp_path / "m.onnx", "-o", tmp_path / "p.json", "--shapes-from-run")
    assert r.code == 2 and "needs the weights" in r.err and "m.data is absent" in r.err
    assert not (tmp_path / "p.json").exists()
