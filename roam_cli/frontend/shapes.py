"""Static dtype and shape of every tensor.

1. Bind symbolic dimensions (`--dim batch=8`) and run ONNX shape inference with data propagation.
2. Walk the graph in order and fill what ONNX left unknown: contrib/training ops (com.microsoft)
   and the collectives of a rank step (roam shard) from their semantics (`DOMAIN_RULES`), standard ops whose inputs only became known in this
   walk (ONNX per-node inference), with small integer tensors (shapes, axes) evaluated on the way.
3. Optionally (`--shapes-from-run`) run the graph once in ONNX Runtime on synthetic inputs and
   record every shape it sees.
"""

import copy
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from roam_cli.core.collectives import COLLECTIVE_DOMAIN
from roam_cli.core.errors import RoamError

TensorType = tuple[int, tuple[int, ...]]  # (onnx elem type, shape)
SMALL = 4096  # integer tensors up to this many elements are evaluated (shapes, axes, indices)


def symbolic_dims(model: onnx.ModelProto) -> set[str]:
    """Names of the symbolic dimensions of the model's inputs: what `--dim NAME=N` binds."""
    init = {t.name for t in model.graph.initializer}
    return {d.dim_param for vi in model.graph.input if vi.name not in init and vi.type.HasField("tensor_type")
            for d in vi.type.tensor_type.shape.dim if d.HasField("dim_param")}


def unknown_dim(option: str, name: str, named: set[str]) -> RoamError:
    return RoamError(f"{option} {name}: no input of the model has a symbolic dimension {name!r} "
                     f"(its symbolic dimensions: {', '.join(sorted(named)) or 'none'})")


def bind_dims(model: onnx.ModelProto, dims: dict[str, int]) -> None:
    """Replace symbolic dimensions by the user's values; refuse inputs left symbolic, and a name
    no input has (a misspelt --dim would otherwise be ignored and the model planned at another size)."""
    g = model.graph
    init = {t.name for t in g.initializer}
    named = symbolic_dims(model)
    unknown = next((name for name in dims if name not in named), None)
    if unknown is not None:
        raise unknown_dim("--dim", unknown, named)
    unbound: dict[str, str] = {}
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            continue
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in dims:
                d.dim_value = dims[d.dim_param]
            elif d.HasField("dim_param") and vi in g.input and vi.name not in init:
                unbound.setdefault(d.dim_param, vi.name)
            elif not d.HasField("dim_value") and vi in g.input and vi.name not in init:
                unbound.setdefault("?", vi.name)
    if unbound:
        name, where = next(iter(unbound.items()))
        if name == "?":
            raise RoamError(f"input {where!r} has a dimension with no size or name; it cannot be bound")
        raise RoamError(f"symbolic dimension {name!r} (input {where!r}) is unbound: pass --dim {name}=N")


def tensor_type(vi: onnx.ValueInfoProto) -> TensorType | None:
    if not vi.type.HasField("tensor_type"):
        return None
    tt = vi.type.tensor_type
    if tt.elem_type == TensorProto.UNDEFINED or not tt.HasField("shape"):
        return None
    if any(not d.HasField("dim_value") for d in tt.shape.dim):
        return None
    return tt.elem_type, tuple(d.dim_value for d in tt.shape.dim)


def infer(model: onnx.ModelProto, dims: dict[str, int], run_path: Path | None) -> dict[str, TensorType]:
    """Every tensor's (dtype, shape) that can be determined; names missing are unknown."""
    model = copy.deepcopy(model)
    bind_dims(model, dims)
    try:
        # No data_prop: ONNX's data propagation spells out every 1-D Add/Sub/Mul operand as a shape
        # with one dim per element (~50 B each: a 10^8-element flat buffer costs 5 GB, and more
        # gets the process killed). The walk below evaluates the small integer tensors instead.
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=False)
    except Exception:  # onnx raises many types; the walk below still fills what it can
        inferred = model
    g = inferred.graph
    types: dict[str, TensorType] = {}
    for t in g.initializer:
        types[t.name] = (t.data_type, tuple(t.dims))
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        kind = vi.type.WhichOneof("value")
        if kind not in ("tensor_type", None):  # sequence, map, optional, sparse tensor
            raise RoamError(f"{vi.name!r} is of {kind.removesuffix('_type').replace('_', ' ')} type: "
                            "roam plans tensors only")
        t = tensor_type(vi)
        if t is not None:
            types.setdefault(vi.name, t)
    values = known_values(g)
    opsets = {o.domain: o.version for o in model.opset_import}
    for node in g.node:
        if all(o in types for o in node.output if o):
            evaluate_small(node, types, values)
            continue
        infer_node(node, types, values, opsets, list(model.opset_import), model.ir_version)
        evaluate_small(node, types, values)
    if run_path is not None:
        missing = [x for n in g.node for x in n.output if x and x not in types]
        if missing:
            types.update(shapes_from_run(model, run_path, missing))
    return types


