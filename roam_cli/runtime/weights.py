"""The weights in and out of `roam train`: the step starts from the inference export it was made
from, and the trained parameters go back as PyTorch has them, or into that export.

`make-training-graph` records in the step's metadata (`recover.SOURCE_KEY`) the export's path
(relative to the step's folder) and what it changed: constants the exporter derived from a
parameter (`derived`: constant -> (parameter, perm), the constant being the parameter transposed
by perm; a parameter the export holds only so is that constant transposed back), and ties
(`tied`: another PyTorch name -> the parameter trained).

- `Source.starting_values`: every graph input the export holds a value for (parameters, frozen
  weights, running statistics), read once; RoamError when the export cannot be read (`train`
  then synthesises them and says so).
- `write_weights`: the trained parameters under their PyTorch names (a tied one once, under the
  name trained; `model.load_state_dict(weights, strict=False)` fills the one tensor), in the
  layouts PyTorch has (a recovered weight already is one): safetensors, or .npz.
- `write_model`: the export itself with the trained values, its derived constants made again
  from them (ONNX Runtime's `export_model_for_inferencing`, for roam's steps)."""

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
from roam_cli.core.fileio import write_all_atomic, write_atomic
from roam_cli.frontend.recover import SOURCE_KEY, underived

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
    record = next((p.value for p in model.metadata_props if p.key == SOURCE_KEY), None)
    if record is None:
        return None
    r = json.loads(record)
    return Source(folder / r["model"], {c: (p, perm) for c, (p, perm) in r["derived"].items()}, r["tied"])


def check_weights_path(path: Path) -> None:
    if path.suffix not in WEIGHT_FORMATS:
        raise RoamError(f"--save-weights {path}: write .safetensors or .npz")


def write_weights(path: Path, values: dict[str, np.ndarray], tied: dict[str, str]) -> None:
    """`values` by name, as safetensors (its metadata lists the ties) or .npz."""
    check_weights_path(path)
    if path.suffix == ".npz":
        buffer = io.BytesIO()
        np.savez(buffer, **values)
        write_atomic(path, buffer.getvalue())
        return
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
    write_atomic(path, struct.pack("<Q", len(text)) + text + b"".join(blobs))


def write_model(path: Path, source: Source, values: dict[str, np.ndarray]) -> None:
    """The inference export with each trained value, and each constant derived from one made again;
    its weights in `<path>.data` beside it when they are too large for one file (2 GB)."""
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
        write_atomic(path, model.SerializeToString())
        return
    data = path.with_name(path.name + ".data")
    with tempfile.TemporaryDirectory(dir=path.resolve().parent, prefix=".roam-model-") as scratch:
        onnx.save_model(model, str(Path(scratch, path.name)), save_as_external_data=True, location=data.name)
        write_all_atomic({path: Path(scratch, path.name), data: Path(scratch, data.name)})
