"""Ops that move, select or copy elements: each part puts dy's elements back where they came from
(views become views of dy; selections scatter-add into zeros of the input's shape)."""

import numpy as np
from onnx import TensorProto

from roam_cli.lower import grads


def view(g):
    """Reshape, Flatten, Squeeze, Unsqueeze: dy with the input's shape."""
    g.give(0, g.reshaped(g.dy(), 0, g.shape(g.output(0))))


def transpose(g):
    perm = g.attr("perm") or list(range(len(g.shape(g.input(0))) - 1, -1, -1))
    g.give(0, g.op("Transpose", g.dy(), perm=[perm.index(k) for k in range(len(perm))]))


def cast(g):
    """Cast/CastLike between float types: dy cast back."""
    g.give(0, g.op("Cast", g.dy(), to=g.ctx.dtype(g.input(0))))


def concat(g):
    axis = g.attr("axis") % len(g.shape(g.output(0)))
    sizes = [g.shape(x)[axis] for x in g.node.input]
    parts = g.op("Split", g.dy(), g.axes(*sizes), axis=axis, out=[g.fresh("Split") for _ in sizes])
    for k, part in enumerate(parts):
        g.give(k, part)


def split(g):
    """Concat of the outputs' gradients; zeros for an output none flows to."""
    axis = g.attr("axis", 0)
    pieces = [g.dy(k) or g.zeros_like(o) for k, o in enumerate(g.node.output)]
    g.give(0, g.op("Concat", *pieces, axis=axis))


def slice_(g):
    """Steps of 1: dy padded back with zeros; other steps: scattered at the positions taken,
    computed here from the static shape."""
    shape = g.shape(g.input(0))
    values = [g.ctx.constant_value(g.input(k)) if g.input(k) else None for k in range(1, 5)]
    if any(v is None for v, k in zip(values, range(1, 5)) if g.input(k)):
        g.refuse("its starts, ends, axes and steps must be constants")
    starts, ends, axes, steps = (v.ravel().tolist() if v is not None else None for v in values)
    axes = [a % len(shape) for a in (axes or range(len(starts)))]
    steps = steps or [1] * len(axes)
    index = [slice(None)] * len(shape)
    for a, s, e, st in zip(axes, starts, ends, steps):
        index[a] = slice(s, e, st)
    if all(st == 1 for st in steps):
        begin, end = [0] * len(shape), [0] * len(shape)
        for a in axes:
            taken = range(shape[a])[index[a]]
            begin[a], end[a] = (taken.start, shape[a] - taken.stop) if len(taken) else (0, shape[a])
        g.give(0, g.op("Pad", g.dy(), g.axes(*begin, *end), g.const(0.0, g.dy())))
        return
    positions = np.arange(int(np.prod(shape))).reshape(shape)[tuple(index)]
    flat = g.op("ScatterElements", g.zeros(g.axes(int(np.prod(shape))), g.dy()),
                g.ctx.const(positions.ravel(), TensorProto.INT64), g.op("Reshape", g.dy(), g.axes(-1)), axis=0)
    g.give(0, g.reshaped(flat, 0))


def pad(g):
    """Constant padding: the gradient is dy with the pads cut off."""
    if g.attr("mode", "constant") not in ("constant", b"constant"):
        g.refuse("only constant padding is differentiated")
    pads = g.ctx.constant_value(g.input(1))
    axes = g.ctx.constant_value(g.input(3)) if g.input(3) else None
    if pads is None or (g.input(3) and axes is None) or (pads < 0).any():
        g.refuse("its pads (and axes) must be non-negative constants")
    rank = len(g.shape(g.input(0)))
    axes = [a % rank for a in (axes.ravel().tolist() if axes is not None else range(rank))]
    n = len(axes)
    out = g.shape(g.output(0))
    starts = [int(p) for p in pads.ravel()[:n]]
    ends = [out[a] - int(p) for a, p in zip(axes, pads.ravel()[n:])]
    g.give(0, g.op("Slice", g.dy(), g.axes(*starts), g.axes(*ends), g.axes(*axes)))


def gather(g):
    """A constant scalar index (x[:, i], torch's select) is dy padded back into place: no zeros to
    scatter into, and no identity Transpose (onnxruntime 1.19 fuses one after a Gemm as a real
    transpose: ViT's classifier token got its gradient laid out [768, batch])."""
    index = g.ctx.constant_value(g.input(1))
    if index is not None and index.ndim == 0:
        shape = g.shape(g.input(0))
        axis = g.attr("axis", 0) % len(shape)
        at = int(index) % shape[axis]
        pads = [0] * (2 * len(shape))
        pads[axis], pads[len(shape) + axis] = at, shape[axis] - 1 - at
        g.give(0, g.op("Pad", g.op("Unsqueeze", g.dy(), g.axes(axis)), g.axes(*pads)))
        return
    g.fused(grads.gather_grad, "GatherGrad", [g.axes(*g.shape(g.input(0))), g.input(1), g.dy()], [0])


def gather_elements(g):
    g.give(0, g.scatter_added(g.input(1), g.dy(), g.attr("axis", 0), shape=g.axes(*g.shape(g.input(0)))))


def gather_nd(g):
    """The k index columns name rows of x seen as [N0 x ... x Nk-1, rest]: Gather's gradient on the
    flat row numbers (ScatterND's add loses updates to repeated indices under ORT's threads)."""
    if g.attr("batch_dims", 0):
        g.refuse("GatherND with batch_dims is not differentiated")
    shape, k = g.shape(g.input(0)), g.shape(g.input(1))[-1]
    strides = [int(np.prod(shape[j + 1:k], dtype=np.int64)) for j in range(k)]
    index = g.input(1)
    dims = g.const(np.array(shape[:k], np.int64), dtype=TensorProto.INT64)
    index = g.op("Where", g.op("Less", index, g.const(np.zeros(k, np.int64), dtype=TensorProto.INT64)),
                 g.op("Add", index, dims), index)  # GatherND counts a negative index from the end
    flat = g.op("ReduceSum", g.op("Mul", index, g.const(np.array(strides, np.int64), dtype=TensorProto.INT64)),
                g.axes(-1), keepdims=0)
    rows = grads.rows_added(g, g.axes(int(np.prod(shape[:k], dtype=np.int64)), *shape[k:]), flat, g.dy())
    g.give(0, g.op("Reshape", rows, g.axes(*shape)))


def expand(g):
    g.give(0, g.unbroadcast(g.dy(), 0))


def tile(g):
    """dy viewed as [repeat_0, size_0, repeat_1, size_1, ...], the repeat axes summed."""
    shape = g.shape(g.input(0))
    repeats = g.ctx.constant_value(g.input(1))
    if repeats is None:
        g.refuse("its repeats must be a constant")
    split = [d for r, s in zip(repeats.ravel().tolist(), shape) for d in (r, s)]
    summed = g.op("ReduceSum", g.op("Reshape", g.dy(), g.axes(*split)), g.axes(*range(0, 2 * len(shape), 2)), keepdims=0)
    g.give(0, summed)


def cum_sum(g):
    """The running sum taken the other way."""
    reverse = 1 - g.attr("reverse", 0)
    g.give(0, g.op("CumSum", g.dy(), g.input(1), exclusive=g.attr("exclusive", 0), reverse=reverse))


def trilu(g):
    g.give(0, g.op("Trilu", g.dy(), g.input(1), upper=g.attr("upper", 1)))

