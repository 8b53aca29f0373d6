"""Standard ONNX ops that ONNX defines as functions and onnxruntime (1.31, 1.32) has no kernel for:
it expands them at session load into unnamed nodes that it runs outside the plan's order. Written
here as named kernel ops. The losses hold what the function holds (log-probabilities, then
per-sample values; no one-hot)."""

from roam_cli.lower.losses import label_weights


def cast_like(e):
    """Cast to the second input's element type, known statically."""
    e.cast_like(e.input(0), e.input(1), out=e.output(0), saturate=e.attr("saturate"))


def hard_swish(e):
    """x * HardSigmoid(x) with alpha 1/6, beta 1/2 (ONNX's definition)."""
    x = e.input(0)
    e.op("Mul", x, e.op("HardSigmoid", x, alpha=1 / 6, beta=0.5), out=e.output(0))


def softmax_cross_entropy_loss(e):
    """LogSoftmax over the class axis (the optional output log_prob), then the NLL loss of it."""
    log_prob = e.op("LogSoftmax", e.input(0), out=e.output(1), axis=1)
    negative_log_likelihood_loss(e, log_prob)


def negative_log_likelihood_loss(e, log_prob: str | None = None):
    """-input[n, label[n, d...], d...] * w[label], w = weight[label] (1 without weights), 0 where the
    label is ignore_index; reduction none, sum, or mean = sum / sum of w (the valid count when
    unweighted). Inputs [N, C, d...], label [N, d...], weight [C] (optional)."""
    log_prob = log_prob or e.input(0)
    reduction, safe, per_sample = label_weights(e, e.input(1), e.input(2), log_prob)
    column = e.axes(1)
    picked = e.op("Squeeze", e.op("GatherElements", log_prob, e.op("Unsqueeze", safe, column), axis=1), column)
    loss = e.op("Neg", picked, out=e.output(0) if reduction == "none" and per_sample is None else None)
    if per_sample is not None:
        loss = e.op("Mul", loss, per_sample, out=e.output(0) if reduction == "none" else None)
    if reduction == "none":
        return
    if reduction == "sum":
        e.op("ReduceSum", loss, out=e.output(0), keepdims=0)
    elif per_sample is None:
        e.op("ReduceMean", loss, out=e.output(0), keepdims=0)
    else:
        e.op("Div", e.op("ReduceSum", loss, keepdims=0), e.op("ReduceSum", per_sample, keepdims=0), out=e.output(0))
