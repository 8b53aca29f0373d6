"""The weights in and out of `roam train`: the step starts from the inference export it was made
from, and the trained parameters go back as PyTorch has them, or into that export.

`make-training-graph` records in the step's metadata (`fileio.SOURCE_KEY`) the export's path
(relative to the step's folder) and what it changed: constants the exporter derived from a
parameter (`derived`: constant -> (parameter, perm), the constant being the parameter transposed
by perm; a parameter the export holds only so is that constant transposed back), and ties
(`tied`: another PyTorch name -> the parameter trained).

- `Source.starting_values`: every graph input the export holds a value for (parameters, frozen
  weights, running statistics), read once; RoamError when the export cannot be read (`train`
  then synthesises them and says so).
- `save_trained` writes, as one, either or both of: the trained parameters under their PyTorch
  names (`weights_bytes`: a tied one under each of its names, so `model.load_state_dict(weights)`
  misses no key), in the layouts PyTorch has (a recovered weight already is
  one): safetensors, or .npz; and the export itself with the trained values, its derived
  constants made again from them (`model_files`; ONNX Runtime's `export_model_for_inferencing`,
  for roam's steps)."""

from __future__ import annotations

import io
import json
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from roam_cli.core.errors import RoamError, first_line
from roam_cli.core.fileio import source_record, write_all_atomic
from roam_cli.frontend.recover import underived

SAFETENSORS_DTYPES = {"float32": "F32", "float16": "F16", "float64": "F64", "int64": "I64", "int32": "I32",
                      "int8": "I8", "uint8": "U8", "bool": "BOOL"}
WEIGHT_FORMATS = (".safetensors", ".npz")


@dataclass
class Source:
    path: Path  # the inference export
    derived: dict[str, tuple[str, list[int]]]
    tied: dict[str, str]

    def load(self) -> onnx.ModelProto:
        try:
            return onnx.load(str(self.path))
        except (OSError, ValueError, onnx.checker.ValidationError) as e:
            raise RoamError(f"cannot read the weights of {self.path}: {first_line(e)}") from None

    def starting_values(self, wanted: set[str]) -> dict[str, np.ndarray]:
        """The export's value of each name in `wanted` it holds (a recovered parameter: its derived
        constant transposed back); RoamError when its weights cannot be read."""
        model = self.load()
        inits = {t.name: t for t in model.graph.initializer}
        values = {name: numpy_helper.to_array(inits[name]) for name in wanted if name in inits}
        for const, (param, perm) in self.derived.items():
            if param in wanted and param not in values and const in inits:
                values[param] = underived(numpy_helper.to_array(inits[const]), perm)
        return values


def source_of(model: onnx.ModelProto, folder: Path) -> Source | None:
    """The step's recorded inference export (None for a step roam did not make from one)."""
    r = source_record(model)
    if r is None:
        return None
    return Source(folder / r["model"], {c: (p, perm) for c, (p, perm) in r["derived"].items()}, r["tied"])


def check_weights_path(path: Path) -> None:
    if path.suffix not in WEIGHT_FORMATS:
        raise RoamError(f"--save-weights {path}: write .safetensors or .npz")


def save_trained(save_weights: Path | None, save_model: Path | None, source: Source | None,
                 values: dict[str, np.ndarray]) -> dict[str, str]:
    """The trained `values` written as asked, as one: the weights (`weights_bytes`) and the export
    holding them (`model_files`) are renamed into place together once both are written, so a
    failure (a full disk) leaves neither. Returns the figures naming what was written."""
    files: dict[Path, bytes | Path] = {}
    if save_weights is not None:
        files[save_weights] = weights_bytes(save_weights, values, source.tied if source else {})
    if save_model is None:
        write_all_atomic(files)
    else:  # a model too large for one file is written beside it first, on its file system
        with tempfile.TemporaryDirectory(dir=save_model.resolve().parent, prefix=".roam-model-") as scratch:
            write_all_atomic(files | model_files(save_model, source, values, Path(scratch)))
    return {key: str(path) for key, path in (("saved_weights", save_weights), ("saved_model", save_model)) if path}


def weights_bytes(path: Path, values: dict[str, np.ndarray], tied: dict[str, str]) -> bytes:
    """`values` by name, a tied one under each of its names (PyTorch's state_dict has them all:
    `load_state_dict` then misses none), as safetensors (its metadata lists the ties) or .npz, by
    `path`'s suffix."""
    check_weights_path(path)
    values = values | {alias: values[name] for alias, name in tied.items() if name in values}
    if path.suffix == ".npz":
        buffer = io.BytesIO()
        np.savez(buffer, **values)
        return buffer.getvalue()
    header, blobs, offset = {}, [], 0
    for name, value in values.items():
        value = np.ascontiguousarray(value)
        if value.dtype.name not in SAFETENSORS_DTYPES:
            raise RoamError(f"--save-weights: {name!r} is {value.dtype}, which safetensors cannot hold here; use .npz")
        data = value.astype(value.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": SAFETENSORS_DTYPES[value.dtype.name], "shape": list(value.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt", "tied": json.dumps(tied)}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-aligned
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def model_files(path: Path, source: Source, values: dict[str, np.ndarray], scratch: Path) -> dict[Path, bytes | Path]:
    """The inference export with each trained value, and each constant derived from one made again:
    {path: its bytes}, or, when the weights are too large for one file (2 GB), `path` and
    `<path>.data` beside it, written in `scratch` (on the same file system)."""
    model = source.load()
    for t in model.graph.initializer:
        if t.name in source.derived:
            param, perm = source.derived[t.name]
            value = np.transpose(values[param], perm) if param in values else None
        else:
            value = values.get(t.name)
        if value is not None:  # the tensor keeps its name, type and metadata; only its bytes change
            fresh = numpy_helper.from_array(np.ascontiguousarray(value, dtype=helper.tensor_dtype_to_np_dtype(t.data_type)))
            for data in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "external_data"):
                t.ClearField(data)
            t.data_location = onnx.TensorProto.DEFAULT
            t.raw_data = fresh.raw_data
    if model.ByteSize() < onnx.checker.MAXIMUM_PROTOBUF:
        return {path: model.SerializeToString()}
    data = path.with_name(path.name + ".data")
    onnx.save_model(model, str(scratch / path.name), save_as_external_data=True, location=data.name)
    return {path: scratch / path.name, data: scratch / data.name}

