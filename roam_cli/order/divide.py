"""Tree-based task division: segments of a reference order solved as independent problems.

Fix a topological order and cut it into contiguous segments. Everything before a segment has
run and everything after it will run, so a segment is a problem of its own: a buffer allocated
before it and freed after it passes through as a constant (`base`); one allocated before and
read inside enters live (no allocator); one allocated inside and read after lives to the
segment's end; edges from outside are already satisfied. Every order of the segment, put back
in place, gives the whole order exactly the segment's profile at those steps and leaves every
other step unchanged, so segments can be solved in parallel and stitched.

`split()` builds the division tree: it cuts the order recursively at the position where the
fewest short-lived buffers cross (transformer layers and their halves), nearest the middle on
ties, until every leaf has at most `leaf_size` nodes. Identical layers are then cut at the same
relative places, which is what lets `blocks.py` solve each shape once."""

from dataclasses import dataclass

from roam_cli.order.problem import Buffer, Problem, positions, spans


@dataclass(frozen=True)
class Segment:
    start: int  # position in the reference order
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def subproblem(problem: Problem, order: list[int], seg: Segment) -> Problem:
    """The problem of ordering order[seg.start:seg.stop] with everything else fixed around it.
    Its node i is order[seg.start + i]."""
    pos = positions(order)
    local = {v: i for i, v in enumerate(order[seg.start:seg.stop])}
    preds = tuple(tuple(local[u] for u in problem.preds[v] if u in local) for v in order[seg.start:seg.stop])
    base = problem.base
    buffers = []
    for buf in problem.buffers:
        before = not buf.alloc or any(pos[a] < seg.start for a in buf.alloc)
        inside_alloc = tuple(sorted(local[a] for a in buf.alloc if a in local))
        if not before and not inside_alloc:
            continue  # allocated after the segment
        readers = tuple(sorted(local[r] for r in buf.readers if r in local))
        after = buf.to_end or any(pos[r] >= seg.stop for r in buf.readers)
        if before:
            if after:
                base += buf.bytes
            elif readers:
                buffers.append(Buffer(buf.bytes, (), readers))
            continue
        buffers.append(Buffer(buf.bytes, inside_alloc, () if after else readers, after))
    return Problem(preds, tuple(buffers), base)


def stitch(order: list[int], seg: Segment, local_order: list[int]) -> list[int]:
    """`order` with its segment replaced by `local_order` (indices into the segment)."""
    inside = order[seg.start:seg.stop]
    return order[:seg.start] + [inside[i] for i in local_order] + order[seg.stop:]


def crossing_scores(problem: Problem, order: list[int], reach: int) -> list[int]:
    """For every cut position p (between order[p-1] and order[p]): how many buffers live across
    it that were allocated fewer than `reach` steps before it and are freed fewer than `reach`
    steps after it. Long-lived buffers (saved activations) cross every nearby cut alike and are
    constants to both sides, so they do not count."""
    n = len(order)
    delta = [0] * (n + 2)
    for first, last in spans(problem, order):
        lo, hi = max(first + 1, last - reach + 1), min(last, first + reach)
        if lo <= hi:  # cuts p in (first, last] with p - first <= reach and last - p < reach
            delta[lo] += 1
            delta[hi + 1] -= 1
    scores, running = [], 0
    for p in range(n + 1):
        running += delta[p]
        scores.append(running)
    return scores


def split(n: int, scores: list[int], leaf_size: int) -> list[Segment]:
    """Leaves of the division tree over positions [0, n), left to right."""
    leaves: list[Segment] = []
    stack = [Segment(0, n)]
    while stack:
        seg = stack.pop()
        if seg.size <= leaf_size:
            leaves.append(seg)
            continue
        # keep both halves at least a quarter of a leaf so the tree stays balanced
        margin = max(1, min(leaf_size // 4, seg.size // 2))
        middle = (seg.start + seg.stop) / 2
        cut = min(range(seg.start + margin, seg.stop - margin + 1), key=lambda p: (scores[p], abs(p - middle), p))
        stack.append(Segment(cut, seg.stop))
        stack.append(Segment(seg.start, cut))
    return leaves


def parents(leaves: list[Segment]) -> list[Segment]:
    """The level above: adjacent segments merged in pairs."""
    return [Segment(leaves[i].start, leaves[min(i + 1, len(leaves) - 1)].stop) for i in range(0, len(leaves), 2)]
