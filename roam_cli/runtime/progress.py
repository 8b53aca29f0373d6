"""How a run's steps reach a person and a file: on a terminal, each step's line ends with the pace
and the time left; `--log FILE` appends one JSON line per step (flushed, so a run killed at any
moment leaves every step it finished logged, and a resumed run goes on appending)."""

from __future__ import annotations

import json
import time
from pathlib import Path


class Pace:
    """Steps per second since the first step this process ran, and the time left to `steps`."""

    def __init__(self, steps: int):
        self.steps = steps
        self.first: tuple[int, float] | None = None  # (its number, when it ended)

    def after(self, number: int) -> str:
        """What to say after step `number` ended: nothing after the first (no pace yet)."""
        now = time.monotonic()
        if self.first is None:
            self.first = (number, now)
            return ""
        rate = (number - self.first[0]) / max(now - self.first[1], 1e-9)
        return f"{rate:.3g} steps/s, {duration((self.steps - number) / rate)} left"


def duration(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Log:
    """`--log FILE`: a JSON line per step appended, {"step", "time" (Unix seconds), "seconds" (the
    step's), "outputs" (its scalar outputs; on ranks their mean) and, on ranks, "rank_outputs"}."""

    def __init__(self, path: Path):
        self.path, self.file = path, None  # opened at the first step: a run refused before it leaves no file

    def write(self, step: int, seconds: float, outputs: dict[str, float], **more) -> None:
        if self.file is None:
            self.file = open(self.path, "a")
        self.file.write(json.dumps({"step": step, "time": round(time.time(), 3), "seconds": seconds,
                                    "outputs": outputs, **more}) + "\n")
        self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
