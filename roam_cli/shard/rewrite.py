"""The rank step's graph: a full step's model with every parameter and its optimizer state as a
flat shard, gathered before the forward and backward read it, and every gradient reduce-scattered
before the update reads it (docs/sharding.md has the contract).

Per parameter P of shape S and n elements, s = ceil(n / N):
  P [s] -> AllGather (com.microsoft, group_size N, axis 0) -> P.gathered [N·s]
        -> Slice to [n] (only when N·s > n) -> P.unpadded -> Reshape to S -> P.full,
  which every node of the forward and backward reads instead of P, and per gradient G of P:
  G -> Reshape to [n] -> G.flat -> Pad to [N·s] (only when padded) -> G.padded
    -> ReduceScatter (ai.roam.collective, group_size N, axis 0, reduction "mean") -> G.shard [s],
  which the update reads instead of G. The update's nodes are element-wise: unchanged, they run on
  [s]. Where every reader of P is a Cast to one 16-bit type (a mixed-precision step's weight
  copies), the rank casts its shard first and gathers the 16-bit shard: P [s] -> Cast -> P.cast [s]
  -> AllGather -> ..., the readers of the Casts' outputs read P.full and the Casts go. Half of
  float32's bytes cross the interconnect, as FSDP's MixedPrecisionPolicy gathers param_dtype, and
  the values are the same: a cast rounds each element alone, so it commutes with gathering,
  slicing and reshaping. Graph inputs and in-place outputs keep their names and pairs; their
  shapes become [s]. A gather is placed in the file before the first node reading P, a
  reduce-scatter right after the node making G: the order roam plans moves them where they are
  best."""

import numpy as np
import onnx
from onnx import helper, numpy_helper

from roam_cli.core.collectives import ALL_GATHER, REDUCE_SCATTER
from roam_cli.core.errors import RoamError
from roam_cli.core.graph import Graph
from roam_cli.precision import LOW_TYPES
from roam_cli.shard.arithmetic import padding, shard_size
from roam_cli.shard.find import Survey

MIN_OPSET = 13  # Slice, Pad and Reshape take their sizes as inputs
SLICE, PAD, RESHAPE, CAST = ("", "Slice"), ("", "Pad"), ("", "Reshape"), ("", "Cast")


class Names:
    """Fresh tensor, node and initializer names: `<hint>`, or `<hint>_<k>` where that is taken."""

    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.taken = ({n.name for n in g.node} | {x for n in g.node for x in (*n.input, *n.output)}
                      | {i.name for i in g.input} | {t.name for t in g.initializer} | {o.name for o in g.output})

    def __call__(self, hint: str) -> str:
        name, k = hint, 1
        while name in self.taken:
            name, k = f"{hint}_{k}", k + 1
        self.taken.add(name)
        return name


