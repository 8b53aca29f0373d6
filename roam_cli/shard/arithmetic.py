"""How a flat parameter splits over N ranks (docs/sharding.md): each rank holds s = ceil(numel / N)
elements, rank r elements [r·s, (r+1)·s) of the parameter flattened and zero-padded to N·s."""

import numpy as np


def shard_size(numel: int, ranks: int) -> int:
    """s: the elements each rank holds."""
    return -(-numel // ranks)


def padding(numel: int, ranks: int) -> int:
    """The zeros after the last element: N·s − numel (under one shard's worth)."""
    return ranks * shard_size(numel, ranks) - numel


def split(value: np.ndarray, ranks: int) -> list[np.ndarray]:
    """Every rank's shard of a full value, in rank order."""
    flat = value.reshape(-1)
    padded = np.concatenate([flat, np.zeros(padding(flat.size, ranks), flat.dtype)])
    return np.split(padded, ranks)


def join(shards: list[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    """The full value of `shape` from every rank's shard, in rank order (the padding dropped)."""
    numel = int(np.prod(shape, dtype=np.int64))
    return np.concatenate(shards)[:numel].reshape(shape)
