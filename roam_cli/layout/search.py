"""Exact combinatorial layout search (decision version): "fit every buffer under a capacity".

This is the engine that gets ``roam`` to zero fragmentation.  It follows the ideas of
MiniMalloc (Moffitt, ASPLOS 2023) -- re-implemented here from the paper's description, not
from its code -- plus a few additions of our own:

*Canonical solutions.*  Any layout can be "gravity-normalised" (drop every buffer as low as it
goes) without getting taller, so only layouts in which every buffer rests on offset 0 or on
the top of a buffer that is live at the same time need to be searched.  We build them by
placing buffers in non-decreasing order of offset, each at the lowest offset left free by the
buffers already placed (its *min offset*), ties broken by a static rank; every canonical
layout is generated exactly once.

*Sections.*  Time is cut into the maximal cliques of the interval graph ("sections"): two
buffers overlap in time iff they share a section, and every buffer covers a contiguous run
of sections.  For each section we keep the bytes still to place in it.

*Spatial inference.*  Everything still unplaced in a section must stack above the lowest min
offset of those buffers (and above the current placement offset, by monotonicity), so
``lowest_min_offset + bytes_left <= capacity`` for every section, or the node is dead.  Each
section remembers a *witness* (a member whose min offset still leaves room), so the check is
O(1) until the witness is placed or pushed up; after a placement only the sections where that
can have happened are looked at.

*Dominance.*  If an unplaced buffer ``d`` would fit entirely below the offset at which we are
about to put ``b`` (``min_offset(d) + size(d) <= offset(b)``), the gap under ``b`` can never be
used again -- moving ``d`` down into it gives a layout that is strictly lower, so the branch is
dominated.  Hence only buffers whose min offset is below the lowest "top" of any unplaced
buffer are branching candidates, which usually leaves very few.

*Dynamic decomposition.*  When the unplaced buffers no longer overlap across some section
boundary, the two sides are independent: they are solved one after the other and a failure
on either side fails the node (no thrashing between independent parts).  Each side is ranked
afresh, its ``T`` keys taken from the bytes still unplaced rather than the original section
totals (as MiniMalloc re-sorts every sub-partition): after the long-lived buffers are down, what
is tight in a segment is what is left of it, and deciding that first is what solves the hardest
MiniMalloc instance (I) in thousands of nodes instead of not at all.  The floor (offsets at or
above the last placement) still holds inside each side; the old ranks' tie order does not.  On training graphs
this is what makes ~10k buffers tractable: the long-lived activations are placed first (they
have the lowest min offsets and the largest areas), after which the short-lived remainder
falls apart into many small independent time segments.

*Hatless pruning* (MiniMalloc's).  If the buffer just tried has no unplaced buffer overlapping
it in time and its subtree failed, the node fails: its min offset can never rise again, so in
every later branch (all at a higher offset, or the same offset and a later rank) it could never
be placed.

*Symmetry.*  Identical buffers (same lifetime and size) are placed in rank order only.  (A
stronger rule -- never stack a buffer directly on a larger one with the same lifetime -- is
also sound, but it removes the layouts the rankings find first and made several benchmark
instances much slower, so it is not used.)

*Learning across restarts.*  Every failed section check increments that section's weight (a
caller-owned list shared by the runs of a portfolio); rankings starting with ``K`` put the
buffers of the most-failing sections first.  Chronological backtracking thrashes when an early
decision in one region dooms a tight section elsewhere; after a few restarts the tight
section's buffers are decided first and the failure is found near the root.

*Fixed buffers.*  Callers may pin buffers to offsets; they take part in the canonical order
at their own offset, and a placement that would push one of them up is a conflict.

The search is complete: when it returns ``None`` no layout fits (a proof).  It is run as a
portfolio of static rankings with a doubling node limit (see :mod:`roam_cli.layout.roam`).

The search runs in C (:mod:`roam_cli.layout._search`, ``engine="c"``, the default): the same
search node for node, about 40x faster; an install where that optional extension did not build
runs the Python code instead.  The Python code below is the reference the tests
compare it with (``engine="python"``); the sections and rankings are shared, and the overlaps
are built in C too (``_search.overlaps``, which the tests compare with :func:`overlaps_of`).

Pure-Python performance notes: buffers keep their input ids (a rank array orders them), all
per-node work uses flat lists and builtins that loop in C (``min(map(...))``,
``itertools.compress``, slices); placed buffers get an infinite min offset so they drop out of
every minimum without bookkeeping; undo information is one short list per placement.
"""

from __future__ import annotations

