"""Checkpoints of a `roam train` run, on one process or N ranks: everything the next step needs,
written so that a process killed at any moment leaves the newest complete checkpoint readable, and
nothing half-written is ever taken for one.

A checkpoint is a folder `DIR/step-<k>` (k: the steps done) holding one `rank<r>.npz` per process,
every value the step updates in place as that process holds it (the parameters, the optimizer's
moments and step counter, an fp16 step's loss scale and growth tracker: whatever the step's state
is; on ranks each its own shards, written in parallel, nothing gathered), and `manifest.json`,
written last by rank 0: the format, k, the run it continues (the sha256 of the step, the seed, the
sha256 of `--inputs`, and every input's type and shape in the whole step: a checkpoint of N ranks
resumes on M, or on one process, when the M ranks' step has the same inputs, the same global batch
among them), the ranks and each sharded value's whole shape, and the size and sha256 of every part. The data position is k: step k + 1 reads the batch an
uninterrupted run's step k + 1 reads. The folder is written as `DIR/.step-<k>.part`, each file and
the folder fsynced, then renamed into place and DIR fsynced; then all but the newest `keep` are
removed. Reading takes the newest whose manifest and checksums hold, and says which it passed over
and why; on another number of ranks each value is joined from its shards and split again."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from roam_cli.core.errors import CheckFailed, RoamError, first_line
from roam_cli.core.fileio import read_arrays
from roam_cli.shard.arithmetic import join

FORMAT = 2
NAME = re.compile(r"step-(\d+)")


@dataclass(frozen=True)
class Options:
    """`roam train --checkpoint-dir FOLDER --checkpoint-every EVERY --checkpoint-keep KEEP [--resume]`."""
    folder: Path
    every: int
    keep: int
    resume: bool


@dataclass(frozen=True)
class Run:
    """What a checkpoint must match to continue a run: the step (on as many ranks as this run: on
    others, another rank step of the same whole step, which `Checkpoint.state` checks by its inputs),
    the seed, the data."""
    step_sha256: str
    ranks: int
    seed: int
    inputs_sha256: str | None

    def differs(self, other: dict) -> str | None:
        """How the run a manifest records differs from this one, in words (None: the same run)."""
        if other["ranks"] == self.ranks and other["step_sha256"] != self.step_sha256:
            return f"it is of another step (sha256 {other['step_sha256'][:12]}..., this is {self.step_sha256[:12]}...)"
        if other["seed"] != self.seed:
            return f"its run used --seed {other['seed']}, this one {self.seed}"
        if other["inputs_sha256"] != self.inputs_sha256:
            return "its run read other --inputs" if other["inputs_sha256"] else "its run read no --inputs"
        return None


@dataclass
class Checkpoint:
    step: int
    folder: Path
    manifest: dict
    passed: list[str] = field(default_factory=list)  # the newer ones passed over, and why

    def state(self, inputs: dict[str, list], layout=None, rank: int = 0) -> dict[str, np.ndarray]:
        """The state of rank `rank` of `layout` (a runtime.shards.Sharding; None: one process's whole
        values): its own part when the checkpoint has this layout, else each value joined from the
        checkpoint's shards and split as `layout` shards it. RoamError when the checkpoint's run had
        other inputs than `inputs` (by name, [dtype, shape] in the whole step: the ranks' rows together)."""
        theirs = self.manifest["inputs"]
        for name in sorted(theirs.keys() | inputs.keys()):
            if theirs.get(name) != inputs.get(name):
                raise RoamError(f"--resume: checkpoint {self.folder} is not of this run: its input {name!r} was "
                                f"{spec_said(theirs.get(name))}, this run's is {spec_said(inputs.get(name))} (the "
                                "whole step's: the ranks' rows together)")
        parts = [self.folder / part["file"] for part in self.manifest["parts"]]
        sharded = {name: tuple(shape) for name, shape in self.manifest["sharded"].items()}
        ranks = layout.ranks if layout is not None else 1
        mine = {name: tuple(layout.sharded(name)[0]) for name in sharded if layout is not None and layout.sharded(name)}
        if len(parts) == ranks and mine == sharded:
            return read_arrays(parts[rank], "--resume")
        with contextlib.ExitStack() as stack:
            files = [stack.enter_context(np.load(path, allow_pickle=False)) for path in parts]
            out = {}
            for name in files[0].files:
                whole = join([f[name] for f in files], sharded[name]) if name in sharded else files[0][name]
                out[name] = layout.of_rank(name, whole, rank) if layout is not None else whole
            return out


def spec_said(spec: list | None) -> str:
    return "none" if spec is None else f"{spec[0]} {spec[1]}"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write(folder: Path, step: int, run: Run, state: dict[str, np.ndarray], keep: int, inputs: dict[str, list],
          layout=None, comm=None) -> Path:
    """Checkpoint `step` of `run` (`inputs`: the whole step's, by name [dtype, shape]) into `folder`;
    CheckFailed (the older ones intact) when it cannot be written. On ranks (`comm`, mpi4py's, and the rank step's `layout`)
    every rank calls it with its own state: each writes its part, rank 0 the folder and the manifest."""
    rank, ranks = (comm.rank, comm.size) if comm is not None else (0, 1)
    final, part = folder / f"step-{step}", folder / f".step-{step}.part"
    made = not folder.exists()
    try:
        if rank == 0:
            folder.mkdir(parents=True, exist_ok=True)
            for stale in folder.glob(".step-*.part"):  # a write a killed process left
                shutil.rmtree(stale, ignore_errors=True)
            part.mkdir()
        if comm is not None:
            comm.Barrier()
        parts = [write_part(part, rank, state)]
        if comm is not None:
            parts = comm.gather(parts[0], root=0)
        if rank == 0:
            sharded = {name: list(layout.sharded(name)[0]) for name in state
                       if layout is not None and layout.sharded(name) is not None}
            manifest = {"format": FORMAT, "step": step, "step_sha256": run.step_sha256, "seed": run.seed,
                        "inputs_sha256": run.inputs_sha256, "inputs": inputs, "ranks": ranks, "sharded": sharded,
                        "parts": parts}
            with open(part / "manifest.json", "w") as f:
                f.write(json.dumps(manifest, indent=1) + "\n")
                f.flush()
                os.fsync(f.fileno())
            sync(part)
            if final.exists():  # a checkpoint of this step already (a run resumed before it): this one replaces it
                shutil.rmtree(final)
            os.replace(part, final)
            sync(folder)
    except OSError as e:
        # on ranks the launcher cleans up once every rank has stopped: another may still be writing
        if comm is None:
            shutil.rmtree(part, ignore_errors=True)
            if made:  # the folder this run made, for nothing
                shutil.rmtree(folder, ignore_errors=True)
        kept = [c.name for c in complete(folder)]
        raise CheckFailed(f"cannot write checkpoint {final}: {e.strerror or first_line(e)}; "
                          + (f"{kept[0]} is intact" if kept else "no earlier checkpoint")) from None
    except BaseException:  # interrupted: no half-written folder left
        if comm is None:
            shutil.rmtree(part, ignore_errors=True)
        raise
    if rank == 0:
        for old in complete(folder)[keep:]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def write_part(part: Path, rank: int, state: dict[str, np.ndarray]) -> dict:
    """Rank `rank`'s state into `part`, fsynced: its manifest entry."""
    path = part / f"rank{rank}.npz"
    with open(path, "wb") as f:
        np.savez(f, **state)
        f.flush()
        os.fsync(f.fileno())
    return {"file": path.name, "bytes": path.stat().st_size, "sha256": sha256_of(path)}


def sync(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def complete(folder: Path) -> list[Path]:
    """The checkpoint folders in `folder`, newest first (the ones being written are named .part)."""
    try:
        found = [p for p in folder.iterdir() if p.is_dir() and NAME.fullmatch(p.name)]
    except OSError:  # no folder (a run that made it removed it)
        found = []
    return sorted(found, key=lambda p: int(NAME.fullmatch(p.name).group(1)), reverse=True)


def unfinished(folder: Path) -> None:
    """The writes a stopped run left (ranks killed inside a checkpoint's write) removed."""
    for stale in folder.glob(".step-*.part") if folder.is_dir() else ():
        shutil.rmtree(stale, ignore_errors=True)


def newest(folder: Path, run: Run) -> tuple[Checkpoint | None, list[str]]:
    """The newest checkpoint of `run` in `folder` whose every part matches its checksum, and why each
    newer one was passed over. A checkpoint of another run is refused (RoamError): it is not this
    run's to continue."""
    if folder.exists() and not folder.is_dir():
        raise RoamError(f"--checkpoint-dir {folder}: not a directory")
    passed = []
    for path in complete(folder):
        try:
            manifest = json.loads((path / "manifest.json").read_text())
            if manifest.get("format") != FORMAT:
                raise ValueError(f"format {manifest.get('format')!r}, not {FORMAT}")
            why = run.differs(manifest)
        except (OSError, ValueError, KeyError, TypeError) as e:
            passed.append(f"{path.name} (its manifest: {first_line(e)})")
            continue
        if why:
            raise RoamError(f"--resume: checkpoint {path} is not of this run: {why}")
        try:
            for part in manifest["parts"]:
                file = path / part["file"]
                if file.stat().st_size != part["bytes"] or sha256_of(file) != part["sha256"]:
                    raise ValueError(f"{part['file']} does not match its checksum")
            return Checkpoint(int(manifest["step"]), path, manifest, passed), passed
        except (OSError, ValueError, KeyError, TypeError) as e:
            passed.append(f"{path.name} ({first_line(e)})")
    return None, passed


@dataclass
class Checkpointing:
    """The run's checkpoint options, the run a checkpoint must match, and who hears of a resume; on
    ranks, the rank step's layout and the ranks' communicator, with which each writes its part."""
    options: Options
    run: Run
    say: Callable[[str], None] | None = None
    inputs: dict[str, list] = field(default_factory=dict)  # the whole step's, by name [dtype, shape]
    layout: object = None  # runtime.shards.Sharding
    comm: object = None  # mpi4py's

    def find(self) -> Checkpoint | None:
        """The checkpoint to resume from (None: start at step 1), said in one line."""
        found, passed = newest(self.options.folder, self.run)
        skipped = f" (passed over: {'; '.join(passed)})" if passed else ""
        if found is None:
            self.tell(f"no checkpoint in {self.options.folder} to resume from{skipped}: starting at step 1")
        else:
            self.tell(f"resumed from {found.folder} after step {found.step}{skipped}")
        return found

    def resume(self, start: dict[str, np.ndarray], random_ops: int) -> tuple[dict[str, np.ndarray], int, dict | None]:
        """(the starting state, the first step to run, what was resumed) from the newest checkpoint
        when resuming; else as they were. A step with `random_ops` (Dropout) resumes with their
        streams started again: ONNX Runtime keeps a random op's generator inside its kernel."""
        found = self.find() if self.options.resume else None
        if found is None:
            return start, 1, None
        if random_ops:
            self.tell(f"warning: the step has {random_ops} random ops (Dropout): their random streams start again "
                      "here, so from this step on the run is not bit for bit an uninterrupted one")
        return {**start, **found.state(self.inputs)}, found.step + 1, resumed(found)

    def after(self, k: int, steps: int, state) -> None:
        """Checkpoint step k if it is one to keep: every `every` steps, and the last."""
        if k % self.options.every == 0 or k == steps:
            write(self.options.folder, k, self.run, state(), self.options.keep, self.inputs, self.layout, self.comm)

    def tell(self, line: str) -> None:
        if self.say is not None:
            self.say(line)


def resumed(found: Checkpoint) -> dict:
    """What a run resumed from, as its figures say it."""
    return {"checkpoint": str(found.folder), "step": found.step, "ranks": found.manifest["ranks"],
            "passed_over": found.passed}
