"""ONNX Runtime's own session, allocating from one arena: the plan's.

With memory patterns off and PRIORITY_BASED order, the allocation requests ORT makes during a
step are the same every step: the same sizes, in the same order, freed at the same points. So
the first step is recorded (served by the real allocator) and every later step is served from
one arena: request k at offset k. Given the plan (`planned_requests`), each recorded request is
matched to the planned tensor it is (the node that was running, from ORT's profiler, and the
tensor's bytes) and gets that tensor's offset in the plan's arena; the requests the plan does not
name (kernel scratch it has no `workspace` for) and the few that outlive their plan life are
fitted around them, first fit by their recorded lifetimes. Without a plan, roam's layout
solver lays out all recorded requests. Whatever the recording does not cover falls back to the
real allocator and is counted per step (see `_planalloc.c` for how the requests are intercepted,
and why there).

An output the plan writes over an input of its node (plan field `written_over`, an elementwise
kernel whose input nothing reads afterwards) is requested by ORT like any output and served at
its storage's place while the input still holds it: the requests of one storage may share bytes
while both are live. Where that storage is a state (a functional step's moment, whose new value
the step writes there anyway) the place is the state's own buffer (`place_states`).

A plan that offloads (DESIGN.md, "Memory tiers") has two arenas: the device's (`arena_bytes`) and
the slow tier's (`tiers.arena_bytes`). Each gets a pool of its own: a planned tensor is served at
its offset in its tier's pool, a request the plan does not name is fitted into the pool of the node
that made it (the host's nodes and the transfers to the host use the slow pool). A planned tensor
past the end of its tier's arena is refused: the pools hold what the plan says, no more.

    arena = ArenaAllocator("cpu")
    session = ort.InferenceSession(model, arena.session_options(options), providers=arena.providers())
    for batch in batches:
        with arena.step() as step:
            ...run the session, copy out what you keep, drop ORT's outputs...
        print(step.stats)
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state

from roam_cli import layout
from roam_cli.core.errors import RoamError
from roam_cli.core.memory import DEVICE
from roam_cli.frontend.providers import PROVIDERS, RUNTIME

try:
    from roam_cli.runtime import _planalloc
except ImportError as e:  # optional: it builds on Linux (x86-64, aarch64) with a C compiler
    _planalloc, NOT_BUILT = None, str(e)

ALIGNMENT = 256  # every slot starts on this many bytes: enough for ORT's CPU (64) and CUDA (256) requests
AT_ADDRESS = 2  # the pool of a request served at an address of its own: a state's buffer (_planalloc.c)
ORT_LIBRARY = onnxruntime_pybind11_state.__file__.rsplit("/", 1)[-1]


def _round_up(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


@dataclass
class Recording:
    """One step's requests: bytes, and the allocation events during which each was live."""

    sizes: list[int]
    lifetimes: list[tuple[int, int]]  # [alloc event, free event), half-open
    times: list[int]  # when each request came (ns, CLOCK_REALTIME)

    @property
    def buffers(self) -> list[tuple[int, int, int]]:
        return [(lo, hi, _round_up(size)) for size, (lo, hi) in zip(self.sizes, self.lifetimes)]


@dataclass(frozen=True)
class PlannedTensor:
    """A tensor the plan places in its arena, as ORT requests it (plan order, then output order)."""

    name: str
    node: str
    bytes: int
    offset: int
    step: int  # its node's place in the plan's order
    last_step: int  # the last step of the plan's order that it is live at
    successors: tuple[str, ...] = ()  # planned outputs of its readers of its size: ORT may write one into it
    workspace: bool = False  # kernel scratch (plan field `workspace`), not a tensor
    tier: str = DEVICE  # whose arena its offset is in: the device's, or the slow tier's (plan field `tier`)
    storage: str = ""  # the tensor owning its storage (itself, or what it is written over)
    state: str | None = None  # the state whose own buffer it is written over (offset None)




