"""The memory model (DESIGN.md): which bytes exist, which storage each tensor uses, and when.

Persistent storage (parameters, optimizer state, gradient buffers, constants, data inputs) lives
the whole step outside the arena. Every other storage is transient: allocated when its producer
runs, freed after the last node reading any name that shares it. Views share their input's
storage; in-place updates write into the storage of the state they replace. Sizes are exact and
rounded up to the alignment.

Tiers (DESIGN.md, "Memory tiers"): a model roam rewrote to offload (roam_cli.offload) says in its
metadata (TIERS_KEY) which nodes are transfers, which run on the host, and which persistent
tensors live there. A transient storage lives in the tier of the node that allocates it: a
transfer to the host, or a node run by the host, allocates in the slow tier; every other node on
the device. Orders count the device's bytes only; each tier gets its own arena.

`build()` reads the graph once and returns a `MemoryModel` of plain values that orderings and
layouts consume; `lifetimes()` turns an order into each storage's [first, last] step."""

import json
from dataclasses import dataclass, field

from onnx import TensorProto

from roam_cli.core.collectives import COLLECTIVES
from roam_cli.core.errors import RoamError
from roam_cli.core.graph import Graph, element_size

# Ops whose output 0 is a view of input 0 (ONNX Runtime aliases them; they allocate nothing).
VIEW_OPS = {("", "Reshape"), ("", "Flatten"), ("", "Squeeze"), ("", "Unsqueeze"), ("", "Identity")}

# Ops that update buffers in place by contract: op -> [(output index, input index)]: the input's
# storage is overwritten whether or not the optional output that names the result is present.
INPLACE_OPS = {
    ("com.microsoft", "InPlaceAccumulator"): [(0, 0)],
    ("com.microsoft", "InPlaceAccumulatorV2"): [(1, 0)],
    ("com.microsoft", "SGDOptimizer"): [(0, 1), (1, 2)],
    ("com.microsoft", "AdamOptimizer"): [(0, 1), (1, 4), (2, 5), (3, 2), (4, 3)],
}
# ONNX Runtime's CPU kernels that may write output 0 into input 0 (their `MayInplace(0, 0)` hint:
# onnxruntime/core/providers/cpu activation/activations.cc, math/softmax.cc, tensor/cast_op.cc,
# tensor/scatter.cc; the same in 1.19 and today's). ORT's allocation planner takes the hint when
# the input's storage has no other use left (this node reads it once, last), the input is not a
# graph input, initializer or graph output, the output is not a graph output, and both have the
# same shape and element size. Another execution provider has another table.
MAY_OVERWRITE = {("", op): (0, 0) for op in (
    "Elu", "HardSigmoid", "LeakyRelu", "Relu", "Selu", "Sigmoid", "Softplus", "Softsign", "Tanh",
    "ThresholdedRelu", "Softmax", "LogSoftmax", "Cast", "Scatter", "ScatterElements")}
# Elementwise ops whose output roam's allocator may place over one of their inputs (plan field
# `written_over`): ONNX Runtime's kernels for them read element i of every input before they write
# element i of the output (on the CPU, Eigen and MLAS loops over disjoint ranges; on CUDA, a thread
# per element), so an input of the output's shape and element size whose contents nothing reads
# afterwards can hold the output. ORT does not reuse the input itself (the kernels declare no
# MayInplace): it requests the output, and roam's allocator answers at the input's place — the
# state's own buffer where the input is a state whose new value the step writes there anyway (a
# functional step's donated moments: one parameter's AdamW then holds one temporary, not two).
# Kernels that write their output before they have read all of their input (QuickGelu writes the
# sigmoid, then multiplies) are not here.
WRITE_OVER_OPS = frozenset(("", op) for op in (
    "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Neg", "Reciprocal", "Abs", "Exp", "Log"))
ANCESTOR_SEARCH = 256  # nodes a written-over join's check that its input's other readers come first visits
# Ops ONNX Runtime runs as soon as their input exists: its priority-based order, the one that runs a
# plan's order, takes them first among the nodes ready to run (PriorityNodeCompare in
# onnxruntime/core/graph/graph_viewer.cc; profiled on 1.19 and 1.32): right after the node producing
# their input, or at the start when that is a graph input.
EAGER_OPS = {("", "Shape"), ("", "Size")}
ACCUMULATOR_OPS = {"InPlaceAccumulator", "InPlaceAccumulatorV2"}
# Which input of an in-place optimizer op holds the weights (the rest of its in-place inputs are
# optimizer state or gradients).
OPTIMIZER_WEIGHTS_INPUT = {"SGDOptimizer": 1, "AdamOptimizer": 2}

