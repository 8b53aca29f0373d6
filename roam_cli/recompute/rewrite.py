"""Add the recomputing nodes to the graph and to its ONNX model, or take them out again.

Each recomputed node gets one copy, named `<node>/recompute`, whose outputs are named
`<output>/recompute` (a counter is appended when a name is taken), reading the saved, persistent
or recomputed versions of its inputs. A replayed Dropout output is made by `<dropout>/replay`
from the Dropout's input, saved mask, ratio and training mode: in a graph whose backward uses
ONNX Runtime's DropoutGrad, that kernel (the backward's own arithmetic); in any other graph, in
standard ONNX, as ONNX Runtime's Dropout computes it, bit for bit: where the mask is true,
input / (1 - ratio), else 0 (training mode off: the ratio taken as 0, the mask being all true). Every
node after the forward that read a recomputed value reads the new one instead; the forward itself
is untouched. A new node is placed in the file right before the first node that needs it, as an
eager framework's checkpointing runs it. The model's metadata_props[RECOMPUTE_KEY] maps each
added node to its original, so that any reader of the model can tell them (memory.classify_nodes,
ONNX Runtime sessions)."""

import json
from dataclasses import replace

import numpy as np
import onnx
from onnx import helper, numpy_helper

from roam_cli.core.annotate import set_meta
from roam_cli.core.graph import Graph, Node, Value
from roam_cli.core.memory import RECOMPUTE_KEY
from roam_cli.frontend.onnx_import import Imported

SUFFIX = "/recompute"
REPLAY = "/replay"
REPLAY_OP = "DropoutGrad"  # com.microsoft: dX = dY x mask x scale, the Dropout's own arithmetic
REPLAY_DOMAIN = "com.microsoft"


def unique(name: str, taken: set[str], suffix: str = SUFFIX) -> str:
    candidate, k = name + suffix, 1
    while candidate in taken:
        candidate, k = f"{name}{suffix}_{k}", k + 1
    taken.add(candidate)
    return candidate


def standard_replay(name: str, dropout: Node, data: str, out: str, graph: Graph, taken: set[str]
                    ) -> tuple[list[Node], list[onnx.TensorProto], list[Value]]:
    """The nodes that replay `dropout`'s output from `data` in standard ONNX, the scalar constants
    they read, and their intermediate values: keep = mode ? 1 - ratio : 1; out = mask ? data / keep : 0."""
    source, ratio, mode = dropout.inputs  # `data` is `source` or its recomputed copy
    mask = dropout.outputs[1]
    one = numpy_helper.from_array(np.array(1, helper.tensor_dtype_to_np_dtype(graph.values[ratio].dtype)),
                                  unique(name, taken, "/one"))
    zero = numpy_helper.from_array(np.array(0, helper.tensor_dtype_to_np_dtype(graph.values[source].dtype)),
                                   unique(name, taken, "/zero"))
    kept, keep, scaled = (unique(name, taken, s) for s in ("/kept", "/keep", "/scaled"))
    nodes = [Node(kept, "Sub", "", (one.name, ratio), (kept,)),
             Node(keep, "Where", "", (mode, kept, one.name), (keep,)),
             Node(scaled, "Div", "", (data, keep), (scaled,)),
             Node(name, "Where", "", (mask, scaled, zero.name), (out,))]
    scalar = graph.values[ratio].dtype
    values = [Value(one.name, scalar, ()), Value(zero.name, zero.data_type, ()), Value(kept, scalar, ()),
              Value(keep, scalar, ()), replace(graph.values[source], name=scaled)]
    return nodes, [one, zero], values


