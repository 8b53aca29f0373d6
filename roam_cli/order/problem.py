"""The ordering problem as plain values, and the peak evaluator every strategy shares.

A `Problem` is nodes with precedence plus buffers. A buffer is allocated when the first of its
`alloc` nodes runs (at step 0 when it has none: it entered the problem already live) and freed
after the last of its `readers` runs (after the last step when `to_end`; right after it is
allocated when nobody reads it). A memory model's transient storages are buffers with one
allocator, their producer; the reduction rules (`rules.py`) and the division into segments
(`divide.py`) produce the general form; a buffer that entered live always has a reader. `base`
bytes are live at every step: tensors that pass through a segment untouched.

For a problem made from a memory model, `peak()` equals `memory.peak_live(mm,
memory.lifetimes(mm, order))[0]` (tested), which stays the single definition of an order's cost."""

from dataclasses import dataclass
from functools import cached_property

from roam_cli.core.graph import smallest_first_order
from roam_cli.core.memory import MemoryModel


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
    def allocs(self) -> tuple[tuple[int, ...], ...]:
        """Per node: the buffers it allocates when it is the first of their allocators to run."""
        out: list[list[int]] = [[] for _ in self.preds]
        for b, buf in enumerate(self.buffers):
            for a in buf.alloc:
                out[a].append(b)
        return tuple(tuple(x) for x in out)


def from_memory_model(mm: MemoryModel) -> Problem:
    buffers = tuple(Buffer(s.bytes, (s.producer,), s.readers, s.to_end) for s in mm.storages if s.bytes)
    return Problem(tuple(mm.preds), buffers)


def positions(order: list[int]) -> list[int]:
    pos = [0] * len(order)
    for step, v in enumerate(order):
        pos[v] = step
    return pos


def spans(problem: Problem, order: list[int]) -> list[tuple[int, int]]:
    """[first, last] step of every buffer under `order`."""
    pos = positions(order)
    end = len(order) - 1
    out = []
    for buf in problem.buffers:
        first = min((pos[a] for a in buf.alloc), default=0)
        last = end if buf.to_end else max((pos[r] for r in buf.readers), default=first)
        out.append((first, max(first, last)))
    return out


def profile(problem: Problem, order: list[int]) -> list[int]:
    """Live bytes at every step of `order` (base included)."""
    delta = [0] * (len(order) + 1)
    for buf, (first, last) in zip(problem.buffers, spans(problem, order)):
        delta[first] += buf.bytes
        delta[last + 1] -= buf.bytes
    live, out = problem.base, []
    for d in delta[:-1]:
        live += d
        out.append(live)
    return out


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
