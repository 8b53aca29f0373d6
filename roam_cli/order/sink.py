"""Sinking: nodes that only add bytes run just before the node that needs them.

A training step's backward has many small computations that read only what the forward kept
(the `2x` of a `Pow(x, 2)`'s gradient, a recomputed rotary embedding, a transposed weight): any
order may run them long before their reader, and each then carries its output over every step in
between. A reference order that runs them early (ONNX Runtime's order runs all 64 of a LLaMA-7B
step's norm partials right after the loss: 0.28 GiB above its bound) is far from the best, and the
division tree cannot fix it: the move crosses hundreds of steps and many leaves.

`sink()` moves each such computation as a group — a node and the predecessors that feed only
the group — to just before the first node outside the group that reads it, when the move lowers
the sum of the live bytes over the steps it crosses and raises no step above the order's peak.
A move changes only the steps between the group's first node and its new place, and only through
the buffers the group allocates or reads (every other buffer is live at the same nodes, whose
relative order stays), so each move is weighed on those steps alone. Every accepted move lowers
the total of live bytes over all steps, so the passes end."""

import numpy as np

from roam_cli.order.problem import Problem, profile

GROUP_NODES = 16  # the most nodes moved together (a partial gradient's chain has two or three)
PASSES = 4  # over the whole order, last node first; a pass without a move ends them


def sink(problem: Problem, order: list[int]) -> list[int]:
    """`order` with groups sunk (see the module's doc); never a higher peak."""
    return Sinking(problem, order).run()


class Sinking:
    def __init__(self, problem: Problem, order: list[int]):
        self.p = problem
        self.order = np.asarray(order, dtype=np.int64)
        self.pos = np.empty(problem.n, dtype=np.int64)
        self.pos[self.order] = np.arange(problem.n)
        self.live = np.asarray(profile(problem, self.order), dtype=np.int64)
        self.arrays: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # buffer -> (allocators, readers)
        self.top = int(self.live.max(initial=problem.base))

    def run(self) -> list[int]:
        for _ in range(PASSES):
            moved = 0
            for v in self.order[::-1].tolist():
                moved += self.try_group(v)
            if not moved:
                break
        return self.order.tolist()

    def group(self, v: int) -> tuple[list[int], int]:
        """(the group of v: v and the predecessors whose successors are all in it, by position;
        the last step it may move to: before the first node outside it that reads it)."""
        p, pos = self.p, self.pos
        members, stack = {v}, [v]
        while stack and len(members) < GROUP_NODES:
            for u in p.preds[stack.pop()]:
                if u not in members and all(w in members for w in p.succs[u]) and len(members) < GROUP_NODES:
                    members.add(u)
                    stack.append(u)
        needed = [pos[w] for x in members for w in p.succs[x] if w not in members]
        needed += [pos[r] for x in members for b in p.allocs[x] for r in p.buffers[b].readers if r not in members]
        return sorted(members, key=pos.__getitem__), min(needed, default=p.n) - 1

    def try_group(self, v: int) -> bool:
        members, last = self.group(v)
        first = int(self.pos[members[0]])
        if last <= int(self.pos[members[-1]]) or last - first + 1 == len(members):
            return False  # nowhere to go: nothing of another node's between the group and its reader
        window = self.order[first:last + 1]
        stays = ~np.isin(window, members)
        rest = int(stays.sum())
        at_old = np.flatnonzero(stays) + first  # the old steps of the nodes the group passes
        member_pos = self.pos[members]  # ascending
        new_place = dict(zip(members, range(first + rest, last + 1)))

        def new_pos(nodes: np.ndarray) -> np.ndarray:
            """The steps of `nodes` after the move: the group's at the window's end, the others in
            the window one earlier per member they pass."""
            q = self.pos[nodes]
            out = np.where((q >= first) & (q <= last), q - np.searchsorted(member_pos, q), q)
            for k, w in enumerate(nodes.tolist()):
                if w in new_place:
                    out[k] = new_place[w]
            return out

        touched = sorted({b for x in members for b in (*self.p.allocs[x], *self.p.reads[x])})
        sizes = [self.p.buffers[b].bytes for b in touched]
        old = [self.span(b, self.pos.__getitem__) for b in touched]
        new = [self.span(b, new_pos) for b in touched]
        # every other buffer: live at the same nodes; at the group's new steps, live as between the
        # window's last old step and the next
        between = self.live[last] - self.freed_at(last) - sum(s for (f, l), s in zip(old, sizes) if f <= last < l)
        values = np.empty(last + 1 - first, dtype=np.int64)
        values[:rest] = self.live[at_old]
        values[rest:] = between
        steps = np.arange(first, last + 1)
        for (f, l), (nf, nl), size in zip(old, new, sizes):
            values[:rest] -= size * ((f <= at_old) & (at_old <= l))
            values[max(nf, first) - first:min(nl, last) + 1 - first] += size
        if values.max() > self.top or not lower(values, self.live[first:last + 1]):
            return False
        moved = np.concatenate([window[stays], np.asarray(members, dtype=window.dtype)])
        self.order[first:last + 1] = moved
        self.pos[moved] = steps
        self.live[first:last + 1] = values
        return True

    def span(self, b: int, positions) -> tuple[int, int]:
        """[first, last] step of buffer b, its nodes at `positions(array of nodes)`; a buffer living
        to the end lives past the last step (n)."""
        alloc, readers = self.ends(b)
        first = int(positions(alloc).min()) if len(alloc) else 0
        last = self.p.n if self.p.buffers[b].to_end else int(positions(readers).max()) if len(readers) else first
        return first, max(first, last)

    def ends(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Buffer b's allocators and readers as arrays (made once)."""
        if b not in self.arrays:
            buf = self.p.buffers[b]
            self.arrays[b] = np.asarray(buf.alloc, dtype=np.int64), np.asarray(buf.readers, dtype=np.int64)
        return self.arrays[b]

    def freed_at(self, step: int) -> int:
        """Bytes live at `step` and not after it."""
        w = int(self.order[step])
        return sum(self.p.buffers[b].bytes for b in set(self.p.reads[w]) | set(self.p.allocs[w])
                   if self.span(b, self.pos.__getitem__)[1] == step)


def lower(new: np.ndarray, old: np.ndarray) -> bool:
    """Whether the steps `new` are lower than `old`: their highest first, the first that differs
    decides (a well-founded order on the profile, so the moves end)."""
    a, b = np.sort(new)[::-1], np.sort(old)[::-1]
    differ = np.flatnonzero(a != b)
    return bool(len(differ)) and a[differ[0]] < b[differ[0]]