def rewrite(imported: Imported, forward: set[int], copied: list[int], saved: set[str],
            replayed: set[str]) -> tuple[Imported, dict[str, str], dict[str, str]]:
    """The imported model with a copy of each node in `copied` (graph indices of forward nodes)
    and a replay of each Dropout output in `replayed`; the new outputs replace, for the nodes
    outside `forward`, every output of a copied node not in `saved` and every replayed output.
    Returns it, {added node: original node} and {recomputed value: its new name}."""
    graph = imported.graph
    node_names = {n.name for n in graph.nodes}
    value_names = set(graph.values)
    renamed = {out: unique(out, value_names) for i in copied for out in graph.nodes[i].outputs if out not in saved}
    renamed |= {v: unique(v, value_names) for v in sorted(replayed)}
    added: dict[int, list[Node]] = {}  # graph index of the original -> its copy, or its replay's nodes
    constants: list[onnx.TensorProto] = []  # the standard replays' scalars
    values = dict(graph.values)
    for i in copied:
        n = graph.nodes[i]
        outputs = tuple(renamed[o] if o in renamed else unique(o, value_names) for o in n.outputs)
        added[i] = [Node(unique(n.name, node_names), n.op_type, n.domain, tuple(renamed.get(x, x) for x in n.inputs),
                         outputs)]
    fused = any((n.domain, n.op_type) == (REPLAY_DOMAIN, REPLAY_OP) for n in graph.nodes)
    for v in sorted(replayed):
        i = graph.producer[v]
        n = graph.nodes[i]
        data, ratio, mode = n.inputs
        name = unique(n.name, node_names, REPLAY)
        if fused:
            added[i] = [Node(name, REPLAY_OP, REPLAY_DOMAIN, (renamed.get(data, data), n.outputs[1], ratio, mode),
                             (renamed[v],))]
        else:
            added[i], scalars, made = standard_replay(name, n, renamed.get(data, data), renamed[v], graph,
                                                      node_names | value_names)
            constants += scalars
            values.update({x.name: x for x in made})

    sequence: list[tuple[Node, Node]] = []  # (original, node) in the new file order
    placed: set[int] = set()

    def place(first: int) -> None:
        """Node first's copies, after those of every recomputed value they read (depth first, with a
        stack: a chain of copies runs thousands deep on a GPT2-XL-class step)."""
        stack = [(first, False)]
        while stack:
            i, ready = stack.pop()
            if ready:
                sequence.extend((graph.nodes[i], node) for node in added[i])
                continue
            if i in placed:
                continue
            placed.add(i)
            stack.append((i, True))
            # the original's inputs: `renamed` maps them to what the new node reads
            stack.extend((graph.producer[x], False) for x in reversed(graph.nodes[i].inputs) if x in renamed)

    for i, n in enumerate(graph.nodes):
        if i in forward:
            sequence.append((n, n))
            continue
        for x in n.inputs:
            if x in renamed:
                place(graph.producer[x])
        sequence.append((n, replace(n, inputs=tuple(renamed.get(x, x) for x in n.inputs))))

    for i, nodes in added.items():  # a copy's outputs, a replay's last: the original's values renamed
        for old, new in zip(graph.nodes[i].outputs, nodes[-1].outputs):
            values[new] = replace(graph.values[old], name=new)
    originals = {node.name: graph.nodes[i].name for i, nodes in added.items() for node in nodes}
    metadata = {**graph.metadata, RECOMPUTE_KEY: json.dumps(originals, sort_keys=True)}
    nodes = [n for _, n in sequence]
    new_graph = Graph(nodes, values, graph.inputs, list(graph.initializers) + [c.name for c in constants], graph.outputs,
                      graph.constants, metadata)
    model = rewrite_model(imported.model, sequence, values, metadata[RECOMPUTE_KEY], constants)
    return replace(imported, graph=new_graph, model=model), originals, renamed


def rewrite_model(model: onnx.ModelProto, sequence: list[tuple[Node, Node]], values: dict, recorded: str,
                  constants: list[onnx.TensorProto]) -> onnx.ModelProto:
    """The ONNX model of `sequence`: a copy is the clone of its original's proto under its own
    name, inputs and outputs, a replay's nodes new ones; value_info for their outputs."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    protos = {p.name: p for p in out.graph.node}
    typed = {vi.name for vi in list(out.graph.value_info) + list(out.graph.input) + list(out.graph.output)}
    nodes = []
    for original, node in sequence:
        p = onnx.NodeProto()
        if node.op_type != original.op_type:  # a replay's
            p = onnx.helper.make_node(node.op_type, list(node.inputs), list(node.outputs), name=node.name,
                                      domain=node.domain)
        else:
            p.CopyFrom(protos[original.name])
        if node is not original and node.op_type == original.op_type:
            p.name = node.name
            inputs = dict(zip(original.inputs, node.inputs))
            outputs = dict(zip(original.outputs, node.outputs))
            renamed_inputs = [inputs.get(x, x) for x in p.input]
            renamed_outputs = [outputs.get(x, x) for x in p.output]
            del p.input[:], p.output[:]
            p.input.extend(renamed_inputs)
            p.output.extend(renamed_outputs)
        for v in set(node.outputs) - set(original.outputs) - typed:
            out.graph.value_info.append(onnx.helper.make_tensor_value_info(v, values[v].dtype, values[v].shape))
        nodes.append(p)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(constants)
    if any(n.op_type == REPLAY_OP and n.domain == REPLAY_DOMAIN for _, n in sequence) and \
            not any(o.domain == REPLAY_DOMAIN for o in out.opset_import):
        out.opset_import.append(onnx.helper.make_opsetid(REPLAY_DOMAIN, 1))
    set_meta(out, RECOMPUTE_KEY, recorded)
    return out


def undo(model: onnx.ModelProto, record: dict) -> onnx.ModelProto:
    """The model without the nodes a plan's `recompute` record lists, every reader of a
    recomputed tensor reading the original again: the graph as it was before recomputation."""
    added = {n["node"] for n in record["nodes"]}
    original = {t["name"]: t["of"] for t in record["tensors"]}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = []
    for p in out.graph.node:
        if p.name in added:
            continue
        if any(x in original for x in p.input):
            inputs = [original.get(x, x) for x in p.input]
            del p.input[:]
            p.input.extend(inputs)
        kept.append(p)
    del out.graph.node[:]
    out.graph.node.extend(kept)
    infos = [vi for vi in out.graph.value_info if vi.name not in original]
    del out.graph.value_info[:]
    out.graph.value_info.extend(infos)
    metadata = [kv for kv in out.metadata_props if kv.key != RECOMPUTE_KEY]
    del out.metadata_props[:]
    out.metadata_props.extend(metadata)
    return out