import heapq
import random
import sys
import time
from array import array
from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate, compress

try:
    from roam_cli.layout import _search
except ImportError:  # the C extension did not build (it is optional): the Python reference runs instead
    _search = None

INF = 1 << 62
# Candidates a node of the C search gathers at a time: memory per level of a descent, which has
# a level per buffer (a node of a 405B-class step can have 6,000 candidates).  Any value gives
# the same search; a node that tries more scans its component again.
CANDIDATE_CHUNK = 256

# Static rankings tried in the portfolio.  Letters (all descending): T = largest section total
# the buffer takes part in, W = width of its lifetime, A = area (size x width), Z = size,
# L = lower end, U = upper end, K = failure weight learnt so far for the buffer's sections;
# ":<seed>" breaks the remaining ties at random.
DEFAULT_HEURISTICS = ("TAW", "TWA", "KTWA", "KTAW", "WAT", "KWAT")


class SearchAborted(Exception):
    """Raised inside the search when the deadline or the node limit is hit."""


def sections_of(lowers: Sequence[int], uppers: Sequence[int]):
    """Maximal cliques of the interval graph of half-open lifetimes.

    Returns ``(slo, shi, members)``: buffer ``i`` belongs to sections ``slo[i] .. shi[i]-1``
    and ``members[s]`` lists the buffers of section ``s``.  Intervals must be non-empty.
    """
    n = len(lowers)
    events = [(lowers[i], 1, i) for i in range(n)]
    events += [(uppers[i], 0, i) for i in range(n)]
    events.sort()  # at equal time ends (0) come before starts (1): [a,b) and [b,c) are disjoint
    active: dict[int, None] = {}
    slo = [0] * n
    shi = [0] * n
    members: list[list[int]] = []
    grown = False
    for _t, kind, i in events:
        if kind:
            active[i] = None
            slo[i] = len(members)
            grown = True
        else:
            if grown:
                members.append(list(active))
                grown = False
            del active[i]
            shi[i] = len(members)
    return slo, shi, members


def overlaps_of(lowers: Sequence[int], uppers: Sequence[int]) -> list[list[int]]:
    """For each buffer, the buffers whose lifetimes intersect its own (sweep, O(pairs))."""
    n = len(lowers)
    order = sorted(range(n), key=lowers.__getitem__)
    ovl: list[list[int]] = [[] for _ in range(n)]
    active: list[int] = []
    ends: list[tuple[int, int]] = []
    alive = [False] * n
    for i in order:
        lo = lowers[i]
        if ends and ends[0][0] <= lo:
            while ends and ends[0][0] <= lo:
                alive[heapq.heappop(ends)[1]] = False
            active = list(compress(active, map(alive.__getitem__, active)))
        oi = ovl[i]
        oi.extend(active)
        for j in active:
            ovl[j].append(i)
        active.append(i)
        alive[i] = True
        heapq.heappush(ends, (uppers[i], i))
    return ovl


