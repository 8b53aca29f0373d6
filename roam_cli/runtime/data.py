"""A training run's data read from disk a batch at a time (`roam train --inputs FOLDER | TOKENS.bin`):
memory stays flat however large the data set, since each step reads only its batch's rows (with
pread: a memory map would keep every page a shuffled read touched in the process's resident set).

- A folder of arrays by input name: `NAME.npy`, or `NAME/` holding `.npy` shards read in name order
  as one array. A data input's array holds examples along its first axis (each the shape of one
  row of the step's batch); step k reads batch k of the epoch, batches of the step's rows, the
  rows in file order or, with `shuffle`, in an order drawn per epoch from the seed; an epoch is as
  many whole batches as the examples make. Any other input's file is its starting value, whole.
- A flat file of token ids (`.bin`: uint16, as GPT training scripts write them) cut into windows of
  the step's sequence length: the ids input reads window j's tokens, `labels` the same tokens
  shifted by one, as a language model learns to predict each next token.

The data position is the step number: a run resumed after step k reads what an uninterrupted run's
step k + 1 reads."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from roam_cli.core.errors import RoamError, first_line
from roam_cli.runtime.checkpoints import sha256_of

TOKEN_FILE = ".bin"
LABELS = "labels"  # the input make-training-graph --loss cross-entropy adds


def examples(step: int, count: int, per_batch: int, shuffle: bool, seed: int) -> np.ndarray:
    """The examples (of `count`) step `step` reads, ascending: batch (step - 1) % per_epoch of its
    epoch, in file order or in the order drawn for that epoch from `seed`."""
    epoch, k = divmod(step - 1, count // per_batch)
    positions = np.arange(k * per_batch, (k + 1) * per_batch, dtype=np.uint64)
    if not shuffle:
        return positions.astype(np.int64)
    return np.sort(permuted(positions, count, [seed, epoch]).astype(np.int64))  # each file read front to back


ROUNDS = 4


def permuted(positions: np.ndarray, count: int, key: list[int]) -> np.ndarray:
    """Where a pseudo-random permutation of range(count), drawn from `key`, sends `positions`: a
    Feistel network on the fewest even bits covering count, values past count walked on through it
    until they land inside (a bijection of range(count)). No table of count entries: an epoch of a
    billion examples shuffles in the memory of one batch."""
    half = max(1, ((count - 1).bit_length() + 1) // 2)
    mask = np.uint64((1 << half) - 1)
    keys = np.random.default_rng(key).integers(0, 1 << 62, ROUNDS, dtype=np.uint64)

    def network(x: np.ndarray) -> np.ndarray:
        left, right = x >> np.uint64(half), x & mask
        for k in keys:
            mixed = (right ^ k) * np.uint64(0x9E3779B97F4A7C15)  # wraps mod 2**64
            left, right = right, left ^ ((mixed ^ (mixed >> np.uint64(29))) & mask)
        return (left << np.uint64(half)) | right

    with np.errstate(over="ignore"):
        out = network(positions)
        outside = out >= count
        while outside.any():
            out[outside] = network(out[outside])
            outside = out >= count
    return out


class Batches:
    """One data input's batches over the examples along its arrays' first axis: `batch(k)` is step
    k's, of `shape` (the step's input)."""

    def __init__(self, name: str, parts: list[np.ndarray], shape: tuple[int, ...], dtype: np.dtype,
                 shuffle: bool, seed: int):
        self.name, self.parts, self.shape, self.dtype = name, parts, shape, dtype
        self.shuffle, self.seed = shuffle, seed
        self.starts = np.cumsum([0] + [len(p) for p in parts])
        self.count = int(self.starts[-1])
        self.per_batch = shape[0]

    @property
    def per_epoch(self) -> int:
        return self.count // self.per_batch

    def batch(self, step: int) -> np.ndarray:
        rows = examples(step, self.count, self.per_batch, self.shuffle, self.seed)
        out = np.empty((len(rows), *self.parts[0].shape[1:]), self.parts[0].dtype)
        part = np.searchsorted(self.starts, rows, side="right") - 1
        for p in np.unique(part):
            mine = part == p
            out[mine] = self.parts[p].rows(rows[mine] - self.starts[p])
        return out.reshape(self.shape)


class TokenWindows(Batches):
    """Windows of `seq` tokens of a flat token file, begun `shift` tokens on (the labels: 1); each
    window an example, so batches, epochs and shuffling are as for arrays."""

    def __init__(self, name: str, tokens: np.ndarray, shape: tuple[int, ...], seq: int, shift: int,
                 dtype: np.dtype, shuffle: bool, seed: int):
        self.name, self.tokens, self.shape, self.dtype = name, tokens, shape, dtype
        self.seq, self.shift, self.shuffle, self.seed = seq, shift, shuffle, seed
        self.count = (len(tokens) - 1) // seq  # the last token is only ever a label
        self.per_batch = int(np.prod(shape)) // seq

    def batch(self, step: int) -> np.ndarray:
        starts = examples(step, self.count, self.per_batch, self.shuffle, self.seed) * self.seq + self.shift
        return np.stack([self.tokens.read(s, self.seq) for s in starts]).astype(self.dtype).reshape(self.shape)


def read(path: Path, specs: dict[str, tuple[np.dtype, tuple[int, ...]]], data_inputs: set[str], shuffle: bool,
         seed: int) -> dict[str, np.ndarray | Batches]:
    """The values a folder or a token file gives, by input name: a data input's as Batches, any other
    whole. `specs`: every input's (dtype, shape); RoamError for data that does not fit them."""
    if path.suffix == TOKEN_FILE and path.is_file():
        return token_windows(path, specs, data_inputs, shuffle, seed)
    if not path.is_dir():
        raise RoamError(f"--inputs {path}: not an .npz, a folder of .npy arrays by input name, or a {TOKEN_FILE} "
                        "token file")
    found = {p.stem if p.is_file() else p.name: p for p in sorted(path.iterdir())
             if (p.is_file() and p.suffix == ".npy") or p.is_dir()}
    if not found:
        raise RoamError(f"--inputs {path}: no NAME.npy nor NAME/ of .npy shards in the folder")
    values: dict[str, np.ndarray | Batches] = {}
    for name, where in found.items():
        if name not in specs:
            raise RoamError(f"--inputs {where}: {name!r} is not an input of the model")
        dtype, shape = specs[name]
        files = sorted(where.glob("*.npy")) if where.is_dir() else [where]
        if not files:
            raise RoamError(f"--inputs {where}: a folder without .npy shards")
        parts = [npy_rows(f) for f in files]
        for f, part in zip(files, parts, strict=True):
            if part.dtype != dtype or (name in data_inputs and part.shape[1:] != shape[1:]):
                raise RoamError(f"--inputs {f}: {name!r} is {part.dtype}{list(part.shape)}, the model takes "
                                + (f"{dtype}[examples, {', '.join(map(str, shape[1:]))}]" if name in data_inputs
                                   else f"{dtype}{list(shape)}"))
        if name not in data_inputs:
            if len(parts) != 1 or parts[0].shape != shape:
                raise RoamError(f"--inputs {where}: {name!r} is the model's {dtype}{list(shape)}, given whole")
            values[name] = parts[0].rows(np.arange(len(parts[0]))) if shape else parts[0].read(0, 1).reshape(())
            continue
        batches = Batches(name, parts, shape, dtype, shuffle, seed)
        if batches.per_epoch < 1:
            raise RoamError(f"--inputs {where}: {batches.count} examples of {name!r}, fewer than one batch "
                            f"({shape[0]} rows)")
        values[name] = batches
    sizes = {b.per_epoch for b in values.values() if isinstance(b, Batches)}
    if len(sizes) > 1:
        said = ", ".join(f"{b.name} {b.count}" for b in values.values() if isinstance(b, Batches))
        raise RoamError(f"--inputs {path}: the data inputs hold different numbers of examples ({said})")
    return values


