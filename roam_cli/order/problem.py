"""The ordering problem as plain values, and the peak evaluator every strategy shares.

A `Problem` is nodes with precedence plus buffers. A buffer is allocated when the first of its
`alloc` nodes runs (at step 0 when it has none: it entered the problem already live) and freed
after the last of its `readers` runs (after the last step when `to_end`; right after it is
allocated when nobody reads it). A memory model's transient storages are buffers with one
allocator, their producer; the reduction rules (`rules.py`) and the division into segments
(`divide.py`) produce the general form; a buffer that entered live always has a reader. `base`
bytes are live at every step: tensors that pass through a segment untouched.

For a problem made from a memory model, `peak()` equals `memory.peak_live(mm,
memory.lifetimes(mm, order))[0]` on every order ONNX Runtime runs (`order.runs`; tested), which
stays the single definition of an order's cost."""

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from roam_cli.core.graph import smallest_first_order
from roam_cli.core.memory import DEVICE, MemoryModel


@dataclass(frozen=True)
class Buffer:
    bytes: int
    alloc: tuple[int, ...]  # allocated when the first of these runs; () = live from step 0
    readers: tuple[int, ...]  # freed after the last of these runs
    to_end: bool = False  # lives to the last step


@dataclass(frozen=True)
class Problem:
    preds: tuple[tuple[int, ...], ...]
    buffers: tuple[Buffer, ...]
    base: int = 0

    @property
    def n(self) -> int:
        return len(self.preds)

    @cached_property
    def succs(self) -> tuple[tuple[int, ...], ...]:
        out: list[list[int]] = [[] for _ in self.preds]
        for v, ps in enumerate(self.preds):
            for u in ps:
                out[u].append(v)
        return tuple(tuple(s) for s in out)

    @cached_property
    def reads(self) -> tuple[tuple[int, ...], ...]:
        """Per node: the buffers it reads."""
        out: list[list[int]] = [[] for _ in self.preds]
        for b, buf in enumerate(self.buffers):
            for r in buf.readers:
                out[r].append(b)
        return tuple(tuple(x) for x in out)

    @cached_property
    def tables(self) -> "Tables":
        return Tables.of(self)

    @cached_property
    def allocs(self) -> tuple[tuple[int, ...], ...]:
        """Per node: the buffers it allocates when it is the first of their allocators to run."""
        out: list[list[int]] = [[] for _ in self.preds]
        for b, buf in enumerate(self.buffers):
            for a in buf.alloc:
                out[a].append(b)
        return tuple(tuple(x) for x in out)


@dataclass(frozen=True)
class Tables:
    """A problem's buffers as flat arrays (allocators and readers of the buffers that have any,
    concatenated), for span_arrays()."""
    sizes: np.ndarray
    to_end: np.ndarray
    has_alloc: np.ndarray
    alloc_nodes: np.ndarray
    alloc_starts: np.ndarray
    has_readers: np.ndarray
    reader_nodes: np.ndarray
    reader_starts: np.ndarray
    alloc_buffer: np.ndarray  # the buffer of each entry of alloc_nodes
    reader_buffer: np.ndarray  # the buffer of each entry of reader_nodes
    pred_nodes: np.ndarray  # every precedence edge as (node, predecessor): this node
    pred_of: np.ndarray  # and that predecessor

    @staticmethod
    def of(problem: Problem) -> "Tables":
        def flat(groups) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
            groups = list(groups)
            present = np.array([bool(g) for g in groups], dtype=bool)
            lengths = [len(g) for g in groups if g]
            starts = np.cumsum([0] + lengths[:-1], dtype=np.int64) if lengths else np.zeros(0, dtype=np.int64)
            owner = np.repeat(np.arange(len(groups), dtype=np.int64), [len(g) for g in groups])
            return present, np.array([v for g in groups for v in g], dtype=np.int64), starts, owner

        buffers = problem.buffers
        has_alloc, alloc_nodes, alloc_starts, alloc_buffer = flat(b.alloc for b in buffers)
        has_readers, reader_nodes, reader_starts, reader_buffer = flat(b.readers for b in buffers)
        _, pred_of, _, pred_nodes = flat(problem.preds)
        return Tables(np.array([b.bytes for b in buffers], dtype=np.int64), np.array([b.to_end for b in buffers], dtype=bool),
                      has_alloc, alloc_nodes, alloc_starts, has_readers, reader_nodes, reader_starts, alloc_buffer,
                      reader_buffer, pred_nodes, pred_of)


