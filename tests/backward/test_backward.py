"""roam's backward (roam_cli/backward): every gradient rule against central finite differences in
ONNX Runtime (float64 where ONNX Runtime has the kernels, float32 otherwise), over broadcasting and
the attributes each rule supports."""

import numpy as np
import onnx
import pytest
from backward_cases import CASES, LINEAR_CASES, f32, i64, n
from backward_check import check, session, weighted_loss
from onnx import helper, numpy_helper

from roam_cli.backward.graph import gradient_model
from roam_cli.lower import lower_model


@pytest.mark.parametrize("nodes,feeds,wrt,inits", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rule_matches_finite_differences(nodes, feeds, wrt, inits):
    check(nodes, feeds, list(wrt), inits)


@pytest.mark.parametrize("nodes,feeds,wrt,inits", [c[1:] for c in LINEAR_CASES], ids=[c[0] for c in LINEAR_CASES])
def test_rule_of_a_map_linear_in_each_input_matches_finite_differences_to_rounding(nodes, feeds, wrt, inits):
    check(nodes, feeds, list(wrt), inits, rtol=1e-4)


def test_dropout_in_training_mode_passes_dy_through_the_mask_scaled():
    """Random, so no finite differences: with loss = sum(y * r), dx = r * mask / (1 - ratio), the
    mask being the forward's own (added as the node's output 1 for the backward to read)."""
    x = f32(4, 5)
    nodes = [n("Dropout", ["a", "r", "t"])]
    m = weighted_loss(nodes, {"a": x}, {"r": np.array(0.25, np.float32), "t": np.array(True)}, 20)
    g, grads = gradient_model(m, ["a"], "loss")
    drop = next(node for node in g.graph.node if node.op_type == "Dropout")
    assert list(drop.output) == ["y", "y.mask"]
    g.graph.output.extend([helper.make_empty_tensor_value_info("y.mask")])
    r = next(t for t in g.graph.initializer if t.name == "loss.r")
    dx, mask = session(lower_model(g)).run([grads["a"], "y.mask"], {"a": x})
    assert 0 < mask.sum() < mask.size
    np.testing.assert_allclose(dx, numpy_helper.to_array(r) * mask / 0.75, rtol=1e-6)


def test_a_select_read_by_a_gemm_has_its_gradient_laid_out_right_with_onnxruntimes_fusions_on():
    """ViT's classifier token: x[:, 0] (Gather, scalar index, axis 1) into a Gemm. With ONNX
    Runtime's graph optimizations on, an identity Transpose between the Gemm's gradient and a
    scatter was fused as a real one (a [3, 2] update for [2, 3]: the session failed). dx is dy @ w
    at position 0 of axis 1, zero elsewhere."""
    import onnxruntime as ort

    x, w = f32(2, 4, 3), f32(5, 3)
    nodes = [n("Gather", ["a", "i"], ["s"], axis=1), n("Gemm", ["s", "w"], transB=1)]
    m = weighted_loss(nodes, {"a": x}, {"i": np.array(0, np.int64), "w": w}, 20)
    g, grads = gradient_model(m, ["a"], "loss")
    r = numpy_helper.to_array(next(t for t in g.graph.initializer if t.name == "loss.r"))
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(lower_model(g).SerializeToString(), so, providers=["CPUExecutionProvider"])
    (dx,) = s.run([grads["a"]], {"a": x})
    expected = np.zeros_like(x)
    expected[:, 0] = r @ w
    np.testing.assert_allclose(dx, expected, rtol=1e-5, atol=1e-6)


def test_silu_s_backward_keeps_x_and_recomputes_the_sigmoid():
    """y = x * sigmoid(x): the backward reads x, not the forward's sigmoid, which it computes again."""
    m = helper.make_model(helper.make_graph(
        [n("Sigmoid", "x", ["s"]), n("Mul", "xs", ["y"]), n("ReduceSum", "y", ["loss"], keepdims=0)], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])]), opset_imports=[helper.make_opsetid("", 21)])
    g, grads = gradient_model(m, ["x"], "loss")
    backward = [b for b in g.graph.node if "/grad/" in b.name]
    assert not any("s" in b.input for b in backward)
    assert [b.op_type for b in backward].count("Sigmoid") == 1


