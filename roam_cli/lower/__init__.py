"""Lower ONNX Runtime's fused training ops to standard ONNX (issue 18).

`lower_model` rewrites every node outside the standard ONNX operator set as a few standard nodes
with the same outputs (`RULES`: one rule per op, written in the family modules), so that any maintained
ONNX runtime runs the graph. Graph inputs and outputs keep their names and order; an in-place
update (a gradient accumulator, an optimizer step) becomes a graph output `<state>.out`, appended
after the original outputs and declared in metadata `roam.inplace`, which the memory model writes
into the state's own buffer. Nothing reads a weight: external data stays where it is."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import onnx
from onnx import helper, version_converter

from roam_cli.core.annotate import name_nodes
from roam_cli.core.errors import RoamError, first_line
from roam_cli.core.fileio import write_all_atomic
from roam_cli.core.memory import INPLACE_KEY
from roam_cli.lower import activations, functions, grads, losses, norms, optimizers, training
from roam_cli.lower.emit import Emit, Lowering

MS, ONNX = "com.microsoft", ""
# (domain, op type) -> the rule writing the op's standard form (ORT registers ConvGrad and
# MaxPoolGrad in the default domain, which ONNX does not define them in; standard function ops
# without a kernel in onnxruntime are written as kernel ops).
RULES = {
    (MS, "SoftmaxCrossEntropyLossGrad"): losses.softmax_cross_entropy_loss_grad,
    (MS, "LayerNormalizationGrad"): norms.layer_norm_grad,
    (MS, "SimplifiedLayerNormalization"): norms.simplified_layer_norm,
    (ONNX, "SimplifiedLayerNormalization"): norms.simplified_layer_norm,
    (MS, "SimplifiedLayerNormalizationGrad"): norms.simplified_layer_norm_grad,
    (ONNX, "BatchNormalization"): norms.batch_norm_training,  # training_mode=1 only (CONDITIONAL)
    (MS, "BatchNormInternal"): norms.batch_norm_training,
    (MS, "BatchNormalizationGrad"): norms.batch_norm_grad,
    (MS, "FastGelu"): activations.fast_gelu,
    (MS, "FastGeluGrad"): activations.fast_gelu_grad,
    (MS, "BiasFastGeluGrad_dX"): activations.bias_fast_gelu_grad,
    (MS, "Gelu"): activations.gelu,
    (MS, "BiasGelu"): activations.gelu,
    (MS, "GeluGrad"): activations.gelu_grad,
    (MS, "BiasGeluGrad_dX"): activations.bias_gelu_grad,
    (MS, "QuickGelu"): activations.quick_gelu,
    (MS, "QuickGeluGrad"): activations.quick_gelu_grad,
    (MS, "ReluGrad"): activations.relu_grad,
    (MS, "SigmoidGrad"): activations.sigmoid_grad,
    (MS, "TanhGrad"): activations.tanh_grad,
    (MS, "SoftmaxGrad_13"): activations.softmax_grad,
    (MS, "LogSoftmaxGrad_13"): lambda e: activations.softmax_grad(e, log=True),
    (MS, "SoftmaxGrad"): lambda e: activations.softmax_grad(e, coerced=True),
    (MS, "LogSoftmaxGrad"): lambda e: activations.softmax_grad(e, log=True, coerced=True),
    (MS, "FusedMatMul"): grads.fused_matmul,
    (MS, "GatherGrad"): grads.gather_grad,
    (MS, "ConvGrad"): grads.conv_grad,
    (ONNX, "ConvGrad"): grads.conv_grad,
    (MS, "MaxPoolGrad"): grads.max_pool_grad,
    (ONNX, "MaxPoolGrad"): grads.max_pool_grad,
    (MS, "InPlaceAccumulatorV2"): training.in_place_accumulator_v2,
    (MS, "DropoutGrad"): training.dropout_grad,
    (MS, "ConcatTraining"): training.concat_training,
    (MS, "SplitTraining"): training.split_training,
    (MS, "Scale"): training.scale,
    (MS, "AdamWOptimizer"): optimizers.adamw,
    (MS, "SGDOptimizerV2"): optimizers.sgd_v2,
    # standard ops that ONNX defines as functions and onnxruntime runs only expanded, out of plan order
    (ONNX, "CastLike"): functions.cast_like,
    (ONNX, "HardSwish"): functions.hard_swish,
    (ONNX, "SoftmaxCrossEntropyLoss"): functions.softmax_cross_entropy_loss,
    (ONNX, "NegativeLogLikelihoodLoss"): functions.negative_log_likelihood_loss,
}
STANDARD_DOMAINS = ("", "ai.onnx")
# metadata_props key of a lowered model: {"path": source relative to the model's folder, "sha256"}
LOWERED_FROM_KEY = "roam.lowered_from"
# The default-domain opset a lowered model declares at least: Gelu (20) is the newest op a rule
# writes, and onnxruntime 1.19 and later run it.
MIN_OPSET = 20
# Standard ops lowered only in a form today's runtimes do not run.
CONDITIONAL = {("", "BatchNormalization"): lambda n: any(a.name == "training_mode" and a.i for a in n.attribute)}


def rule_for(node: onnx.NodeProto):
    """The rule lowering `node`, or None when the node is standard ONNX that any runtime runs."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    rule = RULES.get((domain, node.op_type))
    if rule is not None and (domain, node.op_type) in CONDITIONAL:
        return rule if CONDITIONAL[(domain, node.op_type)](node) else None
    return rule


