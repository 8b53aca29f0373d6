"""Products. MatMul's parts are products with the other operand transposed over its last two
axes, summed over the batch axes the operand was broadcast along; a matrix operand against a
batch gets one Gemm over the batch flattened (a view) instead of a batch of products and a sum."""


def swap_last(g, x: str, rank: int) -> str:
    """x with its last two axes swapped; when the forward made x by that swap (attention's
    K^T), its input: no copy, and the swapped tensor need not be kept for the backward."""
    perm = [*range(rank - 2), rank - 1, rank - 2]
    made = g.ctx.producer.get(x)
    if made is not None and made.op_type == "Transpose" and list(g.ctx.attr_of(made, "perm") or []) == perm:
        return made.input[0]
    return g.op("Transpose", x, perm=perm)


def matmul(g):
    """A vector operand is a matrix ([1, K] or [K, 1]) whose added axis dy lacks."""
    a, b, dy = g.input(0), g.input(1), g.dy()
    sa, sb, out = g.shape(a), g.shape(b), g.shape(g.output(0))
    if len(sa) == 1:
        a, sa, out = g.op("Reshape", a, g.axes(1, sa[0])), [1, sa[0]], [*out[:-1], 1, out[-1]] if len(sb) > 1 else [1, *out]
    if len(sb) == 1:
        b, sb, out = g.op("Reshape", b, g.axes(sb[0], 1)), [sb[0], 1], [*out, 1]
    if out != g.shape(g.output(0)):
        dy = g.op("Reshape", dy, g.axes(*out))
    if g.needs(0):
        if len(sb) == 2:  # one Gemm over the flattened batch, B not copied
            part = g.op("Gemm", g.op("Reshape", dy, g.axes(-1, out[-1])), b, transB=1)
            part = g.op("Reshape", part, g.axes(*out[:-1], sb[0]))
        else:
            part = g.op("MatMul", dy, swap_last(g, b, len(sb)))
        g.give(0, g.reshaped(g.sum_to(part, [*out[:-1], sb[-2]], sa), 0, sa))
    if g.needs(1):
        if len(sb) == 2:  # the batch's products summed by one Gemm
            part = g.op("Gemm", g.op("Reshape", a, g.axes(-1, sa[-1])), g.op("Reshape", dy, g.axes(-1, out[-1])), transA=1)
            g.give(1, g.reshaped(part, 1, sb))
        else:
            part = g.op("MatMul", swap_last(g, a, len(sa)), dy)
            g.give(1, g.reshaped(g.sum_to(part, [*out[:-2], sa[-1], out[-1]], sb), 1, sb))


def gemm(g):
    """y = alpha op(A) op(B) + beta C, each part one Gemm with the flags that undo op()."""
    a, b, dy = g.input(0), g.input(1), g.dy()
    ta, tb, alpha = g.attr("transA", 0), g.attr("transB", 0), g.attr("alpha", 1.0)
    if g.needs(0):
        g.give(0, g.op("Gemm", dy, b, alpha=alpha, transB=1 - tb) if not ta else
               g.op("Gemm", b, dy, alpha=alpha, transA=tb, transB=1))
    if g.needs(1):
        g.give(1, g.op("Gemm", a, dy, alpha=alpha, transA=1 - ta) if not tb else
               g.op("Gemm", dy, a, alpha=alpha, transA=1, transB=ta))
    if g.needs(2):
        beta = g.attr("beta", 1.0)
        scaled = dy if beta == 1.0 else g.op("Mul", dy, g.const(beta, dy))
        g.give(2, g.unbroadcast(scaled, 2))


def einsum(g):
    """Each operand's part is an Einsum of dy and the other operands into its subscripts; a letter
    only that operand has (summed away in the forward) is broadcast back with Expand."""
    equation = g.attr("equation")
    equation = (equation.decode() if isinstance(equation, bytes) else equation).replace(" ", "")
    if "..." in equation or "->" not in equation:
        g.refuse("Einsum gradients need an explicit output and no ellipsis")
    lhs, out = equation.split("->")
    terms = lhs.split(",")
    if any(len(set(t)) != len(t) for t in terms):
        g.refuse("an Einsum operand repeats a subscript (a diagonal)")
    for k, term in enumerate(terms):
        if not g.needs(k):
            continue
        others = [(t, g.input(j)) for j, t in enumerate(terms) if j != k]
        known = set(out) | {c for t, _ in others for c in t}
        kept = "".join(c for c in term if c in known)
        part = g.op("Einsum", g.dy(), *[x for _, x in others], equation=",".join([out, *[t for t, _ in others]]) + "->" + kept)
        if kept != term:
            shape = g.shape(g.input(k))
            part = g.op("Expand", g.op("Reshape", part, g.axes(*[d if c in known else 1 for c, d in zip(term, shape)])),
                        g.axes(*shape))
        g.give(k, part)
