"""Synthetic feeds for running a graph whose real inputs the user did not give."""

import numpy as np

ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_,
}


def synthetic_feeds(session, seed: int = 0, dims: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Small random floats and zero integers (zero is a valid index and a valid label)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for inp in session.get_inputs():
        shape = [d if isinstance(d, int) else (dims or {}).get(d, 1) for d in inp.shape]
        dtype = ORT_TYPES.get(inp.type)
        if dtype is None:
            raise ValueError(f"input {inp.name!r} has type {inp.type}, which roam cannot synthesise")
        if np.issubdtype(dtype, np.floating):
            feeds[inp.name] = (rng.standard_normal(shape) * 0.1).astype(dtype)
        else:
            feeds[inp.name] = np.zeros(shape, dtype=dtype)
    return feeds