def rewrite(model: onnx.ModelProto, graph: Graph, found: Survey, ranks: int) -> onnx.ModelProto:
    """A new model: the rank step of `model` (whose graph is `graph`) for `ranks` ranks."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        raise RoamError(f"the step is at ONNX opset {opset}; roam shard writes opset {MIN_OPSET} nodes into it: "
                        "export it at opset 13 or later")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    fresh = Names(out)
    constants: list[onnx.TensorProto] = []
    typed: dict[str, tuple[int, list[int]]] = {}  # new or reshaped values -> (dtype, shape)

    def const(hint: str, values: list[int]) -> str:
        name = fresh(hint)
        constants.append(numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    def node(name: str, op: tuple[str, str], inputs: list[str], output: str, shape: list[int], dtype: int,
             **attrs) -> onnx.NodeProto:
        typed[output] = (dtype, shape)
        return helper.make_node(op[1], inputs, [output], name=fresh(name), domain=op[0], **attrs)

    before: dict[int, list[onnx.NodeProto]] = {}  # node index -> the gathers placed before it
    after: dict[int, list[onnx.NodeProto]] = {}  # node index -> the reduce-scatters placed after it
    gathered: dict[str, str] = {}  # parameter (or its Casts' outputs) -> the full value the forward and
    # backward read
    reduced: dict[str, str] = {}  # gradient -> its shard, which the update reads
    dropped: set[int] = set()  # the Casts of full values whose shards are cast instead, and the Shape and
    # Size nodes of parameters (constants now)
    for p in found.parameters:
        dtype, n = graph.values[p.name].dtype, p.numel
        s, pad = shard_size(n, ranks), padding(n, ranks)
        readers = [u for u in graph.consumers.get(p.name, ()) if u not in found.update_nodes]
        # a Shape or Size of the parameter is known here: a constant, so nothing is gathered for it (a
        # GatherGrad's Shape of the embedding would gather the whole table again in the backward)
        static = [u for u in readers if graph.nodes[u].op_type in ("Shape", "Size") and graph.nodes[u].domain == ""]
        for u in static:
            constants.append(numpy_helper.from_array(static_value(g.node[u], list(p.shape)), graph.nodes[u].outputs[0]))
        dropped.update(static)
        readers = [u for u in readers if u not in static]
        if readers:  # (a parameter only Shape reads is never gathered)
            low = low_copy(graph, readers, found.update_nodes)
            chain = []
            if low is not None:
                dtype = low
                chain.append(node(f"{p.name}/cast", CAST, [p.name], fresh(f"{p.name}.cast"), [s], dtype, to=dtype))
            chain.append(node(f"{p.name}/all_gather", ALL_GATHER, [chain[-1].output[0] if chain else p.name],
                              fresh(f"{p.name}.gathered"), [ranks * s], dtype, group_size=ranks, axis=0))
            if pad:
                chain.append(node(f"{p.name}/unpad", SLICE, [chain[-1].output[0], const(f"{p.name}.start", [0]),
                                                             const(f"{p.name}.numel", [n]), const(f"{p.name}.axis", [0])],
                                  fresh(f"{p.name}.unpadded"), [n], dtype))
            chain.append(node(f"{p.name}/reshape", RESHAPE, [chain[-1].output[0], const(f"{p.name}.shape", list(p.shape))],
                              fresh(f"{p.name}.full"), list(p.shape), dtype))
            gathered[p.name] = chain[-1].output[0]
            if low is not None:  # every Cast's output is the gathered 16-bit value
                gathered.update({graph.nodes[u].outputs[0]: chain[-1].output[0] for u in readers})
                dropped.update(readers)
            before.setdefault(min(readers), []).extend(chain)
        for grad in p.gradients:
            gdtype = graph.values[grad].dtype
            chain = [node(f"{grad}/flatten", RESHAPE, [grad, const(f"{grad}.flat_shape", [n])], fresh(f"{grad}.flat"),
                          [n], gdtype)]
            if pad:
                chain.append(node(f"{grad}/pad", PAD, [chain[-1].output[0], const(f"{grad}.pads", [0, pad])],
                                  fresh(f"{grad}.padded"), [ranks * s], gdtype))
            chain.append(node(f"{grad}/reduce_scatter", REDUCE_SCATTER, [chain[-1].output[0]], fresh(f"{grad}.shard"),
                              [s], gdtype, group_size=ranks, axis=0, reduction="mean"))
            reduced[grad] = chain[-1].output[0]
            after.setdefault(graph.producer[grad], []).extend(chain)

    nodes = []
    for i, proto in enumerate(g.node):
        nodes.extend(before.get(i, ()))
        if i in dropped:
            continue
        renamed = reduced if i in found.update_nodes else gathered
        proto.input[:] = [renamed.get(x, x) for x in proto.input]
        nodes.append(proto)
        nodes.extend(after.get(i, ()))
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(constants)

    # every value a rank holds a shard of is [s]: its inputs, in-place outputs and update temporaries
    size = {p.name: [shard_size(p.numel, ranks)] for p in found.parameters}
    for t, p in found.shard_of.items():
        if t not in reduced:
            typed[t] = (graph.values[t].dtype, size[p])
    for vi in list(g.input) + list(g.output):
        if vi.name in typed:
            vi.type.CopyFrom(helper.make_tensor_type_proto(*typed[vi.name]))
    gone = {graph.nodes[i].outputs[0] for i in dropped}
    kept = [vi for vi in g.value_info if vi.name not in typed and vi.name not in gone]
    del g.value_info[:]
    g.value_info.extend(kept)
    declared = {vi.name for vi in list(g.input) + list(g.output)}
    g.value_info.extend(helper.make_tensor_value_info(t, *typed[t]) for t in typed if t not in declared)
    for domain in (ALL_GATHER[0], REDUCE_SCATTER[0]):
        if not any(o.domain == domain for o in out.opset_import):
            out.opset_import.append(helper.make_opsetid(domain, 1))
    return out


def static_value(proto: onnx.NodeProto, shape: list[int]) -> np.ndarray:
    """What a Shape (with its start and end) or Size node gives for a tensor of `shape`."""
    if proto.op_type == "Size":
        return np.array(int(np.prod(shape)), np.int64)
    attrs = {a.name: a.i for a in proto.attribute}
    return np.array(shape[attrs.get("start", 0):attrs.get("end", len(shape))], np.int64)


def low_copy(graph: Graph, readers: list[int], update_nodes: set[int]) -> int | None:
    """The 16-bit type every one of a parameter's `readers` (its forward and backward nodes) casts
    it to, when each is a Cast to that one type whose output neither leaves the graph nor feeds the
    update (which reads shards); else None."""
    types = set()
    for u in readers:
        n = graph.nodes[u]
        out = n.outputs[0]
        if ((n.domain, n.op_type) != CAST or out in graph.outputs
                or any(c in update_nodes for c in graph.consumers.get(out, ()))):
            return None
        types.add(graph.values[out].dtype)
    return types.pop() if len(types) == 1 and next(iter(types)) in LOW_TYPES else None
