"""Add the transfers between the device and the slow tier to the graph and to its ONNX model.

A node reads a value in its own tier (DESIGN.md, "Memory tiers"), but for the values ONNX Runtime
folds into initializers at the session's start (memory.folded_values), which it holds itself, and
for the ops that read a shape only (METADATA_OPS): those are read where they are. Where a value
does not live in its reader's tier, the node reads a copy made by a transfer node:
`<value>/to_host` or `<value>/to_device` (a second one for the backward, `<value>/to_device/backward`, when the value is fetched per phase),
each made once and read by every node of its tier and phase. An offloaded activation goes to
the slow tier and comes back: the nodes after the forward read `<value>/to_device`, a copy of
`<value>/to_host`. A transfer is standard ONNX, an Expand to the value's own shape (a copy of
any rank: ONNX Runtime allocates its output, where an Identity would share its input's buffer);
the model's metadata_props[TIERS_KEY] says which nodes are transfers, which the host runs and
which persistent tensors live in the slow tier (core.memory reads it). A transfer is placed in
the file right before the first node that reads it; the order moves it."""

import json
from dataclasses import dataclass, replace

import numpy as np
import onnx
from onnx import helper, numpy_helper

from roam_cli.core.annotate import set_meta
from roam_cli.core.errors import RoamError
from roam_cli.core.graph import Graph, Node, Value
from roam_cli.core.memory import DEVICE, TIERS_KEY, MemoryModel, folded_values
from roam_cli.frontend.onnx_import import Imported
from roam_cli.recompute.rewrite import unique

SAME_SHAPE = "roam/same_shape"  # the empty shape every transfer's Expand reads: keep the input's own
TRANSFER_OP = "Expand"
# Ops that read their input's shape, not its bytes: they read it in whichever tier it lives (and
# ONNX Runtime folds them where shapes are static)
METADATA_OPS = {("", "Shape"), ("", "Size")}


@dataclass(frozen=True)
class Placement:
    """Where each byte lives: plain values a policy or the planner chooses."""

    slow: str  # "host" | "storage"
    offloaded: frozenset[str] = frozenset()  # forward values sent to the slow tier until the backward
    homes: frozenset[str] = frozenset()  # persistent tensors kept in the slow tier
    host_nodes: frozenset[int] = frozenset()  # nodes the host runs (the optimizer update)
    fetch_per_phase: bool = False  # a home read by the device: one copy for the forward, one after it


def rewrite(imported: Imported, mm: MemoryModel, placement: Placement) -> tuple[Imported, list[dict]]:
    """The model with the transfers `placement` needs, and one record per transfer: {node, value,
    direction, bytes}. ValueError when the placement is not one a step can run (a device node
    writing in place into a tensor kept in the slow tier): a policy's bug, never a user's error."""
    graph = imported.graph
    slow = placement.slow
    tier_of_node = [slow if i in placement.host_nodes else DEVICE for i in range(len(graph.nodes))]

    def tier_of(x: str) -> str:
        """Where x lives once the graph is rewritten: a persistent tensor in its home; anything a
        node makes (a view too: its node reads a copy in its own tier) in that node's tier."""
        if x in graph.producer:
            return tier_of_node[graph.producer[x]]
        return slow if x in placement.homes else DEVICE

    for i, n in enumerate(graph.nodes):
        for out in n.outputs:
            root = mm.storage_of[out]
            if mm.alias.get(out) == "inplace" and root in mm.persistent and tier_of(root) != tier_of_node[i]:
                raise ValueError(f"node {n.name!r} runs on the {tier_of_node[i]} but writes into {root!r}, "
                                 f"kept on the {tier_of(root)}")

    folded = folded_values(graph)  # read where they are: ORT holds them itself, and folds a copy of one
    taken = set(graph.values) | {n.name for n in graph.nodes}
    values = dict(graph.values)
    made: dict[tuple[str, str, bool], Node] = {}  # (value, tier, after the forward) -> its transfer
    records: list[dict] = []

    def transfer(source: str, value: str, to: str, suffix: str) -> Node:
        name = unique(f"{value}/to_{'host' if to != DEVICE else 'device'}{suffix}", taken, "")
        node = Node(name, TRANSFER_OP, "", (source, SAME_SHAPE), (name,))
        values[name] = replace(graph.values[value], name=name)
        records.append({"node": name, "value": value, "reads": source,
                        "direction": "to_host" if to != DEVICE else "to_device", "bytes": mm.tensor_bytes[value]})
        return node

    sequence: list[Node] = []

    def copy_for(x: str, tier: str, after_forward: bool) -> str:
        """The name node of `tier` reads for x (phase: after the forward or not)."""
        if x in folded:
            return x
        if x in placement.offloaded and after_forward and tier == DEVICE:
            key = (x, slow, False)  # the copy a host node reading x reads too
            if key not in made:
                made[key] = transfer(x, x, slow, "")
                sequence.append(made[key])
            back = (x, DEVICE, True)
            if back not in made:
                made[back] = transfer(made[key].outputs[0], x, DEVICE, "")
                sequence.append(made[back])
            return made[back].outputs[0]
        if tier_of(x) == tier:
            return x
        phase = after_forward and placement.fetch_per_phase and tier == DEVICE
        key = (x, tier, phase)
        if key not in made:
            made[key] = transfer(x, x, tier, "/backward" if phase else "")
            sequence.append(made[key])
        return made[key].outputs[0]

    for i, n in enumerate(graph.nodes):
        after_forward = mm.node_class[i] != "forward"
        inputs = n.inputs if (n.domain, n.op_type) in METADATA_OPS else \
            tuple(copy_for(x, tier_of_node[i], after_forward) for x in n.inputs)
        sequence.append(n if inputs == n.inputs else replace(n, inputs=inputs))

    host_nodes = sorted(graph.nodes[i].name for i in placement.host_nodes)
    return tiered(imported, sequence, values, slow, records, host_nodes, sorted(placement.homes)), records


