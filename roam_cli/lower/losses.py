"""The loss gradient. SoftmaxCrossEntropyLossGrad's lowering holds two logits-sized tensors at any
step, as the fused op does (its input log_prob and its output): exp(log_prob) scaled per sample,
then the label's column corrected in place of a one-hot (ScatterElements add)."""


def label_weights(e, label, weight, like):
    """The losses' shared reading of their attributes and labels: (reduction, safe labels, per-sample
    weights). Safe labels have ignore_index replaced by 0, so that they index; the per-sample weight
    is weight[label] (or 1), zero where the label is ignored, in `like`'s element type; None when it
    is 1 everywhere."""
    reduction, ignore = e.attr("reduction", b"mean"), e.attr("ignore_index")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    safe, per_sample = label, None
    if ignore is not None:
        valid = e.op("Not", e.op("Equal", label, e.const(ignore, label)))
        safe = e.op("Where", valid, label, e.const(0, label))
        per_sample = e.cast_like(valid, like)
    if weight is not None:
        w = e.op("Gather", weight, safe)
        per_sample = w if per_sample is None else e.op("Mul", w, per_sample)
    return reduction, safe, per_sample


def softmax_cross_entropy_loss_grad(e):
    """d logits = (softmax - onehot(label)) * w[label] * dY / denominator; ignored labels give 0.
    Inputs dY, log_prob [N, C, d...], label [N, d...], weight [C] (optional)."""
    dy, log_prob, label, weight = e.input(0), e.input(1), e.input(2), e.input(3)
    reduction, safe, per_sample = label_weights(e, label, weight, dy)
    if reduction == "none":
        per_sample = dy if per_sample is None else e.op("Mul", per_sample, dy)
    else:
        if per_sample is None:
            per_sample = e.op("Expand", e.const(1.0, dy), e.op("Shape", label))
        if reduction == "mean":
            dy = e.op("Div", dy, e.op("ReduceSum", per_sample, keepdims=0))
        per_sample = e.op("Mul", per_sample, dy)
    column = e.axes(1)
    per_sample = e.op("Unsqueeze", per_sample, column)
    scaled = e.op("Mul", e.op("Exp", log_prob), per_sample)
    e.scatter_added(e.op("Unsqueeze", safe, column), e.op("Neg", per_sample), 1, into=scaled, out=e.output(0))
