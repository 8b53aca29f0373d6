"""Convolutions and pooling. Conv's parts are ONNX's own adjoints (the `lower` package's ConvGrad
form): ConvTranspose of dy for the input, a Conv over batch-and-channel-swapped tensors for the
weight. ConvTranspose is Conv's input-gradient, so its own parts are a Conv (input) and the same
weight form with the roles of input and output exchanged. Average pooling spreads dy back with a
ConvTranspose of a ones kernel."""

import numpy as np
from onnx import TensorProto

from roam_cli.lower import grads


def spatial_attrs(g, rank: int) -> tuple[list[int], list[int], list[int]]:
    n = rank - 2
    if g.attr("auto_pad", "NOTSET") not in ("NOTSET", "VALID", b"NOTSET", b"VALID"):
        g.refuse("auto_pad SAME_* is not differentiated (export with explicit pads)")
    return g.attr("strides") or [1] * n, g.attr("pads") or [0] * (2 * n), g.attr("dilations") or [1] * n


def conv(g):
    g.fused(grads.conv_grad, "ConvGrad", [g.dy(), g.input(0), g.input(1)], [0, 1, 2])


def conv_transpose(g):
    x, w, dy = g.input(0), g.input(1), g.dy()
    if g.attr("output_shape"):
        g.refuse("ConvTranspose with output_shape is not differentiated (use pads and output_padding)")
    strides, pads, dilations = spatial_attrs(g, len(g.shape(x)))
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
    """ConvTranspose of dy / count with a ones kernel per channel; the count is the kernel's area,
    or, with count_include_pad=0, the window's cells inside the input (a constant)."""
    x = g.input(0)
    shape = g.shape(x)
    strides, pads, dilations = spatial_attrs(g, len(shape))
    kernel = g.attr("kernel_shape")
    channels = shape[1]
    ones = g.ctx.const(np.ones([channels, 1, *kernel]), g.ctx.dtype(x))
    out = g.shape(g.output(0))
    if g.attr("count_include_pad", 0) or not any(pads):
        scaled = g.op("Mul", g.dy(), g.const(1.0 / float(np.prod(kernel)), x))
    else:
        counts = window_counts(shape[2:], out[2:], kernel, strides, pads, dilations)
        scaled = g.op("Div", g.dy(), g.ctx.const(counts, g.ctx.dtype(x)))
    g.give(0, g.op("ConvTranspose", scaled, ones, strides=strides, pads=pads, dilations=dilations, group=channels,
                   output_padding=covered_gap(shape[2:], out[2:], kernel, strides, pads, dilations)))


def covered_gap(size, out, kernel, strides, pads, dilations) -> list[int]:
    """The input cells past the last window: ConvTranspose's output_padding."""
    n = len(size)
    return [s - ((o - 1) * st - pads[k] - pads[k + n] + d * (kk - 1) + 1)
            for k, (s, o, kk, st, d) in enumerate(zip(size, out, kernel, strides, dilations))]


def window_counts(size, out, kernel, strides, pads, dilations) -> np.ndarray:
    """How many cells of each output's window lie inside the input (shape [1, 1, *out])."""
    n = len(size)
    per_axis = []
    for k in range(n):
        starts = np.arange(out[k]) * strides[k] - pads[k]
        taps = starts[:, None] + np.arange(kernel[k]) * dilations[k]
        per_axis.append(((taps >= 0) & (taps < size[k])).sum(axis=1))
    counts = per_axis[0]
    for axis in per_axis[1:]:
        counts = np.multiply.outer(counts, axis)
    return counts.reshape([1, 1, *out]).astype(np.float64)


def global_average_pool(g):
    shape = g.shape(g.input(0))
    area = float(np.prod(shape[2:]))
    g.give(0, g.op("Expand", g.op("Mul", g.dy(), g.const(1.0 / area, g.dy())), g.axes(*shape)))
