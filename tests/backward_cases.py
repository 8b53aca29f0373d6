"""The gradient rules' cases: (id, nodes, feeds, wrt, initializers), each checked against central finite
differences by tests/backward/test_backward.py, and in 16 bits by tests/precision/test_backward_precision.py."""

import numpy as np
from onnx import helper

R = np.random.default_rng(7)


def f64(*shape):
    return R.standard_normal(shape)


def f32(*shape):
    return R.standard_normal(shape).astype(np.float32)


def pos(*shape):
    return R.uniform(0.5, 2.0, shape)


def distinct(*shape):
    """float32 values at least 0.1 apart: finite differences do not cross a max."""
    return (R.permutation(int(np.prod(shape))).reshape(shape) * 0.1).astype(np.float32)


def n(op, inputs, outputs=("y",), **attrs):
    return helper.make_node(op, list(inputs), list(outputs), name=f"{op}_{outputs[0]}", **attrs)


def i64(*values):
    return np.array(values, np.int64)


# (id, nodes, feeds, wrt, initializers)
CASES = [
    ("Add-broadcast", [n("Add", "ab")], {"a": f64(2, 3, 4), "b": f64(3, 1)}, "ab", {}),
    ("Sub-broadcast", [n("Sub", "ab")], {"a": f64(3, 1), "b": f64(2, 1, 4)}, "ab", {}),
    ("Mul-broadcast", [n("Mul", "ab")], {"a": f64(2, 3), "b": f64(3)}, "ab", {}),
    ("Div-broadcast", [n("Div", "ab")], {"a": f64(2, 3), "b": pos(2, 1)}, "ab", {}),
    ("Neg", [n("Neg", "a")], {"a": f64(2, 3)}, "a", {}),
    ("Pow-constant-exponent", [n("Pow", ["a", "e"])], {"a": pos(2, 3)}, "a", {"e": np.array(3.0)}),
    ("Pow-square", [n("Pow", ["a", "e"])], {"a": f64(2, 3)}, "a", {"e": np.array(2.0)}),
    ("Pow-both", [n("Pow", "ab")], {"a": pos(2, 3), "b": f64(3)}, "ab", {}),
    ("Sqrt", [n("Sqrt", "a")], {"a": pos(2, 3)}, "a", {}),
    ("Reciprocal", [n("Reciprocal", "a")], {"a": pos(2, 3)}, "a", {}),
    ("Exp", [n("Exp", "a")], {"a": f64(2, 3)}, "a", {}),
    ("Log", [n("Log", "a")], {"a": pos(2, 3)}, "a", {}),
    ("Abs", [n("Abs", "a")], {"a": pos(2, 3) * np.array([1, -1, 1])}, "a", {}),
    ("Tanh", [n("Tanh", "a")], {"a": f64(2, 3)}, "a", {}),
    ("Sigmoid", [n("Sigmoid", "a")], {"a": f64(2, 3)}, "a", {}),
    ("SiLU", [n("Sigmoid", "a", ["s"]), n("Mul", "sa")], {"a": f64(2, 3)}, "a", {}),
    ("SiLU-sigmoid-read-twice", [n("Sigmoid", "a", ["s"]), n("Mul", "as", ["m"]), n("Add", "ms")],
     {"a": f64(2, 3)}, "a", {}),
    ("Relu", [n("Relu", "a")], {"a": pos(2, 3) * np.array([1, -1, 1])}, "a", {}),
    ("Erf", [n("Erf", "a")], {"a": f32(2, 3)}, "a", {}),
    ("Gelu", [n("Gelu", "a")], {"a": f32(2, 3)}, "a", {}),
    ("Gelu-tanh", [n("Gelu", "a", approximate="tanh")], {"a": f32(2, 3)}, "a", {}),
    ("Sin", [n("Sin", "a")], {"a": f32(2, 3)}, "a", {}),
    ("Cos", [n("Cos", "a")], {"a": f32(2, 3)}, "a", {}),
    ("HardSwish", [n("HardSwish", "a")], {"a": np.array([[-4.0, -1.0, 0.5], [2.0, 3.5, -2.5]], np.float32)}, "a", {}),
    ("Where-broadcast", [n("Where", ["c", "a", "b"])], {"a": f64(2, 3), "b": f64(3)}, "ab",
     {"c": np.array([[True, False, True], [False, False, True]])}),
    ("Max-ties", [n("Max", "abc")], {"a": np.array([[1.0, 2.0, 3.0]]), "b": np.array([[1.0, 0.0, 4.0]]),
                                     "c": np.array([0.5])}, "abc", {}),
    ("Min-broadcast", [n("Min", "ab")], {"a": f64(2, 3), "b": f64(3)}, "ab", {}),
    ("Clip", [n("Clip", ["a", "lo", "hi"])], {"a": np.array([[-2.0, -0.3, 0.2], [0.7, 1.5, 0.1]])}, "a",
     {"lo": np.array(-0.5), "hi": np.array(0.5)}),
    ("Clip-min-only", [n("Clip", ["a", "lo"])], {"a": np.array([[-2.0, -0.3, 0.2]])}, "a", {"lo": np.array(-0.5)}),
    ("Sum-broadcast", [n("Sum", "abc")], {"a": f64(2, 3), "b": f64(3), "c": f64(2, 1)}, "abc", {}),
    ("Identity", [n("Identity", "a")], {"a": f64(2, 3)}, "a", {}),
    ("MatMul-2d", [n("MatMul", "ab")], {"a": f64(2, 3), "b": f64(3, 4)}, "ab", {}),
    ("MatMul-batch-matrix", [n("MatMul", "ab")], {"a": f64(2, 3, 4), "b": f64(4, 5)}, "ab", {}),
    ("MatMul-batch-broadcast", [n("MatMul", "ab")], {"a": f64(2, 1, 3, 4), "b": f64(3, 4, 2)}, "ab", {}),
    ("MatMul-vector-left", [n("MatMul", "ab")], {"a": f64(3), "b": f64(2, 3, 4)}, "ab", {}),
    ("MatMul-vector-right", [n("MatMul", "ab")], {"a": f64(2, 3, 4), "b": f64(4)}, "ab", {}),
    ("MatMul-vectors", [n("MatMul", "ab")], {"a": f64(3), "b": f64(3)}, "ab", {}),
    ("Gemm", [n("Gemm", "abc")], {"a": f64(2, 3), "b": f64(3, 4), "c": f64(4)}, "abc", {}),
    ("Gemm-transA-transB-alpha-beta", [n("Gemm", "abc", transA=1, transB=1, alpha=0.5, beta=2.0)],
     {"a": f64(3, 2), "b": f64(4, 3), "c": f64(2, 1)}, "abc", {}),
    ("Gemm-transB", [n("Gemm", "ab", transB=1)], {"a": f64(2, 3), "b": f64(4, 3)}, "ab", {}),
    ("Einsum-attention", [n("Einsum", "ab", equation="bhqd,bhkd->bhqk")], {"a": f64(1, 2, 3, 4), "b": f64(1, 2, 5, 4)},
     "ab", {}),
    ("Einsum-summed-letter", [n("Einsum", "ab", equation="ij,jk->i")], {"a": f64(2, 3), "b": f64(3, 4)}, "ab", {}),
    ("Reshape", [n("Reshape", ["a", "s"])], {"a": f64(2, 6)}, "a", {"s": i64(3, -1)}),
    ("Flatten", [n("Flatten", "a", axis=2)], {"a": f64(2, 3, 2)}, "a", {}),
    ("Squeeze", [n("Squeeze", ["a", "ax"])], {"a": f64(2, 1, 3)}, "a", {"ax": i64(1)}),
    ("Unsqueeze", [n("Unsqueeze", ["a", "ax"])], {"a": f64(2, 3)}, "a", {"ax": i64(0, 3)}),
    ("Transpose", [n("Transpose", "a", perm=[1, 2, 0])], {"a": f64(2, 3, 4)}, "a", {}),
    ("Transpose-default", [n("Transpose", "a")], {"a": f64(2, 3, 4)}, "a", {}),
    ("Cast-float64", [n("Cast", "a", ("t",), to=11), n("Cast", "t", to=1)], {"a": f32(2, 3)}, "a", {}),
    ("CastLike", [n("CastLike", ["a", "like"])], {"a": f32(2, 3)}, "a", {"like": np.zeros(1)}),
    ("Concat", [n("Concat", "abc", axis=1)], {"a": f64(2, 1), "b": f64(2, 3), "c": f64(2, 2)}, "abc", {}),
    ("Concat-negative-axis", [n("Concat", "ab", axis=-2)], {"a": f64(1, 2), "b": f64(3, 2)}, "ab", {}),
    ("Split-one-output-used", [n("Split", ["a", "sizes"], ("y0", "y1", "y2"), axis=1), n("Mul", ["y2", "y0"])],
     {"a": f64(2, 6)}, "a", {"sizes": i64(2, 2, 2)}),
    ("Split-equal", [n("Split", "a", ("y0", "y1"), axis=0, num_outputs=2), n("Sub", ["y0", "y1"])],
     {"a": f64(4, 3)}, "a", {}),
    ("Slice", [n("Slice", ["a", "st", "en", "ax"])], {"a": f64(3, 5)}, "a",
     {"st": i64(1, 1), "en": i64(3, -1), "ax": i64(0, 1)}),
    ("Slice-steps", [n("Slice", ["a", "st", "en", "ax", "sp"])], {"a": f64(3, 6)}, "a",
     {"st": i64(-1, 0), "en": i64(-10, 6), "ax": i64(0, 1), "sp": i64(-2, 2)}),
    ("Pad", [n("Pad", ["a", "p"])], {"a": f64(2, 3)}, "a", {"p": i64(0, 1, 2, 0)}),
    ("Gather-axis0", [n("Gather", ["a", "i"])], {"a": f64(4, 3)}, "a", {"i": i64(0, 2, 2, 3).reshape(2, 2)}),
    ("Gather-axis1", [n("Gather", ["a", "i"], axis=1)], {"a": f64(2, 4, 3)}, "a", {"i": i64(3, 0, 3)}),
    ("Gather-scalar", [n("Gather", ["a", "i"])], {"a": f64(4, 3)}, "a", {"i": np.array(2, np.int64)}),
    ("Gather-scalar-negative-axis1", [n("Gather", ["a", "i"], axis=-2)], {"a": f64(2, 4, 3)}, "a",
     {"i": np.array(-3, np.int64)}),
    ("GatherElements", [n("GatherElements", ["a", "i"], axis=1)], {"a": f64(2, 3)}, "a",
     {"i": i64(0, 0, 2, 1, 1, 0).reshape(2, 3)}),
    ("GatherND", [n("GatherND", ["a", "i"])], {"a": f64(3, 2, 2)}, "a", {"i": i64(0, 1, 0, 1, 2, 0).reshape(3, 2)}),
    ("GatherND-negative-every-axis", [n("GatherND", ["a", "i"])], {"a": f64(3, 2, 2)}, "a",
     {"i": i64(-1, 0, -1, 2, -2, 1, -1, 0, -1).reshape(3, 3)}),
    ("Expand", [n("Expand", ["a", "s"])], {"a": f64(3, 1)}, "a", {"s": i64(2, 3, 4)}),
    ("Tile", [n("Tile", ["a", "r"])], {"a": f64(2, 3)}, "a", {"r": i64(2, 3)}),
    ("CumSum", [n("CumSum", ["a", "ax"])], {"a": f64(2, 4)}, "a", {"ax": np.array(1, np.int64)}),
    ("CumSum-reverse-exclusive", [n("CumSum", ["a", "ax"], reverse=1, exclusive=1)], {"a": f64(2, 4)}, "a",
     {"ax": np.array(0, np.int64)}),
    ("Trilu", [n("Trilu", "a", upper=0)], {"a": f64(3, 3)}, "a", {}),
    ("ReduceSum", [n("ReduceSum", ["a", "ax"], keepdims=0)], {"a": f64(2, 3, 4)}, "a", {"ax": i64(0, 2)}),
    ("ReduceSum-all", [n("ReduceSum", "a")], {"a": f64(2, 3)}, "a", {}),
    ("ReduceMean-keepdims", [n("ReduceMean", ["a", "ax"])], {"a": f64(2, 3, 4)}, "a", {"ax": i64(-1)}),
    ("Softmax", [n("Softmax", "a", axis=1)], {"a": f64(2, 3, 4)}, "a", {}),
    ("LogSoftmax", [n("LogSoftmax", "a")], {"a": f64(2, 5)}, "a", {}),
    ("LayerNormalization", [n("LayerNormalization", "abc")], {"a": f32(2, 3, 4), "b": f32(4), "c": f32(4)}, "abc", {}),
    ("LayerNormalization-float64-float32-statistics", [n("LayerNormalization", "abc")],
     {"a": f64(2, 3, 4), "b": f64(4), "c": f64(4)}, "abc", {}),
    ("LayerNormalization-axis", [n("LayerNormalization", "ab", axis=1)], {"a": f32(2, 3, 4), "b": f32(3, 4)}, "ab", {}),
    ("BatchNormalization-training", [n("BatchNormalization", ["a", "s", "b", "m", "v"], ("y", "rm", "rv"), training_mode=1)],
     {"a": f32(3, 2, 2, 2), "s": f32(2), "b": f32(2)}, "asb", {"m": np.zeros(2, np.float32), "v": np.ones(2, np.float32)}),
    ("Dropout-inference", [n("Dropout", ["a", "r"])], {"a": f64(2, 3)}, "a", {"r": np.array(0.5)}),
    ("Dropout-ratio-0", [n("Dropout", ["a", "r", "t"])], {"a": f32(2, 3)}, "a",
     {"r": np.array(0.0, np.float32), "t": np.array(True)}),
    ("Conv", [n("Conv", "awb")], {"a": f32(2, 2, 5, 5), "w": f32(3, 2, 3, 3), "b": f32(3)}, "awb", {}),
    ("Conv-strides-pads-dilations", [n("Conv", "aw", strides=[2, 1], pads=[1, 0, 1, 2], dilations=[1, 2])],
     {"a": f32(1, 2, 6, 5), "w": f32(2, 2, 2, 2)}, "aw", {}),
    ("Conv-groups", [n("Conv", "awb", group=2, strides=[2, 2], pads=[1, 1, 1, 1])],
     {"a": f32(2, 4, 5, 5), "w": f32(6, 2, 3, 3), "b": f32(6)}, "awb", {}),
    ("Conv-1d", [n("Conv", "aw", strides=[2])], {"a": f32(1, 2, 7), "w": f32(3, 2, 3)}, "aw", {}),
    ("ConvTranspose", [n("ConvTranspose", "awb", strides=[2, 2], pads=[1, 0, 0, 1], output_padding=[1, 0])],
     {"a": f32(1, 2, 3, 3), "w": f32(2, 3, 3, 2), "b": f32(3)}, "awb", {}),
    ("ConvTranspose-groups", [n("ConvTranspose", "aw", group=2, dilations=[2, 1])],
     {"a": f32(2, 4, 3, 3), "w": f32(4, 1, 2, 2)}, "aw", {}),
    ("MaxPool", [n("MaxPool", "a", kernel_shape=[2, 2], strides=[2, 2])], {"a": f32(2, 2, 4, 4)}, "a", {}),
    ("MaxPool-pads-overlap", [n("MaxPool", "a", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
     {"a": distinct(1, 2, 5, 5)}, "a", {}),
    ("AveragePool", [n("AveragePool", "a", kernel_shape=[2, 2], strides=[2, 2])], {"a": f32(2, 2, 4, 4)}, "a", {}),
    ("AveragePool-pads-excluded", [n("AveragePool", "a", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
     {"a": f32(1, 2, 5, 5)}, "a", {}),
    ("AveragePool-pads-included-ceil", [n("AveragePool", "a", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 0, 0],
                                          count_include_pad=1, ceil_mode=1)], {"a": f32(1, 1, 6, 6)}, "a", {}),
    ("GlobalAveragePool", [n("GlobalAveragePool", "a")], {"a": f32(2, 3, 2, 2)}, "a", {}),
    # more attributes and operand forms
    ("Gemm-scalar-C", [n("Gemm", "abc", beta=0.5)], {"a": f64(2, 3), "b": f64(3, 4), "c": f64(1)}, "abc", {}),
    ("Gemm-full-C-transA", [n("Gemm", "abc", transA=1)], {"a": f64(3, 2), "b": f64(3, 4), "c": f64(2, 4)}, "abc", {}),
    ("Softmax-default-axis", [n("Softmax", "a")], {"a": f64(2, 3, 4)}, "a", {}),
    ("LogSoftmax-axis-0", [n("LogSoftmax", "a", axis=0)], {"a": f64(3, 2)}, "a", {}),
    ("ReduceSum-keepdims-negative-axes", [n("ReduceSum", ["a", "ax"])], {"a": f64(2, 3, 4)}, "a", {"ax": i64(-1, -3)}),
    ("Squeeze-all", [n("Squeeze", "a")], {"a": f64(1, 3, 1)}, "a", {}),
    ("Einsum-three-operands", [n("Einsum", "abc", equation="ij,jk,k->i")], {"a": f64(2, 3), "b": f64(3, 4), "c": f64(4)},
     "abc", {}),
    ("Where-broadcast-condition", [n("Where", ["c", "a", "b"])], {"a": f64(2, 3), "b": f64(2, 1)}, "ab",
     {"c": np.array([True, False, True])}),
    ("Clip-max-only", [n("Clip", ["a", "", "hi"])], {"a": np.array([[-2.0, 0.7, 0.2]])}, "a", {"hi": np.array(0.5)}),
    ("Sum-one-input", [n("Sum", "a")], {"a": f64(2, 3)}, "a", {}),
    ("Concat-with-a-constant", [n("Concat", ["a", "k"], axis=0)], {"a": f64(1, 3)}, "a", {"k": np.ones((2, 3))}),
    ("Tanh-fan-out", [n("Tanh", "a", ("t",)), n("Mul", ["t", "t"], ("u",)), n("Add", ["u", "t"])], {"a": f64(2, 3)}, "a", {}),
    ("Conv-auto-pad-valid", [n("Conv", "aw", auto_pad="VALID")], {"a": f32(1, 1, 4, 4), "w": f32(2, 1, 2, 2)}, "aw", {}),
    ("MaxPool-dilations-ceil", [n("MaxPool", "a", kernel_shape=[2, 2], strides=[2, 2], dilations=[2, 1], ceil_mode=1)],
     {"a": distinct(1, 2, 5, 5)}, "a", {}),
    ("SoftmaxCrossEntropyLoss-ignore-index", [n("SoftmaxCrossEntropyLoss", ["a", "lab"], ignore_index=1)],
     {"a": f32(4, 3)}, "a", {"lab": i64(0, 1, 2, 2)}),
    ("SoftmaxCrossEntropyLoss-weights-sum", [n("SoftmaxCrossEntropyLoss", ["a", "lab", "w"], reduction="sum")],
     {"a": f32(2, 3, 2)}, "a", {"lab": i64(0, 2, 1, 1).reshape(2, 2), "w": np.array([0.5, 1.0, 2.0], np.float32)}),
    ("NegativeLogLikelihoodLoss", [n("LogSoftmax", "a", ("lp",)), n("NegativeLogLikelihoodLoss", ["lp", "lab"])],
     {"a": f32(4, 3)}, "a", {"lab": i64(0, 1, 2, 2)}),
    ("NegativeLogLikelihoodLoss-none", [n("NegativeLogLikelihoodLoss", ["a", "lab"], reduction="none")],
     {"a": f32(4, 3)}, "a", {"lab": i64(0, 1, 2, 2)}),
    ("MaxPool-1d", [n("MaxPool", "a", kernel_shape=[3], strides=[1])], {"a": distinct(2, 2, 6)}, "a", {}),
]


def resize_case(mode, coordinates, shape, scales=None, sizes=None, nearest="round_prefer_floor"):
    """Resize with constant scales (or sizes); float32: ONNX Runtime has no float64 Resize."""
    inits = {"sc": np.array(scales or [], np.float32), **({"sz": i64(*sizes)} if sizes else {})}
    node = n("Resize", ["a", "", "sc", *(["sz"] if sizes else [])], mode=mode, coordinate_transformation_mode=coordinates,
             nearest_mode=nearest)
    to = "x".join(map(str, sizes or scales))
    return (f"Resize-{mode}-{coordinates}-{nearest}-{'x'.join(map(str, shape))}-to-{to}", [node], {"a": f32(*shape)}, "a",
            inits)


COORDINATES = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric"]
NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
# The loss is linear in each element perturbed alone (Resize, average pooling and Conv's operands
# one at a time; MaxPool away from ties), so central differences are exact but for rounding: these
# are checked to 1e-4 in float32, where ONNX Runtime has no float64 kernel.
LINEAR_CASES = [
    *(resize_case("nearest", c, (1, 2, 4, 5), scales=[1, 1, 2, 1.5], nearest=m) for c in COORDINATES for m in NEAREST),
    *(resize_case("nearest", c, (1, 1, 6, 7), sizes=[1, 1, 4, 3], nearest=m) for c in COORDINATES for m in NEAREST),
    *(resize_case("linear", c, (1, 2, 4, 5), scales=[1, 1, 2, 1.5]) for c in COORDINATES),
    *(resize_case("linear", c, (1, 1, 6, 7), sizes=[1, 1, 4, 3]) for c in COORDINATES),
    *(resize_case("linear", c, (1, 1, 3, 4), scales=[1, 1, 0.6, 2.5]) for c in COORDINATES),
    resize_case("linear", "half_pixel", (2, 3, 7), scales=[1, 1, 3]),
    resize_case("linear", "align_corners", (1, 1, 2, 3, 4), scales=[1, 1, 2, 1.5, 0.5]),
    resize_case("nearest", "asymmetric", (1, 1, 2, 3, 4), sizes=[1, 1, 3, 6, 2], nearest="floor"),
    resize_case("linear", "pytorch_half_pixel", (1, 1, 4, 4), sizes=[1, 1, 1, 7]),
    resize_case("nearest", "half_pixel", (1, 2, 3, 3), scales=[1, 1, 1, 1]),
    ("AveragePool-ceil-kernel-larger-than-input", [n("AveragePool", "a", kernel_shape=[7, 9], strides=[7, 9], ceil_mode=1,
                                                     count_include_pad=1)], {"a": f32(2, 3, 3, 4)}, "a", {}),
    ("AveragePool-ceil-kernel-larger-than-input-pads", [n("AveragePool", "a", kernel_shape=[5, 5], strides=[2, 2],
                                                          pads=[1, 1, 1, 1], ceil_mode=1)], {"a": f32(1, 2, 3, 3)}, "a", {}),
    ("AveragePool-ceil-pads-included", [n("AveragePool", "a", kernel_shape=[3, 2], strides=[2, 3], pads=[1, 0, 0, 1],
                                          ceil_mode=1, count_include_pad=1)], {"a": f32(1, 1, 6, 7)}, "a", {}),
    ("AveragePool-ceil-pads-excluded", [n("AveragePool", "a", kernel_shape=[3, 2], strides=[2, 3], pads=[1, 0, 0, 1],
                                          ceil_mode=1)], {"a": f32(1, 1, 6, 7)}, "a", {}),
    ("AveragePool-dilations-ceil", [n("AveragePool", "a", kernel_shape=[2, 3], strides=[2, 2], dilations=[2, 1],
                                      pads=[0, 1, 0, 1], ceil_mode=1)], {"a": f32(1, 2, 5, 6)}, "a", {}),
    ("AveragePool-same-upper-stride-2", [n("AveragePool", "a", kernel_shape=[3, 2], strides=[2, 2], auto_pad="SAME_UPPER")],
     {"a": f32(1, 2, 5, 6)}, "a", {}),
    ("AveragePool-same-lower-odd-included", [n("AveragePool", "a", kernel_shape=[2, 4], strides=[1, 2],
                                               auto_pad="SAME_LOWER", count_include_pad=1)], {"a": f32(1, 1, 5, 7)}, "a", {}),
    ("AveragePool-same-upper-kernel-below-stride", [n("AveragePool", "a", kernel_shape=[1], strides=[3],
                                                      auto_pad="SAME_UPPER")], {"a": f32(1, 2, 6)}, "a", {}),
    ("AveragePool-3d-ceil", [n("AveragePool", "a", kernel_shape=[2, 2, 3], strides=[2, 2, 2], ceil_mode=1)],
     {"a": f32(1, 1, 3, 4, 5)}, "a", {}),
    ("MaxPool-ceil-kernel-larger-than-input-pads", [n("MaxPool", "a", kernel_shape=[5, 5], strides=[2, 2],
                                                      pads=[1, 1, 1, 1], ceil_mode=1)], {"a": distinct(1, 2, 3, 3)}, "a", {}),
    ("MaxPool-same-lower-stride-2", [n("MaxPool", "a", kernel_shape=[2, 3], strides=[2, 2], auto_pad="SAME_LOWER")],
     {"a": distinct(1, 2, 5, 6)}, "a", {}),
    ("Conv-same-upper-stride-2", [n("Conv", "awb", kernel_shape=[3, 2], strides=[2, 2], auto_pad="SAME_UPPER")],
     {"a": f32(1, 2, 5, 6), "w": f32(3, 2, 3, 2), "b": f32(3)}, "awb", {}),
    ("Conv-same-lower-odd", [n("Conv", "aw", strides=[1, 2], auto_pad="SAME_LOWER")],
     {"a": f32(2, 2, 5, 7), "w": f32(2, 2, 2, 4)}, "aw", {}),
    ("Conv-same-upper-depthwise", [n("Conv", "aw", group=4, strides=[2, 2], auto_pad="SAME_UPPER")],
     {"a": f32(1, 4, 7, 6), "w": f32(4, 1, 3, 3)}, "aw", {}),
    ("Conv-same-lower-pointwise-stride-2", [n("Conv", "aw", strides=[2, 2], auto_pad="SAME_LOWER")],
     {"a": f32(1, 3, 6, 5), "w": f32(2, 3, 1, 1)}, "aw", {}),
]
