"""Reductions, softmaxes, normalisations, Dropout and the cross-entropy loss. The normalisations'
gradients read the statistics the forward saved (LayerNormalization's mean and inverse standard
deviation, BatchNormalization's batch mean and inverse standard deviation, Dropout's mask),
added as the forward node's optional outputs when the export left them out."""

from onnx import TensorProto

from roam_cli.lower import activations, losses, norms, training


def reduce_axes(g) -> list[int]:
    rank = len(g.shape(g.input(0)))
    axes = g.attr("axes")
    if axes is None and g.input(1):
        value = g.ctx.constant_value(g.input(1))
        if value is None:
            g.refuse("its axes must be a constant")
        axes = value.ravel().tolist()
    if not axes:
        return [] if g.attr("noop_with_empty_axes", 0) else list(range(rank))
    return sorted(a % rank for a in axes)


def reduce_sum(g, mean: bool = False):
    """dy put back over the reduced axes (kept as size 1), then broadcast to the input's shape."""
    shape = g.shape(g.input(0))
    axes = reduce_axes(g)
    kept = g.op("Reshape", g.dy(), g.axes(*[1 if i in axes else d for i, d in enumerate(shape)]))
    if mean:
        count = 1
        for a in axes:
            count *= shape[a]
        kept = g.op("Mul", kept, g.const(1.0 / count, g.dy()))
    g.give(0, g.op("Expand", kept, g.axes(*shape)))


def reduce_mean(g):
    reduce_sum(g, mean=True)


def softmax(g):
    g.fused(activations.softmax_grad, "SoftmaxGrad_13", [g.dy(), g.output(0)], [0])


def log_softmax(g):
    g.fused(lambda e: activations.softmax_grad(e, log=True), "LogSoftmaxGrad_13", [g.dy(), g.output(0)], [0])


def layer_norm(g):
    x = g.input(0)
    shape = g.shape(x)
    axis = g.attr("axis", -1) % len(shape)
    stat_type = g.attr("stash_type", TensorProto.FLOAT)
    stats = [*shape[:axis], *[1] * (len(shape) - axis)]
    mean = g.forward_output(1, "mean", stat_type, stats)
    inv = g.forward_output(2, "inv_std_dev", stat_type, stats)
    if stat_type != g.ctx.dtype(x):  # float16 input, float32 statistics: the gradient is in the input's type
        mean, inv = (g.op("Cast", s, to=g.ctx.dtype(x)) for s in (mean, inv))
    g.fused(norms.layer_norm_grad, "LayerNormalizationGrad", [g.dy(), x, g.input(1), mean, inv], [0, 1, 2])


def batch_norm(g):
    """Training mode: the batch's statistics, saved by the forward as outputs 3 and 4 (a form the
    `lower` package writes in standard ops when the step is assembled)."""
    if not g.attr("training_mode", 0):
        g.refuse("BatchNormalization in inference mode (training_mode=0) is not differentiated; "
                 "the training graph normalises with the batch's statistics")
    channels = [g.shape(g.input(0))[1]]
    dtype = g.ctx.dtype(g.input(3))  # the running statistics' type: float32 beside a low-precision input
    mean = g.forward_output(3, "saved_mean", dtype, channels)
    inv = g.forward_output(4, "saved_inv_std", dtype, channels)
    g.fused(norms.batch_norm_grad, "BatchNormalizationGrad", [g.dy(), g.input(0), g.input(1), mean, inv], [0, 1, 2])


def dropout(g):
    """Without training_mode (or with a ratio of 0) Dropout is the identity; else dy * mask / (1 - ratio)."""
    mode = g.ctx.constant_value(g.input(2)) if g.input(2) else False
    if mode is not None and not bool(mode):
        g.give(0, g.dy())
        return
    if mode is None:
        g.refuse("its training_mode is computed at run time; make it a constant")
    mask = g.forward_output(1, "mask", TensorProto.BOOL, g.shape(g.input(0)))
    g.fused(training.dropout_grad, "DropoutGrad", [g.dy(), mask, g.input(1)], [0])


def softmax_cross_entropy(g):
    """The loss's gradient from the log-probabilities the forward saved (output 1)."""
    log_prob = g.forward_output(1, "log_prob", g.ctx.dtype(g.input(0)), g.shape(g.input(0)))
    g.fused(losses.softmax_cross_entropy_loss_grad, "SoftmaxCrossEntropyLossGrad",
            [g.dy(), log_prob, g.input(1), g.input(2)], [0])


def negative_log_likelihood(g):
    """-w[label] dy / denominator at the label's column, zeros elsewhere: softmax_cross_entropy's
    gradient without the softmax term."""
    zeros = g.zeros_like(g.input(0))
    g.fused(losses.softmax_cross_entropy_loss_grad, "SoftmaxCrossEntropyLossGrad",
            [g.dy(), g.op("Log", zeros), g.input(1), g.input(2)], [0])