class CanonicalSearch:
    """Decision search for one set of buffers (sizes > 0, non-empty lifetimes).

    ``solve(capacity, deadline, heuristic, node_limit, fixed)`` returns a list of offsets
    whose maximum top is ``<= capacity``, ``None`` when the search space was exhausted (proof
    that the capacity is infeasible), or raises :class:`SearchAborted`.
    """

    def __init__(self, buffers: Sequence[tuple[int, int, int]]):
        self.buffers = [(int(lo), int(hi), int(sz)) for lo, hi, sz in buffers]
        for lo, hi, sz in self.buffers:
            if sz <= 0 or hi <= lo:
                raise ValueError("CanonicalSearch needs positive sizes and non-empty lifetimes")
        n = len(self.buffers)
        self.n = n
        self.lowers = [b[0] for b in self.buffers]
        self.uppers = [b[1] for b in self.buffers]
        self.size = [b[2] for b in self.buffers]
        self.slo, self.shi, self.members = sections_of(self.lowers, self.uppers)
        size = self.size
        self.sec_total = [sum(map(size.__getitem__, m)) for m in self.members]
        self.lower_bound = max(self.sec_total, default=0)
        self.ovl = None  # built on first solve
        self._cuts0 = None
        self.nodes = 0
        self.backtracks = 0
        self._arrays = None  # the problem as int64 arrays, for the C search

    def _overlaps(self):
        if self.ovl is None:
            self.ovl = overlaps_of(self.lowers, self.uppers)
        return self.ovl

    def key_columns(self, heuristic: str, weights=None) -> tuple[list[list[int]], list[bool]]:
        """The sort keys named by ``heuristic`` (see DEFAULT_HEURISTICS), most significant
        first, each one int per buffer (smaller first), and which of them are ``T`` columns: the
        search recomputes those from the bytes still unplaced whenever the problem splits.

        ``K`` ranks by the failure weight learnt for the buffer's sections (``weights``); a
        seed adds a column of random ranks."""
        name, _, seed = heuristic.partition(":")
        n = self.n
        slo, shi = self.slo, self.shi
        lowers, uppers, size = self.lowers, self.uppers, self.size
        column = {
            "T": lambda: [-max(self.sec_total[slo[i]:shi[i]]) for i in range(n)],
            "W": lambda: [lowers[i] - uppers[i] for i in range(n)],
            "A": lambda: [-size[i] * (uppers[i] - lowers[i]) for i in range(n)],
            "Z": lambda: [-z for z in size],
            "L": lambda: [-lo for lo in lowers],
            "U": lambda: [-hi for hi in uppers],
            "K": lambda: [-max((weights or [0] * len(self.sec_total))[slo[i]:shi[i]]) for i in range(n)],
        }
        cols = [column[c]() for c in name if c in column]
        dynamic = [c == "T" for c in name if c in column]
        if seed:
            r = random.Random(int(seed))
            rnd = [r.random() for _ in range(n)]
            col = [0] * n
            for k, i in enumerate(sorted(range(n), key=rnd.__getitem__)):
                col[i] = k
            cols.append(col)
            dynamic.append(False)
        return cols, dynamic

    def ranking(self, heuristic: str, weights=None) -> list[int]:
        """Buffer ids in the static order named by ``heuristic`` (ties: the lower id first)."""
        cols, _ = self.key_columns(heuristic, weights)
        return sorted(range(self.n), key=lambda i: [c[i] for c in cols] + [i])

    # ------------------------------------------------------------------ the search
    def solve(self, capacity: int, deadline: float | None = None, heuristic: str = "TWA",
              node_limit: int | None = None, fixed: dict | None = None,
              weights: list | None = None, engine: str = "c") -> list[int] | None:
        """Search for offsets with every top <= capacity.

        ``fixed`` maps buffer index -> offset for buffers that must stay where they are.  A
        fixed buffer takes part in the canonical order at its own offset; any placement that
        would push its min offset above that offset is a conflict.  ``engine`` "c" runs the
        search in :mod:`roam_cli.layout._search`, "python" runs the reference below; both
        visit the same nodes and return the same offsets.
        """
        n = self.n
        if n == 0:
            return []
        C = int(capacity)
        size = self.size
        if self.lower_bound > C or max(size) > C:
            return None
        slo, shi, members = self.slo, self.shi, self.members
        cols, dynamic = self.key_columns(heuristic, weights)
        order = sorted(range(n), key=lambda i: [c[i] for c in cols] + [i])
        if weights is None:
            weights = [0] * len(members)
        rank = [0] * n
        for r, i in enumerate(order):
            rank[i] = r
        S = len(members)
        total = list(self.sec_total)
        cuts = list(self._section_cuts())
        minoff = [0] * n
        top = list(size)
        fx = [False] * n
        if fixed:
            for i, off in fixed.items():
                off = int(off)
                if off < 0 or off + size[i] > C:
                    return None
                fx[i] = True
                minoff[i] = off
                top[i] = off + 1  # a fixed buffer bounds the level; it is never "dominated"
        # identical buffers: a later-ranked twin waits for its predecessor
        twin_prev = [-1] * n
        seen: dict = {}
        for i in order:
            if fx[i]:
                continue
            key = (self.lowers[i], self.uppers[i], size[i])
            if key in seen:
                twin_prev[i] = seen[key]
            seen[key] = i
        if engine == "c" and _search is not None:
            return self._solve_c(C, order, rank, twin_prev, fixed, node_limit, deadline, weights,
                                 cols, dynamic)
        ovl = self._overlaps()
        offset = [0] * n
        placed = [False] * n
        witness = [m[0] for m in members]
        perf = time.perf_counter
        limit = node_limit if node_limit is not None else INF
        dl = deadline if deadline is not None else float("inf")
        mo_get = minoff.__getitem__
        top_get = top.__getitem__
        rank_get = rank.__getitem__
        trail: list = []  # one record per placement: (b, x, [(o, old_minoff), ...])
        counters = [0, 0]  # nodes, backtracks

        def unplace():
            b, x, changed = trail.pop()
            sz = size[b]
            lo_b = slo[b]
            hi_b = shi[b]
            for k in range(lo_b + 1, hi_b):
                cuts[k] += 1
            for s in range(lo_b, hi_b):
                total[s] += sz
            placed[b] = False
            minoff[b] = x
            top[b] = x + 1 if fx[b] else x + sz
            for o, old in reversed(changed):
                minoff[o] = old
                top[o] = old + size[o]

        def refresh(s, room):
            """Find a new witness for section s; False if none is left."""
            mem = members[s]
            w = next(compress(reversed(mem), map(room.__ge__, map(mo_get, reversed(mem)))), -1)
            if w < 0:
                return False
            witness[s] = w
            return True

        def search(comp: list[int], s0: int, s1: int, last_x: int, last_r: int) -> bool:
            counters[0] += 1
            nodes = counters[0]
            if nodes >= limit:
                raise SearchAborted("node limit")
            if not (nodes & 127) and perf() > dl:
                raise SearchAborted("deadline")
            mh = min(map(top_get, comp))
            cands = list(compress(comp, map(mh.__gt__, map(mo_get, comp))))
            if len(cands) > 1:
                cands.sort(key=mo_get)  # stable: ties stay in rank order
            seg = total[s0:s1]
            big = max(seg)  # cheap pre-checks of the monotone-floor bound
            smax = s0 + seg.index(big)
            mono_hit = False
            for b in cands:
                x = minoff[b]
                if x < last_x or (x == last_x and rank[b] < last_r):
                    continue
                sz = size[b]
                if x + big - sz > C:
                    if not mono_hit:
                        weights[smax] += 1
                        mono_hit = True
                    continue
                tp = twin_prev[b]
                if tp >= 0 and not placed[tp]:
                    continue
                lo_b = slo[b]
                hi_b = shi[b]
                if x + big > C:
                    # exact monotone-floor bound after placing b, without placing it
                    if smax < lo_b or smax >= hi_b:
                        continue
                    if lo_b > s0 and x + max(total[s0:lo_b]) > C:
                        continue
                    if hi_b < s1 and x + max(total[hi_b:s1]) > C:
                        continue
                    if x + max(total[lo_b:hi_b]) - sz > C:
                        continue
                t = x + sz
                # ---- place b at x
                changed = []
                rlo = lo_b
                rhi = hi_b
                clash = False
                hatless = all(map(placed.__getitem__, ovl[b]))
                for o in ovl[b]:
                    if minoff[o] < t:
                        if fx[o]:
                            clash = True  # would overlap a fixed buffer
                            continue
                        changed.append((o, minoff[o]))
                        minoff[o] = t
                        top[o] = t + size[o]
                        if slo[o] < rlo:
                            rlo = slo[o]
                        if shi[o] > rhi:
                            rhi = shi[o]
                minoff[b] = INF
                top[b] = INF
                placed[b] = True
                offset[b] = x
                for s in range(lo_b, hi_b):
                    total[s] -= sz
                splits = []
                for k in range(lo_b + 1, hi_b):
                    cuts[k] -= 1
                    if not cuts[k]:
                        splits.append(k)
                trail.append((b, x, changed))
                # ---- inference: every section keeps a member that can still be its lowest.
                # Raised members now sit at t, so only sections with less than t bytes of
                # room, or whose witness was b itself, can have lost their witness.
                ok = not clash
                if ok:
                    thr = C - t
                    for s in compress(range(rlo, rhi), map(thr.__lt__, total[rlo:rhi])):
                        room = C - total[s]
                        if minoff[witness[s]] > room and not refresh(s, room):
                            ok = False
                            weights[s] += 1
                            break
                if ok:
                    # a witness is a member of its section: b's sections are the only ones
                    # that can have chosen b
                    for s in range(lo_b, hi_b):
                        if witness[s] == b and total[s] and not refresh(s, C - total[s]):
                            ok = False
                            weights[s] += 1
                            break
                if ok:
                    if len(comp) == 1:
                        return True
                    rest = comp.copy()
                    rest.remove(b)
                    r_b = rank[b]
                    if not splits:
                        if search(rest, s0, s1, x, r_b):
                            return True
                    elif split_search(rest, splits, s0, s1, x):
                        return True
                unplace()
                if hatless:
                    break
            counters[1] += 1
            return False

        def rerank(group):
            """Rank ``group`` afresh, its ``T`` keys from the bytes still unplaced; returns the
            ranks it replaced."""
            now = {}
            for i in group:
                now[i] = [-max(total[slo[i]:shi[i]]) if dyn else c[i] for c, dyn in zip(cols, dynamic)]
                now[i].append(i)
            group.sort(key=now.__getitem__)
            old = [rank[i] for i in group]
            for r, i in enumerate(group):
                rank[i] = r
            return old

        def split_search(rest, splits, s0, s1, x) -> bool:
            """Solve the groups between zero-cut boundaries one after the other, each ranked
            afresh (what is tight in a group has changed since the static ranking); the floor
            ``x`` still holds, the old ranks' tie order no longer applies."""
            groups: dict[int, list[int]] = {}
            for i in rest:
                groups.setdefault(bisect_right(splits, slo[i]), []).append(i)
            mark = len(trail)
            # largest group first: it is the most likely to fail
            for g in sorted(groups, key=lambda g: -len(groups[g])):
                g0 = splits[g - 1] if g > 0 else s0
                g1 = splits[g] if g < len(splits) else s1
                group = groups[g]
                old = rerank(group)
                found = search(group, g0, g1, x, -1)
                for i, r in zip(group, old):
                    rank[i] = r
                if not found:
                    while len(trail) > mark:
                        unplace()
                    return False
            return True

        # every section must have a witness to begin with (fixed buffers may sit high)
        for s in range(S):
            if total[s] and minoff[witness[s]] > C - total[s] and not refresh(s, C - total[s]):
                return None
        def root():
            comp0 = sorted(range(n), key=rank_get)
            splits0 = [k for k in range(1, S) if not cuts[k]]
            if splits0:
                return split_search(comp0, splits0, 0, S, 0)
            return search(comp0, 0, S, 0, -1)

        if sys.getrecursionlimit() < 4 * n + 1000:
            sys.setrecursionlimit(4 * n + 1000)
        try:
            found = _deep_call(root) if n > 2000 else root()
        finally:
            self.nodes += counters[0]
            self.backtracks += counters[1]
        if not found:
            return None
        return offset

    def _section_cuts(self) -> list[int]:
        """cuts[k]: the buffers covering both section k-1 and k (a difference array: the long-lived
        buffers of a training step cover thousands of sections each)."""
        if self._cuts0 is None:
            cuts = [0] * (len(self.members) + 1)
            for lo, hi in zip(self.slo, self.shi):
                if lo + 1 < hi:
                    cuts[lo + 1] += 1
                    cuts[hi] -= 1
            self._cuts0 = list(accumulate(cuts))
        return self._cuts0

    def prepare(self) -> None:
        """Build the search's arrays now (a caller about to fork workers shares them)."""
        self._section_cuts()
        if _search is None or self._arrays is not None:
            return
        mem_start = array("q", [0])
        for m in self.members:
            mem_start.append(mem_start[-1] + len(m))
        # built in C, never as lists: 28 million overlaps on a 70B-class step
        ovl_start, ovl = _search.overlaps(array("q", self.lowers), array("q", self.uppers))
        self._arrays = (array("q", self.size), array("q", self.slo), array("q", self.shi),
                        mem_start, array("q", [i for m in self.members for i in m]), ovl_start, ovl)

    def _solve_c(self, C, order, rank, twin_prev, fixed, node_limit, deadline, weights, cols, dynamic):
        """The same search in C: the problem goes over as int64 arrays (built once)."""
        self.prepare()
        pinned = array("q", [-1]) * self.n
        for i, off in (fixed or {}).items():
            pinned[i] = int(off)
        learnt = array("q", weights)
        seconds = deadline - time.perf_counter() if deadline is not None else float("inf")
        limit = node_limit if node_limit is not None else INF

        def root():
            return _search.run(*self._arrays, array("q", rank), array("q", order),
                               array("q", twin_prev), pinned, C, limit, seconds, learnt,
                               array("q", [v for c in cols for v in c]), array("q", dynamic), CANDIDATE_CHUNK)

        status, offsets, nodes, backtracks = _deep_call(root) if self.n > 2000 else root()
        weights[:] = learnt
        self.nodes += nodes
        self.backtracks += backtracks
        if status in ("node limit", "deadline"):
            raise SearchAborted(status)
        return offsets


def _deep_call(fn):
    """Run ``fn`` in a thread with a large stack: the search recurses once per placement."""
    import threading
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised in the caller
            box["error"] = e

    old = threading.stack_size()
    try:
        threading.stack_size(256 * 1024 * 1024)
        t = threading.Thread(target=run, name="roam-layout-search")
        t.start()
    except (RuntimeError, ValueError, MemoryError):  # no big stacks here: plain call
        return fn()
    finally:
        threading.stack_size(old)
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
