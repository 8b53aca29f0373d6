"""Layout strategies: offsets for buffers with fixed lifetimes in one arena."""

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from roam_cli.layout.first_fit import first_fit

STRATEGIES = ("first-fit",)


@dataclass(frozen=True)
class Layout:
    offsets: list[int]
    arena: int
    stats: dict = field(default_factory=dict)


def peak_live(buffers: Sequence[tuple[int, int, int]]) -> int:
    events = sorted([(lo, size) for lo, hi, size in buffers] + [(hi, -size) for lo, hi, size in buffers],
                    key=lambda e: (e[0], e[1]))
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    return peak


def place(buffers: Sequence[tuple[int, int, int]], strategy: str = "first-fit", *, time_limit=None,
          jobs: int = 1, capacity=None, progress=None) -> Layout:
    start = time.perf_counter()
    offsets = first_fit(buffers)
    arena = max((o + b[2] for o, b in zip(offsets, buffers)), default=0)
    return Layout(offsets, arena, {"strategy": strategy, "seconds": time.perf_counter() - start})
