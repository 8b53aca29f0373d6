"""Output safety: outputs never clobber inputs and are never left half-written; and JSON and
.npz inputs read with one clear line for any unreadable file."""

import contextlib
import json
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import onnx

from roam_cli.core.errors import RoamError, first_line


def read_json(path: str | os.PathLike):
    """The JSON document at `path`; RoamError naming the file and the first line of the reason."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise RoamError(f"cannot read {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def read_arrays(path: str | os.PathLike, option: str) -> dict:
    """The arrays of the .npz at `path` by name; RoamError, naming `option` and the file, for a file
    that is not an .npz of plain arrays (numpy would read any file that is not an archive as a
    pickle, and return a member that is not an .npy file as bytes)."""
    try:
        if not Path(path).is_file():
            raise RoamError(f"{option} {path}: " + ("not a file" if Path(path).exists() else "no such file"))
        if not zipfile.is_zipfile(path):
            raise RoamError(f"{option} {path}: not an .npz file (a zip archive of .npy arrays, as numpy.savez writes)")
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except ValueError as e:
        why = "it holds Python objects, which roam does not unpickle" if "pickle" in str(e) else first_line(e)
        raise RoamError(f"{option} {path}: not an .npz file of arrays ({why})") from None
    except (OSError, EOFError, zipfile.BadZipFile) as e:
        raise RoamError(f"{option} {path}: not a readable .npz file ({first_line(e)})") from None
    for name, value in arrays.items():
        if not isinstance(value, np.ndarray):
            raise RoamError(f"{option} {path}: member {name!r} is not an array (.npy)")
    return arrays


# A step's metadata key for where its parameters came from: the inference export (its path relative
# to the step's folder) and what make-training-graph changed (frontend.recover). The step's weights
# are that export's: as much the user's as the step itself.
SOURCE_KEY = "roam.source"


def source_record(model: onnx.ModelProto) -> dict | None:
    """The step's SOURCE_KEY record as JSON, or None where it has none."""
    record = next((p.value for p in model.metadata_props if p.key == SOURCE_KEY), None)
    return None if record is None else json.loads(record)


def external_data_files(model: onnx.ModelProto) -> set[str]:
    """The files, relative to the model's folder, that hold its initializers' external data."""
    return {kv.value for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
            for kv in t.external_data if kv.key == "location"}


def with_data_files(path: str | os.PathLike) -> list[Path]:
    """An ONNX model, the external-data files it names and, for a step roam made from an export, that
    export and its data files (where the step's weights are read from); any other file (or one onnx
    cannot read) alone. A model's data is as much the user's as the model."""
    path = Path(path)
    if path.suffix != ".onnx" or not path.is_file():
        return [path]
    try:
        model = onnx.load_model(str(path), load_external_data=False)
    except Exception:  # not ONNX after all: the command reading it says so
        return [path]
    files = [path] + [path.parent / f for f in sorted(external_data_files(model))]
    with contextlib.suppress(ValueError, KeyError, TypeError):  # a record roam cannot read names no file
        export = path.parent / source_record(model)["model"]
        if export.resolve() != path.resolve():
            files += with_data_files(export)
    return files


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


NEW_FILE_MODE = 0o666 & ~_umask()  # what open() gives a new file


def same_file(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))


def check_output_path(out: str | os.PathLike, inputs: list[str | os.PathLike],
                      outputs: list[str | os.PathLike] = ()) -> Path:
    """Refuse, before any work is done, an output that cannot be written, or that is an input, an
    input model's external-data file, or another of the command's `outputs` — it, or (where the
    output is a model) the `.data` file roam writes beside a model too large for one file."""
    return refuse_taken(Path(out), input_files(inputs) + [(Path(o), f"output {o}") for o in outputs])


def check_outputs(outputs: list[str | os.PathLike], inputs: list[str | os.PathLike]) -> None:
    """check_output_path for each of a command's outputs, against the inputs (each model read once)
    and the outputs before it."""
    given = input_files(inputs)
    for i, out in enumerate(outputs):
        refuse_taken(Path(out), given + [(Path(o), f"output {o}") for o in outputs[:i]])


