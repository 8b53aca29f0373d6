"""Layout strategies: offsets for buffers with fixed lifetimes in one arena.

A layout instance is a list of buffers ``(lower, upper, size)``: ``size`` bytes live on the
half-open step interval ``[lower, upper)``.  Two buffers whose lifetimes intersect must not
overlap in address; the arena is ``max(offset + size)``.  The peak of live bytes is a lower
bound for every layout (:func:`peak_live`).

Strategies (:data:`STRATEGIES`, the default first):

- ``roam``        -- exact search + ILP with decomposition, never worse than the heuristics
                     (:mod:`roam_cli.layout.roam`);
- ``first-fit``   -- allocation order, lowest gap (:mod:`roam_cli.layout.first_fit`);
- ``best-fit``    -- XLA's global decreasing-size best-fit heap;
- ``greedy-size`` -- TFLite / ExecuTorch greedy by size (:mod:`roam_cli.layout.heuristics`);
- ``pytorch``     -- replay through PyTorch's CUDA caching allocator;
- ``bfc``         -- replay through ONNX Runtime's BFC arena (:mod:`roam_cli.layout.allocators`).

Every strategy returns a valid single-arena layout and ``Layout.arena == max(offset + size)``;
the allocator replays also report their own figure in ``stats`` (``peak_reserved`` /
``peak_allocated``, and ``allocator_bytes``: peak reserved for ``pytorch``, peak allocated for
``bfc``).
"""

from __future__ import annotations

import operator
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from roam_cli.layout.first_fit import first_fit

STRATEGIES: tuple[str, ...] = ("roam", "first-fit", "best-fit", "greedy-size", "pytorch", "bfc")


@dataclass(frozen=True)
class Layout:
    offsets: list[int]  # one per buffer, same order as the input
    arena: int  # max(offset + size), 0 for no buffers
    stats: dict = field(default_factory=dict)  # plain JSON-able


def _validate(buffers) -> list[tuple[int, int, int]]:
    out = []
    for k, b in enumerate(buffers):
        try:
            lo, hi, size = b
            lo, hi, size = operator.index(lo), operator.index(hi), operator.index(size)
        except (TypeError, ValueError):
            raise ValueError(f"buffer {k}: expected (lower, upper, size) integers, got {b!r}") from None
        if size < 0:
            raise ValueError(f"buffer {k}: negative size {size}")
        if hi < lo:
            raise ValueError(f"buffer {k}: upper {hi} < lower {lo}")
        out.append((int(lo), int(hi), int(size)))
    return out


def peak_live(buffers: Sequence[tuple[int, int, int]]) -> int:
    """Max over time of the bytes of buffers live at that time (half-open lifetimes)."""
    events = []
    for lo, hi, size in buffers:
        if size > 0 and hi > lo:
            events.append((lo, size))
            events.append((hi, -size))
    events.sort()  # at equal times the frees (negative) come first
    live = peak = 0
    for _, delta in events:
        live += delta
        if live > peak:
            peak = live
    return peak


def arena_of(buffers: Sequence[tuple[int, int, int]], offsets: Sequence[int]) -> int:
    return max((o + b[2] for o, b in zip(offsets, buffers) if b[2] > 0), default=0)


def place(buffers: Sequence[tuple[int, int, int]], strategy: str = "roam", *,
          time_limit: float | None = None, jobs: int = 1, capacity: int | None = None,
          progress=None, solver: str = "cbc", gap: float = 0.0) -> Layout:
    """Offsets for ``buffers`` with ``strategy``.

    ``time_limit`` (seconds) bounds the ``roam`` search (default: a few seconds, growing with
    the instance); ``jobs`` is the number of processes it may use; ``capacity`` turns ``roam``
    into a decision problem (stop as soon as the layout fits) and adds ``stats["fits"]`` for
    every strategy; ``progress`` is an optional ``callable(str)``; ``solver`` is the MILP solver
    of ``roam``'s offset ILP (``cbc`` or ``highs``); ``gap`` stops ``roam``'s search once the
    arena is within that fraction of the peak of live bytes.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown layout strategy {strategy!r} (choose from {', '.join(STRATEGIES)})")
    bufs = _validate(buffers)
    if capacity is not None:
        capacity = operator.index(capacity)
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
    t0 = time.perf_counter()
    lb = peak_live(bufs)
    stats: dict = {"strategy": strategy}
    if strategy == "roam":
        from roam_cli.layout.roam import roam_layout
        offsets, extra = roam_layout(bufs, time_limit=time_limit, jobs=jobs, capacity=capacity,
                                     progress=progress, solver=solver, gap=gap)
        stats.update(extra)
    elif strategy == "first-fit":
        offsets = first_fit(bufs)
    elif strategy in ("best-fit", "greedy-size"):
        from roam_cli.layout import heuristics
        offsets = (heuristics.best_fit if strategy == "best-fit" else heuristics.greedy_size)(bufs)
    else:
        from roam_cli.layout import allocators
        if strategy == "pytorch":
            offsets, extra = allocators.pytorch_caching(bufs)
            extra["allocator_bytes"] = extra["peak_reserved"]
        else:
            offsets, extra = allocators.bfc_arena(bufs)
            extra["allocator_bytes"] = extra["peak_allocated"]
        stats.update(extra)
    offsets = [int(o) if b[2] > 0 and b[1] > b[0] else 0 for o, b in zip(offsets, bufs)]
    arena = arena_of(bufs, offsets)
    stats["seconds"] = round(time.perf_counter() - t0, 4)
    stats["lower_bound"] = lb
    stats["arena"] = arena
    stats["fragmentation"] = round(arena / lb - 1.0, 6) if lb else 0.0
    if capacity is not None:
        stats["capacity"] = capacity
        stats["fits"] = arena <= capacity
    return Layout(offsets, arena, stats)


__all__ = ["STRATEGIES", "Layout", "place", "peak_live", "arena_of", "first_fit"]
