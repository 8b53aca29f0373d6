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
``lowest_min_offset + bytes_left <= capacity`` for every section, or the node is dead.

*Dominance.*  If an unplaced buffer ``d`` would fit entirely below the offset at which we are
about to put ``b`` (``min_offset(d) + size(d) <= offset(b)``), the gap under ``b`` can never be
used again -- moving ``d`` down into it gives a layout that is strictly lower, so the branch is
dominated.  Hence only buffers whose min offset is below the lowest "top" of any unplaced
buffer are branching candidates, which usually leaves very few.

*Dynamic decomposition.*  When the unplaced buffers no longer overlap across some section
boundary, the two sides are independent: they are solved one after the other and a failure
on either side fails the node (no thrashing between independent parts).

*Identical buffers* (same lifetime and size) are placed in rank order only (symmetry).

*Portfolio with restarts.*  Several static rankings are tried round-robin with a doubling
node limit (and across processes when ``jobs > 1``); the first to succeed wins.

Pure-Python performance notes: all per-node work uses flat lists indexed by buffer id and
builtins that loop in C (``min(map(...))``, slices); placed buffers get an infinite min offset
so they drop out of every minimum without bookkeeping; undo information is a short list per
placement.
"""

from __future__ import annotations

import sys
import time
from bisect import bisect_right
from collections.abc import Sequence

INF = 1 << 62

# Static rankings tried in the portfolio.  Letters: T = largest section total the buffer is
# part of, W = width of its lifetime, A = area (size x width), Z = size; all descending.
DEFAULT_HEURISTICS = ("TWA", "WAT", "TAW", "ZWT")


class SearchAborted(Exception):
    """Raised inside the search when the deadline or the node limit is hit."""


def sections_of(lowers: Sequence[int], uppers: Sequence[int]):
    """Maximal cliques of the interval graph of half-open lifetimes.

    Returns ``(slo, shi, members)``: buffer ``i`` belongs to sections ``slo[i] .. shi[i]-1``
    and ``members[s]`` lists the buffers of section ``s``.  Intervals must be non-empty.
    """
    n = len(lowers)
    events = []
    for i in range(n):
        events.append((lowers[i], 1, i))
        events.append((uppers[i], 0, i))
    events.sort()  # at equal time ends (0) come before starts (1): [a,b) and [b,c) are disjoint
    active: dict[int, None] = {}
    slo = [0] * n
    shi = [0] * n
    members: list[list[int]] = []
    grown = False
    for _t, kind, i in events:
        if kind == 1:
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


def _preorder(key: str, n, sizes, widths, totals):
    def k(i):
        out = []
        for c in key:
            if c == "T":
                out.append(-totals[i])
            elif c == "W":
                out.append(-widths[i])
            elif c == "A":
                out.append(-sizes[i] * widths[i])
            elif c == "Z":
                out.append(-sizes[i])
        out.append(i)
        return tuple(out)

    return sorted(range(n), key=k)


class CanonicalSearch:
    """Decision search for one set of buffers (sizes > 0, non-empty lifetimes).

    ``solve(capacity, deadline, heuristic, node_limit)`` returns a list of offsets whose
    maximum top is ``<= capacity``, ``None`` when the search space was exhausted (proof that
    the capacity is infeasible), or raises :class:`SearchAborted`.
    """

    def __init__(self, buffers: Sequence[tuple[int, int, int]]):
        self.buffers = [(int(lo), int(hi), int(sz)) for lo, hi, sz in buffers]
        for lo, hi, sz in self.buffers:
            if sz <= 0 or hi <= lo:
                raise ValueError("CanonicalSearch needs positive sizes and non-empty lifetimes")
        n = len(self.buffers)
        self.n = n
        lowers = [b[0] for b in self.buffers]
        uppers = [b[1] for b in self.buffers]
        sizes = [b[2] for b in self.buffers]
        slo, shi, members = sections_of(lowers, uppers)
        sec_total = [sum(sizes[i] for i in m) for m in members]
        self.sec_total = sec_total
        self.lower_bound = max(sec_total, default=0)
        self._slo, self._shi = slo, shi
        widths = [uppers[i] - lowers[i] for i in range(n)]
        totals = [max(sec_total[slo[i]:shi[i]]) for i in range(n)]
        self._keys = (sizes, widths, totals)
        self.nodes = 0
        self.backtracks = 0

    # ------------------------------------------------------------------ setup per ranking
    def _setup(self, heuristic: str):
        n = self.n
        sizes, widths, totals = self._keys
        order = _preorder(heuristic, n, sizes, widths, totals)  # rank -> original id
        rank = [0] * n
        for r, i in enumerate(order):
            rank[i] = r
        lowers = [self.buffers[i][0] for i in order]
        uppers = [self.buffers[i][1] for i in order]
        size = [self.buffers[i][2] for i in order]
        slo, shi, members = sections_of(lowers, uppers)
        for m in members:
            m.sort()
        S = len(members)
        overlaps: list[set] = [set() for _ in range(n)]
        for m in members:
            for i in m:
                overlaps[i].update(m)
        ovl = []
        for i in range(n):
            overlaps[i].discard(i)
            ovl.append(sorted(overlaps[i]))
        # identical buffers: j may only be placed once its identical predecessor is placed
        twin_prev = [-1] * n
        seen: dict = {}
        for r in range(n):
            key = (lowers[r], uppers[r], size[r])
            if key in seen:
                twin_prev[r] = seen[key]
            seen[key] = r
        cuts = [0] * (S + 1)  # cuts[k]: unplaced buffers covering both section k-1 and k
        for i in range(n):
            for k in range(slo[i] + 1, shi[i]):
                cuts[k] += 1
        total = [0] * S
        for s, m in enumerate(members):
            total[s] = sum(size[i] for i in m)
        return order, size, slo, shi, members, ovl, twin_prev, cuts, total

    # ------------------------------------------------------------------ the search
    def solve(self, capacity: int, deadline: float | None = None, heuristic: str = "TWA",
              node_limit: int | None = None) -> list[int] | None:
        n = self.n
        if n == 0:
            return []
        if self.lower_bound > capacity or max(b[2] for b in self.buffers) > capacity:
            return None
        order, size, slo, shi, members, ovl, twin_prev, cuts, total = self._setup(heuristic)
        C = capacity
        minoff = [0] * n
        top = list(size)
        offset = [0] * n
        placed = [False] * n
        perf = time.perf_counter
        limit = node_limit if node_limit is not None else INF
        dl = deadline if deadline is not None else float("inf")
        mo_get = minoff.__getitem__
        top_get = top.__getitem__
        trail: list = []  # one record per placement, (b, x, [(o, old_minoff), ...])
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
            top[b] = x + sz
            for o, old in reversed(changed):
                minoff[o] = old
                top[o] = old + size[o]

        def search(comp: list[int], s0: int, s1: int, last_x: int, last_b: int) -> bool:
            counters[0] += 1
            nodes = counters[0]
            if nodes >= limit:
                raise SearchAborted("node limit")
            if not (nodes & 255) and perf() > dl:
                raise SearchAborted("deadline")
            mh = min(map(top_get, comp))
            cands = [i for i in comp if minoff[i] < mh]
            if len(cands) > 1:
                cands.sort(key=mo_get)
            for b in cands:
                x = minoff[b]
                if x < last_x or (x == last_x and b < last_b):
                    continue
                tp = twin_prev[b]
                if tp >= 0 and not placed[tp]:
                    continue
                sz = size[b]
                t = x + sz
                lo_b = slo[b]
                hi_b = shi[b]
                # ---- place b at x
                changed = []
                rlo = lo_b
                rhi = hi_b
                for o in ovl[b]:
                    if minoff[o] < t:
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
                # ---- inference: every section must still fit
                ok = x + max(total[s0:s1]) <= C
                if ok:
                    for s in range(rlo, rhi):
                        ts = total[s]
                        if ts and min(map(mo_get, members[s])) + ts > C:
                            ok = False
                            break
                if ok:
                    rest = [i for i in comp if i != b]
                    if not rest:
                        return True
                    if not splits:
                        if search(rest, s0, s1, x, b):
                            return True
                    else:
                        groups: dict[int, list[int]] = {}
                        for i in rest:
                            groups.setdefault(bisect_right(splits, slo[i]), []).append(i)
                        mark = len(trail)
                        good = True
                        for g in sorted(groups, key=lambda g: -len(groups[g])):
                            g0 = splits[g - 1] if g > 0 else s0
                            g1 = splits[g] if g < len(splits) else s1
                            if not search(groups[g], g0, g1, x, b):
                                good = False
                                break
                        if good:
                            return True
                        while len(trail) > mark:
                            unplace()
                unplace()
            counters[1] += 1
            return False

        old_limit = sys.getrecursionlimit()
        if old_limit < 4 * n + 1000:
            sys.setrecursionlimit(4 * n + 1000)
        try:
            found = search(list(range(n)), 0, len(members), 0, -1)
        finally:
            self.nodes += counters[0]
            self.backtracks += counters[1]
        if not found:
            return None
        out = [0] * n
        for r in range(n):
            out[order[r]] = offset[r]
        return out