# A graph output named <state><suffix> replaces state <state> (same dtype and shape) in place.
UPDATE_SUFFIXES = (".out", "_out", ".new", "_new", ".updated", "_updated", "_next")
# The model may declare its pairs explicitly: metadata_props[INPLACE_KEY] = {"output": "input"}.
INPLACE_KEY = "roam.inplace"

# A transient integer value (a shape, a position, an index) is kind "index" whichever node class made
# it (a shape the backward computes is no gradient), but for a transfer's copy, which is a transfer.
INTEGER_TYPES = frozenset({TensorProto.INT64, TensorProto.INT32, TensorProto.INT16, TensorProto.INT8,
                           TensorProto.UINT64, TensorProto.UINT32, TensorProto.UINT16, TensorProto.UINT8})
NODE_CLASSES = ("forward", "backward", "accumulate", "update", "recompute", "transfer")
# metadata_props key of a model with nodes roam added to recompute values after the forward:
# {"copy node": "original node"} (roam_cli.recompute)
RECOMPUTE_KEY = "roam.recompute"
# metadata_props key of a model roam rewrote to offload (roam_cli.offload): {"tier": "host" |
# "storage", "transfers": {node: "to_host" | "to_device"}, "host_nodes": [node], "homes": [persistent
# tensor]}: the slow tier's name, the copies between tiers, the nodes the host runs, and the
# persistent tensors kept in the slow tier
TIERS_KEY = "roam.tiers"
DEVICE = "device"
SLOW_TIERS = ("host", "storage")


@dataclass(frozen=True)
class Storage:
    """One transient buffer in the arena. `root` is the tensor that allocates it."""

    root: str
    bytes: int
    kind: str
    producer: int  # node index that allocates it
    readers: tuple[int, ...]  # nodes reading any name that shares this storage
    to_end: bool  # holds a graph output: lives until the last step
    tier: str = DEVICE  # "device", or the slow tier ("host" | "storage")


@dataclass
class MemoryModel:
    alignment: int
    num_nodes: int
    tensor_bytes: dict[str, int]  # aligned size of every tensor name
    kind: dict[str, str]  # class of every tensor name (alias names: the class of the alias)
    storage_of: dict[str, str]  # every tensor name -> the root name owning its storage
    alias: dict[str, str]  # non-root name -> "view" | "inplace"
    persistent: dict[str, str]  # persistent root -> class
    storages: list[Storage]  # transient storages, in producer order
    node_class: list[str]  # per node index: forward | backward | accumulate | update
    extra_deps: list[tuple[int, int]]  # (a, b): node a must run before node b (in-place safety)
    preds: list[tuple[int, ...]]  # per node: nodes that must run before it (data + in-place)
    notes: list[str]
    tiers: "Tiers | None" = None  # None: one memory, the device's
    # Shape/Size nodes ORT runs right after the node producing their input (EAGER_OPS): node ->
    # that producer, or None where the input is a graph input (they run at the start)
    eager: dict[int, int | None] = field(default_factory=dict)
    # kernel outputs written into their input (ONNX Runtime's in-place kernels and WRITE_OVER_OPS,
    # as `order` let them): output -> input
    kernel_joins: dict[str, str] = field(default_factory=dict)
    # those of them roam's allocator places (WRITE_OVER_OPS: ORT requests them): output -> input
    written_over: dict[str, str] = field(default_factory=dict)
    # per node: `preds` without the edges the joins added (another reader of a joined input first):
    # what an order ONNX Runtime makes itself respects, the data edges and the in-place updates'
    run_preds: list[tuple[int, ...]] = field(default_factory=list)

    @property
    def persistent_bytes(self) -> int:
        """The persistent bytes on the device (what --budget counts besides the arena)."""
        homes = self.tiers.homes if self.tiers else frozenset()
        return sum(self.tensor_bytes[name] for name in self.persistent if name not in homes)

    @property
    def slow_persistent_bytes(self) -> int:
        return sum(self.tensor_bytes[name] for name in self.tiers.homes) if self.tiers else 0

    def on(self, tier: str) -> list[int]:
        """Indices (in storages) of the transient storages in `tier`."""
        return [k for k, s in enumerate(self.storages) if s.tier == tier]


