"""Products and the gradients of Gather, Conv and MaxPool."""

from roam_cli.core.errors import RoamError


def transposed(e, x: str, batch: bool, last_two: bool) -> str:
    """FusedMatMul's operand layout: transBatch moves axis 0 before the last axis, then trans
    swaps the last two axes; one Transpose (none when neither applies)."""
    rank = e.rank(x)
    perm = list(range(rank))
    if batch and rank >= 3:
        perm = perm[1:-1] + [perm[0], perm[-1]]
    if last_two and rank >= 2:
        perm[-2], perm[-1] = perm[-1], perm[-2]
    return x if perm == list(range(rank)) else e.op("Transpose", x, perm=perm)


def fused_matmul(e):
    """alpha * op(A) @ op(B). A matrix B without batch transposes is a Gemm (trans flags and alpha
    inside, A's leading axes flattened as a view): no transposed copy of either operand."""
    a, b = e.input(0), e.input(1)
    alpha = e.attr("alpha", 1.0)
    ta, tb, tba, tbb = (bool(e.attr(k, 0)) for k in ("transA", "transB", "transBatchA", "transBatchB"))
    ra, rb = e.rank(a), e.rank(b)
    if rb == 2 and ra >= 2 and not tba and (ra == 2 or not ta):
        if ra == 2:
            e.op("Gemm", a, b, out=e.output(0), alpha=alpha, transA=int(ta), transB=int(tb))
            return
        rows = e.op("Flatten", a, axis=ra - 1)
        product = e.op("Gemm", rows, b, alpha=alpha, transB=int(tb))
        shape = e.op("Concat", e.op("Shape", a, end=-1), e.op("Shape", product, start=1), axis=0)
        e.op("Reshape", product, shape, out=e.output(0))
        return
    product = e.op("MatMul", transposed(e, a, tba, ta), transposed(e, b, tbb, tb),
                   out=None if alpha != 1.0 else e.output(0))
    if alpha != 1.0:
        e.op("Mul", product, e.const(alpha, a), out=e.output(0))


def gather_grad(e):
    """Zeros of the gathered tensor's shape, dY's rows added at their indices (indices of an axis
    other than 0 work on a transposed copy)."""
    shape, indices, dy = e.input(0), e.input(1), e.input(2)
    axis = e.attr("axis", 0)
    rank = e.ctx.shape(shape)
    if rank is None or not isinstance(rank[0], int):
        raise RoamError(f"cannot lower GatherGrad node {e.node.name!r}: the rank of {shape!r} is unknown")
    rank = rank[0]
    axis %= rank
    if axis == 0:
        rows_added(e, shape, indices, dy, out=e.output(0))
        return
    q = e.rank(indices)
    dy_perm = [*range(axis, axis + q), *range(axis), *range(axis + q, rank - 1 + q)]
    data_perm = [axis, *range(axis), *range(axis + 1, rank)]
    moved = rows_added(e, e.op("Gather", shape, e.axes(*data_perm)), indices, e.op("Transpose", dy, perm=dy_perm))
    e.op("Transpose", moved, out=e.output(0), perm=[data_perm.index(k) for k in range(rank)])


def rows_added(e, shape: str, indices: str, dy: str, out: str | None = None) -> str:
    """Zeros of `shape` with each row of dy (dy is indices' shape + a row's) added at its index on
    axis 0. ScatterElements add over [rows, row size], the indices repeated along each row (int32,
    the size of dy): ScatterND's add loses updates to a repeated index when ONNX Runtime splits
    it over threads (1.19.2 and 1.32.0, measured: a GPT-2 batch repeats tokens)."""
    flat = e.op("Reshape", indices, e.axes(-1))
    rows = e.op("Reshape", dy, e.op("Concat", e.op("Shape", flat), e.axes(-1), axis=0))
    column = e.op("Add", e.op("Unsqueeze", e.op("Cast", flat, to=6), e.axes(-1)), e.zero_from(dy, 6))  # 6: INT32
    where = e.op("Expand", column, e.op("Shape", rows))  # made at run time, also for constant indices
    size = e.op("Concat", e.op("Slice", shape, e.axes(0), e.axes(1)), e.op("Shape", rows, start=1), axis=0)
    return e.op("Reshape", e.scatter_added(where, rows, shape=size), shape, out=out)


