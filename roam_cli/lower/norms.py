"""Normalisations' gradients (and the training forms ONNX Runtime's inference builds lack).
The gradients reuse the statistics the forward saved (mean, inverse standard deviation) and
reduce in the input's own layout: no transposes, a few input-sized temporaries.

Mixed precision: a normalisation whose inputs mix a low-precision type with float32 (a bf16 or
fp16 activation with float32 scale and statistics, as ONNX's BatchNormalization and ONNX Runtime's
LayerNormalizationGrad allow) computes in float32, as a GPU's mixed kernels accumulate, and each
result is cast to the type its output is declared with."""

from roam_cli.core.graph import element_size


def computing_type(e, *names: str | None) -> int:
    """The widest element type among `names`: the type the rule computes in."""
    return max({e.ctx.dtype(n) for n in names if n} - {None}, key=element_size)


def widened(e, names: list[str | None], dtype: int) -> list[str | None]:
    """Each of `names` in `dtype` (a Cast where it has another type)."""
    return [x if not x or e.ctx.dtype(x) == dtype else e.op("Cast", x, to=dtype) for x in names]


def result(e, k: int, dtype: int, op_type: str, *inputs: str, **attrs) -> str:
    """Output k, computed by `op_type` in `dtype` and cast to the type its output is declared with."""
    declared = e.ctx.dtype(e.output(k))
    if declared in (None, dtype):
        return e.op(op_type, *inputs, out=e.output(k), **attrs)
    return e.op("Cast", e.op(op_type, *inputs, **attrs), out=e.output(k), to=declared)


def leading_and_normalized(e, x: str, axis: int) -> tuple[list[int], list[int]]:
    rank = e.rank(x)
    axis = axis % rank
    return list(range(axis)), list(range(axis, rank))


def normalized_grad(e, g, xhat, axes, with_mean: bool) -> str:
    """The gradient through xhat = (x - mean) * inv, divided by inv: g - mean(g) - xhat mean(g xhat)
    over `axes` (no mean term for RMSNorm), for g the gradient of xhat."""
    proj = e.op("ReduceMean", e.op("Mul", g, xhat), e.axes(*axes), keepdims=1)
    centred = e.op("Sub", g, e.op("ReduceMean", g, e.axes(*axes), keepdims=1)) if with_mean else g
    return e.op("Sub", centred, e.op("Mul", xhat, proj))


def layer_norm_grad(e, with_mean: bool = True):
    """Inputs dY, X, scale, mean, inv_std_dev (RMSNorm: dY, X, scale, inv_std_dev);
    outputs dX, d scale, d bias."""
    dtype = computing_type(e, *e.node.input)
    dy, x, scale, mean, inv = widened(e, [e.input(0), e.input(1), e.input(2), *(
        [e.input(3), e.input(4)] if with_mean else [None, e.input(3)])], dtype)
    leading, normalized = leading_and_normalized(e, e.input(1), e.attr("axis", -1))
    xhat = e.op("Mul", e.op("Sub", x, mean) if with_mean else x, inv)
    if with_mean and e.output(2):
        result(e, 2, dtype, "ReduceSum", dy, e.axes(*leading), keepdims=0)
    if e.output(1):
        result(e, 1, dtype, "ReduceSum", e.op("Mul", dy, xhat), e.axes(*leading), keepdims=0)
    if e.output(0):
        result(e, 0, dtype, "Mul", normalized_grad(e, e.op("Mul", dy, scale), xhat, normalized, with_mean), inv)


def simplified_layer_norm_grad(e):
    layer_norm_grad(e, with_mean=False)


def simplified_layer_norm(e):
    """RMSNorm: y = x / sqrt(mean(x^2) + eps) * scale; output 1 (optional) is the inverse."""
    dtype = computing_type(e, e.input(0), e.input(1))
    x, scale = widened(e, [e.input(0), e.input(1)], dtype)
    _, normalized = leading_and_normalized(e, e.input(0), e.attr("axis", -1))
    mean_square = e.op("ReduceMean", e.op("Mul", x, x), e.axes(*normalized), keepdims=1)
    root = e.op("Sqrt", e.op("Add", mean_square, e.const(e.attr("epsilon", 1e-5), x)))
    inv = result(e, 1, dtype, "Reciprocal", root) if e.output(1) else e.op("Reciprocal", root)
    result(e, 0, dtype, "Mul", e.op("Mul", x, inv), scale)


def channel_axes(e, x: str) -> tuple[list[int], str]:
    """The axes a batch norm reduces (all but 1) and the shape [C, 1, ...] its per-channel
    vectors broadcast with."""
    rank = e.rank(x)
    return [0, *range(2, rank)], e.axes(-1, *[1] * (rank - 2))


def batch_norm_training(e):
    """BatchNormalization(training_mode=1) and com.microsoft BatchNormInternal: normalise by the
    batch's statistics; running statistics move by `momentum`; BatchNormInternal also returns the
    batch's mean and inverse standard deviation for its gradient."""
    dtype = computing_type(e, *e.node.input)
    x, scale, bias, running_mean, running_var = widened(e, [e.input(k) for k in range(5)], dtype)
    axes, column = channel_axes(e, e.input(0))
    momentum, eps = e.attr("momentum", 0.9), e.attr("epsilon", 1e-5)
    mean = e.op("ReduceMean", x, e.axes(*axes), keepdims=1)
    centred = e.op("Sub", x, mean)
    var = e.op("ReduceMean", e.op("Mul", centred, centred), e.axes(*axes), keepdims=1)
    inv = e.op("Reciprocal", e.op("Sqrt", e.op("Add", var, e.const(eps, x))))
    normalized = e.op("Mul", centred, inv)
    result(e, 0, dtype, "Add", e.op("Mul", normalized, e.op("Reshape", scale, column)), e.op("Reshape", bias, column))
    flat = e.axes(-1)
    for k, (batch, running) in enumerate([(mean, running_mean), (var, running_var)], start=1):
        if e.output(k):
            moved = e.op("Mul", running, e.const(momentum, x))
            result(e, k, dtype, "Add", moved, e.op("Mul", e.op("Reshape", batch, flat), e.const(1 - momentum, x)))
    for k, saved in ((3, mean), (4, inv)):
        if e.output(k):
            result(e, k, dtype, "Reshape", saved, flat)


def batch_norm_grad(e):
    """Inputs dY, X, scale, saved mean, saved inverse std; outputs dX, d scale, d bias."""
    dtype = computing_type(e, *e.node.input)
    dy, x, scale, mean, inv = widened(e, [e.input(k) for k in range(5)], dtype)
    axes, column = channel_axes(e, e.input(1))
    inv = e.op("Reshape", inv, column)
    xhat = e.op("Mul", e.op("Sub", x, e.op("Reshape", mean, column)), inv)
    if e.output(2):
        result(e, 2, dtype, "ReduceSum", dy, e.axes(*axes), keepdims=0)
    if e.output(1):
        result(e, 1, dtype, "ReduceSum", e.op("Mul", dy, xhat), e.axes(*axes), keepdims=0)
    if e.output(0):
        scaled = e.op("Mul", e.op("Reshape", scale, column), inv)
        result(e, 0, dtype, "Mul", normalized_grad(e, dy, xhat, axes, True), scaled)
