"""A rank step's layout as the runtime uses it: the record `roam shard` writes in its metadata
(core.collectives.sharding) read into the values of one rank, the shard of each parameter and of
its optimizer state (shard.arithmetic) and the rows of each data input.

Rank r of N holds rows [r*b, (r+1)*b) of each global batch of b*N rows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from roam_cli.core.collectives import SHARDING_KEY, sharding
from roam_cli.core.errors import RoamError
from roam_cli.shard.arithmetic import join, shard_size, split


@dataclass(frozen=True)
class Sharding:
    ranks: int
    parameters: dict[str, tuple[tuple[int, ...], int]]  # parameter -> (its full shape, its shard's elements)
    state: dict[str, str]  # optimizer state input -> the parameter it is sharded as
    replicated: tuple[str, ...]
    data_inputs: tuple[str, ...]

    def sharded(self, name: str) -> tuple[tuple[int, ...], int] | None:
        """(full shape, shard elements) of a sharded input, or None."""
        return self.parameters.get(self.state.get(name, name))

    def full_shape(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape an input of the rank step (of `shape`) has in the whole step."""
        if (sharded := self.sharded(name)) is not None:
            return sharded[0]
        if name in self.data_inputs and shape:
            return (shape[0] * self.ranks, *shape[1:])
        return shape

    def of_rank(self, name: str, value: np.ndarray, rank: int) -> np.ndarray:
        """Rank `rank`'s part of an input's whole value: its shard, its rows, or the value itself."""
        if self.sharded(name) is not None:
            return split(value, self.ranks)[rank].copy()  # not a view that keeps every rank's shards
        if name in self.data_inputs and value.ndim:
            rows = value.shape[0] // self.ranks
            return value[rank * rows:(rank + 1) * rows]
        return value

    def whole(self, name: str, shards: list[np.ndarray]) -> np.ndarray:
        """A sharded input's whole value from its N shards in rank order."""
        return join(shards, self.sharded(name)[0])


def read(metadata: dict[str, str], what: str) -> Sharding | None:
    """The layout a rank step declares, None for a step that is not one; RoamError when malformed."""
    try:
        record = sharding(metadata)
    except RoamError as e:
        raise RoamError(f"{what}: {e}") from None
    if record is None:
        return None
    try:
        parameters = {name: (tuple(int(x) for x in p["shape"]), p["shard"]) for name, p in record["parameters"].items()}
        layout = Sharding(record["ranks"], parameters, dict(record.get("state", {})),
                          tuple(record.get("replicated", ())), tuple(record.get("data_inputs", ())))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise RoamError(f"{what}: metadata {SHARDING_KEY!r} is not a rank layout ({type(e).__name__}: {e})") from None
    if any(p not in parameters for p in layout.state.values()):
        raise RoamError(f"{what}: metadata {SHARDING_KEY!r} names a state of no parameter")
    for name, (shape, shard) in parameters.items():
        if shard != shard_size(int(np.prod(shape, dtype=np.int64)), layout.ranks):
            raise RoamError(f"{what}: metadata {SHARDING_KEY!r} gives {name!r} of shape {list(shape)} shards of {shard} "
                            f"elements over {layout.ranks} ranks (ceil(numel / ranks) expected)")
    return layout