def reapply(imported: Imported, plan: dict) -> Imported:
    """The source model rewritten as a plan's `offload` and `tiers` say: the same transfers, under
    the same names, read by the same nodes, as `rewrite` made them."""
    graph = imported.graph
    index = graph.node_index()
    transfers = plan["offload"]["transfers"]
    made = {t["node"] for t in transfers}
    missing = next((r for t in transfers for r in t["readers"] if r not in index and r not in made), None)
    if missing is not None:
        raise RoamError(f"the plan's transfers are read by node {missing!r}, which the model does not have")
    by_name = {t["node"]: t for t in transfers}
    wanted: dict[str, list[str]] = {}  # reader -> the transfers it reads
    for t in transfers:
        for r in t["readers"]:
            wanted.setdefault(r, []).append(t["node"])
    values = dict(graph.values)
    sequence: list[Node] = []
    placed: set[str] = set()

    def place(name: str) -> None:
        t = by_name[name]
        if name in placed:
            return
        placed.add(name)
        if t["reads"] in by_name:  # a fetch of an offloaded value reads its copy on the host
            place(t["reads"])
        values[name] = replace(graph.values[t["value"]], name=name)
        sequence.append(Node(name, TRANSFER_OP, "", (t["reads"], SAME_SHAPE), (name,)))

    for n in graph.nodes:
        reads = {by_name[t]["value"]: t for t in wanted.get(n.name, ())}  # what it read before: the value
        for t in reads.values():
            place(t)
        sequence.append(replace(n, inputs=tuple(reads.get(x, x) for x in n.inputs)) if reads else n)
    homes = sorted(t["name"] for t in plan["tensors"] if t.get("tier") and t["offset"] is None and "alias_of" not in t)
    records = [{"node": t["node"], "direction": t["direction"]} for t in transfers]
    return tiered(imported, sequence, values, plan["tiers"]["slow"], records, plan["tiers"].get("host_nodes", []), homes)


def tiered(imported: Imported, sequence: list[Node], values: dict[str, Value], slow: str, records: list[dict],
           host_nodes: list[str], homes: list[str]) -> Imported:
    """The imported model with the nodes of `sequence`, and TIERS_KEY saying what it has."""
    graph = imported.graph
    transfers = {r["node"]: r["direction"] for r in records}
    metadata = {**graph.metadata, TIERS_KEY: json.dumps({"tier": slow, "transfers": transfers, "host_nodes": host_nodes,
                                                         "homes": homes}, sort_keys=True)}
    shape = numpy_helper.from_array(np.zeros(0, np.int64), SAME_SHAPE)
    values = {**values, SAME_SHAPE: Value(SAME_SHAPE, onnx.TensorProto.INT64, (0,))}
    new_graph = Graph(sequence, values, graph.inputs, list(graph.initializers) + [SAME_SHAPE], graph.outputs,
                      graph.constants, metadata)
    model = rewrite_model(imported.model, graph, sequence, values, metadata[TIERS_KEY], shape)
    return replace(imported, graph=new_graph, model=model)


def rewrite_model(model: onnx.ModelProto, graph: Graph, sequence: list[Node], values: dict[str, Value], recorded: str,
                  shape: onnx.TensorProto) -> onnx.ModelProto:
    """The ONNX model of `sequence`: the model's own nodes with their inputs renamed, the transfers
    new Expand nodes with value_info for their outputs."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    protos = {p.name: p for p in out.graph.node}
    originals = {n.name: n.inputs for n in graph.nodes}
    nodes = []
    for node in sequence:
        if node.name not in protos:
            nodes.append(helper.make_node(TRANSFER_OP, list(node.inputs), list(node.outputs), name=node.name))
            v = values[node.outputs[0]]
            out.graph.value_info.append(helper.make_tensor_value_info(v.name, v.dtype, v.shape))
            continue
        p = protos[node.name]
        if node.inputs != originals[node.name]:  # a node reads one copy of a value, however often
            renamed = dict(zip(originals[node.name], node.inputs))
            inputs = [renamed.get(x, x) for x in p.input]
            del p.input[:]
            p.input.extend(inputs)
        nodes.append(p)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.append(shape)
    set_meta(out, TIERS_KEY, recorded)
    return out
