"""Checkpoints of a `roam train` run: everything the next step needs, written so that a process
killed at any moment leaves the newest complete checkpoint readable, and nothing half-written is
ever taken for one.

A checkpoint is a folder `DIR/step-<k>` (k: the steps done) holding `state.npz`, every value the
step updates in place (the parameters, the optimizer's moments and step counter, an fp16 step's
loss scale and growth tracker: whatever the step's state is), and `manifest.json`, written last:
the format, k, the run it continues (the sha256 of the step model optimize read, the seed, the
sha256 of `--inputs`), and the size and sha256 of `state.npz`. The data position is k: step k + 1
reads the batch an uninterrupted run's step k + 1 reads. The folder is written as
`DIR/.step-<k>.part`, each file and the folder fsynced, then renamed into place and DIR fsynced;
then all but the newest `keep` are removed. Reading takes the newest whose manifest and checksum
hold, and says which it passed over and why."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from roam_cli.core.errors import CheckFailed, RoamError, first_line
from roam_cli.core.fileio import read_arrays

FORMAT = 1
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
    """What a checkpoint must match to continue a run: the step, the seed, the data."""
    model_sha256: str
    seed: int
    inputs_sha256: str | None

    def differs(self, other: dict) -> str | None:
        """How the run a manifest records differs from this one, in words (None: the same run)."""
        if other["model_sha256"] != self.model_sha256:
            return f"it is of another step (sha256 {other['model_sha256'][:12]}..., this is {self.model_sha256[:12]}...)"
        if other["seed"] != self.seed:
            return f"its run used --seed {other['seed']}, this one {self.seed}"
        if other["inputs_sha256"] != self.inputs_sha256:
            return "its run read other --inputs" if other["inputs_sha256"] else "its run read no --inputs"
        return None


@dataclass
class Checkpoint:
    step: int
    state: dict[str, np.ndarray]
    folder: Path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write(folder: Path, step: int, run: Run, state: dict[str, np.ndarray], keep: int) -> Path:
    """Checkpoint `step` of `run` into `folder`; CheckFailed (the older ones intact) when it cannot be
    written."""
    final = folder / f"step-{step}"
    part = folder / f".step-{step}.part"
    made = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(part, ignore_errors=True)
        part.mkdir()
        with open(part / "state.npz", "wb") as f:
            np.savez(f, **state)
            f.flush()
            os.fsync(f.fileno())
        manifest = {"format": FORMAT, "step": step, "model_sha256": run.model_sha256, "seed": run.seed,
                    "inputs_sha256": run.inputs_sha256, "state": {"file": "state.npz",
                                                                   "bytes": (part / "state.npz").stat().st_size,
                                                                   "sha256": sha256_of(part / "state.npz")}}
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
        shutil.rmtree(part, ignore_errors=True)
        if made:  # the folder this run made, for nothing
            shutil.rmtree(folder, ignore_errors=True)
        kept = [c.name for c in complete(folder)]
        raise CheckFailed(f"cannot write checkpoint {final}: {e.strerror or first_line(e)}; "
                          + (f"{kept[0]} is intact" if kept else "no earlier checkpoint")) from None
    except BaseException:  # interrupted: no half-written folder left
        shutil.rmtree(part, ignore_errors=True)
        raise
    for old in complete(folder)[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def sync(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def complete(folder: Path) -> list[Path]:
    """The checkpoint folders in `folder`, newest first (the ones being written are named .part)."""
    found = [p for p in folder.iterdir() if p.is_dir() and NAME.fullmatch(p.name)] if folder.is_dir() else []
    return sorted(found, key=lambda p: int(NAME.fullmatch(p.name).group(1)), reverse=True)


def newest(folder: Path, run: Run) -> tuple[Checkpoint | None, list[str]]:
    """The newest checkpoint of `run` in `folder` that reads whole, and why each newer one was passed
    over. A checkpoint of another run is refused (RoamError): it is not this run's to continue."""
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
            state_file = path / manifest["state"]["file"]
            if state_file.stat().st_size != manifest["state"]["bytes"] or sha256_of(state_file) != manifest["state"]["sha256"]:
                raise ValueError("state.npz does not match its checksum")
            return Checkpoint(int(manifest["step"]), read_arrays(state_file, "--resume"), path), passed
        except (OSError, ValueError, KeyError, TypeError, RoamError) as e:
            passed.append(f"{path.name} ({first_line(e)})")
    return None, passed


@dataclass
class Checkpointing:
    """The run's checkpoint options, the run a checkpoint must match, and who hears of a resume."""
    options: Options
    run: Run
    say: Callable[[str], None] | None = None

    def resume(self, start: dict[str, np.ndarray], random_ops: int) -> tuple[dict[str, np.ndarray], int, dict | None]:
        """(the starting state, the first step to run, what was resumed) from the newest checkpoint
        when resuming; else as they were. A step with `random_ops` (Dropout) resumes with their
        streams started again: ONNX Runtime keeps a random op's generator inside its kernel."""
        if not self.options.resume:
            return start, 1, None
        found, passed = newest(self.options.folder, self.run)
        skipped = f" (passed over: {'; '.join(passed)})" if passed else ""
        if found is None:
            self.tell(f"no checkpoint in {self.options.folder} to resume from{skipped}: starting at step 1")
            return start, 1, None
        self.tell(f"resumed from {found.folder} after step {found.step}{skipped}")
        if random_ops:
            self.tell(f"warning: the step has {random_ops} random ops (Dropout): their random streams start again "
                      "here, so from this step on the run is not bit for bit an uninterrupted one")
        return {**start, **found.state}, found.step + 1, {"checkpoint": str(found.folder), "step": found.step,
                                                          "passed_over": passed}

    def after(self, k: int, steps: int, state) -> None:
        """Checkpoint step k if it is one to keep: every `every` steps, and the last."""
        if k % self.options.every == 0 or k == steps:
            write(self.options.folder, k, self.run, state(), self.options.keep)

    def tell(self, line: str) -> None:
        if self.say is not None:
            self.say(line)
