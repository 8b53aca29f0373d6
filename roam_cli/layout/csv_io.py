"""Read and write layout problems in minimalloc's CSV format.

Input: a header row with at least ``id,lower,upper,size`` (any order, extra columns ignored);
each row is a buffer of ``size`` bytes live on the half-open interval ``[lower, upper)``.
Output: the same columns plus ``offset``.
"""

from __future__ import annotations

import csv
import io
import os
import tempfile
from collections.abc import Sequence

REQUIRED = ("id", "lower", "upper", "size")
# Every value, and the sum of the sizes (the largest arena a layout can need), must be an int64:
# what offsets are in a plan, in the C search and in any allocator.
LARGEST = 2**63 - 1


def read_csv(path) -> tuple[list[str], list[tuple[int, int, int]]]:
    """Return ``(ids, buffers)`` with ``buffers[i] = (lower, upper, size)``.

    Raises ``ValueError`` (one line, naming the file and row) on text that is not UTF-8, a
    missing column, a value that is not an integer, a negative value or one over ``LARGEST``,
    sizes that sum to more than ``LARGEST``, ``lower >= upper`` or a duplicate id.
    """
    name = os.fspath(path)
    try:
        with open(name, "rb") as fh:
            data = fh.read()
    except OSError as e:
        raise ValueError(f"{name}: cannot read: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        row = data.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{name}:{row}: not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start})") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        return parse_rows(reader, name)
    except csv.Error as e:  # a malformed row: a field over csv's size limit
        raise ValueError(f"{name}:{reader.line_num}: {e}") from None


def parse_rows(reader, name: str) -> tuple[list[str], list[tuple[int, int, int]]]:
    """read_csv()'s rows, from a csv reader; `name` is the file's, for the messages."""
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
    total = 0
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
                value = int(cell)
            except ValueError:
                raise ValueError(f"{name}:{line}: {c} is not an integer: {cell[:40]!r}") from None
            if value < 0:
                raise ValueError(f"{name}:{line}: negative {c} {value} for buffer {ident!r}")
            if value > LARGEST:
                raise ValueError(f"{name}:{line}: {c} {value} for buffer {ident!r} is over 2^63 - 1")
            vals.append(value)
        lo, hi, size = vals
        if lo >= hi:
            raise ValueError(f"{name}:{line}: lower ({lo}) must be < upper ({hi}) "
                             f"for buffer {ident!r}")
        if ident in seen:
            raise ValueError(f"{name}:{line}: duplicate id {ident!r}")
        total += size
        if total > LARGEST:
            raise ValueError(f"{name}:{line}: the sizes up to this row sum to {total}, over 2^63 - 1")
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