def token_windows(path: Path, specs, data_inputs: set[str], shuffle: bool, seed: int) -> dict[str, TokenWindows]:
    """The ids input and `labels` of a language-model step, as windows of the token file."""
    ids = sorted(n for n in data_inputs if n != LABELS and specs[n][0].kind in "iu")
    if LABELS not in data_inputs or len(ids) != 1:
        raise RoamError(f"--inputs {path}: a token file feeds a step with one integer ids input and {LABELS!r} "
                        f"(make-training-graph --loss cross-entropy); this step's data inputs are "
                        f"{', '.join(sorted(data_inputs)) or 'none'}")
    shape = specs[ids[0]][1]
    if len(shape) != 2 or int(np.prod(specs[LABELS][1])) != int(np.prod(shape)):
        raise RoamError(f"--inputs {path}: the ids input {ids[0]!r} is {list(shape)} and {LABELS!r} "
                        f"{list(specs[LABELS][1])}: a token file feeds [batch, sequence] ids and as many labels")
    tokens = Flat(path, np.dtype(np.uint16), 0, (path.stat().st_size // 2,))
    seq = shape[1]
    out = {ids[0]: TokenWindows(ids[0], tokens, shape, seq, 0, specs[ids[0]][0], shuffle, seed),
           LABELS: TokenWindows(LABELS, tokens, specs[LABELS][1], seq, 1, specs[LABELS][0], shuffle, seed)}
    if out[LABELS].per_epoch < 1:
        raise RoamError(f"--inputs {path}: {len(tokens)} tokens, fewer than one batch of {shape[0]} windows of {seq}")
    return out


class Flat:
    """The elements of a file of one dtype from byte `offset` on, read with pread and kept nowhere (the
    file open only while it is read: a folder of thousands of shards holds no descriptor)."""

    def __init__(self, path: Path, dtype: np.dtype, offset: int, shape: tuple[int, ...]):
        self.path, self.dtype, self.offset, self.shape = path, dtype, offset, shape
        self.row = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1  # elements a row

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 1

    def read(self, start: int, count: int, fd: int | None = None) -> np.ndarray:
        """`count` elements from element `start` (of the file open as `fd`, or opened for this)."""
        if fd is None:
            with open(self.path, "rb") as f:
                return self.read(start, count, f.fileno())
        size = self.dtype.itemsize
        got = os.pread(fd, count * size, self.offset + int(start) * size)
        if len(got) != count * size:
            raise RoamError(f"--inputs {self.path}: shorter than its header says (truncated?)")
        return np.frombuffer(got, self.dtype)

    def rows(self, indices: np.ndarray) -> np.ndarray:
        """The rows at ascending `indices`, each run of consecutive ones in one read."""
        out = np.empty((len(indices), *self.shape[1:]), self.dtype)
        breaks = np.flatnonzero(np.diff(indices) != 1) + 1
        with open(self.path, "rb") as f:
            for run in np.split(np.arange(len(indices)), breaks):
                if len(run):
                    out[run] = self.read(indices[run[0]] * self.row, len(run) * self.row,
                                         f.fileno()).reshape(len(run), *self.shape[1:])
        return out


def npy_rows(path: Path) -> Flat:
    """The rows of the .npy at `path`, read as they are asked for: its header read here, nothing else."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = header(f)
            offset = f.tell()
    except (ValueError, OSError, EOFError) as e:
        raise RoamError(f"--inputs {path}: not a readable .npy array ({first_line(e)})") from None
    if fortran and len(shape) > 1 or dtype.hasobject:
        raise RoamError(f"--inputs {path}: " + ("a Fortran-ordered array" if fortran else "an array of Python objects")
                        + "; roam reads C-ordered arrays of numbers (numpy.save's default)")
    if path.stat().st_size < offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
        raise RoamError(f"--inputs {path}: shorter than its header says (truncated?)")
    return Flat(path, dtype, offset, shape)


def identity(path: Path) -> str:
    """What a checkpoint records of the data: the sha256 of an .npz or token file; of a folder, of its
    files' names and sizes and each one's first MiB (a data set of terabytes is not read to resume)."""
    if not path.is_dir():
        return sha256_of(path)
    digest = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{f.relative_to(path)}\0{f.stat().st_size}\0".encode())
        with open(f, "rb") as fh:
            digest.update(fh.read(1 << 20))
    return digest.hexdigest()
