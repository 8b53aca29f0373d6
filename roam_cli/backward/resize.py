"""Resize's gradient. Resize is linear in X and acts on each axis apart: along an axis, output cell
o reads one input cell (nearest) or two (linear) with weights fixed by the static sizes and the
attributes. Those weights are one [out, in] matrix per axis, computed here as ONNX Runtime computes
them (coordinates in float32); dX is dY through their transposes (`spatial.along_axes`)."""

import numpy as np

from roam_cli.backward.spatial import along_axes

# where output cell x lands in the input, from (x, scale, out size, in size), all float32 (the
# symmetric form's second half is in double, cast back: ONNX Runtime's arithmetic, to the last bit)
COORDINATES = {
    "half_pixel": lambda x, s, o, i: (x + 0.5) / s - 0.5,
    "half_pixel_symmetric": lambda x, s, o, i: i / 2 * (1 - o / (s * i)) + (x.astype(np.float64) + 0.5) / np.float64(s) - 0.5,
    "pytorch_half_pixel": lambda x, s, o, i: (x + 0.5) / s - 0.5 if o > 1 else 0 * x,
    "align_corners": lambda x, s, o, i: x * (i - 1) / (o - 1) if o > 1 else 0 * x,
    "asymmetric": lambda x, s, o, i: x / s,
}
# the input cell nearest to coordinate x (float64 here: x +- 0.5 is exact for a float32 x)
NEAREST = {
    "round_prefer_floor": lambda x: np.ceil(x - 0.5),
    "round_prefer_ceil": lambda x: np.floor(x + 0.5),
    "floor": np.floor,
    "ceil": np.ceil,
}
DEFAULTS = {"antialias": 0, "exclude_outside": 0, "keep_aspect_ratio_policy": "stretch", "axes": None}


def text(value):
    return value.decode() if isinstance(value, bytes) else value


def resize(g):
    """Opset 11 to 21: inputs X, roi, scales, sizes; the scales or sizes must be constants."""
    mode = text(g.attr("mode", "nearest"))
    coordinates = text(g.attr("coordinate_transformation_mode", "half_pixel"))
    nearest = text(g.attr("nearest_mode", "round_prefer_floor"))
    if mode not in ("nearest", "linear"):
        g.refuse(f"mode {mode} is not differentiated (nearest and linear are)")
    if coordinates not in COORDINATES:
        g.refuse(f"coordinate_transformation_mode {coordinates} is not differentiated")
    changed = next((k for k, v in DEFAULTS.items() if text(g.attr(k, v)) != v), None)
    if changed:
        g.refuse(f"{changed} other than its default is not differentiated")
    shape, out = g.shape(g.input(0)), g.shape(g.output(0))
    scales = g.ctx.constant_value(g.input(2)) if g.input(2) else None
    if scales is None or scales.size == 0:
        sizes = g.ctx.constant_value(g.input(3)) if g.input(3) else None
        if sizes is None:
            g.refuse("its scales or sizes must be constants")
        scales = np.float32(out) / np.float32(shape)
    place = COORDINATES[coordinates]
    maps = {}
    for axis, (size, length, scale) in enumerate(zip(shape, out, np.float32(scales.ravel()))):
        # astype, not np.float32(...): before numpy 2.3 that makes a one-element array a scalar
        x = np.asarray(place(np.arange(length, dtype=np.float32), scale, np.float32(length), np.float32(size)),
                       dtype=np.float32).astype(np.float64)
        maps[axis] = (nearest_matrix(NEAREST[nearest](x), size) if mode == "nearest" else linear_matrix(x, size))
    g.give(0, along_axes(g, g.dy(), maps))


def nearest_matrix(cells: np.ndarray, size: int) -> np.ndarray:
    m = np.zeros((len(cells), size))
    m[np.arange(len(cells)), np.clip(cells, 0, size - 1).astype(np.int64)] = 1.0
    return m


def linear_matrix(x: np.ndarray, size: int) -> np.ndarray:
    """Coordinates past either edge read the edge cell."""
    x = np.clip(x, 0, size - 1)
    low = np.floor(x).astype(np.int64)
    high = np.minimum(low + 1, size - 1)
    m = np.zeros((len(x), size))
    rows = np.arange(len(x))
    np.add.at(m, (rows, low), 1 - (x - low))
    np.add.at(m, (rows, high), x - low)
    return m
