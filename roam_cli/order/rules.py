"""Training-graph theory: rules that shrink an ordering problem and provably keep an optimum.

Two exchange rules, each proved in docs/ordering.md ("Reduction rules"):

- after (rule 1): a node that allocates nothing (views, in-place accumulators and optimizer
  steps, the last op of an update chain writing a parameter in place) runs right after the last
  of its predecessors. Moving it earlier past any other node never raises a step's live bytes.
- before (rule 2): a node that frees nothing in any order (every buffer it allocates or reads is
  also read by one of its descendants, or lives to the end) runs right before the first of its
  successors. Moving it later never raises a step's live bytes. This is what keeps shape
  computations, transposed weights and the state-only halves of update chains (m * beta1) out
  of the forward pass.

`reduce()` applies both to a fixpoint. A removed node leaves no step in the reduced problem:
its reads move to its predecessors (after) or its allocations to its successors (before), and
its successors inherit its predecessors. The reduced problem's optimum equals the original's,
and `Reduction.expand()` turns any order of the reduced problem into an order of the original
with the same peak."""

from dataclasses import dataclass
from fractions import Fraction
from itertools import pairwise

from roam_cli.order.problem import Buffer, Problem, reachability


@dataclass(frozen=True)
class Reduction:
    problem: Problem  # over the kept nodes, numbered 0..k-1 in original index order
    kept: tuple[int, ...]  # reduced index -> original node
    removed: tuple[tuple[int, str, tuple[int, ...]], ...]  # (node, "after" | "before", anchors), in removal order

    def expand(self, order: list[int]) -> list[int]:
        """An order of the original problem: undo the removals last to first, each node put right
        after the last of its anchors (after) or right before the first of them (before).

        The sequence is a linked list whose nodes carry rational labels in sequence order (an
        insertion takes the midpoint of its neighbours'), so each undo costs its anchors, not a
        search of a list of tens of thousands of nodes."""
        seq = [self.kept[v] for v in order]
        ends = (None, *seq, None)
        after = dict(pairwise(ends))  # None -> the first node
        before = dict(zip(ends[1:], ends[:-1]))  # None -> the last node
        label = {v: Fraction(i) for i, v in enumerate(seq)}

        def insert(v: int, left: int | None) -> None:
            right = after[left]
            low = label[left] if left is not None else (label[right] - 1 if right is not None else Fraction(0))
            label[v] = (low + label[right]) / 2 if right is not None else low + 1
            after[left], after[v], before[v], before[right] = v, right, left, v

        for v, rule, anchors in reversed(self.removed):
            if rule == "after":
                insert(v, max(anchors, key=label.__getitem__, default=None))
            else:
                insert(v, before[min(anchors, key=label.__getitem__)])
        out, v = [], after[None]
        while v is not None:
            out.append(v)
            v = after[v]
        return out


RULES = ("after", "before")


def reduce(problem: Problem, enabled: tuple[str, ...] = RULES) -> Reduction:
    """Apply the `enabled` rules until none applies."""
    n = problem.n
    anc, desc = reachability(problem)
    preds = [set(p) for p in problem.preds]
    succs = [set(s) for s in problem.succs]
    buffers = [b for b in problem.buffers if b.bytes]  # zero-byte buffers never change a peak
    size = [b.bytes for b in buffers]
    alloc = [set(b.alloc) for b in buffers]
    readers = [set(b.readers) for b in buffers]
    to_end = [b.to_end for b in buffers]
    reads: list[set[int]] = [set() for _ in range(n)]
    allocs: list[set[int]] = [set() for _ in range(n)]
    for b, buf in enumerate(buffers):
        for r in buf.readers:
            reads[r].add(b)
        for a in buf.alloc:
            allocs[a].add(b)
    alive = [True] * n
    removed = []

    def frees_nothing(v: int) -> bool:
        for b in allocs[v] | reads[v]:
            if not to_end[b] and not any(desc[v] >> r & 1 for r in readers[b]):
                return False
        return True

    def unlink(v: int) -> None:
        for s in succs[v]:
            preds[s].discard(v)
            preds[s].update(preds[v])
        for p in preds[v]:
            succs[p].discard(v)
            succs[p].update(succs[v])
        alive[v] = False

    changed = True
    while changed:
        changed = False
        for v in range(n):
            if not alive[v]:
                continue
            if "after" in enabled and not allocs[v]:
                for b in reads[v]:
                    readers[b].discard(v)
                    readers[b].update(preds[v])
                    for p in preds[v]:
                        reads[p].add(b)
                removed.append((v, "after", maximal(preds[v], anc)))
                unlink(v)
                changed = True
            elif "before" in enabled and succs[v] and frees_nothing(v):
                for b in allocs[v]:
                    alloc[b].discard(v)
                    alloc[b].update(succs[v])
                    for s in succs[v]:
                        allocs[s].add(b)
                for b in reads[v]:
                    readers[b].discard(v)
                removed.append((v, "before", minimal(succs[v], desc)))
                unlink(v)
                changed = True
    kept = tuple(v for v in range(n) if alive[v])
    index = {v: i for i, v in enumerate(kept)}
    new_preds = tuple(tuple(index[u] for u in maximal(preds[v], anc)) for v in kept)
    new_buffers = tuple(Buffer(size[b], tuple(index[a] for a in minimal(alloc[b], desc)),
                               tuple(index[r] for r in maximal(readers[b], anc)), to_end[b])
                        for b in range(len(size)))
    return Reduction(Problem(new_preds, new_buffers, problem.base), kept, tuple(removed))


def maximal(nodes: set[int], anc: list[int]) -> tuple[int, ...]:
    """The nodes that are not an ancestor of another one: only they can run last (and a
    predecessor that is an ancestor of another predecessor is a redundant edge)."""
    mask = 0
    for v in nodes:
        mask |= anc[v]
    return tuple(sorted(v for v in nodes if not mask >> v & 1))


def minimal(nodes: set[int], desc: list[int]) -> tuple[int, ...]:
    """The nodes that are not a descendant of another one: only they can run first."""
    mask = 0
    for v in nodes:
        mask |= desc[v]
    return tuple(sorted(v for v in nodes if not mask >> v & 1))

