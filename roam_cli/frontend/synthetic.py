"""Synthetic feeds for running a graph whose real inputs the user did not give."""

import numpy as np

ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_,
}


def synthetic_feeds(session, seed: int = 0, dims: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Feeds for every input of an ONNX Runtime session (see `synthesize`)."""
    specs = []
    for inp in session.get_inputs():
        shape = [d if isinstance(d, int) else (dims or {}).get(d, 1) for d in inp.shape]
        dtype = ORT_TYPES.get(inp.type)
        if dtype is None:
            raise ValueError(f"input {inp.name!r} has type {inp.type}, which roam cannot synthesise")
        specs.append((inp.name, dtype, shape))
    return synthesize(specs, seed)


def synthesize(specs, seed: int = 0) -> dict[str, np.ndarray]:
    """Small random floats and zero integers (zero is a valid index and a valid label), one array
    per (name, numpy dtype, shape), drawn in the order given; an integer or boolean input named like
    a mask is all ones: a padding mask of zeros masks every position, each attention score swamped
    by the mask's most negative float, and the step trains (and differences see) no attention."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, dtype, shape in specs:
        if np.issubdtype(dtype, np.floating):
            feeds[name] = (rng.standard_normal(shape) * 0.1).astype(dtype)
        else:
            feeds[name] = (np.ones if "mask" in name.lower() else np.zeros)(shape, dtype=dtype)
    return feeds
