"""The orders ONNX Runtime runs a graph in: by default (`ExecutionOrder.DEFAULT`), and the
priority-based one that runs a plan's order.

ORT's `GraphViewer` builds it with `Graph::ReverseDFSFrom`: a depth-first search from the leaf
nodes (nodes no other node reads) along input edges, emitting each node after all its inputs
(post-order). Leaves start on a stack in index order, so the last leaf is explored first; a
node's input nodes are pushed in ascending index order, so the highest-index input is explored
first. Training builds (onnxruntime-training, ENABLE_TRAINING) then move every `Shape`/`Size`
node to right after the node producing its input, so that input can be freed early; other
builds do not (`training_build`, by default the installed runtime's).

Cross-checked against ORT 1.19 (training) and 1.32 profiling (`benchmarks/runtime/ort_order_check.py`). The edges are the
memory model's constraints: data edges plus the in-place rules, which ORT does not need because
it does not update declared state in place; on graphs without such rules they are ORT's edges.

`ExecutionOrder.PRIORITY_BASED` (what roam's runtime asks for) is Kahn's algorithm taking, among
the nodes ready to run, Shape and Size first, then the lowest priority value, then the lowest
index: for a file written in a topological order, that order itself, except that every Shape or
Size node runs as soon as its input exists (`priority_based`)."""

import importlib.metadata

SHAPE_OPS = ("Shape", "Size")


def installed_training_build() -> bool:
    """Whether the installed ONNX Runtime is a training build, read from the packages' metadata:
    importing onnxruntime-training imports torch where torch is installed (seconds per command)."""
    for package in ("onnxruntime-training", "onnxruntime-training-cpu"):
        try:
            importlib.metadata.distribution(package)
            return True
        except importlib.metadata.PackageNotFoundError:
            continue
    return False


TRAINING_BUILD = installed_training_build()


def ort_default(preds: list[tuple[int, ...]], op_types: list[str], training_build: bool = TRAINING_BUILD) -> list[int]:
    n = len(preds)
    has_user = [False] * n
    for ps in preds:
        for u in ps:
            has_user[u] = True
    stack = [(v, False) for v in range(n) if not has_user[v]]
    visited = [False] * n
    post_order = []
    while stack:
        v, leaving = stack.pop()
        if leaving:
            post_order.append(v)
            continue
        if visited[v]:
            continue
        visited[v] = True
        stack.append((v, True))
        stack.extend((u, False) for u in sorted(preds[v]) if not visited[u])

    followers: dict[int, list[int]] = {}  # producer -> Shape/Size nodes reading its output
    for v in range(n):
        if training_build and op_types[v] in SHAPE_OPS and preds[v]:
            followers.setdefault(min(preds[v]), []).append(v)
    order, placed = [], [False] * n
    for v in post_order:
        if placed[v]:
            continue
        order.append(v)
        placed[v] = True
        for w in followers.get(v, ()):
            order.append(w)
            placed[w] = True
    return order


def priority_based(order: list[int], eager: dict[int, int | None]) -> list[int]:
    """The order ORT runs with PRIORITY_BASED when the file lists the nodes in `order`: each
    Shape/Size node of `eager` (node -> the node producing its input, None for a graph input)
    right after that producer, those of graph inputs first; every other node where `order` has
    it. Several ready at once run in file order, which is this order's."""
    followers: dict[int | None, list[int]] = {}
    for v in order:
        if v in eager:
            followers.setdefault(eager[v], []).append(v)
    out: list[int] = []

    def run(v: int | None) -> None:
        stack = list(reversed(followers.get(v, ())))
        while stack:  # each Shape/Size, then those reading its output, before the next of v's
            w = stack.pop()
            out.append(w)
            stack.extend(reversed(followers.get(w, ())))

    run(None)
    for v in order:
        if v not in eager:
            out.append(v)
            run(v)
    return out
