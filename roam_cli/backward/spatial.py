"""Convolutions and pooling. Conv's parts are ONNX's own adjoints (the `lower` package's ConvGrad
form): ConvTranspose of dy for the input, a Conv over batch-and-channel-swapped tensors for the
weight. ConvTranspose is Conv's input-gradient, so its own parts are a Conv (input) and the same
weight form with the roles of input and output exchanged. Average pooling, like Resize, is linear
and acts on each spatial axis apart: its gradient is dy through the transposes of per-axis
matrices (`along_axes`)."""

import numpy as np
from onnx import TensorProto

from roam_cli.frontend.providers import average_pool_divides_by_the_whole_kernel
from roam_cli.lower import grads


def conv(g):
    g.fused(grads.conv_grad, "ConvGrad", [g.dy(), g.input(0), g.input(1)], [0, 1, 2])


def conv_transpose(g):
    x, w, dy = g.input(0), g.input(1), g.dy()
    if g.attr("output_shape"):
        g.refuse("ConvTranspose with output_shape is not differentiated (use pads and output_padding)")
    if g.attr("auto_pad", b"NOTSET") in (b"SAME_UPPER", b"SAME_LOWER"):
        g.refuse("ConvTranspose with auto_pad SAME_* is not differentiated (use pads and output_padding)")
    strides, pads, dilations = grads.window_attrs(g, g.shape(x)[2:], g.shape(w)[2:])
    group = g.attr("group", 1)
    if g.needs(0):
        g.give(0, g.op("Conv", dy, w, strides=strides, pads=pads, dilations=dilations, group=group))
    if g.needs(1):  # y = ConvGrad_x(x as dy, w): the weight's part is ConvGrad_w with dy as the input
        g.fused(grads.conv_grad, "ConvGrad", [x, dy, w], [None, 1, None], output_padding=None)
    if g.needs(2):
        g.give(2, g.op("ReduceSum", dy, g.axes(0, *range(2, len(g.shape(x)))), keepdims=0))


def max_pool(g):
    """dy added at the positions MaxPool's Indices output names (added when the export left it out)."""
    if g.attr("storage_order", 0):
        g.refuse("MaxPool with storage_order=1 is not differentiated")
    indices = g.forward_output(1, "indices", TensorProto.INT64, g.shape(g.output(0)))
    g.fused(grads.max_pool_grad, "MaxPoolGrad", [g.dy(), indices], [0])


def average_pool(g):
    """Along each spatial axis an output cell is the mean of the input cells its window covers:
    one [out, in] matrix per axis, whatever the pads, ceil_mode, dilations or kernel size
    (EfficientNet's pooler has a 1280-wide kernel over 7 cells: as a ConvTranspose, a ones kernel
    of that size per channel)."""
    shape, out = g.shape(g.input(0)), g.shape(g.output(0))
    kernel = g.attr("kernel_shape")
    strides, pads, dilations = grads.window_attrs(g, shape[2:], kernel)
    n = len(kernel)
    include_pad = bool(g.attr("count_include_pad", 0))
    whole = include_pad and average_pool_divides_by_the_whole_kernel(g.ctx.opset)
    maps = {2 + k: window_means(shape[2 + k], out[2 + k], kernel[k], strides[k], pads[k], pads[n + k], dilations[k],
                                include_pad, whole) for k in range(n)}
    g.give(0, along_axes(g, g.dy(), maps))


def window_means(size, out, kernel, stride, begin, end, dilation, include_pad, whole=False) -> np.ndarray:
    """[out, size]: output cell o's weight on each input cell. The divisor is the window's cells
    inside the input, or with count_include_pad those inside the padded input (ONNX Runtime 1.32's
    and PyTorch's: a window that ceil_mode runs past the end pad counts only up to it), or with
    `whole` the kernel's every cell (ONNX Runtime 1.19's)."""
    taps = np.arange(out)[:, None] * stride - begin + np.arange(kernel)[None, :] * dilation
    inside = (taps >= 0) & (taps < size)
    counted = np.ones_like(taps, bool) if whole else (taps < size + end) if include_pad else inside
    m = np.zeros((out, size))
    m[np.nonzero(inside)[0], taps[inside]] = 1.0
    return m / counted.sum(axis=1, keepdims=True)


def along_axes(g, dy: str, maps: dict[int, np.ndarray]) -> str:
    """The gradient of a map that is linear and acts on each axis apart: dy contracted with each
    axis's matrix M [out, in] over that axis, a MatMul (an axis before the last two: dy viewed as
    [before, out, after], M^T [in, out] broadcast over `before`; not an Einsum, which ONNX allows
    in bfloat16 only from opset 28). The axes that shrink most go first, so the tensors in between
    are the smallest; identity matrices are skipped."""
    shape = list(g.shape(g.output(0)))
    rank = len(shape)
    for axis, m in sorted(maps.items(), key=lambda am: am[1].shape[1] / am[1].shape[0]):
        if m.shape[0] == m.shape[1] and np.array_equal(m, np.eye(len(m))):
            continue
        if axis == rank - 1:
            dy = g.op("MatMul", dy, g.const(m, dy))
        elif axis == rank - 2:
            dy = g.op("MatMul", g.const(m.T, dy), dy)
        else:  # [before, out, after] -> [before, in, after], views either side
            folded = g.op("Reshape", dy, g.axes(int(np.prod(shape[:axis])), shape[axis], int(np.prod(shape[axis + 1:]))))
            dy = g.op("Reshape", g.op("MatMul", g.const(m.T, dy), folded),
                      g.axes(*shape[:axis], m.shape[1], *shape[axis + 1:]))
        shape[axis] = m.shape[1]
    return dy


def global_average_pool(g):
    shape = g.shape(g.input(0))
    area = float(np.prod(shape[2:]))
    g.give(0, g.op("Expand", g.op("Mul", g.dy(), g.const(1.0 / area, g.dy())), g.axes(*shape)))
