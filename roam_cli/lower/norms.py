"""Normalisations' gradients (and the training forms ONNX Runtime's inference builds lack).
The gradients reuse the statistics the forward saved (mean, inverse standard deviation) and
reduce in the input's own layout: no transposes, a few input-sized temporaries."""

from roam_cli.core.errors import RoamError


def same_type(e, *names: str) -> None:
    """The rules compute in the input's type: mixed precision (float16 input, float statistics)
    is refused rather than written as an invalid graph."""
    types = {e.ctx.dtype(n) for n in names if n} - {None}
    if len(types) > 1:
        raise RoamError(f"cannot lower {e.node.op_type} node {e.node.name!r}: its inputs mix element types "
                        "(mixed precision), which lowering does not handle")


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
    dy, x, scale = e.input(0), e.input(1), e.input(2)
    inv = e.input(4) if with_mean else e.input(3)
    same_type(e, *e.node.input)
    leading, normalized = leading_and_normalized(e, x, e.attr("axis", -1))
    xhat = e.op("Mul", e.op("Sub", x, e.input(3)) if with_mean else x, inv)
    if with_mean and e.output(2):
        e.op("ReduceSum", dy, e.axes(*leading), out=e.output(2), keepdims=0)
    if e.output(1):
        e.op("ReduceSum", e.op("Mul", dy, xhat), e.axes(*leading), out=e.output(1), keepdims=0)
    if e.output(0):
        e.op("Mul", normalized_grad(e, e.op("Mul", dy, scale), xhat, normalized, with_mean), inv, out=e.output(0))


def simplified_layer_norm_grad(e):
    layer_norm_grad(e, with_mean=False)


def simplified_layer_norm(e):
    """RMSNorm: y = x / sqrt(mean(x^2) + eps) * scale; output 1 (optional) is the inverse."""
    x, scale = e.input(0), e.input(1)
    _, normalized = leading_and_normalized(e, x, e.attr("axis", -1))
    mean_square = e.op("ReduceMean", e.op("Mul", x, x), e.axes(*normalized), keepdims=1)
    root = e.op("Sqrt", e.op("Add", mean_square, e.const(e.attr("epsilon", 1e-5), x)))
    inv = e.op("Reciprocal", root, out=e.output(1) or None)
    e.op("Mul", e.op("Mul", x, inv), scale, out=e.output(0))


def channel_axes(e, x: str) -> tuple[list[int], str]:
    """The axes a batch norm reduces (all but 1) and the shape [C, 1, ...] its per-channel
    vectors broadcast with."""
    rank = e.rank(x)
    return [0, *range(2, rank)], e.axes(-1, *[1] * (rank - 2))


def batch_norm_training(e):
    """BatchNormalization(training_mode=1) and com.microsoft BatchNormInternal: normalise by the
    batch's statistics; running statistics move by `momentum`; BatchNormInternal also returns the
    batch's mean and inverse standard deviation for its gradient."""
    x, scale, bias, running_mean, running_var = (e.input(k) for k in range(5))
    axes, column = channel_axes(e, x)
    momentum, eps = e.attr("momentum", 0.9), e.attr("epsilon", 1e-5)
    mean = e.op("ReduceMean", x, e.axes(*axes), keepdims=1)
    centred = e.op("Sub", x, mean)
    var = e.op("ReduceMean", e.op("Mul", centred, centred), e.axes(*axes), keepdims=1)
    inv = e.op("Reciprocal", e.op("Sqrt", e.op("Add", var, e.const(eps, x))))
    normalized = e.op("Mul", centred, inv)
    e.op("Add", e.op("Mul", normalized, e.op("Reshape", scale, column)), e.op("Reshape", bias, column),
         out=e.output(0))
    flat = e.axes(-1)
    for k, (batch, running) in enumerate([(mean, running_mean), (var, running_var)], start=1):
        if e.output(k):
            moved = e.op("Mul", running, e.const(momentum, x))
            e.op("Add", moved, e.op("Mul", e.op("Reshape", batch, flat), e.const(1 - momentum, x)), out=e.output(k))
    if e.output(3):
        e.op("Reshape", mean, flat, out=e.output(3))
    if e.output(4):
        e.op("Reshape", inv, flat, out=e.output(4))


def batch_norm_grad(e):
    """Inputs dY, X, scale, saved mean, saved inverse std; outputs dX, d scale, d bias."""
    dy, x, scale, mean, inv = (e.input(k) for k in range(5))
    same_type(e, *e.node.input)
    axes, column = channel_axes(e, x)
    inv = e.op("Reshape", inv, column)
    xhat = e.op("Mul", e.op("Sub", x, e.op("Reshape", mean, column)), inv)
    if e.output(2):
        e.op("ReduceSum", dy, e.axes(*axes), out=e.output(2), keepdims=0)
    if e.output(1):
        e.op("ReduceSum", e.op("Mul", dy, xhat), e.axes(*axes), out=e.output(1), keepdims=0)
    if e.output(0):
        scaled = e.op("Mul", e.op("Reshape", scale, column), inv)
        e.op("Mul", normalized_grad(e, dy, xhat, axes, True), scaled, out=e.output(0))
