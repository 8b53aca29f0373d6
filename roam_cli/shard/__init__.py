"""Fully sharded data parallelism: the step of one of N ranks (`roam shard`, docs/sharding.md).

`find` tells the parameters, their optimizer state and gradients, the replicated inputs and the
data inputs apart in a full step; `rewrite` writes the rank step, its collectives graph nodes
(roam_cli.core.collectives); `arithmetic` is how a parameter splits; `record` is the plan's
`sharding` (the collectives' volume and estimated time on a device profile). The rank step is a
graph like any other: roam orders, recomputes (an all-gather again in the backward) and lays it out."""

import json
from pathlib import Path

import onnx

from roam_cli.core.collectives import SHARDING_KEY
from roam_cli.core.errors import RoamError
from roam_cli.frontend.onnx_import import import_model, load_model
from roam_cli.frontend.shapes import symbolic_dims
from roam_cli.lower import LOWERED_FROM_KEY
from roam_cli.shard import find, rewrite
from roam_cli.shard.arithmetic import shard_size

# The size bound to every symbolic dimension while the step is read: the parameters' shapes are
# static, and which values are gradients does not depend on the batch (the rank step keeps the names)
READ_AT = 2


def shard(path: Path, ranks: int) -> tuple[onnx.ModelProto, dict]:
    """The rank step of the full step at `path` for `ranks` ranks, and its record (SHARDING_KEY,
    written into its metadata)."""
    if ranks < 1:
        raise RoamError(f"--ranks must be at least 1, got {ranks}")
    if is_rank_step(path):
        raise RoamError(f"{path} is already a rank step (metadata {SHARDING_KEY!r}): shard the full step")
    imported = import_model(path, dict.fromkeys(symbolic_dims(load_model(path)[0]), READ_AT))
    found = find.survey(imported.graph)
    record = {
        "ranks": ranks,
        "parameters": {p.name: {"shape": list(p.shape), "numel": p.numel, "shard": shard_size(p.numel, ranks)}
                       for p in found.parameters},
        "state": {s: p.name for p in found.parameters for s in p.state},
        "replicated": found.replicated,
        "data_inputs": found.data_inputs,
        "batch": batch(imported.model.graph, found.data_inputs, ranks),
    }
    out = rewrite.rewrite(imported.model, imported.graph, found, ranks)
    meta = [p for p in out.metadata_props if p.key != LOWERED_FROM_KEY]  # not the rank step's source
    del out.metadata_props[:]
    out.metadata_props.extend(meta)
    out.metadata_props.add(key=SHARDING_KEY, value=json.dumps(record))
    return out, record


def batch(graph: onnx.GraphProto, data_inputs: list[str], ranks: int) -> dict:
    """{"rank": the rows of each rank's batch (a number, or the symbolic dimension's name, which the
    plan binds), "global": ranks x rows, or null}: every data input's first dimension, which must
    be one, or for a fixed batch b of inputs [b, s, ...] the b*s of a 1-d input flattened over both
    (labels [B*S] beside input_ids [B, S], as a loss on logits [B*S, V] reads them): it splits into
    N equal parts row-major too, so each rank gets its own sequences' rows."""
    if not data_inputs:
        raise RoamError("the step reads no data input in its forward: there is no batch to split over ranks")
    shapes = {}
    for vi in graph.input:
        if vi.name in data_inputs:
            shapes[vi.name] = [d.dim_param if d.HasField("dim_param") else d.dim_value for d in vi.type.tensor_type.shape.dim]
    first = next((k for k, s in shapes.items() if len(s) > 1), next(iter(shapes)))  # not a flattened one
    b = shapes[first][0]
    flattened = {b * s[1] for s in shapes.values() if isinstance(b, int) and len(s) > 1 and isinstance(s[1], int)}
    for name, shape in shapes.items():
        if shape[0] != b and not (len(shape) == 1 and shape[0] in flattened):
            raise RoamError(f"data inputs {first!r} and {name!r} disagree on the batch ({b} and {shape[0]} rows): roam "
                            "shard splits every data input's first dimension over the ranks")
    return {"rank": b, "global": ranks * b if isinstance(b, int) else None}


def is_rank_step(path: Path) -> bool:
    """Whether the model at `path` is a rank step (what `shard` writes)."""
    return SHARDING_KEY in {p.key for p in load_model(path)[0].metadata_props}
