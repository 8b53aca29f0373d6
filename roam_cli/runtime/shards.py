"""A rank step's layout (its metadata `roam.sharding`, written by `roam shard`) and the values of
one rank: the shard of each parameter and of its optimizer state, the rows of each data input.

Rank r of N holds elements [r*s, (r+1)*s) of a parameter flattened and zero-padded to N*s
(s = ceil(numel / N)), and rows [r*b, (r+1)*b) of each global batch of b*N rows."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from roam_cli.core.errors import RoamError

KEY = "roam.sharding"


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
        if (sharded := self.sharded(name)) is not None:
            return shard_of(value, sharded[1], self.ranks, rank)
        if name in self.data_inputs and value.ndim:
            rows = value.shape[0] // self.ranks
            return value[rank * rows:(rank + 1) * rows]
        return value

    def whole(self, name: str, gathered: np.ndarray) -> np.ndarray:
        """A sharded input's whole value from its N shards in rank order (padded, flat)."""
        shape = self.sharded(name)[0]
        return gathered[:int(np.prod(shape, dtype=np.int64))].reshape(shape)


def shard_of(value: np.ndarray, shard: int, ranks: int, rank: int) -> np.ndarray:
    flat = np.zeros(shard * ranks, value.dtype)
    flat[:value.size] = value.reshape(-1)
    return flat[rank * shard:(rank + 1) * shard].copy()


def read(metadata: dict[str, str], what: str) -> Sharding | None:
    """The layout a rank step declares, None for a step that is not one; RoamError when malformed."""
    if KEY not in metadata:
        return None
    try:
        d = json.loads(metadata[KEY])
        parameters = {name: (tuple(int(x) for x in p["shape"]), int(p["shard"])) for name, p in d["parameters"].items()}
        sharding = Sharding(int(d["ranks"]), parameters, dict(d.get("state", {})), tuple(d.get("replicated", ())),
                            tuple(d.get("data_inputs", ())))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise RoamError(f"{what}: metadata {KEY!r} is not a rank layout ({type(e).__name__}: {e})") from None
    if sharding.ranks < 1 or any(p not in parameters for p in sharding.state.values()):
        raise RoamError(f"{what}: metadata {KEY!r} names {sharding.ranks} ranks or a state of no parameter")
    for name, (shape, shard) in parameters.items():
        if shard != -(-int(np.prod(shape, dtype=np.int64)) // sharding.ranks):
            raise RoamError(f"{what}: metadata {KEY!r} gives {name!r} of shape {list(shape)} shards of {shard} "
                            f"elements over {sharding.ranks} ranks (ceil(numel / ranks) expected)")
    return sharding
