"""Lower ONNX Runtime's fused training ops to standard ONNX (issue 18).

`lower_model` rewrites every node outside the standard ONNX operator set as a few standard nodes
with the same outputs (`RULES`: one rule per op, in the family modules), so that any maintained
ONNX runtime runs the graph. Graph inputs and outputs keep their names and order; an in-place
update (a gradient accumulator, an optimizer step) becomes a graph output `<state>.out`, appended
after the original outputs and declared in metadata `roam.inplace`, which the memory model writes
into the state's own buffer. Nothing reads a weight: external data stays where it is."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import onnx
from onnx import helper

from roam_cli.core.errors import RoamError
from roam_cli.core.fileio import write_atomic
from roam_cli.core.memory import INPLACE_KEY
from roam_cli.lower import activations, grads, losses, norms, optimizers, training
from roam_cli.lower.emit import Emit, Lowering

RULES = {**losses.RULES, **norms.RULES, **activations.RULES, **grads.RULES, **training.RULES, **optimizers.RULES}
STANDARD_DOMAINS = ("", "ai.onnx")
# metadata_props key of a lowered model: {"path": source relative to the model's folder, "sha256"}
LOWERED_FROM_KEY = "roam.lowered_from"
# The default-domain opset a lowered model declares at least: Gelu (20) is the newest op a rule
# writes, and onnxruntime 1.19 and later run it.
MIN_OPSET = 20


def rule_for(node: onnx.NodeProto):
    """The rule lowering `node`, or None when the node is standard ONNX that any runtime runs."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    rule = RULES.get((domain, node.op_type))
    if rule is not None and (domain, node.op_type) in CONDITIONAL:
        return rule if CONDITIONAL[(domain, node.op_type)](node) else None
    return rule


# Standard ops lowered only in a form today's runtimes do not run.
CONDITIONAL = {("", "BatchNormalization"): lambda n: any(a.name == "training_mode" and a.i for a in n.attribute)}


def nonstandard_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The nodes that are not standard ONNX (or that ONNX Runtime's inference builds do not run)."""
    found = []
    for n in model.graph.node:
        domain = "" if n.domain == "ai.onnx" else n.domain
        if domain not in STANDARD_DOMAINS or not onnx.defs.has(n.op_type) or rule_for(n) is not None:
            found.append(n)
    return found


def lower_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` in standard ONNX; RoamError naming the first op that has no rule."""
    for n in nonstandard_nodes(model):
        if rule_for(n) is None:
            raise RoamError(f"cannot lower {n.op_type} node {n.name!r} (domain {n.domain or 'ai.onnx'!r}): "
                            "no rule for this op")
    check_opset(model)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    named = name_nodes(out.graph)
    ctx = Lowering(out)
    nodes = []
    for n in named:
        rule = rule_for(n)
        if rule is None:
            nodes.append(n)
            continue
        emit = Emit(n, ctx)
        rule(emit)
        nodes.extend(emit.nodes)
    g = out.graph
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(ctx.constants.values())
    g.output.extend(ctx.outputs)
    if ctx.inplace:
        meta = {p.key: p for p in out.metadata_props}
        pairs = json.loads(meta[INPLACE_KEY].value) if INPLACE_KEY in meta else {}
        pairs.update(ctx.inplace)
        if INPLACE_KEY in meta:
            meta[INPLACE_KEY].value = json.dumps(pairs)
        else:
            out.metadata_props.add(key=INPLACE_KEY, value=json.dumps(pairs))
    set_opsets(out)
    return out


def name_nodes(g: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Every node of the graph, an unnamed one given a name that its generated tensors derive from."""
    taken = {n.name for n in g.node}
    for k, n in enumerate(g.node):
        if not n.name:
            n.name = next(c for c in (f"{n.op_type}_{k}", f"{n.op_type}_{k}_lowered") if c not in taken)
            taken.add(n.name)
    return list(g.node)


def check_opset(model: onnx.ModelProto) -> None:
    """The rules write opset-18 forms (Reduce* axes as inputs); raising an older model to 18
    would change its own nodes, which is onnx.version_converter's job, not lowering's."""
    for imp in model.opset_import:
        if imp.domain in STANDARD_DOMAINS and imp.version < 18:
            raise RoamError(f"the model imports ONNX opset {imp.version}; lowering needs opset 18 or later "
                            "(onnx.version_converter.convert_version converts it)")


def set_opsets(model: onnx.ModelProto) -> None:
    """Default domain at MIN_OPSET or above (18 to 20 adds ops and types only, no node of the
    model changes meaning); drop the imports no node uses any more."""
    used = {n.domain for n in model.graph.node} | {""}
    kept = []
    for imp in model.opset_import:
        if imp.domain in STANDARD_DOMAINS:
            kept.append(helper.make_opsetid("", max(imp.version, MIN_OPSET)))
        elif imp.domain in used:
            kept.append(imp)
    del model.opset_import[:]
    model.opset_import.extend(kept)


def summary(before: onnx.ModelProto, after: onnx.ModelProto) -> dict:
    """Which ops were rewritten, and the node counts."""
    rewritten = Counter(n.op_type for n in nonstandard_nodes(before))
    return {"nodes_before": len(before.graph.node), "nodes_after": len(after.graph.node),
            "rewritten": dict(sorted(rewritten.items())), "nonstandard_after": len(nonstandard_nodes(after))}


def write_lowered(lowered: onnx.ModelProto, source: Path, sha256: str, out: Path) -> None:
    """Write the lowered model atomically, recording its source; external weights stay where
    they are, referenced from the output's folder."""
    def relative(target: Path) -> str:
        return Path(os.path.relpath(target.resolve(), out.resolve().parent)).as_posix()

    for init in lowered.graph.initializer:
        for kv in init.external_data:
            if kv.key == "location":
                kv.value = relative(source.parent / kv.value)
    meta = [p for p in lowered.metadata_props if p.key != LOWERED_FROM_KEY]
    del lowered.metadata_props[:]
    lowered.metadata_props.extend(meta)
    lowered.metadata_props.add(key=LOWERED_FROM_KEY, value=json.dumps({"path": relative(source), "sha256": sha256}))
    write_atomic(out, lowered.SerializeToString())