def nonstandard_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The nodes, subgraphs' included, that are not standard ONNX, or that ONNX Runtime's inference
    builds do not run as kernels (BatchNormalization's training form; CastLike, HardSwish and the
    losses, which ONNX defines as functions)."""
    return [n for n in (*model.graph.node, *subgraph_nodes(model.graph)) if nonstandard(n)]


def nonstandard(node: onnx.NodeProto) -> bool:
    domain = "" if node.domain == "ai.onnx" else node.domain
    return domain not in STANDARD_DOMAINS or not onnx.defs.has(node.op_type) or rule_for(node) is not None


def subgraph_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The nodes of the control-flow nodes' subgraphs (If, Loop, Scan), at any depth."""
    found = []
    for n in graph.node:
        for a in n.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                found += [*g.node, *subgraph_nodes(g)]
    return found


def lower_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` in standard ONNX; RoamError naming the first op that has no rule."""
    for n in nonstandard_nodes(model):
        if rule_for(n) is None:
            raise RoamError(f"cannot lower {n.op_type} node {n.name!r} (domain {n.domain or 'ai.onnx'!r}): "
                            "no rule for this op")
    for n in subgraph_nodes(model.graph):
        if nonstandard(n):
            raise RoamError(f"cannot lower {n.op_type} node {n.name!r}: it is inside a subgraph (If, Loop, Scan), "
                            "which lowering does not enter")
    out = onnx.ModelProto()
    out.CopyFrom(at_opset_18(model))
    name_nodes(out.graph)
    ctx = Lowering(out)
    nodes = []
    for n in list(out.graph.node):
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


def at_opset_18(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model itself when it imports ONNX opset 18 or later, else converted to 18 by
    onnx.version_converter: the rules write opset-18 forms (Reduce* axes as inputs)."""
    version = next((imp.version for imp in model.opset_import if imp.domain in STANDARD_DOMAINS), 1)
    if version >= 18:
        return model
    try:
        return version_converter.convert_version(model, 18)
    except Exception as e:  # the converter raises bare RuntimeErrors and others
        raise RoamError(f"cannot convert the model from ONNX opset {version} to 18 for lowering: "
                        f"{first_line(e)}") from None


def set_opsets(model: onnx.ModelProto) -> None:
    """Default domain at MIN_OPSET or above (18 to 20 adds ops and types only, no node of the
    model changes meaning); drop the imports no node uses any more."""
    used = {n.domain for n in (*model.graph.node, *subgraph_nodes(model.graph))} | {""}
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


def relative(target: Path, out: Path) -> str:
    """`target`'s path from the folder `out` is written into."""
    return Path(os.path.relpath(target.resolve(), out.resolve().parent)).as_posix()


def write_with_weights(model: onnx.ModelProto, source: Path, out: Path) -> None:
    """Write `model`, read from `source`, to `out`, its external weights referenced from `out`'s
    folder: where they are when that folder holds them (in it or below); else, as ONNX Runtime
    refuses a path that leaves the model's folder, a hard link of the file beside `out` (a copy
    across file systems), written with the model as one (`write_all_atomic`). A file that is not
    there (a step of weights never written, to plan only) stays referenced where it would be."""
    files: dict[Path, bytes | Path] = {}
    with tempfile.TemporaryDirectory(dir=out.resolve().parent, prefix=".roam-weights-") as scratch:
        placed: dict[Path, str] = {}
        for init in model.graph.initializer:
            for kv in init.external_data:
                if kv.key != "location":
                    continue
                target = (source.parent / kv.value).resolve()
                where = relative(target, out)
                if (where == ".." or where.startswith("../")) and target.is_file():
                    if target not in placed:
                        placed[target] = weights_beside(target, source, out, Path(scratch), files)
                    where = placed[target]
                kv.value = where
        files[out] = model.SerializeToString()
        write_all_atomic(files)


def weights_beside(target: Path, source: Path, out: Path, scratch: Path, files: dict) -> str:
    """The name, in `out`'s folder, of the weights file `target`: one already there that is it, else
    a new link (copy) made in `scratch` and added to `files`; its own name, or `<out>.<its name>`
    where that is taken by another file."""
    for name in (target.name, f"{out.name}.{target.name}"):
        dest = out.parent / name
        if dest.exists() and os.path.samefile(dest, target):
            return name
        if not dest.exists() and dest not in files:
            try:
                os.link(target, scratch / name)
            except OSError:  # another file system
                shutil.copyfile(target, scratch / name)
            files[dest] = scratch / name
            return name
    raise RoamError(f"cannot place {target}, the weights of {source}, beside {out}: {target.name} and "
                    f"{out.name}.{target.name} are other files there")


def write_lowered(lowered: onnx.ModelProto, source: Path, sha256: str, out: Path) -> None:
    """Write the lowered model atomically, recording its source (`write_with_weights`)."""
    meta = [p for p in lowered.metadata_props if p.key != LOWERED_FROM_KEY]
    del lowered.metadata_props[:]
    lowered.metadata_props.extend(meta)
    lowered.metadata_props.add(key=LOWERED_FROM_KEY, value=json.dumps({"path": relative(source, out), "sha256": sha256}))
    write_with_weights(lowered, source, out)
