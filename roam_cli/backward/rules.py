"""The gradient rules, one per forward op: op type -> (rule, the inputs it differentiates; None:
all). A rule reads its node's output gradients and gives each input its part (`emit.Grad`).
Ops in NONDIFFERENTIABLE pass nothing back: their results are constant almost everywhere or not
floating-point (shapes, comparisons, indices, rounding, random draws)."""

from roam_cli.backward import elementwise as ew
from roam_cli.backward import linear, movement, normalization, resize, spatial

ALL = None
RULES = {
    # elementwise
    "Add": (ew.add, (0, 1)),
    "Sub": (ew.sub, (0, 1)),
    "Mul": (ew.mul, (0, 1)),
    "Div": (ew.div, (0, 1)),
    "Neg": (ew.neg, (0,)),
    "Pow": (ew.power, (0, 1)),
    "Sqrt": (ew.sqrt, (0,)),
    "Reciprocal": (ew.reciprocal, (0,)),
    "Exp": (ew.exp, (0,)),
    "Log": (ew.log, (0,)),
    "Abs": (ew.absolute, (0,)),
    "Sin": (ew.sin, (0,)),
    "Cos": (ew.cos, (0,)),
    "Erf": (ew.erf, (0,)),
    "Tanh": (ew.tanh, (0,)),
    "Sigmoid": (ew.sigmoid, (0,)),
    "Relu": (ew.relu, (0,)),
    "Gelu": (ew.gelu, (0,)),
    "HardSwish": (ew.hard_swish, (0,)),
    "Where": (ew.where, (1, 2)),
    "Min": (ew.extremum, ALL),
    "Max": (ew.extremum, ALL),
    "Clip": (ew.clip, (0,)),
    "Sum": (ew.total, ALL),
    "Identity": (ew.identity, (0,)),
    # products
    "MatMul": (linear.matmul, (0, 1)),
    "Gemm": (linear.gemm, (0, 1, 2)),
    "Einsum": (linear.einsum, ALL),
    # moving and selecting
    "Reshape": (movement.view, (0,)),
    "Flatten": (movement.view, (0,)),
    "Squeeze": (movement.view, (0,)),
    "Unsqueeze": (movement.view, (0,)),
    "Transpose": (movement.transpose, (0,)),
    "Cast": (movement.cast, (0,)),
    "CastLike": (movement.cast, (0,)),
    "Concat": (movement.concat, ALL),
    "Split": (movement.split, (0,)),
    "Slice": (movement.slice_, (0,)),
    "Pad": (movement.pad, (0,)),
    "Gather": (movement.gather, (0,)),
    "GatherElements": (movement.gather_elements, (0,)),
    "GatherND": (movement.gather_nd, (0,)),
    "Expand": (movement.expand, (0,)),
    "Tile": (movement.tile, (0,)),
    "CumSum": (movement.cum_sum, (0,)),
    "Trilu": (movement.trilu, (0,)),
    # reductions, normalisations, losses
    "ReduceSum": (normalization.reduce_sum, (0,)),
    "ReduceMean": (normalization.reduce_mean, (0,)),
    "Softmax": (normalization.softmax, (0,)),
    "LogSoftmax": (normalization.log_softmax, (0,)),
    "LayerNormalization": (normalization.layer_norm, (0, 1, 2)),
    "BatchNormalization": (normalization.batch_norm, (0, 1, 2)),
    "Dropout": (normalization.dropout, (0,)),
    "SoftmaxCrossEntropyLoss": (normalization.softmax_cross_entropy, (0,)),
    "NegativeLogLikelihoodLoss": (normalization.negative_log_likelihood, (0,)),
    # convolution and pooling
    "Conv": (spatial.conv, (0, 1, 2)),
    "ConvTranspose": (spatial.conv_transpose, (0, 1, 2)),
    "MaxPool": (spatial.max_pool, (0,)),
    "AveragePool": (spatial.average_pool, (0,)),
    "GlobalAveragePool": (spatial.global_average_pool, (0,)),
    "Resize": (resize.resize, (0,)),
}

NONDIFFERENTIABLE = {
    "Shape", "Size", "Constant", "ConstantOfShape", "Range", "EyeLike", "Equal", "Less", "LessOrEqual", "Greater",
    "GreaterOrEqual", "And", "Or", "Xor", "Not", "IsNaN", "IsInf", "ArgMax", "ArgMin", "NonZero",
    "Floor", "Ceil", "Round", "Sign", "OneHot", "RandomNormal", "RandomNormalLike", "RandomUniform",
    "RandomUniformLike", "Bernoulli", "Multinomial",
}
