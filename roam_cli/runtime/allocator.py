"""ONNX Runtime's own session, allocating from one arena laid out by roam.

With memory patterns off and PRIORITY_BASED order, the allocation requests ORT makes during a
step are the same every step: the same sizes, in the same order, freed at the same points. So
the first step is recorded (served by the real allocator), the recorded requests are laid out
by roam's layout solver as buffers whose lifetimes are the step's allocation events, and every
later step is served from one arena of that layout's size: request k at offset k. Whatever the
recording does not cover falls back to the real allocator and is counted per step (see
`_planalloc.c` for how the requests are intercepted, and why there).

    arena = ArenaAllocator("cpu")
    session = ort.InferenceSession(model, arena.session_options(options), providers=arena.providers())
    for batch in batches:
        with arena.step() as step:
            ...run the session, copy out what you keep, drop ORT's outputs...
        print(step.stats)
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state

from roam_cli import layout
from roam_cli.core.errors import RoamError
from roam_cli.frontend.providers import PROVIDERS, RUNTIME
from roam_cli.runtime import _planalloc

ALIGNMENT = 256  # every slot starts on this many bytes: enough for ORT's CPU (64) and CUDA (256) requests
ORT_LIBRARY = onnxruntime_pybind11_state.__file__.rsplit("/", 1)[-1]


def _round_up(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


@dataclass
class Recording:
    """One step's requests: bytes, and the allocation events during which each was live."""

    sizes: list[int]
    lifetimes: list[tuple[int, int]]  # [alloc event, free event), half-open

    @property
    def buffers(self) -> list[tuple[int, int, int]]:
        return [(lo, hi, _round_up(size)) for size, (lo, hi) in zip(self.sizes, self.lifetimes)]


@dataclass
class Step:
    """What one step asked of the allocator (filled in when the step's block ends)."""

    number: int
    recorded: bool = False
    stats: dict = field(default_factory=dict)


class ArenaAllocator:
    """Serves one session's ORT allocations from an arena laid out by roam after the first step.
    Each has a state of its own in the C extension; several may live in one process, one in a
    step per thread at a time. close() ends it (also after a failed step)."""

    def __init__(self, device: str = "cpu", strategy: str = "roam", time_limit: float = 30.0):
        self.handle: int | None = None
        if device not in ("cpu", "cuda"):
            raise RoamError(f"unknown device {device!r} (cpu or cuda)")
        self.device, self.strategy, self.time_limit = device, strategy, time_limit
        self.steps = 0
        self.recording: Recording | None = None
        self.layout: dict = {}
        try:
            if device == "cuda":
                self.cuda_functions = _planalloc.cuda_functions()
            self.handle = _planalloc.new_session(device, ORT_LIBRARY)
        except RuntimeError as e:
            raise RoamError(f"cannot serve ONNX Runtime's {device.upper()} allocations: {e}") from None

    def session_options(self, options: ort.SessionOptions) -> ort.SessionOptions:
        """`options` made to send every tensor to this allocator, one request per tensor."""
        options.enable_mem_pattern = False  # a pattern is one block for the whole step: nothing to place
        options.enable_mem_reuse = False  # ORT's own reuse would hand one request to several tensors
        if self.device == "cpu":
            options.enable_cpu_mem_arena = False  # ORT's CPU allocator then asks the system per tensor
        return options

    def providers(self) -> list:
        providers: list = list(PROVIDERS[self.device])
        if self.device == "cuda":
            alloc, free, empty = self.cuda_functions
            providers[0] = (providers[0], {"gpu_external_alloc": str(alloc), "gpu_external_free": str(free),
                                           "gpu_external_empty_cache": str(empty)})
        return providers

    @contextmanager
    def step(self):
        """One step: recorded if it is the first, served from the arena after that."""
        self.steps += 1
        current = Step(self.steps, recorded=self.recording is None)
        if current.recorded:
            self._begin(_planalloc.begin_record)
            try:
                yield current
            finally:
                sizes, allocs, frees, events = _planalloc.end_record(self.handle)
            if not sizes:
                raise RoamError(f"roam's allocator saw none of {RUNTIME}'s {self.device} allocations (it allocates "
                                "otherwise than the hooks expect): run with --allocator ort")
            self.recording = Recording(sizes, [(a, f if f >= 0 else events) for a, f in zip(allocs, frees)])
            current.stats = {"recorded": len(sizes), "recorded_bytes": sum(sizes)}
            self._load(self.recording)
        else:
            self._begin(_planalloc.begin_step)
            try:
                yield current
            finally:
                current.stats = _planalloc.end_step(self.handle)

    def _begin(self, begin) -> None:
        if self.handle is None:
            raise RoamError("roam's allocator is closed")
        try:
            begin(self.handle)
        except RuntimeError as e:
            raise RoamError(f"roam's allocator cannot begin step {self.steps}: {e}") from None

    def _load(self, recording: Recording) -> None:
        t = time.perf_counter()
        buffers = recording.buffers
        placed = layout.place(buffers, self.strategy, time_limit=self.time_limit)
        pairs = _planalloc.load_plan(self.handle, recording.sizes, placed.offsets, [b[2] for b in buffers],
                                     placed.arena)
        self.layout = {"strategy": self.strategy, "requests": len(buffers), "arena_bytes": placed.arena,
                       "peak_live_bytes": layout.peak_live(buffers), "address_sharing_pairs": pairs,
                       "seconds": time.perf_counter() - t}

    def close(self) -> int:
        """Stop serving, at once, and free the arena: now, or when the last buffer ORT still holds
        from it is freed (returns how many such buffers there are). The last allocator to close
        gives ORT's library its own allocation entries back. Closing twice does nothing."""
        if self.handle is None:
            return 0
        held, self.handle = _planalloc.close(self.handle), None
        return held

    def __del__(self):
        self.close()