def known_values(g: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Small integer tensors whose contents are in the file (initializers, Constant nodes)."""
    values = {}
    for t in g.initializer:
        if t.data_location != TensorProto.EXTERNAL and np.prod(t.dims) <= SMALL and is_int(t.data_type):
            try:
                values[t.name] = numpy_helper.to_array(t)
            except ValueError:  # e.g. raw_data shorter than the shape says
                raise RoamError(f"initializer {t.name!r} is corrupt: its data does not match its shape "
                                f"{list(t.dims)}") from None
    return values


def is_int(dtype: int) -> bool:
    return dtype in (TensorProto.INT64, TensorProto.INT32, TensorProto.INT8, TensorProto.UINT8, TensorProto.BOOL)


def evaluate_small(node: onnx.NodeProto, types: dict, values: dict) -> None:
    """Compute small integer outputs (Shape, Gather on shapes, Concat, ...) for later ops."""
    outs = [o for o in node.output if o]
    if not outs or not all(o in types and is_int(types[o][0]) and np.prod(types[o][1]) <= SMALL for o in outs):
        return
    if node.domain not in ("", "ai.onnx"):
        return
    if node.op_type == "Shape":
        shape = types.get(node.input[0], (None, None))[1]
        if shape is not None:
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            start, end = attrs.get("start", 0), attrs.get("end", len(shape))
            values[outs[0]] = np.array(shape[start:end], dtype=np.int64)
        return
    if node.op_type == "Size":
        shape = types.get(node.input[0], (None, None))[1]
        if shape is not None:
            values[outs[0]] = np.array(int(np.prod(shape)), dtype=np.int64)
        return
    ins = [x for x in node.input if x]
    if node.op_type != "Constant" and not all(x in values for x in ins):
        return
    try:
        fn = ReferenceEvaluator(single_node_model(node, types))
        results = fn.run(None, {x: values[x] for x in ins})
    except Exception:  # an op the reference evaluator lacks: its values stay unknown
        return
    for name, r in zip(outs, results):
        values[name] = np.asarray(r)


def single_node_model(node: onnx.NodeProto, types: dict) -> onnx.ModelProto:
    ins = [helper.make_tensor_value_info(x, types[x][0], types[x][1]) for x in node.input if x]
    outs = [helper.make_tensor_value_info(x, types[x][0], types[x][1]) for x in node.output if x]
    graph = helper.make_graph([node], "n", ins, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def infer_node(node, types, values, opsets, opset_imports, ir_version) -> None:
    in_types = [types.get(x) if x else None for x in node.input]
    in_values = [values.get(x) if x else None for x in node.input]
    domain = node.domain if node.domain != "ai.onnx" else ""
    rule = DOMAIN_RULES.get(domain, {}).get(node.op_type)
    results: list[TensorType | None] | None = None
    if rule is not None:
        try:
            results = rule(node, in_types, in_values)
        except (TypeError, IndexError, ValueError):  # an input it needs is unknown
            results = None
    elif domain == "" and all(t is not None for x, t in zip(node.input, in_types) if x):
        results = onnx_node_inference(node, in_types, in_values, opsets, opset_imports, ir_version)
    if results is None:
        return
    for name, t in zip([o for o in node.output], results):
        if name and t is not None and name not in types:
            types[name] = (t[0], tuple(int(d) for d in t[1]))


def onnx_node_inference(node, in_types, in_values, opsets, opset_imports, ir_version):
    try:
        schema = onnx.defs.get_schema(node.op_type, opsets.get("", opsets.get("ai.onnx", 21)), "")
        input_types = {x: helper.make_tensor_type_proto(t[0], t[1]) for x, t in zip(node.input, in_types) if x}
        data = {x: numpy_helper.from_array(v, x) for x, v in zip(node.input, in_values) if x and v is not None}
        out = onnx.shape_inference.infer_node_outputs(schema, node, input_types, data, None, opset_imports, ir_version)
    except Exception:  # onnx raises several error types for ops it cannot infer
        return None
    results = []
    for name in node.output:
        tp = out.get(name)
        if tp is None or not tp.HasField("tensor_type"):
            results.append(None)
            continue
        results.append(tensor_type(helper.make_value_info(name, tp)))
    return results


# ---- com.microsoft and roam's collective operators: ONNX shape inference cannot see them --------
# Each rule: (node, input types, input values) -> output types. `in_types[i]` is (dtype, shape).

def attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def like(i: int, *more: int) -> Callable:
    """Every output has the type of input i (then of the inputs listed after it, in turn)."""
    sources = (i,) + more
    return lambda node, t, v: [t[sources[min(k, len(sources) - 1)]] for k in range(len(node.output))]


def shape_from_value(value_input: int, dtype_input: int) -> Callable:
    """Output shape given by a shape tensor input (GatherGrad, SliceGrad ...), dtype of another."""
    return lambda node, t, v: [(t[dtype_input][0], tuple(int(d) for d in v[value_input]))]


def matmul_shape(a, b, trans_a=False, trans_b=False, trans_batch_a=False, trans_batch_b=False):
    a, b = list(a), list(b)
    if trans_batch_a:
        a = a[1:-1] + [a[0], a[-1]]
    if trans_batch_b:
        b = b[1:-1] + [b[0], b[-1]]
    if len(a) == 1:
        a = [1] + a
        drop_a = True
    else:
        drop_a = False
    if len(b) == 1:
        b = b + [1]
        drop_b = True
    else:
        drop_b = False
    if trans_a:
        a[-1], a[-2] = a[-2], a[-1]
    if trans_b:
        b[-1], b[-2] = b[-2], b[-1]
    batch = np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
    out = list(batch) + [a[-2], b[-1]]
    if drop_a:
        out.pop(-2)
    if drop_b:
        out.pop(-1)
    return tuple(out)


def fused_matmul(node, t, v):
    shape = matmul_shape(t[0][1], t[1][1], attr(node, "transA", 0), attr(node, "transB", 0),
                         attr(node, "transBatchA", 0), attr(node, "transBatchB", 0))
    return [(t[0][0], shape)]


def softmax_cross_entropy_internal(node, t, v):
    loss_shape = () if attr(node, "reduction", b"mean") not in (b"none", "none") else t[1][1]
    return [(t[0][0], loss_shape), t[0]]


def reduce_sum_training(node, t, v):
    shape = list(t[0][1])
    axes = [] if len(node.input) < 2 or not node.input[1] else [int(a) % len(shape) for a in v[1].ravel()]
    if not axes:
        axes = [] if attr(node, "noop_with_empty_axes", 0) else list(range(len(shape)))
    keep = attr(node, "keepdims", 1)
    out = [1 if i in axes else d for i, d in enumerate(shape)] if keep else [d for i, d in enumerate(shape) if i not in axes]
    return [(t[0][0], tuple(out))]


def broadcast_gradient_args(node, t, v):
    a, b = [int(x) for x in v[0]], [int(x) for x in v[1]]
    rank = max(len(a), len(b))
    a, b = [1] * (rank - len(a)) + a, [1] * (rank - len(b)) + b
    out_a = [i for i in range(rank) if a[i] == 1 and b[i] != 1 or i < rank - len(v[0])]
    out_b = [i for i in range(rank) if b[i] == 1 and a[i] != 1 or i < rank - len(v[1])]
    return [(TensorProto.INT64, (len(out_a),)), (TensorProto.INT64, (len(out_b),))]


def in_place_accumulator_v2(node, t, v):
    return [(TensorProto.BOOL, (1,)), t[0]]


def layer_norm_grad(node, t, v):
    # (dY, X, scale, mean, inv_std) -> dX like X, dscale and dbias like scale
    return [t[1], t[2], t[2]][: len(node.output)]


def batch_norm_internal(node, t, v):
    # (X, scale, B, running_mean, running_var) -> Y like X; new running stats, saved mean and
    # saved inverse std-dev, all of the per-channel statistics' shape
    stats = (t[0][0], t[3][1])
    return [t[0], t[3], t[4], stats, stats][: len(node.output)]


def conv_grad(node, t, v):
    # (dY, X, W) -> dX like X, dW like W, dB one per output channel
    return [t[1], t[2], (t[2][0], (t[2][1][0],))][: len(node.output)]


def concat_training(node, t, v):
    axis = attr(node, "axis")
    shapes = [s[1] for s in t if s is not None]
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    return [(t[0][0], tuple(out)), (TensorProto.INT64, (len(shapes),))]


def bitmask_dropout(node, t, v):
    count = int(np.prod(t[0][1]))
    return [t[0], (TensorProto.UINT32, ((count + 31) // 32,))]


def all_gather(node, t, v):
    """[.., d, ..] -> [.., group_size·d, ..] along `axis`: every rank's block, in rank order."""
    shape = list(t[0][1])
    shape[attr(node, "axis", 0)] *= attr(node, "group_size", 1)
    return [(t[0][0], tuple(shape))]


def reduce_scatter(node, t, v):
    """[.., group_size·d, ..] -> [.., d, ..] along `axis`: this rank's block (ValueError, the size
    unknown, where the ranks do not divide the dimension)."""
    shape = list(t[0][1])
    axis, ranks = attr(node, "axis", 0), attr(node, "group_size", 1)
    if ranks < 1 or shape[axis] % ranks:
        raise ValueError(f"{ranks} ranks do not divide dimension {shape[axis]}")
    shape[axis] //= ranks
    return [(t[0][0], tuple(shape))]


CONTRIB_RULES: dict[str, Callable] = {
    **{op: like(0) for op in (
        "FastGelu", "Gelu", "QuickGelu", "BiasGelu", "BiasSoftmax", "BiasDropout", "Dropout",
        "SoftmaxGrad", "SoftmaxGrad_13", "LogSoftmaxGrad", "LogSoftmaxGrad_13", "DropoutGrad",
        "BitmaskDropoutGrad", "ReluGrad", "SigmoidGrad", "TanhGrad", "GeluGrad", "FastGeluGrad",
        "BiasGeluGrad_dX", "BiasFastGeluGrad_dX", "QuickGeluGrad", "InPlaceAccumulator",
        "ZeroGradient", "PassThrough", "MegatronF", "MegatronG", "Scale", "BiasSoftmaxDropout",
        "SoftmaxDropoutGrad", "LeakyReluGrad", "SiLUGrad", "IsAllFinite",
    )},
    "SoftmaxCrossEntropyLossInternal": softmax_cross_entropy_internal,
    "SoftmaxCrossEntropyLossInternalGrad": like(1),
    "SoftmaxCrossEntropyLossGrad": like(1),
    "SparseSoftmaxCrossEntropyGrad": like(1),
    "SoftmaxCrossEntropyGrad": like(1),
    "LayerNormalizationGrad": layer_norm_grad,
    "SimplifiedLayerNormalizationGrad": layer_norm_grad,
    "InvertibleLayerNormalizationGrad": layer_norm_grad,
    "BatchNormalizationGrad": layer_norm_grad,  # (dY, X, scale, saved mean, saved inv std-dev): same outputs
    "BatchNormInternal": batch_norm_internal,
    "ConvGrad": conv_grad,
    "GatherGrad": shape_from_value(0, 2),
    "GatherNDGrad": shape_from_value(0, 2),
    "GatherElementsGrad": shape_from_value(1, 0),
    "SliceGrad": shape_from_value(1, 0),
    "FusedMatMul": fused_matmul,
    "TransposeMatMul": fused_matmul,
    "ReduceSumTraining": reduce_sum_training,
    "BroadcastGradientArgs": broadcast_gradient_args,
    "InPlaceAccumulatorV2": in_place_accumulator_v2,
    "ConcatTraining": concat_training,
    "BitmaskDropout": bitmask_dropout,
    "AllGather": all_gather,  # ONNX Runtime's collective (its NCCL builds run it)
}


# the domains whose ops ONNX's shape inference has no schema for, each with its rules
DOMAIN_RULES: dict[str, dict[str, Callable]] = {
    "com.microsoft": CONTRIB_RULES,
    COLLECTIVE_DOMAIN: {"ReduceScatter": reduce_scatter},  # roam shard's (roam_cli.core.collectives)
}


def shapes_from_run(model: onnx.ModelProto, path: Path, names: list[str]) -> dict[str, TensorType]:
    """Run the graph once in ONNX Runtime on synthetic inputs and record the given tensors' shapes.

    Needs the weights (ORT reads them), so refuses a model whose external data is absent."""
    import onnxruntime as ort

    from roam_cli.frontend.providers import check_runs, locate_weights
    from roam_cli.frontend.synthetic import synthetic_feeds

    check_runs(model, f"--shapes-from-run {path}")

    probe = copy.deepcopy(model)
    g = probe.graph
    existing = {o.name for o in g.output}
    for name in names:
        if name not in existing:
            g.output.append(helper.make_empty_tensor_value_info(name))
    for t in g.initializer:
        for kv in t.external_data:
            if kv.key == "location" and not (path.parent / kv.value).exists():
                raise RoamError(f"--shapes-from-run needs the weights, but external data file {kv.value} is absent")
    options = ort.SessionOptions()
    for key, value in locate_weights(probe, path.parent).items():
        options.add_session_config_entry(key, value)
    try:
        session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
        feeds = synthetic_feeds(session, seed=0)
        results = session.run(names, feeds)
    except RoamError:
        raise
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RoamError(f"--shapes-from-run: ONNX Runtime could not run the graph: {first}") from None
    out = {}
    for name, r in zip(names, results):
        if not isinstance(r, np.ndarray):  # a sequence, map or empty optional
            raise RoamError(f"{name!r} is not a tensor (ONNX Runtime returned a {type(r).__name__}): "
                            "roam plans tensors only")
        arr = np.asarray(r)
        out[name] = (helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape)
    return out
