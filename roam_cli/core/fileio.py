"""Output safety: outputs never clobber inputs and are never left half-written; and JSON inputs
read with one clear line for any unreadable file."""

import json
import os
import tempfile
from pathlib import Path

from roam_cli.core.errors import RoamError


def read_json(path: str | os.PathLike):
    """The JSON document at `path`; RoamError naming the file and the first line of the reason."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise RoamError(f"cannot read {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


NEW_FILE_MODE = 0o666 & ~_umask()  # what open() gives a new file


def check_output_path(out: str | os.PathLike, inputs: list[str | os.PathLike]) -> Path:
    """Refuse, before any work is done, an output that is an input or cannot be written."""
    out = Path(out)
    for inp in inputs:
        inp = Path(inp)
        if out.resolve() == inp.resolve() or (out.exists() and inp.exists() and os.path.samefile(out, inp)):
            raise RoamError(f"output path {out} is the same file as input {inp}; choose another output")
    parent = out.resolve().parent
    if not parent.is_dir():
        raise RoamError(f"cannot write {out}: directory {parent} does not exist")
    if out.is_dir():
        raise RoamError(f"cannot write {out}: it is a directory")
    if not os.access(parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise RoamError(f"cannot write {out}: permission denied")
    return out


def check_output_folder(folder: str | os.PathLike, files: list[Path], inputs: list[str | os.PathLike]) -> None:
    """Refuse, before any work is done, a folder `files` cannot be written into, or one of them
    that is an input. A folder that does not exist yet is fine when it can be made (make_folder)."""
    folder = Path(folder)
    if folder.is_dir():
        for f in files:
            check_output_path(f, inputs)
        return
    if folder.exists():
        raise RoamError(f"cannot write into {folder}: it is not a directory")
    ancestor = next(p for p in folder.resolve().parents if p.exists())  # the root always exists
    if not ancestor.is_dir():
        raise RoamError(f"cannot make {folder}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK):
        raise RoamError(f"cannot make {folder}: permission denied")


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
