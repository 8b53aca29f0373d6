"""Add the recomputing nodes to the graph and to its ONNX model, or take them out again.

Each recomputed node gets one copy, named `<node>/recompute`, whose outputs are named
`<output>/recompute` (a counter is appended when a name is taken), reading the saved, persistent
or recomputed versions of its inputs. A replayed Dropout output is made by `<dropout>/replay`,
ONNX Runtime's DropoutGrad on the Dropout's input, saved mask, ratio and training mode. Every
node after the forward that read a recomputed value reads the new one instead; the forward itself
is untouched. A new node is placed in the file right before the first node that needs it, as an
eager framework's checkpointing runs it. The model's metadata_props[RECOMPUTE_KEY] maps each
added node to its original, so that any reader of the model can tell them (memory.classify_nodes,
ONNX Runtime sessions)."""

import json
from dataclasses import replace

import onnx

from roam_cli.core.annotate import set_meta
from roam_cli.core.graph import Graph, Node
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
    added: dict[int, Node] = {}  # graph index of the original -> its copy or replay
    for i in copied:
        n = graph.nodes[i]
        outputs = tuple(renamed[o] if o in renamed else unique(o, value_names) for o in n.outputs)
        added[i] = Node(unique(n.name, node_names), n.op_type, n.domain, tuple(renamed.get(x, x) for x in n.inputs),
                        outputs)
    for v in sorted(replayed):
        i = graph.producer[v]
        n = graph.nodes[i]
        data, ratio, mode = n.inputs
        added[i] = Node(unique(n.name, node_names, REPLAY), REPLAY_OP, REPLAY_DOMAIN,
                        (renamed.get(data, data), n.outputs[1], ratio, mode), (renamed[v],))

    sequence: list[tuple[Node, Node]] = []  # (original, node) in the new file order
    placed: set[int] = set()

    def place(i: int) -> None:
        if i not in placed:
            placed.add(i)
            for x in graph.nodes[i].inputs:  # the original's: `renamed` maps them to what the new node reads
                if x in renamed:
                    place(graph.producer[x])
            sequence.append((graph.nodes[i], added[i]))

    for i, n in enumerate(graph.nodes):
        if i in forward:
            sequence.append((n, n))
            continue
        for x in n.inputs:
            if x in renamed:
                place(graph.producer[x])
        sequence.append((n, replace(n, inputs=tuple(renamed.get(x, x) for x in n.inputs))))

    values = dict(graph.values)
    for i, node in added.items():
        for old, new in zip(graph.nodes[i].outputs, node.outputs):
            values[new] = replace(graph.values[old], name=new)
    originals = {node.name: graph.nodes[i].name for i, node in added.items()}
    metadata = {**graph.metadata, RECOMPUTE_KEY: json.dumps(originals, sort_keys=True)}
    nodes = [n for _, n in sequence]
    new_graph = Graph(nodes, values, graph.inputs, graph.initializers, graph.outputs, graph.constants, metadata)
    model = rewrite_model(imported.model, sequence, values, metadata[RECOMPUTE_KEY])
    return replace(imported, graph=new_graph, model=model), originals, renamed


def rewrite_model(model: onnx.ModelProto, sequence: list[tuple[Node, Node]], values: dict, recorded: str) -> onnx.ModelProto:
    """The ONNX model of `sequence`: a copy is the clone of its original's proto under its own
    name, inputs and outputs, a replay a new DropoutGrad node; value_info for their outputs."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    protos = {p.name: p for p in out.graph.node}
    typed = {vi.name for vi in list(out.graph.value_info) + list(out.graph.input) + list(out.graph.output)}
    nodes = []
    for original, node in sequence:
        p = onnx.NodeProto()
        if node.op_type == REPLAY_OP and original.op_type != REPLAY_OP:
            p = onnx.helper.make_node(REPLAY_OP, list(node.inputs), list(node.outputs), name=node.name,
                                      domain=REPLAY_DOMAIN)
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