def planned_requests(graph, plan: dict) -> list[PlannedTensor]:
    """The plan's arena tensors in the order ORT allocates them: by the producing node's place in
    the plan's order, then the node's outputs in order, then its workspace (plan field
    `workspace`). Views and ORT's in-place results have no offset of their own: ORT makes no
    request for them. An output written over an input (`written_over`) is requested, and served
    at its storage's offset, or in the state's buffer where that storage is a state."""
    place = {t["name"]: t for t in plan["tensors"]}
    step = {name: k for k, name in enumerate(plan["order"])}
    scratch: dict[str, list[dict]] = {}
    for w in plan.get("workspace", ()):
        scratch.setdefault(w["node"], []).append(w)
    def placed(name: str) -> bool:
        return name in place and place[name]["offset"] is not None and "alias_of" not in place[name]

    def root(name: str) -> str:
        while "alias_of" in place.get(name, {}):
            name = place[name]["alias_of"]
        return name

    group: dict[str, list[str]] = {}  # storage -> the tensors in it (itself, its views)
    for name in place:
        group.setdefault(root(name), []).append(name)

    def tier(name: str) -> str:
        return place[name].get("tier", DEVICE)

    def requested(name: str) -> PlannedTensor | None:
        if placed(name):
            return PlannedTensor(name, "", place[name]["bytes"], place[name]["offset"], 0, place[name]["last_step"],
                                 successors(name), tier=tier(name), storage=name)
        if name in place and "written_over" in place[name]:
            r = root(name)
            return PlannedTensor(name, "", place[name]["bytes"], place[r]["offset"], 0, place[name]["last_step"], (),
                                 tier=tier(name), storage=r, state=r if place[r]["offset"] is None else None)
        return None

    def successors(name: str) -> tuple[str, ...]:
        """What its readers, or its views' readers, make of its size in its tier: a kernel in place writes one there."""
        return tuple(out for member in group.get(name, [name]) for i in graph.consumers.get(member, ())
                     for out in graph.nodes[i].outputs
                     if placed(out) and place[out]["bytes"] == place[name]["bytes"] and tier(out) == tier(name))

    out = []
    for n in sorted(graph.nodes, key=lambda n: step[n.name]):
        out += [replace(t, node=n.name, step=step[n.name]) for t in map(requested, n.outputs) if t is not None]
        out += [PlannedTensor(f"workspace {k + 1} of {n.name}", n.name, w["bytes"], w["offset"], w["step"], w["step"],
                              (), True) for k, w in enumerate(scratch.get(n.name, ()))]
    return out


def slow_nodes(plan: dict) -> frozenset[str]:
    """The nodes whose requests the plan does not name go to the slow pool: the nodes the host
    runs and the transfers to the host (plan fields `tiers`, `offload`)."""
    if "tiers" not in plan:
        return frozenset()
    to_host = (t["node"] for t in plan.get("offload", {}).get("transfers", ()) if t["direction"] == "to_host")
    return frozenset(plan["tiers"].get("host_nodes", ())) | frozenset(to_host)


def within_node(lifetimes: list[tuple[int, int]], nodes: list[str | None]) -> list[bool]:
    """Whether each request was freed before the next node's first request came: kernel scratch,
    where an output lives on into the nodes that read it. The last node's are taken for outputs:
    no later request tells."""
    nexts, following = [0] * len(nodes), -1
    for k in range(len(nodes) - 1, -1, -1):
        nexts[k] = following
        if k and nodes[k - 1] != nodes[k]:
            following = lifetimes[k][0]
    return [hi <= nxt for (_, hi), nxt in zip(lifetimes, nexts)]


