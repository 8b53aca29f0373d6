"""Which operators a recompute may copy, and the class each belongs to in the report.

A copy must compute the same values as the original from the same inputs: no random op (Dropout
keeps its saved mask), no in-place write, no op with subgraphs or state. `free` copies only ops
whose cost is a pass over their data (elementwise, shape and view, normalisation, activation);
`budget` also copies the compute-bound products and reductions, which the FLOP count prices. Both
gather a rank step's parameter again (roam shard's all-gather): it reads the rank's own shard,
persistent, and costs no FLOP; its price is communication, which the report estimates."""

from roam_cli.core.collectives import ALL_GATHER
from roam_cli.core.graph import Node
from roam_cli.core.memory import INPLACE_OPS

ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Neg", "Abs", "Exp", "Log", "Erf",
               "Cast", "CastLike", "Where", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not",
               "And", "Or", "Xor", "Max", "Min", "Clip", "Sum", "Mean", "Ceil", "Floor", "Round", "Sign",
               "IsNaN", "IsInf", "Mod", "BitShift", "Scale"}
SHAPE = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose", "Expand", "Concat", "Slice",
         "Split", "Gather", "GatherElements", "GatherND", "Pad", "Tile", "Shape", "Size", "ConstantOfShape",
         "Range", "Trilu"}
NORMALISATION = {"LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
                 "SkipSimplifiedLayerNormalization", "BatchNormalization", "BatchNormInternal",
                 "InstanceNormalization", "GroupNormalization", "RMSNormalization", "LpNormalization"}
ACTIVATION = {"Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "Gelu", "FastGelu", "BiasGelu", "QuickGelu",
              "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Softplus", "Softsign", "Mish", "Softmax",
              "LogSoftmax", "Hardmax", "ThresholdedRelu", "Sin", "Cos"}
# compute-bound (2·M·N·K) and reducing ops: worth copying only when memory is worth their FLOPs
COMPUTE = {"MatMul", "Gemm", "FusedMatMul", "Conv", "ConvTranspose", "Einsum", "Attention",
           "MultiHeadAttention", "FusedConv", "FusedGemm", "TransposeMatMul"}
REDUCTION = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceL1",
             "ReduceLogSumExp", "ReduceSumSquare", "MaxPool", "AveragePool", "GlobalAveragePool",
             "GlobalMaxPool", "ArgMax", "ArgMin", "CumSum", "TopK"}
# never: a copy would draw other random numbers
RANDOM = {"Dropout", "BitmaskDropout", "BiasDropout", "BitmaskBiasDropout", "RandomNormal", "RandomNormalLike",
          "RandomUniform", "RandomUniformLike", "Bernoulli", "Multinomial"}

CLASSES = {**{op: "elementwise" for op in ELEMENTWISE}, **{op: "shape" for op in SHAPE},
           **{op: "normalisation" for op in NORMALISATION}, **{op: "activation" for op in ACTIVATION},
           **{op: "compute" for op in COMPUTE}, **{op: "reduction" for op in REDUCTION}}
COLLECTIVE = "collective"  # a parameter gathered again (FSDP's reshard after forward)
FREE_CLASSES = ("elementwise", "shape", "normalisation", "activation", COLLECTIVE)
MODE_CLASSES = {"free": FREE_CLASSES, "budget": FREE_CLASSES + ("compute", "reduction")}
DOMAINS = ("", "com.microsoft")  # ops of other domains are unknown: never copied


def op_class(node: Node) -> str | None:
    """elementwise | shape | normalisation | activation | compute | reduction | collective; None for
    an op no recompute copies (random, in-place, control flow, unknown, a reduce-scatter)."""
    if (node.domain, node.op_type) == ALL_GATHER:
        return COLLECTIVE
    if node.domain not in DOMAINS or (node.domain, node.op_type) in INPLACE_OPS or node.op_type in RANDOM:
        return None
    return CLASSES.get(node.op_type)


def copyable(node: Node, mode: str) -> bool:
    return op_class(node) in MODE_CLASSES[mode]


REPLAY_CLASS = "dropout replay"  # the report's class of a Dropout output recomputed from its mask


def replay_inputs(node: Node) -> tuple[str, ...] | None:
    """The inputs of the replay of a Dropout's output (DropoutGrad(input, mask, ratio,
    training_mode), as ONNX Runtime's gradient builder makes it); None for any other node, and for
    a Dropout without its mask or its ratio and mode inputs, whose replay could differ."""
    if (node.domain, node.op_type) != ("", "Dropout") or len(node.outputs) != 2 or len(node.inputs) != 3:
        return None
    return (node.inputs[0], node.outputs[1], node.inputs[1], node.inputs[2])
