"""Random small training-like graphs for the ordering tests, and the brute-force optimum.

Graphs are built as `Graph` IR directly (no shape inference, so every tensor gets a random
size) and go through the real memory model: views (Identity, Reshape), in-place gradient
accumulation (InPlaceAccumulatorV2 into an `.accumulation.buffer` input) and declared update
pairs (graph output `w.out` replaces input `w`), with state-only readers and unused outputs."""

import random

from onnx import TensorProto

from roam_cli.core import memory
from roam_cli.core.graph import Graph, Node, Value
from roam_cli.order.problem import Buffer, Problem

F, B = TensorProto.FLOAT, TensorProto.BOOL


def random_graph(rng: random.Random, max_nodes: int = 10) -> Graph:
    values: dict[str, Value] = {}
    nodes: list[Node] = []
    pool: list[str] = []  # tensors later nodes may read, newest last
    base: dict[str, str] = {}  # view -> the tensor whose storage it shares

    def tensor(name: str, elements: int | None = None, dtype: int = F) -> str:
        values[name] = Value(name, dtype, (elements if elements is not None else rng.randint(1, 3000),))
        return name

    inputs = [tensor("x")]
    pool.append("x")
    state = tensor("w") if rng.random() < 0.6 else None
    buffer = tensor("g.accumulation.buffer") if rng.random() < 0.5 else None
    inputs += [s for s in (state, buffer) if s]
    if state:
        pool.append(state)
    outputs: list[str] = []

    def pick() -> str:
        # mostly recent tensors: chains keep the number of orders small enough to enumerate
        return pool[-1 - min(int(rng.expovariate(0.8)), len(pool) - 1)]

    for i in range(rng.randint(2, max_nodes)):
        kind = rng.random()
        if kind < 0.15:
            src = pick()
            out = tensor(f"v{i}", values[src].shape[0])
            nodes.append(Node(f"n{i}", rng.choice(["Identity", "Reshape"]), "", (src,), (out,)))
            base[out] = base.get(src, src)
            pool.append(out)
        elif kind < 0.27 and buffer:
            grad = pick()
            values[buffer] = Value(buffer, F, values[grad].shape)
            flag, new = tensor(f"flag{i}", 1, B), tensor(f"acc{i}", values[grad].shape[0])
            nodes.append(Node(f"n{i}", "InPlaceAccumulatorV2", "com.microsoft", (buffer, grad), (flag, new)))
            outputs.append(flag)
            buffer = None
        elif kind < 0.39 and state:
            operand = pick()
            values[f"{state}.out"] = Value(f"{state}.out", F, values[state].shape)
            nodes.append(Node(f"n{i}", "Add", "", (state, operand), (f"{state}.out",)))
            outputs.append(f"{state}.out")
            pool[:] = [t for t in pool if base.get(t, t) != state]  # the old value, under any name
            state = None
        else:
            ins = tuple(dict.fromkeys(pick() for _ in range(rng.randint(1, 2))))
            outs = tuple(tensor(f"t{i}_{k}") for k in range(1 if rng.random() < 0.8 else 2))
            nodes.append(Node(f"n{i}", "Mul", "", ins, outs))
            pool.extend(outs)
    produced = [o for n in nodes for o in n.outputs if values[o].dtype == F]
    outputs += [pool[-1]] if pool[-1] in produced else []
    outputs += rng.sample(produced, k=min(len(produced), rng.randint(0, 1)))
    if not outputs:
        outputs.append(nodes[-1].outputs[0])
    return Graph(nodes, values, [i for i in inputs], [], list(dict.fromkeys(outputs)))


def count_orders(preds: list[tuple[int, ...]], cap: int) -> int:
    """How many topological orders there are, counted up to `cap` (DP over executed sets)."""
    n = len(preds)
    masks = [sum(1 << u for u in p) for p in preds]
    ways = {0: 1}
    for _ in range(n):
        nxt: dict[int, int] = {}
        for done, w in ways.items():
            for v in range(n):
                if not done >> v & 1 and masks[v] & ~done == 0:
                    nxt[done | 1 << v] = min(cap + 1, nxt.get(done | 1 << v, 0) + w)
        ways = nxt
    return sum(ways.values())


def topological_orders(preds: list[tuple[int, ...]]):
    """Every topological order, depth first."""
    n = len(preds)
    order: list[int] = []
    placed = [False] * n

    def extend():
        if len(order) == n:
            yield list(order)
            return
        for v in range(n):
            if not placed[v] and all(placed[u] for u in preds[v]):
                placed[v] = True
                order.append(v)
                yield from extend()
                order.pop()
                placed[v] = False

    yield from extend()


def brute_force(mm: memory.MemoryModel) -> int:
    """The lowest peak of any order, by the memory model's own definition of a peak."""
    return min(memory.peak_live(mm, memory.lifetimes(mm, o))[0] for o in topological_orders(list(mm.preds)))


def cases(count: int, seed: int, max_orders: int = 3000, max_nodes: int = 10):
    """`count` (graph, memory model) pairs whose orders can be enumerated, deterministically."""
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        graph = random_graph(rng, max_nodes)
        mm = memory.build(graph, alignment=rng.choice([1, 256]))
        if count_orders(list(mm.preds), max_orders) <= max_orders:
            out.append((graph, mm))
    return out


def random_problem(rng: random.Random, n: int) -> Problem:
    """A random problem in the general form the rules and segments produce: buffers with several
    allocators, none (entered live), readers that may run before the allocator (a reader handed to
    an unrelated predecessor by the `after` rule), dead buffers and buffers living to the end."""
    preds = tuple(tuple(sorted(set(rng.sample(range(v), min(v, rng.choice([0, 1, 1, 2])))))) for v in range(n))
    buffers = []
    for _ in range(rng.randint(1, 2 * n)):
        alloc = rng.choice([(), (rng.randrange(n),), (rng.randrange(n),), tuple(sorted({rng.randrange(n) for _ in "ab"}))])
        readers = tuple(sorted({rng.randrange(n) for _ in range(rng.randint(0 if len(alloc) == 1 else 1, 3))}))
        buffers.append(Buffer(rng.choice([1, 2, 3, 5, 8, 13, 100]), alloc, readers, rng.random() < 0.1))
    return Problem(preds, tuple(buffers), rng.choice([0, 7]))