def match(sizes: list[int], planned: list[PlannedTensor], alignment: int, nodes: list[str | None] | None = None,
          scratch: list[bool] | None = None, window: int = 16) -> list[int]:
    """For each request, the index of the planned tensor it is, or -1 (workspace). With `nodes`
    (the node that ran when each request came, from ORT's profiler): a request is the first
    tensor of its node not yet matched whose bytes are its size rounded up to the plan's
    alignment, workspace first for a request freed within its node (`scratch`), outputs first
    for the others; the others choose first, since a kernel may take its scratch before its
    output (ORT's Where broadcasting its inputs). Without: the next planned tensor of its size
    within `window` places, in order."""
    rounded = [-(-size // alignment) * alignment for size in sizes]
    if nodes is not None:
        outputs: dict[str, list[int]] = {}
        for j, t in enumerate(planned):
            outputs.setdefault(t.node, []).append(j)
        inside = scratch or [False] * len(sizes)
        found = [-1] * len(sizes)
        for k in sorted(range(len(sizes)), key=lambda k: inside[k]):  # stable: in request order within each
            left = outputs.get(nodes[k], [])
            hit = next((j for j in sorted(left, key=lambda j: planned[j].workspace != inside[k])
                        if planned[j].bytes == rounded[k]), -1)
            if hit >= 0:
                left.remove(hit)
                found[k] = hit
        return found
    found, cursor = [], 0
    for size in rounded:
        hit = next((j for j in range(cursor, min(cursor + window, len(planned))) if planned[j].bytes == size), -1)
        found.append(hit)
        if hit >= 0:
            cursor = hit + 1
    return found


# ORT's profile gives a kernel's start and duration in whole microseconds, each cut down: the
# kernel's true end is up to 2 us past the span's (requests made at a kernel's very end were
# measured 2 to 174 ns past it, under load; the next kernel started 3.8 us or more after)
PROFILE_ROUNDING_NS = 2000


def node_at(times: list[int], spans: list[tuple[int, int, str]]) -> list[str | None]:
    """The node whose kernel ran at each time (ns), from spans (start, end, node) sorted by start."""
    starts = [span[0] for span in spans]
    nodes = []
    for t in times:
        k = bisect.bisect_right(starts, t) - 1
        nodes.append(spans[k][2] if k >= 0 and t <= spans[k][1] + PROFILE_ROUNDING_NS else None)
    return nodes


def settle(buffers: list[tuple[int, int, int, list[int]]], late: set[int] = frozenset(),
           groups: list[str] | None = None, nodes: list[str | None] | None = None) -> list[int | None]:
    """For buffers (lo, hi, bytes, candidate offsets), over recorded lifetimes, the first candidate
    that shares no bytes with a buffer settled before it while both are live, or None: a sweep in
    allocation order, then the `late` ones (those that outlive their plan life: they must not take
    the place of the many that keep to it). Buffers of one of `groups` (a storage and the outputs
    written over it) may share bytes, where the older is freed before the next kernel's first request
    after the newer (`nodes`: each request's kernel, where the profile tells; else the next request):
    its last reader is the kernel writing over it. One ORT holds on (its own kernel in place
    extending it, or a request matched to another tensor of the same size than the plan's) would be
    overwritten while it is still to be read."""
    live: list[tuple[int, int]] = []  # (hi, index) of the settled buffers, a heap
    chosen: list[int | None] = [None] * len(buffers)
    group = groups or [None] * len(buffers)
    node = nodes or [None] * len(buffers)
    by_start = sorted(range(len(buffers)), key=lambda k: buffers[k][0])
    following = [math.inf] * len(buffers)  # the first request of another kernel after each one's
    for i, k in enumerate(by_start):
        following[k] = next((buffers[j][0] for j in by_start[i + 1:] if node[j] is None or node[j] != node[k]),
                            math.inf)

    def shares(j: int, k: int) -> bool:
        """Whether j and k, live at once, may share bytes: one storage's, the older freed in time."""
        older, newer = (j, k) if buffers[j][0] <= buffers[k][0] else (k, j)
        return group[j] is not None and group[j] == group[k] and buffers[older][1] <= following[newer]

    def free(k: int, at: int, others) -> bool:
        return not any(at < chosen[j] + buffers[j][2] and chosen[j] < at + buffers[k][2] and not shares(j, k)
                       for j in others)

    for k in sorted(set(range(len(buffers))) - late, key=lambda k: buffers[k][0]):
        lo, hi, _, candidates = buffers[k]
        while live and live[0][0] <= lo:
            heapq.heappop(live)
        chosen[k] = next((at for at in candidates if free(k, at, (j for _, j in live))), None)
        if chosen[k] is not None:
            heapq.heappush(live, (hi, k))
    for k in sorted(late, key=lambda k: buffers[k][0]):
        lo, hi, _, candidates = buffers[k]
        meets = [j for j, c in enumerate(chosen) if c is not None and buffers[j][0] < hi and lo < buffers[j][1]]
        chosen[k] = next((at for at in candidates if free(k, at, meets)), None)
    return chosen


def fit_around(fixed: list[tuple[int, int, int, int]], loose: list[tuple[int, int, int]]) -> list[int]:
    """Offsets for `loose` buffers (lo, hi, bytes) that overlap neither the `fixed` ones (lo, hi,
    bytes, offset) nor each other while both are live ([lo, hi) events): first fit, largest first."""
    placed = list(fixed)
    offsets = [0] * len(loose)
    for k in sorted(range(len(loose)), key=lambda k: -loose[k][2]):
        lo, hi, size = loose[k]
        at = 0
        for _, _, other, start in sorted((p for p in placed if p[0] < hi and lo < p[1]), key=lambda p: p[3]):
            if start >= at + size:
                break
            at = max(at, _round_up(start + other))
        offsets[k] = at
        placed.append((lo, hi, size, at))
    return offsets


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

    def __init__(self, device: str = "cpu", strategy: str = "roam", time_limit: float = 30.0,
                 planned: list[PlannedTensor] | None = None, plan_arena: int = 0, plan_alignment: int = ALIGNMENT,
                 slow_arena: int = 0, slow_nodes: frozenset[str] = frozenset()):
        """planned: the plan's tensors as ORT requests them (`planned_requests`), served at their
        offsets in the device's pool of `plan_arena` bytes, or the slow tier's of `slow_arena` bytes
        (their `tier`); the requests of `slow_nodes` (`slow_nodes`) the plan does not name are fitted
        into the slow pool. None lays out what step 1 records, in one pool."""
        self.handle: int | None = None
        if _planalloc is None:
            raise RoamError(f"roam's allocator cannot be imported from {Path(__file__).parent}: {NOT_BUILT} (its C "
                            "extension _planalloc.c builds at install time on Linux, x86-64 or aarch64, with a C "
                            "compiler); --allocator ort trains on ONNX Runtime's own allocator, not at the plan's offsets")
        self.planned, self.plan_alignment = planned, plan_alignment
        self.plan_arenas, self.slow_nodes = (plan_arena, slow_arena), slow_nodes
        self.pool: list[int] = []  # per request of step 1: 0, the device's pool, or 1, the slow tier's
        self.matched: list[int] = []  # per request of step 1: the planned tensor it is, or -1 (workspace)
        self.moved: set[int] = set()  # requests of planned tensors that ORT keeps past the plan's lives
        self.served_at: dict[int, int] = {}  # request -> the plan offset it is served at
        self.spans: list[tuple[int, int, str]] | None = None  # ORT's kernels in step 1 (start, end ns, node)
        self.state_addresses: dict[str, int] = {}  # state -> its buffer's address (place_states)
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

    def place_states(self, addresses: dict[str, int]) -> None:
        """Where each state's buffer is, for the outputs the plan writes over a state: they are served
        there from the step after the first. The buffers must stay where they are while the plan is
        served (aligned to ALIGNMENT: a request is served only at an address of its alignment)."""
        self.state_addresses = dict(addresses)

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
                sizes, allocs, frees, times, events = _planalloc.end_record(self.handle)
            if not sizes:
                raise RoamError(f"roam's allocator saw none of {RUNTIME}'s {self.device} allocations (it allocates "
                                "otherwise than the hooks expect): run with --allocator ort")
            self.recording = Recording(sizes, [(a, f if f >= 0 else events) for a, f in zip(allocs, frees)], times)
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
        if self.planned is None:
            placed = layout.place(buffers, self.strategy, time_limit=self.time_limit)
            offsets, rounded, arenas = placed.offsets, [b[2] for b in buffers], (placed.arena, 0)
            self.matched, self.pool = [-1] * len(buffers), [0] * len(buffers)
        else:
            offsets, rounded, arenas = self._at_plan_offsets(buffers)
        storages = {t.storage: g for g, t in enumerate(self.planned or ())}
        groups = [storages[self.planned[m].storage] if m >= 0 else -1 for m in self.matched]
        pairs = _planalloc.load_plan(self.handle, recording.sizes, offsets, rounded,
                                     [self.at_offset(k) for k in range(len(buffers))], self.pool, groups, arenas)
        workspace = [b for b, m in zip(buffers, self.matched) if m < 0]
        named = sum(m >= 0 for m in self.matched)

        def pool(q: int) -> dict:
            mine = [k for k, p in enumerate(self.pool) if p == q]
            return {"arena_bytes": arenas[q], "plan_arena_bytes": self.plan_arenas[q] if self.planned else None,
                    "requests": len(mine), "planned_requests": sum(self.matched[k] >= 0 for k in mine),
                    "peak_live_bytes": layout.peak_live([buffers[k] for k in mine])}

        self.layout = {"strategy": "plan" if self.planned is not None else self.strategy, "requests": len(buffers),
                       "planned_requests": named, "planned_not_requested": len(self.planned or ()) - named,
                       "planned_moved": len(self.moved),
                       "first_moved": self.request(min(self.moved)) if self.moved else None,
                       "workspace_requests": len(workspace), "workspace_bytes": layout.peak_live(workspace),
                       "in_state_buffers": self.pool.count(AT_ADDRESS),
                       "arena_bytes": arenas[0], "peak_live_bytes": layout.peak_live(buffers),
                       "pools": {"device": pool(0), "slow": pool(1)},
                       "address_sharing_pairs": pairs, "seconds": time.perf_counter() - t}

    def _at_plan_offsets(self, buffers) -> tuple[list[int], list[int], tuple[int, int]]:
        """Each request the plan names at its tensor's offset in its tier's pool; the workspace
        fitted around them in the pool of its node. Returns (offsets, rounded sizes, pool sizes)."""
        nodes = node_at(self.recording.times, self.spans) if self.spans else None
        scratch = within_node(self.recording.lifetimes, nodes) if nodes else None
        self.matched = match(self.recording.sizes, self.planned, self.plan_alignment, nodes, scratch)
        # an output written over a state whose buffer was not given is served like kernel scratch
        self.matched = [-1 if m >= 0 and self.planned[m].state is not None
                        and self.planned[m].state not in self.state_addresses else m for m in self.matched]
        self.pool = [(AT_ADDRESS if self.planned[m].state is not None else int(self.planned[m].tier != DEVICE))
                     if m >= 0 else int(bool(nodes) and nodes[k] in self.slow_nodes) for k, m in enumerate(self.matched)]
        self._refuse_past_pools()
        # ORT may keep a tensor longer than the plan says: a kernel working in place (Relu, on
        # onnxruntime 1.19 even with memory reuse off) writes its output into its input, which then
        # lives as long as the output. Such a request takes the output's plan offset when its own
        # is taken by then; one that has no free plan offset is fitted like workspace.
        offset = {t.name: t.offset for t in self.planned}
        requested = {self.planned[m].name for m in self.matched if m >= 0}
        at_plan = [k for k, m in enumerate(self.matched) if m >= 0]
        step = {t.name: s for s, t in enumerate(self.planned)}  # the plan's place of each planned request
        came = sorted((buffers[k][0], step[self.planned[self.matched[k]].name]) for k in at_plan)

        def reached(k: int) -> int:
            """The planned request ORT had come to when it freed request k."""
            return came[max(bisect.bisect_left(came, (buffers[k][1], -1)) - 1, 0)][1]

        def candidates(k: int) -> list[int]:
            """Its own offset first; an unrequested successor's first when it outlived that one's start."""
            t = self.planned[self.matched[k]]
            absorbed = [s for s in t.successors if s not in requested]
            if absorbed and reached(k) > step[absorbed[0]]:
                return [offset[s] for s in absorbed] + [t.offset]
            return [t.offset] + [offset[s] for s in absorbed]

        def outlives(k: int) -> bool:
            """Freed after a request the plan makes after its last step (ORT frees an output nobody
            reads at the end of the run; a kernel in place extends its input's life)."""
            return self.planned[reached(k)].step > self.planned[self.matched[k]].last_step

        self.served_at, self.moved = {}, set()
        offsets = [0] * len(buffers)
        for k in at_plan:
            if self.pool[k] == AT_ADDRESS:
                offsets[k] = self.served_at[k] = self.state_addresses[self.planned[self.matched[k]].state]
        for q in (0, 1):  # the pools share no bytes: each is settled and fitted on its own
            mine = [k for k in at_plan if self.pool[k] == q]
            late = {i for i, k in enumerate(mine) if outlives(k)}
            chosen = settle([(*buffers[k][:2], self.planned[self.matched[k]].bytes, candidates(k)) for k in mine], late,
                            [self.planned[self.matched[k]].storage for k in mine], [nodes[k] for k in mine] if nodes else None)
            self.moved |= {k for k, at in zip(mine, chosen) if at is None}
            served = {k: at for k, at in zip(mine, chosen) if at is not None}
            self.served_at |= served
            fixed = [(*buffers[k][:2], self.planned[self.matched[k]].bytes, at) for k, at in served.items()]
            fits = [k for k in range(len(buffers)) if self.pool[k] == q and k not in served]
            for k, at in zip(fits, fit_around(fixed, [buffers[k] for k in fits])):
                offsets[k] = at
            for k, at in served.items():
                offsets[k] = at
        rounded = [self.planned[m].bytes if self.at_offset(k) else b[2]
                   for k, (b, m) in enumerate(zip(buffers, self.matched))]
        arenas = tuple(max([self.plan_arenas[q]] + [o + r for o, r, p in zip(offsets, rounded, self.pool) if p == q])
                       for q in (0, 1))
        return offsets, rounded, arenas

    def _refuse_past_pools(self) -> None:
        """A request the plan names whose offset lies past the end of its tier's arena: the pool,
        which holds what the plan says, cannot serve it."""
        for k, m in enumerate(self.matched):
            t = self.planned[m] if m >= 0 and self.pool[k] != AT_ADDRESS else None
            if t is not None and t.offset + t.bytes > self.plan_arenas[self.pool[k]]:
                raise RoamError(f"the plan places {t.name!r} ({t.bytes} bytes, made by node {t.node!r}) at offset "
                                f"{t.offset} of the {t.tier} arena, which holds {self.plan_arenas[self.pool[k]]} bytes: "
                                "past its end, where the pool cannot serve it")

    def at_offset(self, k: int) -> bool:
        """Request k is served at its tensor's plan offset."""
        return self.matched[k] >= 0 and k not in self.moved

    def request(self, k: int) -> str:
        """Request k of a step in words: the planned tensor it is, or the workspace near one."""
        if not 0 <= k < len(self.matched):
            return f"request {k + 1} (past the {len(self.matched)} of step 1)"
        if self.matched[k] >= 0:
            t = self.planned[self.matched[k]]
            return f"request {k + 1} ({t.name!r} of node {t.node!r}, {t.bytes} bytes at offset {t.offset})"
        before = next((self.planned[m] for m in reversed(self.matched[:k]) if m >= 0), None)
        return f"request {k + 1} (workspace" + (f" after node {before.node!r})" if before else ")")

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
