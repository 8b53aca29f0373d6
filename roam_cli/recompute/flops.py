"""FLOPs of a node from static shapes, the price of recomputing it.

Products (MatMul, Gemm, FusedMatMul) cost 2·M·N·K, convolutions 2·(output elements)·(inputs per
output), a convolution's gradient twice its convolution (the input and the weight gradient);
every other op one per output element, views, shape queries and a rank step's collectives nothing
(they move bytes between ranks: the cost model prices them in seconds)."""

from roam_cli.core.collectives import COLLECTIVES
from roam_cli.core.graph import Graph, Node
from roam_cli.core.memory import VIEW_OPS

PRODUCTS = {"MatMul", "Gemm", "FusedMatMul", "TransposeMatMul", "FusedGemm"}
CONVOLUTIONS = {"Conv", "FusedConv", "ConvTranspose"}
FREE = {"Shape", "Size"}


def elements(shape: tuple[int, ...]) -> int:
    count = 1
    for d in shape:
        count *= d
    return count


def inner_dim(op_type: str, a: tuple[int, ...], b: tuple[int, ...], out: tuple[int, ...]) -> int:
    """K of a product of operands shaped `a` and `b`. A vector operand is K long, and MatMul
    never transposes: a is [.., M, K]. Other products may store a transposed, [.., K, M] (the
    IR keeps no attributes): whichever of a's last two dimensions is not M."""
    if len(a) == 1:
        return a[0]
    if len(b) == 1:  # [.., M, K] x [K]: the output has no N, and its last dimension is M
        return b[0]
    if op_type == "MatMul":
        return a[-1]
    m = out[-2] if len(out) >= 2 else 1
    return a[-1] if a[-2] == m else a[-2]


def node_flops(graph: Graph, node: Node) -> int:
    if (node.domain, node.op_type) in VIEW_OPS or node.op_type in FREE or (node.domain, node.op_type) in COLLECTIVES:
        return 0
    shape = lambda name: graph.values[name].shape  # noqa: E731
    out = shape(node.outputs[0]) if node.outputs else ()
    if node.op_type in PRODUCTS and len(node.inputs) >= 2:
        return 2 * elements(out) * inner_dim(node.op_type, shape(node.inputs[0]), shape(node.inputs[1]), out)
    if node.op_type in CONVOLUTIONS and len(node.inputs) >= 2:
        # weights [C_out, C_in/group, k..] (ConvTranspose: [C_in, C_out/group, k..]): each output
        # (ConvTranspose: each input) element meets the rest of one slice
        w = shape(node.inputs[1])
        per_element = elements(w) // w[0] if w and w[0] else 0
        counted = shape(node.inputs[0]) if node.op_type == "ConvTranspose" else out
        return 2 * elements(counted) * per_element
    if node.op_type == "ConvGrad" and len(node.inputs) >= 3:  # (dY, X, W) -> dX, dW
        dy, w = shape(node.inputs[0]), shape(node.inputs[2])
        per_output = elements(w) // w[0] if w and w[0] else 0
        return 4 * elements(dy) * per_output
    return sum(elements(shape(o)) for o in node.outputs)


def graph_flops(graph: Graph) -> int:
    return sum(node_flops(graph, n) for n in graph.nodes)
