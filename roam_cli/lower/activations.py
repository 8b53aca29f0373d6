"""Activations and their gradients. Each gradient keeps at most a few input-sized temporaries
alive at once: a chain of elementwise ops, each freeing the one before."""

import math

SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
GELU_C = 0.044715  # tanh approximation: 0.5 x (1 + tanh(k (x + c x^3)))


def biased(e, x_in: int = 0, bias_in: int = 1) -> str:
    x = e.input(x_in)
    return e.op("Add", x, e.input(bias_in)) if e.input(bias_in) else x


def fast_gelu(e):
    e.op("Gelu", biased(e), out=e.output(0), approximate="tanh")


def gelu(e):
    e.op("Gelu", biased(e), out=e.output(0))


def fast_gelu_grad(e, x=None):
    """d/dx x*sigmoid(z), z = 2k(x + c x^3): s + x s (1 - s) z', z' = 2k(1 + 3c x^2)."""
    dy, x = e.input(0), x or e.input(1)
    x2 = e.op("Mul", x, x)
    z = e.op("Mul", x, e.op("Add", e.op("Mul", x2, e.const(2 * SQRT_2_OVER_PI * GELU_C, x)),
                              e.const(2 * SQRT_2_OVER_PI, x)))
    s = e.op("Sigmoid", z)
    dz = e.op("Add", e.op("Mul", x2, e.const(6 * SQRT_2_OVER_PI * GELU_C, x)), e.const(2 * SQRT_2_OVER_PI, x))
    slope = e.op("Mul", e.op("Mul", e.op("Mul", s, e.op("Sub", e.const(1.0, x), s)), dz), x)
    e.op("Mul", dy, e.op("Add", s, slope), out=e.output(0))


def gelu_grad(e, x=None):
    """d/dx x Phi(x) = Phi(x) + x phi(x)."""
    dy, x = e.input(0), x or e.input(1)
    cdf = e.op("Mul", e.op("Add", e.op("Erf", e.op("Mul", x, e.const(1 / math.sqrt(2), x))), e.const(1.0, x)),
               e.const(0.5, x))
    pdf = e.op("Exp", e.op("Mul", e.op("Mul", x, x), e.const(-0.5, x)))
    slope = e.op("Mul", e.op("Mul", pdf, x), e.const(1 / math.sqrt(2 * math.pi), x))
    e.op("Mul", dy, e.op("Add", cdf, slope), out=e.output(0))


def bias_gelu_grad(e):
    gelu_grad(e, biased(e, 1, 2))


def bias_fast_gelu_grad(e):
    fast_gelu_grad(e, biased(e, 1, 2))


def quick_gelu(e):
    x = e.input(0)
    e.op("Mul", x, e.op("Sigmoid", e.op("Mul", x, e.const(e.attr("alpha", 1.702), x))), out=e.output(0))


def quick_gelu_grad(e):
    """d/dx x sigmoid(a x) = s (1 + a x (1 - s))."""
    dy, x = e.input(0), e.input(1)
    ax = e.op("Mul", x, e.const(e.attr("alpha", 1.702), x))
    s = e.op("Sigmoid", ax)
    inner = e.op("Add", e.op("Mul", ax, e.op("Sub", e.const(1.0, x), s)), e.const(1.0, x))
    e.op("Mul", dy, e.op("Mul", s, inner), out=e.output(0))


def relu_grad(e):
    dy, x = e.input(0), e.input(1)
    e.op("Where", e.op("Greater", x, e.const(0.0, x)), dy, e.const(0.0, dy), out=e.output(0))


def sigmoid_grad(e):  # inputs dY, Y
    dy, y = e.input(0), e.input(1)
    e.op("Mul", dy, e.op("Mul", y, e.op("Sub", e.const(1.0, y), y)), out=e.output(0))


def tanh_grad(e):  # inputs dY, Y
    dy, y = e.input(0), e.input(1)
    e.op("Mul", dy, e.op("Sub", e.const(1.0, y), e.op("Mul", y, y)), out=e.output(0))


def softmax_grad(e, log: bool = False, coerced: bool = False):
    """Inputs dY, Y (the forward's output). Softmax: dX = Y (dY - sum(dY Y)); LogSoftmax:
    dX = dY - exp(Y) sum(dY), the sums along `axis`. The pre-13 ops (`coerced`) normalise over
    all axes from `axis` on: flattened to 2-D (views) and shaped back."""
    dy, y = e.input(0), e.input(1)
    axis = e.attr("axis", 1 if coerced else -1)
    flattened = coerced and axis % e.rank(dy) != e.rank(dy) - 1
    if flattened:
        dy, y, axis = e.op("Flatten", dy, axis=axis), e.op("Flatten", y, axis=axis), -1
    out = None if flattened else e.output(0)
    if log:
        total = e.op("ReduceSum", dy, e.axes(axis), keepdims=1)
        dx = e.op("Sub", dy, e.op("Mul", e.op("Exp", y), total), out=out)
    else:
        dot = e.op("ReduceSum", e.op("Mul", dy, y), e.axes(axis), keepdims=1)
        dx = e.op("Mul", y, e.op("Sub", dy, dot), out=out)
    if flattened:
        e.op("Reshape", dx, e.op("Shape", e.input(0)), out=e.output(0))