def test_a_pool_whose_kernel_is_larger_than_its_input_gives_a_training_graph_onnx_runtime_runs(tmp_path):
    """EfficientNet's pooler: AveragePool(ceil_mode=1) with a kernel larger than its input (a global
    mean). Its gradient once wrote a ConvTranspose with a negative output_padding, which ONNX
    Runtime refuses to load. Here the step loads with ONNX Runtime's optimizations on, and the
    weight's gradient is the hand-computed one: y = W mean(x), loss = mean((y - t)^2)."""
    import onnxruntime as ort

    from roam_cli.backward import step
    from roam_cli.frontend import training_graph

    w = f32(4, 2, 1, 1)
    nodes = [n("Conv", "xw", ["c"]), n("AveragePool", "c", ["p"], kernel_shape=[7, 9], strides=[7, 9], ceil_mode=1,
                                         count_include_pad=1), n("Flatten", "p")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 3, 4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
                              [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), tmp_path / "m.onnx")
    training_graph.make(tmp_path / "m.onnx", tmp_path / "t.onnx", loss="mse", backward=step.build, requires_grad=["w"],
                        optimizer_path=tmp_path / "o.onnx")
    s = ort.InferenceSession(str(tmp_path / "t.onnx"), providers=["CPUExecutionProvider"])
    x, t = f32(1, 2, 3, 4), f32(1, 4)
    feeds = {"x": x, "target": t, "w": w, "lazy_reset_grad": np.array([True]), "w_grad.accumulation.buffer": np.zeros_like(w)}
    assert {i.name for i in s.get_inputs()} == set(feeds)
    (dw,) = s.run(["w_grad.accumulation.buffer.out"], feeds)
    from roam_cli.frontend.providers import average_pool_divides_by_the_whole_kernel

    # the pool's forward as this runtime computes it at opset 20: 1.19 divides by the whole 7 x 9
    # kernel, 1.23 (at opset 19 on) and 1.32 by the 3 x 4 cells
    mean = x.sum(axis=(2, 3))[0] / (63 if average_pool_divides_by_the_whole_kernel(20) else 12)
    y = w[:, :, 0, 0] @ mean
    np.testing.assert_allclose(dw[:, :, 0, 0], np.outer(2 / 4 * (y - t[0]), mean), rtol=1e-5, atol=1e-6)


SCALES = {"sc": np.array([1, 1, 2, 2], np.float32)}
REFUSED = [
    ("Resize-cubic", [n("Resize", ["a", "", "sc"], mode="cubic")], SCALES, "mode cubic is not differentiated"),
    ("Resize-tf-crop-and-resize", [n("Resize", ["a", "roi", "sc"], mode="linear",
                                     coordinate_transformation_mode="tf_crop_and_resize")],
     {**SCALES, "roi": np.array([0, 0, 0, 0, 1, 1, 1, 1], np.float32)}, "tf_crop_and_resize is not differentiated"),
    ("Resize-antialias", [n("Resize", ["a", "", "sc"], mode="linear", antialias=1)], SCALES, "antialias other than"),
    ("Resize-sizes-computed", [n("Shape", "a", ["lead"], end=2), n("Concat", ["lead", "tail"], ["sz"], axis=0),
                               n("Resize", ["a", "", "", "sz"])], {"tail": i64(6, 12)}, "scales or sizes must be constants"),
    ("Conv-same-kernel-two-below-stride", [n("Conv", "aw", strides=[1, 3], auto_pad="SAME_UPPER")],
     {"w": np.ones((1, 1, 1, 1), np.float32)}, "kernel smaller than its stride"),
    ("AveragePool-same-dilations", [n("AveragePool", "a", kernel_shape=[2, 2], dilations=[2, 2], auto_pad="SAME_UPPER")],
     {}, "auto_pad SAME_UPPER with dilations"),
    ("ConvTranspose-same", [n("ConvTranspose", "aw", strides=[2, 2], auto_pad="SAME_LOWER")],
     {"w": np.ones((1, 1, 2, 2), np.float32)}, "ConvTranspose with auto_pad SAME"),
]


@pytest.mark.parametrize("nodes,inits,words", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_form_without_a_rule_is_refused_in_one_line_naming_the_node(nodes, inits, words):
    from backward_check import forward_model

    from roam_cli.core.errors import RoamError

    loss = helper.make_node("ReduceSum", [nodes[-1].output[0]], ["loss"], keepdims=0, name="loss")
    m = forward_model([*nodes, loss], {"a": f32(1, 1, 3, 6)}, inits,
                      [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])], 20)
    with pytest.raises(RoamError, match=words) as refused:
        gradient_model(m, ["a"], "loss")
    assert nodes[-1].name in str(refused.value) and "\n" not in str(refused.value)
