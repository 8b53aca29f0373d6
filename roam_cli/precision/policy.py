"""The automatic-mixed-precision policy: the element type each op computes in.

The reference is torch.autocast's CUDA op lists (aten/src/ATen/autocast_mode.h), in ONNX ops:
- `LOW`: the ops autocast runs in the low type (matrix products, convolutions): every
  floating-point input is cast down, the result is low;
- `FLOAT32`: the ops it runs in float32 (softmax, normalisations, exp/log/pow, the reductions that
  sum, the losses): low inputs are cast up, the result is float32;
- every other op takes PyTorch's type promotion over the inputs its ONNX schema says must share
  a type: the widest of their types. A constant (a value no graph input reaches: a scalar, a
  table the exporter or roam folded) takes the other inputs' type, as PyTorch's 0-dim tensors and
  Python scalars do. An op ONNX has no schema for computes in float32.

Where roam differs from torch, and why:
- roam rewrites the float32 export, where a model's own cast to the computing type
  (`cos.to(q.dtype)` in LLaMA's rotary embedding) is a no-op; letting constants take the others'
  type gives the same result for the folded tables such casts are written for. A non-constant
  float32 operand (an attention mask made from the batch, a position bias made from a weight)
  promotes as in torch.
- A GELU written out (GPT-2's, with `pow`) is fused into one `Gelu` before the policy runs
  (`backward.rewrite.fuse_gelu`), which computes in its input's type as `F.gelu` does; torch's
  autocast runs the written-out form's `pow` in float32.
- `ReduceMean` computes in its input's type (torch's `mean` is on neither list); `ReduceSum`,
  torch's `sum`, in float32.
- A Linear's bias, an `Add` exporters write apart from the MatMul, is added in the low type, as
  `F.linear` adds it (`autocast.linear_bias`): by promotion alone it would be float32, and its
  result twice the bytes."""

from onnx import TensorProto

from roam_cli.core.graph import element_size

LOW, FLOAT32 = "low", "float32"

POLICY = {
    **dict.fromkeys(("MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "PRelu"), LOW),
    **dict.fromkeys((
        "Softmax", "LogSoftmax", "LayerNormalization", "GroupNormalization", "LpNormalization",
        "Exp", "Log", "Pow", "Reciprocal", "Softplus", "Sinh", "Cosh", "Tan", "Asin", "Acos",
        "ReduceSum", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
        "CumSum", "SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"), FLOAT32),
}

FLOATS = frozenset({TensorProto.DOUBLE, TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16})


def rule(op_type: str) -> str | None:
    """LOW, FLOAT32, or None: PyTorch's type promotion."""
    return POLICY.get(op_type)


def widest(types) -> int:
    """The type a promotion picks among an op's operands (a step mixes one 16-bit type with wider ones)."""
    return max(types, key=element_size)