def from_memory_model(mm: MemoryModel) -> Problem:
    """The device's bytes: a slower tier's storages are laid out in their own arena, and the order
    minimises what the device holds. A Shape/Size node ONNX Runtime runs right after its input's
    producer (`mm.eager`) allocates and reads with that producer here, so where an order puts it
    does not change a peak, and the order ORT runs (`ort.priority_based`) has the same peak."""

    def anchor(v: int) -> int | None:
        """The node v runs with: itself, or the producer its chain of Shape/Size nodes starts at
        (None: a graph input, so the start)."""
        while v in mm.eager:
            if mm.eager[v] is None:
                return None
            v = mm.eager[v]
        return v

    def with_anchors(nodes: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(sorted({v if anchor(v) is None else anchor(v) for v in nodes}))

    buffers = tuple(Buffer(s.bytes, () if anchor(s.producer) is None else (anchor(s.producer),),
                           with_anchors(s.readers), s.to_end)
                    for s in mm.storages if s.bytes and s.tier == DEVICE)
    return Problem(tuple(mm.preds), buffers)


def positions(order: list[int]) -> list[int]:
    pos = [0] * len(order)
    for step, v in enumerate(order):
        pos[v] = step
    return pos


def spans(problem: Problem, order: list[int]) -> list[tuple[int, int]]:
    """[first, last] step of every buffer under `order`."""
    first, last = span_arrays(problem, order)
    return list(zip(first.tolist(), last.tolist()))


def span_arrays(problem: Problem, order: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """spans() as two arrays, computed in numpy: an order of a 70B-class step has 20,000 buffers,
    and the search evaluates thousands of orders."""
    t = problem.tables
    pos = np.empty(len(order), dtype=np.int64)
    pos[np.asarray(order, dtype=np.int64)] = np.arange(len(order), dtype=np.int64)
    first = np.zeros(len(problem.buffers), dtype=np.int64)
    if len(t.alloc_nodes):
        first[t.has_alloc] = np.minimum.reduceat(pos[t.alloc_nodes], t.alloc_starts)
    last = first.copy()
    if len(t.reader_nodes):
        last[t.has_readers] = np.maximum(first[t.has_readers], np.maximum.reduceat(pos[t.reader_nodes], t.reader_starts))
    last[t.to_end] = len(order) - 1
    return first, last


def profile(problem: Problem, order: list[int]) -> list[int]:
    """Live bytes at every step of `order` (base included)."""
    first, last = span_arrays(problem, order)
    sizes = problem.tables.sizes
    delta = np.zeros(len(order) + 1, dtype=np.int64)
    np.add.at(delta, first, sizes)
    np.add.at(delta, last + 1, -sizes)
    return (np.cumsum(delta[:-1]) + problem.base).tolist()


def peak(problem: Problem, order: list[int]) -> int:
    return max(profile(problem, order), default=problem.base)


def is_topological(problem: Problem, order: list[int]) -> bool:
    if sorted(order) != list(range(problem.n)):
        return False
    pos = positions(order)
    return all(pos[u] < pos[v] for v, ps in enumerate(problem.preds) for u in ps)


def reachability(problem: Problem) -> tuple[list[int], list[int]]:
    """Ancestor and descendant sets of every node as bitsets (Python ints)."""
    topo = kahn(problem)
    anc = [0] * problem.n
    for v in topo:
        for u in problem.preds[v]:
            anc[v] |= anc[u] | (1 << u)
    desc = [0] * problem.n
    for v in reversed(topo):
        for w in problem.succs[v]:
            desc[v] |= desc[w] | (1 << w)
    return anc, desc


def kahn(problem: Problem) -> list[int]:
    """The smallest-index-first topological order."""
    return smallest_first_order([len(p) for p in problem.preds], problem.succs)
