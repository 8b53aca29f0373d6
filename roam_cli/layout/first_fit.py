"""First-fit in allocation order: each buffer takes the lowest offset free for its lifetime.

Buffers are taken by ``lower`` (ties: input order) -- what an online allocator with perfect
coalescing would do.  The buffers live at the current step are kept sorted by offset, so each
placement is one scan for the first gap that fits. Where the layout search's C extension is built,
the placement heuristics' loop in C places the same offsets: taken by ``lower``, the placed buffers
that overlap a buffer's lifetime are those still live at its start, and the lowest gap among them
is the first fit.
"""

import heapq
from bisect import bisect_left, insort
from collections.abc import Sequence

from roam_cli.layout import heuristics


def first_fit(buffers: Sequence[tuple[int, int, int]]) -> list[int]:
    """buffers: (lower, upper, size), lifetime half-open [lower, upper). Returns offsets."""
    order = sorted(range(len(buffers)), key=lambda i: (buffers[i][0], i))
    if heuristics._search is not None:
        return heuristics._place_in_order(buffers, order, smallest_gap=False)
    return first_fit_scan(buffers, order)


def first_fit_scan(buffers: Sequence[tuple[int, int, int]], order: list[int]) -> list[int]:
    """first_fit's reference, a scan of the live buffers in Python (without the C extension)."""
    offsets = [0] * len(buffers)
    active: list[tuple[int, int, int]] = []  # (offset, top, index), sorted
    expiry: list[tuple[int, int]] = []  # (upper, index)
    for i in order:
        lo, hi, size = buffers[i]
        if size <= 0 or hi <= lo:
            continue
        while expiry and expiry[0][0] <= lo:  # each expired entry found by bisection, not a rebuild
            j = heapq.heappop(expiry)[1]
            del active[bisect_left(active, (offsets[j], offsets[j] + buffers[j][2], j))]
        offset = 0
        for start, end, _j in active:
            if start - offset >= size:
                break
            if end > offset:
                offset = end
        offsets[i] = offset
        insort(active, (offset, offset + size, i))
        heapq.heappush(expiry, (hi, i))
    return offsets
