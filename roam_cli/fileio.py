"""Output safety: outputs never clobber inputs and are never left half-written."""

import os
import tempfile
from pathlib import Path

from roam_cli.errors import RoamError


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


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """Write to a temporary file beside `path`, then rename it over `path`.

    A crash, an error or Ctrl-C leaves either the old file or the new one, never a mix."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.resolve().parent)
    except OSError as e:
        raise RoamError(f"cannot write {path}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        raise RoamError(f"cannot write {path}: {e.strerror}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
