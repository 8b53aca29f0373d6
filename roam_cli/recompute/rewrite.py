"""Add the recomputing copies to the graph and to its ONNX model.

Each recomputed node gets one copy, named `<node>/recompute`, whose outputs are named
`<output>/recompute` (a counter is appended when a name is taken), reading the saved, persistent
or recomputed versions of its inputs. Every node after the forward that read a recomputed value
reads the copy's output instead; the forward itself is untouched. A copy is placed in the file
right before the first node that needs it, as an eager framework's checkpointing runs it. The
model's metadata_props[RECOMPUTE_KEY] maps each copy to its original node, so that any reader
of the model can tell added nodes (memory.classify_nodes, verify, ONNX Runtime sessions)."""

import json
from dataclasses import replace

import onnx

from roam_cli.annotate import set_meta
from roam_cli.graph import Graph, Node
from roam_cli.memory import RECOMPUTE_KEY
from roam_cli.onnx_import import Imported

SUFFIX = "/recompute"


def unique(name: str, taken: set[str]) -> str:
    candidate, k = name + SUFFIX, 1
    while candidate in taken:
        candidate, k = f"{name}{SUFFIX}_{k}", k + 1
    taken.add(candidate)
    return candidate


def rewrite(imported: Imported, forward: set[int], copied: list[int],
            saved: set[str]) -> tuple[Imported, dict[str, str], dict[str, str]]:
    """The imported model with a copy of each node in `copied` (graph indices of forward nodes);
    the copies' outputs replace, for the nodes outside `forward`, every output not in `saved`.
    Returns it, {copy name: original node name} and {recomputed value: its copy's name}."""
    graph = imported.graph
    node_names = {n.name for n in graph.nodes}
    value_names = set(graph.values)
    renamed = {out: unique(out, value_names) for i in copied for out in graph.nodes[i].outputs if out not in saved}
    copies = {}
    for i in copied:
        n = graph.nodes[i]
        outputs = tuple(renamed[o] if o in renamed else unique(o, value_names) for o in n.outputs)
        copies[i] = Node(unique(n.name, node_names), n.op_type, n.domain,
                         tuple(renamed.get(x, x) for x in n.inputs), outputs)

    sequence: list[tuple[Node, Node]] = []  # (original, node) in the new file order: copies right before their first reader
    placed: set[int] = set()

    def place(i: int) -> None:
        if i not in placed:
            placed.add(i)
            for x in graph.nodes[i].inputs:
                if x in renamed:
                    place(graph.producer[x])
            sequence.append((graph.nodes[i], copies[i]))

    for i, n in enumerate(graph.nodes):
        if i in forward:
            sequence.append((n, n))
            continue
        for x in n.inputs:
            if x in renamed:
                place(graph.producer[x])
        sequence.append((n, replace(n, inputs=tuple(renamed.get(x, x) for x in n.inputs))))

    values = dict(graph.values)
    for i, c in copies.items():
        for old, new in zip(graph.nodes[i].outputs, c.outputs):
            values[new] = replace(graph.values[old], name=new)
    originals = {copies[i].name: graph.nodes[i].name for i in copied}
    metadata = {**graph.metadata, RECOMPUTE_KEY: json.dumps(originals, sort_keys=True)}
    nodes = [n for _, n in sequence]
    new_graph = Graph(nodes, values, graph.inputs, graph.initializers, graph.outputs, graph.constants, metadata)
    model = rewrite_model(imported.model, sequence, values, metadata[RECOMPUTE_KEY])
    return replace(imported, graph=new_graph, model=model), originals, renamed


def rewrite_model(model: onnx.ModelProto, sequence: list[tuple[Node, Node]], values: dict, recorded: str) -> onnx.ModelProto:
    """The ONNX model of `sequence`: each node the clone of its original's proto under its own
    name, inputs and outputs; value_info for the copies' outputs."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    protos = {p.name: p for p in out.graph.node}
    typed = {vi.name for vi in list(out.graph.value_info) + list(out.graph.input) + list(out.graph.output)}
    nodes = []
    for original, node in sequence:
        p = onnx.NodeProto()
        p.CopyFrom(protos[original.name])
        if node is not original:
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
    set_meta(out, RECOMPUTE_KEY, recorded)
    return out


def undo(model: onnx.ModelProto, record: dict) -> onnx.ModelProto:
    """The model without the copies a plan's `recompute` record lists, every reader of a
    recomputed tensor reading the original again: the graph as it was before recomputation."""
    copies = {n["node"] for n in record["nodes"]}
    original = {t["name"]: t["of"] for t in record["tensors"]}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = []
    for p in out.graph.node:
        if p.name in copies:
            continue
        if any(x in original for x in p.input):
            inputs = [original.get(x, x) for x in p.input]
            del p.input[:]
            p.input.extend(inputs)
        kept.append(p)
    del out.graph.node[:]
    out.graph.node.extend(kept)
    made = {o for p in kept for o in p.output}
    infos = [vi for vi in out.graph.value_info if vi.name in made or vi.name not in original]
    del out.graph.value_info[:]
    out.graph.value_info.extend(infos)
    metadata = [kv for kv in out.metadata_props if kv.key != RECOMPUTE_KEY]
    del out.metadata_props[:]
    out.metadata_props.extend(metadata)
    return out
