"""Elementwise ops: every input's part is the output gradient times the local slope, summed back
to the input's shape (`unbroadcast`). Slopes read the output where it is the cheaper saved
tensor (Exp, Sqrt, Sigmoid, Tanh, Relu, Reciprocal, Div)."""

import math

from roam_cli.lower import activations


def add(g):
    for k in (0, 1):
        g.give(k, g.unbroadcast(g.dy(), k))


def sub(g):
    g.give(0, g.unbroadcast(g.dy(), 0))
    if g.needs(1):
        g.give(1, g.unbroadcast(g.op("Neg", g.dy()), 1))


def mul(g):
    a, b = g.input(0), g.input(1)
    for k in (0, 1):
        if silu(g, k):
            return
    if g.needs(0):
        g.give(0, g.unbroadcast(g.op("Mul", g.dy(), b), 0))
    if g.needs(1):
        g.give(1, g.unbroadcast(g.op("Mul", g.dy(), a), 1))


def silu(g, k: int) -> bool:
    """y = x * sigmoid(x), with input k the sigmoid of the other, which nothing else reads (SiLU as
    exporters write it): dx = dy s (1 + x (1 - s)), s recomputed from x, as PyTorch's silu_backward
    does, so that the backward keeps x alone, not x and s."""
    x, s = g.input(1 - k), g.input(k)
    made = g.ctx.producer.get(s)
    if made is None or made.op_type != "Sigmoid" or made.input[0] != x or g.ctx.readers[s] != 1:
        return False
    again = g.op("Sigmoid", x)
    slope = g.op("Mul", again, g.op("Add", g.const(1.0, x), g.op("Mul", x, g.op("Sub", g.const(1.0, x), again))))
    g.give(1 - k, g.op("Mul", g.dy(), slope))
    return True


def div(g):
    """y = a / b: da = dy / b, db = -da * y."""
    da = g.op("Div", g.dy(), g.input(1))
    if g.needs(0):
        g.give(0, g.unbroadcast(da, 0))
    if g.needs(1):
        g.give(1, g.unbroadcast(g.op("Neg", g.op("Mul", da, g.output(0))), 1))


def neg(g):
    g.give(0, g.op("Neg", g.dy()))


def power(g):
    """y = a^b: da = dy b a^(b-1) (a constant b folds into constants), db = dy y log a."""
    a, b = g.input(0), g.input(1)
    if g.needs(0):
        exponent = g.ctx.constant_value(b)
        if exponent is not None and exponent.size == 1:
            e = float(exponent.ravel()[0])
            slope = g.op("Mul", g.const(e, a), a) if e == 2.0 else g.op("Mul", g.const(e, a), g.op("Pow", a, g.const(e - 1, a)))
        else:
            bb = g.cast_like(b, a)
            slope = g.op("Mul", bb, g.op("Pow", a, g.op("Sub", bb, g.const(1.0, a))))
        g.give(0, g.unbroadcast(g.op("Mul", g.dy(), slope), 0))
    if g.needs(1):
        g.give(1, g.unbroadcast(g.op("Mul", g.op("Mul", g.dy(), g.output(0)), g.op("Log", a)), 1))


def sqrt(g):
    g.give(0, g.op("Div", g.op("Mul", g.dy(), g.const(0.5, g.dy())), g.output(0)))


def reciprocal(g):
    y = g.output(0)
    g.give(0, g.op("Neg", g.op("Mul", g.dy(), g.op("Mul", y, y))))


def exp(g):
    g.give(0, g.op("Mul", g.dy(), g.output(0)))


def log(g):
    g.give(0, g.op("Div", g.dy(), g.input(0)))


def sin(g):
    g.give(0, g.op("Mul", g.dy(), g.op("Cos", g.input(0))))


def cos(g):
    g.give(0, g.op("Neg", g.op("Mul", g.dy(), g.op("Sin", g.input(0)))))


def absolute(g):
    g.give(0, g.op("Mul", g.dy(), g.op("Sign", g.input(0))))


def erf(g):
    x = g.input(0)
    slope = g.op("Mul", g.op("Exp", g.op("Neg", g.op("Mul", x, x))), g.const(2 / math.sqrt(math.pi), x))
    g.give(0, g.op("Mul", g.dy(), slope))


def tanh(g):
    g.fused(activations.tanh_grad, "TanhGrad", [g.dy(), g.output(0)], [0])


def sigmoid(g):
    g.fused(activations.sigmoid_grad, "SigmoidGrad", [g.dy(), g.output(0)], [0])


def relu(g):
    g.fused(activations.relu_grad, "ReluGrad", [g.dy(), g.output(0)], [0])  # y > 0 exactly where x > 0


def gelu(g):
    rule = activations.fast_gelu_grad if g.attr("approximate", "none") in ("tanh", b"tanh") else activations.gelu_grad
    g.fused(rule, "GeluGrad", [g.dy(), g.input(0)], [0])


def hard_swish(g):
    """y = x relu6(x + 3) / 6: slope 0 below -3, 1 above 3, (2x + 3) / 6 between."""
    x = g.input(0)
    middle = g.op("Add", g.op("Mul", x, g.const(1 / 3, x)), g.const(0.5, x))
    slope = g.op("Where", g.op("Less", x, g.const(-3.0, x)), g.const(0.0, x),
                 g.op("Where", g.op("Greater", x, g.const(3.0, x)), g.const(1.0, x), middle))
    g.give(0, g.op("Mul", g.dy(), slope))


def where(g):
    cond, zero = g.input(0), g.const(0.0, g.dy())
    if g.needs(1):
        g.give(1, g.unbroadcast(g.op("Where", cond, g.dy(), zero), 1))
    if g.needs(2):
        g.give(2, g.unbroadcast(g.op("Where", cond, zero, g.dy()), 2))


def extremum(g):
    """Min/Max: the gradient goes to the inputs equal to the result, shared equally on ties."""
    y, dy = g.output(0), g.dy()
    hits = [g.cast_like(g.op("Equal", x, y), dy) for x in g.node.input]
    share = g.op("Div", dy, g.op("Sum", *hits) if len(hits) > 1 else hits[0])
    for k, hit in enumerate(hits):
        if g.needs(k):
            g.give(k, g.unbroadcast(g.op("Mul", share, hit), k))


def clip(g):
    """Passes where min <= x <= max (bounds included, as PyTorch's clamp)."""
    x, inside = g.input(0), None
    for k, test in ((1, "GreaterOrEqual"), (2, "LessOrEqual")):
        if g.input(k):
            bound = g.op(test, x, g.input(k))
            inside = bound if inside is None else g.op("And", inside, bound)
    g.give(0, g.dy() if inside is None else g.op("Where", inside, g.dy(), g.const(0.0, g.dy())))


def total(g):
    for k in range(len(g.node.input)):
        if g.needs(k):
            g.give(k, g.unbroadcast(g.dy(), k))


def identity(g):
    g.give(0, g.dy())
