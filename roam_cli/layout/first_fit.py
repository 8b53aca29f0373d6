"""First-fit in allocation order: each buffer takes the lowest offset free for its lifetime."""

from collections.abc import Sequence


def first_fit(buffers: Sequence[tuple[int, int, int]]) -> list[int]:
    """buffers: (lower, upper, size), lifetime half-open [lower, upper). Returns offsets."""
    order = sorted(range(len(buffers)), key=lambda i: (buffers[i][0], i))
    offsets = [0] * len(buffers)
    placed: list[int] = []
    for i in order:
        lo, hi, size = buffers[i]
        busy = sorted((offsets[j], offsets[j] + buffers[j][2]) for j in placed
                      if buffers[j][0] < hi and lo < buffers[j][1] and buffers[j][2] > 0)
        offset = 0
        for start, end in busy:
            if start - offset >= size:
                break
            offset = max(offset, end)
        offsets[i] = offset
        placed.append(i)
    return offsets
