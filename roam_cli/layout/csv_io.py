"""Read and write layout problems in minimalloc's CSV format.

Input: a header row with at least ``id,lower,upper,size`` (any order, extra columns ignored);
each row is a buffer of ``size`` bytes live on the half-open interval ``[lower, upper)``.
Output: the same columns plus ``offset``.
"""

from __future__ import annotations

import csv
import os
import tempfile
from collections.abc import Sequence

REQUIRED = ("id", "lower", "upper", "size")


def read_csv(path) -> tuple[list[str], list[tuple[int, int, int]]]:
    """Return ``(ids, buffers)`` with ``buffers[i] = (lower, upper, size)``.

    Raises ``ValueError`` (one line, naming the file and row) on a missing column, a value that
    is not an integer, a negative size, ``lower >= upper`` or a duplicate id.
    """
    name = os.fspath(path)
    try:
        fh = open(name, newline="", encoding="utf-8-sig")
    except OSError as e:
        raise ValueError(f"{name}: cannot read: {e.strerror or e}") from None
    with fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            raise ValueError(f"{name}: empty file, expected header {','.join(REQUIRED)}") from None
        cols = [h.strip().lower() for h in header]
        missing = [c for c in REQUIRED if c not in cols]
        if missing:
            raise ValueError(f"{name}: missing column(s) {', '.join(missing)} "
                             f"(header must contain {','.join(REQUIRED)})")
        at = {c: cols.index(c) for c in REQUIRED}
        ids: list[str] = []
        buffers: list[tuple[int, int, int]] = []
        seen: set[str] = set()
        for row in reader:
            line = reader.line_num
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) < len(cols):
                raise ValueError(f"{name}:{line}: expected {len(cols)} columns, got {len(row)}")
            ident = row[at["id"]].strip()
            vals = []
            for c in ("lower", "upper", "size"):
                cell = row[at[c]].strip()
                try:
                    vals.append(int(cell))
                except ValueError:
                    raise ValueError(f"{name}:{line}: {c} is not an integer: {cell!r}") from None
            lo, hi, size = vals
            if size < 0:
                raise ValueError(f"{name}:{line}: negative size {size} for buffer {ident!r}")
            if lo >= hi:
                raise ValueError(f"{name}:{line}: lower ({lo}) must be < upper ({hi}) "
                                 f"for buffer {ident!r}")
            if ident in seen:
                raise ValueError(f"{name}:{line}: duplicate id {ident!r}")
            seen.add(ident)
            ids.append(ident)
            buffers.append((lo, hi, size))
    return ids, buffers


def write_csv(path, ids: Sequence[str], buffers: Sequence[tuple[int, int, int]],
              offsets: Sequence[int]) -> None:
    """Write ``id,lower,upper,size,offset`` rows atomically (temp file, then ``os.replace``)."""
    if not (len(ids) == len(buffers) == len(offsets)):
        raise ValueError("write_csv: ids, buffers and offsets must have the same length")
    name = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(name))
    fd, tmp = tempfile.mkstemp(prefix=".layout-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh, lineterminator="\n")
            w.writerow(["id", "lower", "upper", "size", "offset"])
            for ident, (lo, hi, size), off in zip(ids, buffers, offsets):
                w.writerow([ident, lo, hi, size, int(off)])
        os.replace(tmp, name)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
