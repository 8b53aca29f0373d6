"""A hand-made linear step, whole and as the step of one of N ranks (the rank-step contract: what
`roam shard` writes), small enough to compute every expectation by hand.

pred = x @ w + c, loss = mean((pred - y)^2) over the batch; SGD with momentum:
v <- MU * v + grad, p <- p - learning_rate * v. The rank step gathers w (3 elements) and c (1) from
their shards (AllGather, then Slice off the padding, Reshape), and reduce-scatters their gradients
(Reshape, Pad, ReduceScatter "mean"); its update runs on the shards."""

import json

import numpy as np
from onnx import TensorProto, helper
from onnx_builder import model, node, save

MU = 0.9
SHAPES = {"w": [3], "c": [1]}


def _const(name, values, dtype=TensorProto.INT64, dims=None):
    return node("Constant", [], [name], value=helper.make_tensor(name, dtype, [len(values)] if dims is None else dims,
                                                                 values))


def linear_step(path, batch: int, ranks: int | None = None, dtype=TensorProto.FLOAT):
    """The whole step (ranks None) of `batch` rows, or rank step of `ranks` ranks of `batch` rows each."""
    nodes = [_const("mu", [MU], dtype, []), _const("two_over_b", [2.0 / batch], dtype, [])]
    sharded = {}
    for p, shape in SHAPES.items():
        numel = int(np.prod(shape))
        full = p
        if ranks is not None:
            s = -(-numel // ranks)
            sharded[p] = s
            nodes += [_const(f"{p}.end", [numel]), _const(f"{p}.shape", shape), _const(f"{p}.zero", [0]),
                      _const(f"{p}.pads", [0, ranks * s - numel]),
                      node("AllGather", [p], [f"{p}.gathered"], domain="com.microsoft", group_size=ranks, axis=0),
                      node("Slice", [f"{p}.gathered", f"{p}.zero", f"{p}.end"], [f"{p}.sliced"]),
                      node("Reshape", [f"{p}.sliced", f"{p}.shape"], [f"{p}.full"])]
            full = f"{p}.full"
        nodes.append(node("Identity", [full], [f"{p}.used"]))
    nodes += [node("MatMul", ["x", "w.used"], ["xw"]), node("Add", ["xw", "c.used"], ["pred"]),
              node("Sub", ["pred", "y"], ["diff"]), node("Mul", ["diff", "diff"], ["sq"]),
              node("ReduceMean", ["sq"], ["loss"], keepdims=0),
              node("Mul", ["diff", "two_over_b"], ["d"]), node("MatMul", ["d", "x"], ["w.grad"]),
              node("ReduceSum", ["d"], ["c.grad"], keepdims=1)]
    for p in SHAPES:
        grad = f"{p}.grad"
        if ranks is not None:
            nodes += [node("Pad", [grad, f"{p}.pads"], [f"{p}.grad.padded"]),
                      node("ReduceScatter", [f"{p}.grad.padded"], [f"{p}.grad.shard"], domain="ai.roam.collective",
                           group_size=ranks, axis=0, reduction="mean")]
            grad = f"{p}.grad.shard"
        nodes += [node("Mul", [f"{p}.v", "mu"], [f"{p}.v.decayed"]), node("Add", [f"{p}.v.decayed", grad], [f"{p}.v.out"]),
                  node("Mul", [f"{p}.v.out", "learning_rate"], [f"{p}.delta"]),
                  node("Sub", [p, f"{p}.delta"], [f"{p}.out"])]
    shape = {p: [sharded[p]] if ranks is not None else s for p, s in SHAPES.items()}
    metadata = {"roam.inplace": json.dumps({f"{p}.out": p for p in SHAPES} | {f"{p}.v.out": f"{p}.v" for p in SHAPES})}
    value_info = []
    if ranks is not None:
        metadata["roam.sharding"] = json.dumps({
            "ranks": ranks, "replicated": [], "data_inputs": ["x", "y"],
            "parameters": {p: {"shape": s, "numel": int(np.prod(s)), "shard": sharded[p]} for p, s in SHAPES.items()},
            "state": {f"{p}.v": p for p in SHAPES}, "batch": {"rank": batch, "global": ranks * batch}})
        # the collectives' shapes, which ONNX's shape inference does not know
        value_info = [(f"{p}.gathered", [ranks * sharded[p]], dtype) for p in SHAPES] + \
                     [(f"{p}.grad.shard", [sharded[p]], dtype) for p in SHAPES]
    m = model(nodes, [("x", [batch, 3], dtype), ("y", [batch], dtype)]
              + [(p, shape[p], dtype) for p in SHAPES] + [(f"{p}.v", shape[p], dtype) for p in SHAPES]
              + [("learning_rate", [], dtype)],
              [("loss", [], dtype)] + [(f"{p}.out", shape[p], dtype) for p in SHAPES]
              + [(f"{p}.v.out", shape[p], dtype) for p in SHAPES],
              value_info=value_info, metadata=metadata)
    return save(m, path)


def expected_steps(x, y, w, c, learning_rate, steps):
    """The whole step by hand in float64: (losses, w, c) after `steps` steps on the same batch."""
    w, c = w.astype(np.float64), c.astype(np.float64)
    vw, vc = np.zeros_like(w), np.zeros_like(c)
    losses = []
    for _ in range(steps):
        diff = x @ w + c - y
        losses.append(np.mean(diff ** 2))
        d = 2 * diff / len(y)
        vw, vc = MU * vw + d @ x, MU * vc + d.sum(keepdims=True)
        w, c = w - learning_rate * vw, c - learning_rate * vc
    return losses, w, c
