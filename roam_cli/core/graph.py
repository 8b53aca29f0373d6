"""The one graph IR every pass reads: operators over statically shaped tensors.

Built once by `roam_cli.frontend.onnx_import`; never mutated afterwards. Node indices are positions in
`nodes` (the model's file order, made topological)."""

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache

import numpy as np
from onnx import TensorProto, helper


@dataclass(frozen=True)
class Node:
    name: str
    op_type: str
    domain: str  # "" for the default ONNX domain
    inputs: tuple[str, ...]  # explicit inputs (missing optionals dropped) + subgraph captures
    outputs: tuple[str, ...]  # missing optional outputs dropped


@dataclass(frozen=True)
class Value:
    name: str
    dtype: int  # onnx.TensorProto element type
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Exact size: element count x element size (bool and 8-bit types take one byte)."""
        count = 1
        for d in self.shape:
            count *= d
        return count * element_size(self.dtype)


def type_name(dtype: int) -> str:
    """`float32`, `bfloat16`, `int64`: the element type as numpy (and PyTorch) name it."""
    return np.dtype(helper.tensor_dtype_to_np_dtype(dtype)).name


@cache
def element_size(dtype: int) -> int:
    """Bytes per element; raises ValueError for types without a fixed byte size."""
    if dtype in (TensorProto.STRING, TensorProto.UNDEFINED):
        raise ValueError(f"{TensorProto.DataType.Name(dtype).lower()} tensors have no static size")
    np_type = np.dtype(helper.tensor_dtype_to_np_dtype(dtype))
    if np_type.name in ("int4", "uint4", "float4e2m1", "int2", "uint2"):
        raise ValueError(f"sub-byte {np_type.name} tensors are not supported")
    return np_type.itemsize


@dataclass
class Graph:
    nodes: list[Node]
    values: dict[str, Value]  # every tensor name used by the graph
    inputs: list[str]  # graph inputs that are not initializers
    initializers: list[str]
    outputs: list[str]
    constants: set[str] = field(default_factory=set)  # outputs of Constant nodes
    metadata: dict[str, str] = field(default_factory=dict)  # the model's metadata_props
    producer: dict[str, int] = field(init=False)
    consumers: dict[str, list[int]] = field(init=False)

    def __post_init__(self):
        self.producer = {}
        self.consumers = {}
        for i, node in enumerate(self.nodes):
            for out in node.outputs:
                self.producer[out] = i
            for inp in dict.fromkeys(node.inputs):
                self.consumers.setdefault(inp, []).append(i)

    def node_index(self) -> dict[str, int]:
        return {n.name: i for i, n in enumerate(self.nodes)}


def smallest_first_order(indegree: list[int], successors: Sequence[Sequence[int]]) -> list[int]:
    """Kahn's topological order, taking the smallest ready index first (so a topological file
    order comes back unchanged). Consumes `indegree`; on a cycle the order is short."""
    ready = [v for v, d in enumerate(indegree) if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        v = heapq.heappop(ready)
        order.append(v)
        for w in successors[v]:
            indegree[w] -= 1
            if indegree[w] == 0:
                heapq.heappush(ready, w)
    return order