def window_attrs(e, sizes: list[int], kernel: list[int]) -> tuple[list[int], list[int], list[int]]:
    """Strides, explicit pads and dilations of a Conv or pooling node over spatial `sizes`. auto_pad
    SAME_* pads for ceil(size / stride) outputs, the odd cell at the end (UPPER) or at the start
    (LOWER), as ONNX Runtime computes it: a kernel smaller than its stride needs a negative total,
    halved towards zero (a negative start shifts the windows; a negative end is 0: no window
    reaches it either way); VALID: none."""
    n = len(sizes)
    strides, dilations = e.attr("strides") or [1] * n, e.attr("dilations") or [1] * n
    auto_pad = e.attr("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad == "VALID":
        return strides, [0] * (2 * n), dilations
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        return strides, e.attr("pads") or [0] * (2 * n), dilations
    if any(d != 1 for d in dilations):  # ONNX Runtime refuses it for Conv; its pools' shapes are not ONNX's
        raise RoamError(f"{e.node.op_type} node {e.node.name!r}: auto_pad {auto_pad} with dilations is not "
                        "supported (write explicit pads)")
    total = [(-(-size // s) - 1) * s + k - size for size, k, s in zip(sizes, kernel, strides)]
    begin = [int((t + (auto_pad == "SAME_LOWER")) / 2) for t in total]
    return strides, begin + [max(t - b, 0) for t, b in zip(total, begin)], dilations


def conv_grad(e):
    """dX: ConvTranspose of dY with W; dW: a Conv of X over dY with batch and channels swapped
    (groups kept apart by the channel order); dB: dY summed over all but the channels."""
    dy, x, w = e.input(0), e.input(1), e.input(2)
    x_shape = e.ctx.shape(x)
    if x_shape is None or not all(isinstance(d, int) for d in x_shape):
        raise RoamError(f"cannot lower ConvGrad node {e.node.name!r}: {x!r} needs a static shape")
    spatial = len(x_shape) - 2
    group = e.attr("group", 1)
    kernel = e.attr("kernel_shape") or e.ctx.shape(w)[2:]
    strides, pads, dilations = window_attrs(e, x_shape[2:], kernel)
    if min(pads) < 0:  # measured: ONNX Runtime's own Conv is not consistent there (1.32)
        raise RoamError(f"cannot lower ConvGrad node {e.node.name!r}: auto_pad SAME_* with a kernel smaller than its "
                        "stride by 2 or more (write explicit pads)")
    if e.output(2):
        e.op("ReduceSum", dy, e.axes(0, *range(2, spatial + 2)), out=e.output(2), keepdims=0)
    if e.output(0):
        dy_shape = e.ctx.shape(dy)
        covered = [(o - 1) * s - pads[k] - pads[k + spatial] + d * (kk - 1) + 1
                   for k, (o, s, d, kk) in enumerate(zip(dy_shape[2:], strides, dilations, kernel))]
        e.op("ConvTranspose", dy, w, out=e.output(0), strides=strides, dilations=dilations, pads=pads, group=group,
             output_padding=[size - c for size, c in zip(x_shape[2:], covered)])
    if e.output(1):
        n, channels = x_shape[0], x_shape[1]
        swap = [1, 0, *range(2, spatial + 2)]
        if group == 1:
            xt = e.op("Transpose", x, perm=swap)
        else:  # [N, g, C/g, ...] -> [C/g, g, N, ...] -> [C/g, g*N, ...]
            split = e.op("Reshape", x, e.axes(n, group, channels // group, *x_shape[2:]))
            xt = e.op("Reshape", e.op("Transpose", split, perm=[2, 1, 0, *range(3, spatial + 3)]),
                      e.axes(channels // group, group * n, *x_shape[2:]))
        full = e.op("Conv", xt, e.op("Transpose", dy, perm=swap), strides=dilations, dilations=strides, pads=pads,
                    group=group)
        cut = e.op("Slice", full, e.axes(*[0] * spatial), e.axes(*kernel), e.axes(*range(2, spatial + 2)))
        e.op("Transpose", cut, out=e.output(1), perm=swap)


def max_pool_grad(e):
    """dY added at the flat input positions MaxPool's Indices name (ScatterElements add over the
    flattened input). The input's shape comes from the MaxPool node that made the indices."""
    dy, indices = e.input(0), e.input(1)
    pool = e.ctx.producer.get(indices)
    x_shape = e.ctx.shape(pool.input[0]) if pool is not None and pool.op_type == "MaxPool" else None
    x_shape = x_shape or e.ctx.shape(e.output(0))
    if x_shape is None or not all(isinstance(d, int) for d in x_shape):
        raise RoamError(f"cannot lower MaxPoolGrad node {e.node.name!r}: the pooled input's shape is not static")
    size = 1
    for d in x_shape:
        size *= d
    flat = e.axes(-1)
    summed = e.scatter_added(e.op("Reshape", indices, flat), e.op("Reshape", dy, flat), shape=e.axes(size))
    e.op("Reshape", summed, e.axes(*x_shape), out=e.output(0))