@dataclass(frozen=True)
class Tiers:
    """What a model's TIERS_KEY says, resolved to node indices."""

    slow: str  # "host" | "storage"
    transfers: dict[int, str]  # node -> "to_host" | "to_device"
    host_nodes: frozenset[int]  # nodes run by the host (besides transfers)
    homes: frozenset[str]  # persistent tensors kept in the slow tier

    def node_tier(self, i: int) -> str:
        """Where node i's outputs are allocated."""
        if i in self.transfers:
            return self.slow if self.transfers[i] == "to_host" else DEVICE
        return self.slow if i in self.host_nodes else DEVICE


def aligned(nbytes: int, alignment: int) -> int:
    return -(-nbytes // alignment) * alignment


def declared_pairs(graph: Graph, extra: dict[str, str]) -> dict[str, str]:
    """Graph output -> state input it replaces in place (metadata, --inplace, or name suffix)."""
    states = set(graph.inputs) | set(graph.initializers)
    pairs: dict[str, str] = {}
    if INPLACE_KEY in graph.metadata:
        try:
            declared = json.loads(graph.metadata[INPLACE_KEY])
            assert isinstance(declared, dict)
        except (ValueError, AssertionError):
            raise RoamError(f"model metadata {INPLACE_KEY!r} is not a JSON object of output -> input") from None
        pairs.update(declared)
    pairs.update(extra)
    for out in graph.outputs:
        for suffix in UPDATE_SUFFIXES:
            state = out[: -len(suffix)]
            if out.endswith(suffix) and state in states and out not in pairs:
                a, b = graph.values[out], graph.values[state]
                if (a.dtype, a.shape) == (b.dtype, b.shape):
                    pairs[out] = state
    for out, state in pairs.items():
        if out not in graph.outputs:
            raise RoamError(f"in-place pair {out}={state}: {out!r} is not a graph output")
        if state not in states:
            raise RoamError(f"in-place pair {out}={state}: {state!r} is not a graph input or initializer")
    if len(set(pairs.values())) < len(pairs):
        raise RoamError("two graph outputs are declared to replace the same state in place")
    return pairs


def sharing(graph: Graph, inplace: dict[str, str] | None, order: list[int] | None = None, write_over: bool = True):
    """Which names share storage: (storage_of, alias, writes_into, pairs, find, joins) — name ->
    the name whose storage it uses, each such name's kind of sharing, node -> the state it
    overwrites in place, the declared update pairs, find(name) -> (its storage's root, the links to
    it), and the kernel outputs written into their input where `order` lets them (all that `order`
    changes in a memory model: `Joins`)."""
    nodes = graph.nodes
    storage_of: dict[str, str] = {}
    alias: dict[str, str] = {}
    # name -> (an ancestor along storage_of, the links to it), left by each walk (path compression):
    # a chain joined one name at a time is n names deep, walked once, not once per name. A join
    # only gives a root a target, so an ancestor stays one.
    shortcut: dict[str, tuple[str, int]] = {}

    def find(name: str) -> tuple[str, int]:
        """(the root owning name's storage, the links of storage_of from name to it)."""
        path = []
        while name in storage_of:
            path.append(name)
            name = shortcut.get(name, (storage_of[name], 1))[0]
        links = 0
        for y in reversed(path):
            links += shortcut.get(y, (storage_of[y], 1))[1]
            shortcut[y] = (name, links)
        return name, links

    def root(name: str) -> str:
        return find(name)[0]

    writes_into: dict[int, list[str]] = {}  # node -> state roots it overwrites in place
    for i, n in enumerate(nodes):
        if (n.domain, n.op_type) in VIEW_OPS and n.inputs and n.outputs:
            storage_of[n.outputs[0]] = n.inputs[0]
            alias[n.outputs[0]] = "view"
        for out_i, in_i in INPLACE_OPS.get((n.domain, n.op_type), []):
            if in_i >= len(n.inputs):
                continue
            writes_into.setdefault(i, []).append(n.inputs[in_i])
            if out_i < len(n.outputs):
                storage_of[n.outputs[out_i]] = n.inputs[in_i]
                alias[n.outputs[out_i]] = "inplace"
    pairs = declared_pairs(graph, inplace or {})
    for out, state in pairs.items():
        r = root(out)
        if r == root(state):
            continue
        if r not in graph.producer:
            raise RoamError(f"in-place pair {out}={state}: {out!r} is itself persistent state")
        storage_of[r] = state
        alias[r] = "inplace"
        writes_into.setdefault(graph.producer[r], []).append(state)
    joins = kernels_in_place(graph, storage_of, find, folded_values(graph), pairs, order, write_over)  # joined as found
    alias.update(dict.fromkeys(joins.all, "inplace"))
    return storage_of, alias, writes_into, pairs, find, joins


def kernel_joins(graph: Graph, inplace: dict[str, str] | None, order: list[int] | None) -> dict[str, str]:
    """The kernel outputs written into their input when the graph runs in `order`: where they are
    a memory model's `kernel_joins`, build(..., order) is that model (a 405B-class step's memory
    model takes seconds; this, a fraction of them)."""
    return sharing(graph, inplace, order)[5].all


def build(graph: Graph, alignment: int = 256, inplace: dict[str, str] | None = None,
          loss: str | None = None, order: list[int] | None = None, write_over: bool = True) -> MemoryModel:
    """The memory model of `graph`. With `order` (node indices, the order it runs in), ONNX
    Runtime's in-place kernels are joined where that order lets them (see kernels_in_place);
    `write_over`: outputs are written over inputs (WRITE_OVER_OPS), unless the order that needs
    would contradict the in-place writers' (then none are)."""
    if alignment <= 0:
        raise RoamError(f"--alignment must be positive, got {alignment}")
    nodes = graph.nodes
    notes: list[str] = []
    tensor_bytes = {name: aligned(v.nbytes, alignment) for name, v in graph.values.items()}
    if sum(tensor_bytes.values()) >= 2**63:  # bounds every byte count a plan can hold
        raise RoamError(f"the model's tensors total {sum(tensor_bytes.values())} bytes, more than a "
                        "64-bit size can hold")

    # --- storage sharing: views, in-place ops, declared update pairs, in-place kernels ----------
    storage_of, alias, writes_into, pairs, find, joins = sharing(graph, inplace, order, write_over)

    def root(name: str) -> str:
        return find(name)[0]

    folded = folded_values(graph)
    if pairs:
        notes.append(f"{len(pairs)} graph outputs update state in place")
    if joins.all:
        notes.append(f"{len(joins.all)} kernel outputs written into their input ({len(joins.all) - len(joins.served)} "
                     f"by ONNX Runtime's in-place kernels, {len(joins.served)} placed there by roam)")

    # --- persistent classes -----------------------------------------------------------------
    state_names = list(graph.inputs) + list(graph.initializers) + sorted(graph.constants)
    persistent: dict[str, str] = {}
    grad_buffers, weights, updated = set(), set(), set()
    for i, targets in writes_into.items():
        n = nodes[i]
        if n.op_type in ACCUMULATOR_OPS or any(accumulates(graph, t) for t in targets):
            grad_buffers.update(root(t) for t in targets)
        elif n.op_type in OPTIMIZER_WEIGHTS_INPUT:
            weights.add(root(n.inputs[OPTIMIZER_WEIGHTS_INPUT[n.op_type]]))
            updated.update(root(t) for t in targets)
        else:
            updated.update(root(t) for t in targets)
    for name in state_names:
        if name in grad_buffers:
            kind = "gradient_buffer"
        elif name in weights or f"{name}_grad" in graph.values:
            kind = "parameter"
        elif name in updated:
            kind = "optimizer_state"
        elif name in graph.constants or name in graph.initializers:
            kind = "constant"
        else:
            kind = "data_input"
        persistent[name] = kind

    # --- node classes -------------------------------------------------------------------------
    accumulating = {i for i, targets in writes_into.items() if any(root(t) in grad_buffers for t in targets)}
    node_class = classify_nodes(graph, set(writes_into), loss, accumulating)
    tiers = read_tiers(graph, persistent)
    if tiers is not None:
        for i in tiers.transfers:
            node_class[i] = "transfer"

    # --- storages and tensor kinds ----------------------------------------------------------
    kind: dict[str, str] = dict(persistent)
    readers: dict[str, set[int]] = {}
    to_end: set[str] = set()
    for name in graph.values:
        r = root(name)
        readers.setdefault(r, set()).update(graph.consumers.get(name, ()))
        if name in graph.outputs and name not in pairs:
            to_end.add(r)
    for r, users in readers.items():  # a storage nothing reads: ONNX Runtime frees it at the end
        if r in graph.producer and not users - {graph.producer[r]}:
            to_end.add(r)
    transient_kind = {"forward": "activation", "backward": "gradient", "update": "update_temp",
                      "accumulate": "gradient", "recompute": "activation", "transfer": "transfer"}
    storages = []
    for i, n in enumerate(nodes):
        for out in n.outputs:
            if out in persistent:
                continue
            if out in storage_of:
                kind[out] = alias[out]
                continue
            kind[out] = transient_kind[node_class[i]]
            if kind[out] != "transfer" and graph.values[out].dtype in INTEGER_TYPES:
                kind[out] = "index"
            storages.append(Storage(out, tensor_bytes[out], kind[out], i, tuple(sorted(readers[out] - {i})),
                                    out in to_end, tiers.node_tier(i) if tiers else DEVICE))
    for name in storage_of:
        kind.setdefault(name, alias[name])

    # --- in-place safety: every other reader of the old value runs before the writer ----------
    aliases_of: dict[str, list[str]] = {}
    for name, target in storage_of.items():
        aliases_of.setdefault(target, []).append(name)
    extra_deps = []
    for writer, targets in sorted(writes_into.items()):
        new_names = names_derived(nodes[writer].outputs, aliases_of)
        for target in targets:
            group = root(target)
            for reader in sorted(readers.get(group, ())):
                # a reader of the old value (under any name) runs first; one that reads the old
                # and the new value closes a cycle, which check_acyclic reports
                if reader != writer and any(x not in new_names and root(x) == group for x in nodes[reader].inputs):
                    extra_deps.append((reader, writer))
    preds = [set() for _ in nodes]
    for i, n in enumerate(nodes):
        preds[i].update(graph.producer[x] for x in n.inputs if x in graph.producer)
    for a, b in extra_deps:
        preds[b].add(a)
    run_preds = [tuple(sorted(p)) for p in preds]
    extra_deps += joins.deps
    for a, b in joins.deps:
        preds[b].add(a)
    if joins.deps and stuck(preds) is not None:
        return build(graph, alignment, inplace, loss, order, write_over=False)
    check_acyclic(graph, preds)
    eager = {i: graph.producer.get(n.inputs[0]) for i, n in enumerate(nodes)
             if (n.domain, n.op_type) in EAGER_OPS and n.inputs and n.inputs[0] not in folded}
    return MemoryModel(alignment, len(nodes), tensor_bytes, kind, {n: root(n) for n in graph.values},
                       alias, persistent, storages, node_class, extra_deps,
                       [tuple(sorted(p)) for p in preds], notes, tiers, eager, joins.all, joins.served, run_preds)


def read_tiers(graph: Graph, persistent: dict[str, str]) -> Tiers | None:
    """The model's TIERS_KEY, checked against the graph; None when it has none."""
    if TIERS_KEY not in graph.metadata:
        return None
    index = graph.node_index()
    try:
        meta = json.loads(graph.metadata[TIERS_KEY])
        slow, transfers = meta["tier"], meta["transfers"]
        host_nodes, homes = meta.get("host_nodes", []), meta.get("homes", [])
        assert slow in SLOW_TIERS and isinstance(transfers, dict)
        assert all(d in ("to_host", "to_device") for d in transfers.values())
    except (ValueError, KeyError, TypeError, AssertionError):
        raise RoamError(f"model metadata {TIERS_KEY!r} is not roam's record of tiers "
                        "({tier, transfers: {node: to_host|to_device}, host_nodes, homes})") from None
    unknown = next((n for n in [*transfers, *host_nodes] if n not in index), None)
    if unknown is not None:
        raise RoamError(f"model metadata {TIERS_KEY!r} names node {unknown!r}, which the model does not have")
    stray = next((t for t in homes if t not in persistent), None)
    if stray is not None:
        raise RoamError(f"model metadata {TIERS_KEY!r} keeps {stray!r} in the {slow} tier, "
                        "but it is not a persistent tensor of the model")
    return Tiers(slow, {index[n]: d for n, d in transfers.items()}, frozenset(index[n] for n in host_nodes),
                 frozenset(homes))


@dataclass
class Joins:
    """Kernel outputs written into an input: `all` (output -> input), and `served`, those of them
    roam's allocator places (WRITE_OVER_OPS), the rest ONNX Runtime's own in-place kernels; `deps`,
    (a, b): node a must run before node b, which writes over what a reads."""
    all: dict[str, str] = field(default_factory=dict)
    served: dict[str, str] = field(default_factory=dict)
    deps: list[tuple[int, int]] = field(default_factory=list)


def kernels_in_place(graph: Graph, storage_of: dict[str, str], find, folded: set[str], pairs: dict[str, str],
                     order: list[int] | None = None, write_over: bool = True) -> Joins:
    """The kernel outputs written into an input. ONNX Runtime's in-place kernels (MAY_OVERWRITE)
    write output 0 into input 0 where its planner would: the node reads the input's storage once,
    and last (ORT counts the uses left when the node runs, so a recomputing copy, which reads a
    saved value after the forward's reader, writes into it). WRITE_OVER_OPS (with `write_over`)
    write output 0 over any input of its shape that they read last. Last: the input's other
    readers come before the node in the file (a topological order), and from now on before it in
    every order (`deps`, where they are not its ancestors already): the joins are the model's own,
    so the order search counts what they save and its bound holds for the plan it makes. With
    `order`, ORT's kernels are also joined where that order runs them last (ORT's planner follows
    the order the step runs in). The storage is a node's transient output holding no graph output
    nor a value ORT folds from constants (`folded`), or, for WRITE_OVER_OPS, a state the step
    writes its new value into (`pairs`: output -> state), whose old value is then the input's,
    and whose writer reads the output. Input and output have the same shape and element size. Nodes are taken in the file's
    order, then, for what `order` adds, in `order`, so a chain (Add -> Relu -> Tanh) joins one
    storage step by step. `find(name)`: (the root of name's storage, the links of storage_of from
    name to it)."""
    outputs = set(graph.outputs)
    pos = {i: k for k, i in enumerate(order or ())}
    aliases_of: dict[str, list[str]] = {}
    for name, target in storage_of.items():
        aliases_of.setdefault(target, []).append(name)
    # a donated state's new value: its names are read after its writer, so they are not the input's
    writer: dict[str, int] = {}  # donated state root -> the node writing its new value
    new_value: set[str] = set()
    for out, state in pairs.items():
        made = out
        while made in storage_of and storage_of[made] != state:
            made = storage_of[made]  # the writer's own output, which the pair joined to the state
        if made in graph.producer:
            writer[find(state)[0]] = graph.producer[made]
            new_value |= names_derived((made,), aliases_of)
    # Per storage root, over the names in it: whether one is a graph output, and the nodes reading
    # one that a later join must find before it. A join adds the output's storage to the input's,
    # whose readers are disjoint (the output's come after the node; the input's, where it may join,
    # are the node and nodes before it): the figures add up, and no storage's names are walked again.
    holds_output: dict[str, bool] = {}
    users: dict[str, set[int]] = {}
    for name in graph.values:
        r = find(name)[0]
        holds_output[r] = holds_output.get(r, False) or name in outputs
        if name not in new_value:
            users.setdefault(r, set()).update(graph.consumers.get(name, ()))
    found = Joins()

    def join(i: int, ordered: bool) -> None:
        """Node i's output written into an input where the rules allow; `ordered`: ORT's kernels
        where `order` lets them (and no WRITE_OVER_OPS, which no order decides)."""
        n = graph.nodes[i]
        hint = MAY_OVERWRITE.get((n.domain, n.op_type))
        served = write_over and not ordered and hint is None and (n.domain, n.op_type) in WRITE_OVER_OPS and n.outputs
        if served:
            candidates = range(len(n.inputs))
        elif hint is None or max(hint) >= min(len(n.inputs), len(n.outputs)):
            return
        else:
            candidates = [hint[1]]
        out = n.outputs[0] if served else n.outputs[hint[0]]
        if not out or out in outputs or out in storage_of:
            return
        for k in candidates:
            x = n.inputs[k]
            if not x:
                continue
            r, links = find(x)
            donated = served and r in writer and writer[r] != i
            if r in folded or not (donated or (r in graph.producer and not holds_output[r])):
                continue
            a, b = graph.values[x], graph.values[out]
            if a.shape != b.shape or element_size(a.dtype) != element_size(b.dtype):
                continue
            same = [y for y in n.inputs if y and find(y)[0] == r]
            others = users[r] - {i}
            if served:
                # every name of the storage it reads has the output's shape (none read broadcast, after
                # its elements are written); the output's readers before a state's writer, which
                # overwrites it
                if any(graph.values[y].shape != b.shape for y in same):
                    continue
                if donated and not (writer[r] > i and all(u <= writer[r] for u in graph.consumers.get(out, ()))):
                    continue
            elif len(same) != 1:
                continue
            # its other readers come first: in the file, from now on in every order; or in `order`
            if any(pos[u] > pos[i] for u in others) if ordered else any(u > i for u in others):
                continue
            if not ordered:
                found.deps += [(u, i) for u in sorted(not_ancestors(graph, i, others))]
            found.all[out] = x
            if served:
                found.served[out] = x
            storage_of[out] = x  # later nodes see the joined storage
            holds_output[r] |= holds_output.pop(out)
            # its readers from now on: node i and the output's. The input's others run before node i
            # in every order (the checks above), and i before any later reader of the storage (they
            # read the output): a chain joined step by step keeps one reader, not all of them
            users[r] = {i} | users.pop(out, set())
            return

    for i in range(len(graph.nodes)):  # the file's order: topological
        join(i, False)
    for i in order or ():
        join(i, True)
    return found


def not_ancestors(graph: Graph, i: int, others: set[int]) -> set[int]:
    """The nodes of `others` (before node i in the file, a topological order) not found among
    node i's ancestors within ANCESTOR_SEARCH nodes of a search up from it, which passes no node
    before the first of them (a farther one gets an edge it did not need)."""
    left, seen, stack = set(others), {i}, [i]
    lowest = min(others, default=i)
    while left and stack and len(seen) <= ANCESTOR_SEARCH:
        for x in graph.nodes[stack.pop()].inputs:
            u = graph.producer.get(x)
            if u is not None and u >= lowest and u not in seen:
                seen.add(u)
                left.discard(u)
                stack.append(u)
    return left


def folded_values(graph: Graph) -> set[str]:
    """Initializers, constants, and the values computed from them alone: ONNX Runtime folds these
    into initializers at the session's start and holds them itself, outside any arena."""
    folded = set(graph.constants) | set(graph.initializers)
    for n in graph.nodes:
        if n.inputs and all(x in folded for x in n.inputs if x):
            folded.update(n.outputs)
    return folded


def accumulates(graph: Graph, state: str) -> bool:
    """A state updated in place that an Add sums with a gradient (`*_grad`): a gradient
    accumulation buffer written in standard ONNX (`roam lower`'s InPlaceAccumulatorV2)."""
    return any(graph.nodes[i].op_type == "Add" and any(x.endswith("_grad") for x in graph.nodes[i].inputs)
               for i in graph.consumers.get(state, ()))


def check_acyclic(graph: Graph, preds: list[set[int]]) -> None:
    """The data edges are acyclic (import checked); an in-place rule can still close a cycle:
    a node that must read a state's old value but depends on the state's new value."""
    i = stuck(preds)
    if i is not None:
        raise RoamError(f"in-place updates cannot be honoured: node {graph.nodes[i].name!r} would have to read a "
                        "state both before and after it is overwritten")


def stuck(preds: list[set[int]]) -> int | None:
    """A node on a cycle of `preds`, or None when they have none."""
    indegree = [len(p) for p in preds]
    users: list[list[int]] = [[] for _ in preds]
    for b, ps in enumerate(preds):
        for a in ps:
            users[a].append(b)
    ready = [i for i, d in enumerate(indegree) if d == 0]
    seen = 0
    while ready:
        i = ready.pop()
        seen += 1
        for u in users[i]:
            indegree[u] -= 1
            if indegree[u] == 0:
                ready.append(u)
    return next((i for i, d in enumerate(indegree) if d > 0), None) if seen < len(preds) else None


def names_derived(outputs: tuple[str, ...], aliases_of: dict[str, list[str]]) -> set[str]:
    """The writer's outputs and every view or alias taken of them: names of the new value."""
    found, stack = set(), list(outputs)
    while stack:
        name = stack.pop()
        if name not in found:
            found.add(name)
            stack.extend(aliases_of.get(name, ()))
    return found


def classify_nodes(graph: Graph, writers: set[int], loss: str | None, accumulating: set[int]) -> list[str]:
    """forward: the loss's ancestors; accumulate: gradient accumulators; update: optimizer steps
    and the chains feeding only them, up to a collective; recompute: copies roam added
    (RECOMPUTE_KEY); backward: the rest."""
    nodes = graph.nodes
    if loss is None:
        loss = next((o for o in graph.outputs if o in graph.producer and graph.values[o].nbytes
                     and len(graph.values[o].shape) <= 1 and sum(graph.values[o].shape) <= 1
                     and graph.values[o].dtype in (1, 10, 11, 16)), None)
    elif loss not in graph.producer:
        raise RoamError(f"--loss {loss!r} is not a tensor any node produces")
    forward: set[int] = set()  # the loss's ancestors (none when the graph has no loss)
    stack = [graph.producer[loss]] if loss is not None else []
    while stack:
        i = stack.pop()
        if i not in forward:
            forward.add(i)
            stack.extend(graph.producer[x] for x in nodes[i].inputs if x in graph.producer)
    rest = "backward" if loss is not None else "forward"
    classes = ["forward" if i in forward else rest for i in range(len(nodes))]
    for i in writers:
        classes[i] = "accumulate" if i in accumulating else "update"
    copies = recompute_copies(graph)
    for i, n in enumerate(nodes):
        if n.name in copies:
            classes[i] = "recompute"
    for i in reversed(range(len(nodes))):
        # a rank step's reduce-scatter makes the gradient its rank updates with (roam shard): backward
        if (i in forward or i in writers or classes[i] == "recompute"
                or any(o.endswith("_grad") for o in nodes[i].outputs)
                or (nodes[i].domain, nodes[i].op_type) in COLLECTIVES):
            continue
        users = {u for o in nodes[i].outputs for u in graph.consumers.get(o, ())}
        if users and all(classes[u] == "update" for u in users):
            classes[i] = "update"
    return classes


def recompute_copies(graph: Graph) -> dict[str, str]:
    """{copy node: original node} of the nodes roam added to recompute values (RECOMPUTE_KEY)."""
    try:
        copies = json.loads(graph.metadata.get(RECOMPUTE_KEY, "{}"))
        assert isinstance(copies, dict)
    except (ValueError, AssertionError):
        raise RoamError(f"model metadata {RECOMPUTE_KEY!r} is not a JSON object of copy -> original node") from None
    return copies


def lifetimes(mm: MemoryModel, order: list[int]) -> list[tuple[int, int]]:
    """[first, last] step of every transient storage (same index as mm.storages) under `order`."""
    pos = [0] * len(order)
    for step, i in enumerate(order):
        pos[i] = step
    last_step = len(order) - 1
    out = []
    for s in mm.storages:
        first = pos[s.producer]
        last = last_step if s.to_end else max((pos[r] for r in s.readers), default=first)
        out.append((first, max(first, last)))
    return out


def peak_live(mm: MemoryModel, spans: list[tuple[int, int]], tier: str = DEVICE) -> tuple[int, int]:
    """(peak transient bytes in `tier`, first step where it occurs) for storage spans from `lifetimes`."""
    delta = [0] * (mm.num_nodes + 1)
    for s, (first, last) in zip(mm.storages, spans):
        if s.tier != tier:
            continue
        delta[first] += s.bytes
        delta[last + 1] -= s.bytes
    live = peak = peak_step = 0
    for step in range(mm.num_nodes):
        live += delta[step]
        if live > peak:
            peak, peak_step = live, step
    return peak, peak_step
