"""The annotated model: nodes in planned order, plan facts in metadata_props (DESIGN.md), every
node named (`name_nodes`: the stable generated names of unnamed and duplicate-named nodes)."""

import hashlib
import json
import os
from pathlib import Path

import onnx
from onnx import helper

from roam_cli.core.fileio import write_atomic
from roam_cli.core.graph import Graph


def name_nodes(graph: onnx.GraphProto) -> int:
    """Give unnamed and duplicate-named nodes unique names `<op_type>_<file index>`.

    The names depend only on the file, so the same model always gets the same names."""
    taken = {n.name for n in graph.node if n.name}
    seen: set[str] = set()
    renamed = 0
    for i, node in enumerate(graph.node):
        if node.name and node.name not in seen:
            seen.add(node.name)
            continue
        base = f"{node.op_type}_{i}"
        name, k = base, 1
        while name in taken or name in seen:
            name, k = f"{base}_{k}", k + 1
        node.name = name
        seen.add(name)
        taken.add(name)
        renamed += 1
    return renamed


def plan_digest(plan: dict) -> str:
    """sha256 of the plan's decisions (order and tensors), independent of which model file it names."""
    facts = {"order": plan["order"], "tensors": plan["tensors"], "arena_bytes": plan["arena_bytes"]}
    return hashlib.sha256(json.dumps(facts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def set_meta(proto, key: str, value) -> None:
    for kv in proto.metadata_props:
        if kv.key == key:
            kv.value = str(value)
            return
    proto.metadata_props.add(key=key, value=str(value))


def annotate(model: onnx.ModelProto, graph: Graph, plan: dict, source: Path, out: Path) -> onnx.ModelProto:
    """A copy of `model` (weights untouched, on disk) ordered and annotated by `plan`."""
    annotated = onnx.ModelProto()
    annotated.CopyFrom(model)
    g = annotated.graph
    by_name = {n.name: n for n in g.node}
    ordered = [by_name[name] for name in plan["order"]]
    copies = []
    for step, node in enumerate(ordered):
        c = onnx.NodeProto()
        c.CopyFrom(node)
        set_meta(c, "roam.step", step)
        copies.append(c)
    del g.node[:]
    g.node.extend(copies)

    set_meta(annotated, "roam.plan_digest", plan_digest(plan))
    set_meta(annotated, "roam.arena_bytes", plan["arena_bytes"])
    set_meta(annotated, "roam.peak_live_bytes", plan["peak_live_bytes"])

    io = {vi.name: vi for vi in list(g.input) + list(g.output)}
    infos = {vi.name: vi for vi in g.value_info}
    weights = {i.name for i in g.initializer}
    for t in plan["tensors"]:
        vi = io.get(t["name"]) or infos.get(t["name"])
        if vi is None:
            if t["name"] in weights:
                continue
            v = graph.values[t["name"]]
            vi = g.value_info.add()
            vi.CopyFrom(helper.make_tensor_value_info(v.name, v.dtype, v.shape))
            infos[v.name] = vi
        set_meta(vi, "roam.bytes", t["bytes"])
        if t["offset"] is not None:
            set_meta(vi, "roam.offset", t["offset"])
        if "alias_of" in t:
            set_meta(vi, "roam.alias_of", t["alias_of"])

    # External weights stay where they are: point to them from the annotated model's folder.
    for init in g.initializer:
        for kv in init.external_data:
            if kv.key == "location":
                target = (source.parent / kv.value).resolve()
                kv.value = Path(os.path.relpath(target, out.resolve().parent)).as_posix()
    return annotated


def write(model: onnx.ModelProto, out: Path) -> None:
    write_atomic(out, model.SerializeToString())
