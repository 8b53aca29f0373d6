"""The collectives of a rank step (`roam shard`, docs/sharding.md) and the model's record of its
sharding, which the stages after the rewrite read: shapes, recompute, the cost model, the plan.

The all-gather is ONNX Runtime's own contrib op, so that its builds with NCCL run it; ONNX
Runtime has no reduce-scatter that averages, so that one is roam's, in a domain of its own. Both
take `group_size` (the ranks) and `axis` (0: roam writes them on flat shards)."""

import json

from roam_cli.core.errors import RoamError

ALL_GATHER = ("com.microsoft", "AllGather")  # [s] -> [N·s]: every rank's shard, in rank order
COLLECTIVE_DOMAIN = "ai.roam.collective"
REDUCE_SCATTER = (COLLECTIVE_DOMAIN, "ReduceScatter")  # [N·s] -> [s]: rank r's block of the mean over ranks
COLLECTIVES = frozenset({ALL_GATHER, REDUCE_SCATTER})
# metadata_props key of a rank step: {"ranks": N, "parameters": {P: {"shape", "numel", "shard"}},
# "state": {state input: its parameter}, "replicated": [input], "data_inputs": [input],
# "batch": {"rank": rows or a dimension's name, "global": N x rows or null}}
SHARDING_KEY = "roam.sharding"


def sharding(metadata: dict[str, str]) -> dict | None:
    """The model's SHARDING_KEY record, checked as far as every reader relies on it (the ranks, the
    parameters); None for a step that is not a rank step."""
    if SHARDING_KEY not in metadata:
        return None
    try:
        record = json.loads(metadata[SHARDING_KEY])
        ranks, parameters = record["ranks"], record["parameters"]
        assert isinstance(ranks, int) and not isinstance(ranks, bool) and ranks >= 1
        assert isinstance(parameters, dict) and all(
            isinstance(p.get("shard"), int) and isinstance(p.get("numel"), int) for p in parameters.values())
    except (ValueError, KeyError, TypeError, AttributeError, AssertionError):
        raise RoamError(f"model metadata {SHARDING_KEY!r} is not roam's record of a rank step "
                        "({ranks, parameters: {name: {shape, numel, shard}}, ...})") from None
    return record


def ranks(metadata: dict[str, str]) -> int:
    """The ranks a step is one of: 1 for a step that is not a rank step."""
    record = sharding(metadata)
    return 1 if record is None else record["ranks"]