def input_files(inputs: list[str | os.PathLike]) -> list[tuple[Path, str]]:
    """Every file the inputs are, with its name in words: each input, and each model's data files."""
    def what(given: Path, inp) -> str:
        if given == Path(inp):
            return f"input {inp}"
        if given.suffix == ".onnx":
            return f"{given}, the export input {inp} takes its weights from"
        return f"{given}, the external data of input {inp}"
    return [(given, what(given, inp)) for inp in inputs for given in with_data_files(inp)]


def refuse_taken(out: Path, taken: list[tuple[Path, str]]) -> Path:
    """`out`, or RoamError where it (or its `.data` file) is one of `taken` or cannot be written."""
    written = [out, out.with_name(out.name + ".data")] if out.suffix == ".onnx" else [out]
    for path in written:
        for given, what in taken:
            if same_file(path, given):
                mine = "" if path == out else f" (its external data, {path.name})"
                raise RoamError(f"output path {out}{mine} is the same file as {what}; choose another output")
    parent = out.resolve().parent
    if not parent.is_dir():
        raise RoamError(f"cannot write {out}: directory {parent} does not exist")
    if out.is_dir():
        raise RoamError(f"cannot write {out}: it is a directory")
    if not os.access(parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise RoamError(f"cannot write {out}: {why_unwritable(parent)}")
    return out


def why_unwritable(folder: Path) -> str:
    return "read-only file system" if os.statvfs(folder).f_flag & os.ST_RDONLY else "permission denied"


def check_output_folder(folder: str | os.PathLike, files: list[Path], inputs: list[str | os.PathLike]) -> None:
    """Refuse, before any work is done, a folder `files` cannot be written into, or one of them
    that is an input. A folder that does not exist yet is fine when it can be made (make_folder)."""
    folder = Path(folder)
    if folder.is_dir():
        given = input_files(inputs)
        for f in files:
            refuse_taken(Path(f), given)
        return
    if folder.exists():
        raise RoamError(f"cannot write into {folder}: it is not a directory")
    ancestor = next(p for p in folder.resolve().parents if p.exists())  # the root always exists
    if not ancestor.is_dir():
        raise RoamError(f"cannot make {folder}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK):
        raise RoamError(f"cannot make {folder}: {why_unwritable(ancestor)}")


def make_folder(folder: str | os.PathLike) -> None:
    """Make `folder` and its missing parents (as `mkdir -p`), when the writing begins."""
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RoamError(f"cannot make {folder}: {e.strerror}") from None


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """Write to a temporary file beside `path`, then rename it over `path`.

    A crash, an error or Ctrl-C leaves either the old file or the new one, never a mix."""
    write_all_atomic({path: data})


def write_all_atomic(files: dict[str | os.PathLike, bytes | str | Path]) -> None:
    """Write several files as one: each goes to a temporary file beside it, and only when all are
    written are they renamed over their paths. An error or Ctrl-C before that leaves every path as
    it was, so a plan is never left without the annotated model it names (or the reverse).

    A Path value is a file already written on the same file system (too large to pass as bytes):
    it is renamed into place with the others."""
    temps: list[tuple[str, Path]] = []
    moves: list[tuple[str, Path]] = []
    try:
        for path, data in files.items():
            path = Path(path)
            if isinstance(data, Path):
                moves.append((str(data), path))
                continue
            try:
                fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.resolve().parent)
            except OSError as e:
                raise RoamError(f"cannot write {path}: {e.strerror}") from None
            temps.append((tmp, path))
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data.encode() if isinstance(data, str) else data)
                os.chmod(tmp, NEW_FILE_MODE)  # mkstemp makes 0600; a plan is as readable as any file
            except OSError as e:
                raise RoamError(f"cannot write {path}: {e.strerror}") from None
        for tmp, path in moves + temps:  # a move is what may fail (another file system): first
            try:
                os.replace(tmp, path)
            except OSError as e:
                raise RoamError(f"cannot write {path}: {e.strerror}") from None
    finally:
        for tmp, _ in temps:
            if os.path.exists(tmp):
                os.unlink(tmp)
