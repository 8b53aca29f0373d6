"""`roam verify`: an independent check of a plan against the model it claims to plan.

Shares nothing with the planners but the loader (`onnx_import`) and the pair check (`pair`):
lifetimes, aliasing and overlaps are recomputed here from the order and the node list alone.
The invariants are `RULES`, one small function each, run in order over one `Facts`; the first
broken one is the answer.

A rank step (DESIGN.md, "Sharded steps") says so in its metadata (SHARDING_KEY, read here on its
own): its plan names the same ranks, and its collectives gather and reduce over that many.

Tiers (DESIGN.md, "Memory tiers"): a model with a slower memory says so in its metadata
(TIERS_KEY, read here on its own). A transfer reads one tier and writes the other; a node the
host runs reads and writes the slow tier; every other node the device. A persistent tensor lives
in the slow tier iff the record keeps it there, a transient one in the tier its producer writes,
a view or in-place result in its base's. Each tier is checked as its own arena."""

import bisect
import heapq
import itertools
import json
from dataclasses import dataclass, field

from roam_cli import pair
from roam_cli.core.errors import CheckFailed
from roam_cli.core.graph import Graph, Node, element_size

# Ops whose output may share its input's storage (the planners' list is not imported on purpose).
VIEWS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"}
# Elementwise ops whose output a runtime may place over an input of the output's shape (plan field
# `written_over`): their kernels read element i of every input before writing element i.
WRITTEN_OVER = {"Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Neg", "Reciprocal", "Abs", "Exp", "Log"}
# How a plan may recompute a Dropout's output: ONNX Runtime's DropoutGrad on its input and mask.
DROPOUT_REPLAY = ("com.microsoft", "DropoutGrad")
STANDARD_REPLAY = {("", "Sub"), ("", "Where"), ("", "Div")}  # a Dropout's replay in standard ONNX
PERSISTENT = {"parameter", "optimizer_state", "gradient_buffer", "constant", "data_input"}
# The model's record of tiers: {"tier": "host" | "storage", "transfers": {node: "to_host" |
# "to_device"}, "host_nodes": [node], "homes": [persistent tensor kept in the slow tier]}
TIERS_KEY = "roam.tiers"
DEVICE = "device"
SLOW_TIERS = ("host", "storage")
TRANSFER_OP = "Expand"  # a transfer copies its input: Expand to the input's own shape
SHAPE_READERS = {("", "Shape"), ("", "Size")}  # they read a tensor's shape, not its bytes: from any tier
# A rank step's record ({"ranks": N, ...}) and its collectives: (domain, op) -> (the whole buffer, the
# rank's part): an all-gather's output and input, a reduce-scatter's input and output
SHARDING_KEY = "roam.sharding"
COLLECTIVES = {("com.microsoft", "AllGather"): ("output", "input"),
               ("ai.roam.collective", "ReduceScatter"): ("input", "output")}
PLAN_NAMES = {("com.microsoft", "AllGather"): "all_gather", ("ai.roam.collective", "ReduceScatter"): "reduce_scatter"}


class Violation(Exception):
    pass


@dataclass
class Summary:
    nodes: int
    placed: int
    arena: int  # the device's
    peak_live: int
    slow: dict | None = None  # with tiers: {tier, placed, arena_bytes, peak_live_bytes, transfers}


@dataclass(frozen=True)
class Tiers:
    slow: str
    transfers: dict[str, str]  # node -> "to_host" | "to_device"
    host_nodes: frozenset[str]
    homes: frozenset[str]

    def sides(self, node: str) -> tuple[str, str]:
        """(the tier node reads, the tier it writes)."""
        direction = self.transfers.get(node)
        if direction is not None:
            return (DEVICE, self.slow) if direction == "to_host" else (self.slow, DEVICE)
        return (self.slow, self.slow) if node in self.host_nodes else (DEVICE, DEVICE)


@dataclass
class Facts:
    """What the rules read: the model and the plan, and what the rules before have established
    (each rule records what it checked for those after it, so nothing is derived twice)."""
    graph: Graph
    sha256: str
    plan: dict
    step: dict[str, int] = field(default_factory=dict)  # node -> its step in the order
    produced_at: dict[str, int] = field(default_factory=dict)  # tensor -> the step making it
    readers: dict[str, list[int]] = field(default_factory=dict)  # tensor -> the steps reading it
    producer: dict[str, Node] = field(default_factory=dict)  # tensor -> the node making it
    folded: set[str] = field(default_factory=set)  # what ORT computes at load
    tiers: Tiers | None = None
    tensors: dict[str, dict] = field(default_factory=dict)  # the plan's records by name
    roots: dict[str, str] = field(default_factory=dict)  # name -> the name owning its storage
    group: dict[str, list[str]] = field(default_factory=dict)  # storage -> its names
    tier_of: dict[str, str] = field(default_factory=dict)
    stated: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # tier -> arena, peak, persistent
    placed: dict[str, list] = field(default_factory=dict)  # tier -> (first, last, offset, bytes, name)
    scratch: list = field(default_factory=list)  # the device's workspace, as placed
    peaks: dict[str, int] = field(default_factory=dict)

    @property
    def last(self) -> int:
        return len(self.plan["order"]) - 1

    def root(self, name: str) -> str:
        """The name owning `name`'s storage; each chain of aliases is walked once."""
        seen, path = set(), []
        while name not in self.roots and "alias_of" in self.tensors[name]:
            if name in seen:
                raise Violation(f"alias_of chain through {name!r} is a cycle")
            seen.add(name)
            path.append(name)
            target = self.tensors[name]["alias_of"]
            if target not in self.tensors:
                raise Violation(f"{name!r} is alias_of {target!r}, which the plan does not list")
            name = target
        found = self.roots.get(name, name)
        self.roots.update(dict.fromkeys(path, found))
        return found

    def arena_name(self, tier: str) -> str:
        return "arena" if self.tiers is None else f"{tier} arena"


def the_plan_is_this_models(f: Facts) -> None:
    if pair.member(f.plan, f.sha256) is None:
        raise Violation(pair.refusal(f.plan, f.sha256))


def each_node_once_in_the_order(f: Facts) -> None:
    for s, name in enumerate(f.plan["order"]):
        if name in f.step:
            raise Violation(f"node {name!r} appears twice in the order")
        f.step[name] = s
    missing = [n.name for n in f.graph.nodes if n.name not in f.step]
    if missing:
        raise Violation(f"node {missing[0]!r} is missing from the order ({len(missing)} missing)")
    known = {n.name for n in f.graph.nodes}
    extra = [n for n in f.plan["order"] if n not in known]
    if extra:
        raise Violation(f"order names node {extra[0]!r}, which the model does not have")


def each_input_made_before_it_is_read(f: Facts) -> None:
    for node in f.graph.nodes:
        for out in node.outputs:
            f.produced_at[out] = f.step[node.name]
            f.producer[out] = node
        for inp in node.inputs:
            f.readers.setdefault(inp, []).append(f.step[node.name])
    for node in f.graph.nodes:
        for inp in node.inputs:
            if inp in f.produced_at and f.produced_at[inp] >= f.step[node.name]:
                raise Violation(f"node {node.name!r} at step {f.step[node.name]} reads {inp!r} before it is "
                                f"produced (step {f.produced_at[inp]})")


def shape_nodes_run_first(f: Facts) -> None:
    f.folded = folded_at_load(f.graph)
    check_shape_nodes_first(f.graph, f.plan["order"], f.step, f.produced_at, f.folded)


def collectives_are_the_ranks(f: Facts) -> None:
    check_sharding(f.graph, f.plan)


def tiers_are_the_models(f: Facts) -> None:
    f.tiers = read_tiers(f.graph, f.plan)


def copies_recompute_their_originals(f: Facts) -> None:
    if "recompute" not in f.plan:
        return
    # a transfer's output is its input in another tier: a copy may read either where its original reads one
    moved = {n.outputs[0]: n.inputs[0] for n in f.graph.nodes
             if f.tiers is not None and n.name in f.tiers.transfers and n.inputs and n.outputs}
    check_recompute(f.graph, f.plan["recompute"], f.step, moved)


def each_tensor_listed_with_its_bytes(f: Facts) -> None:
    for t in f.plan["tensors"]:
        if t["name"] in f.tensors:
            raise Violation(f"tensor {t['name']!r} is listed twice")
        if t["name"] not in f.graph.values:
            raise Violation(f"tensor {t['name']!r} is not in the model")
        f.tensors[t["name"]] = t
    for name, value in f.graph.values.items():
        if name not in f.tensors:
            raise Violation(f"tensor {name!r} is not in the plan")
        if f.tensors[name]["bytes"] < value.nbytes:
            raise Violation(f"tensor {name!r} needs {value.nbytes} bytes, plan gives {f.tensors[name]['bytes']}")


def aliases_are_their_nodes(f: Facts) -> None:
    """An alias is made by a node that may share its input's storage (a view, an in-place
    write); a tensor without an offset is persistent and made by no node but a Constant."""
    for name, t in f.tensors.items():
        r = f.root(name)
        f.group.setdefault(r, []).append(name)
        node = f.producer.get(name)
        if "alias_of" in t:
            if t["offset"] is not None:
                raise Violation(f"alias {name!r} has an offset of its own")
            if node is None:
                raise Violation(f"{name!r} is not produced by any node, so it cannot be an alias")
            if t["kind"] == "view" and (node.op_type not in VIEWS or f.root(node.inputs[0]) != r):
                raise Violation(f"{name!r} is marked a view of {t['alias_of']!r}, but {node.op_type} "
                                f"node {node.name!r} does not make views")
            if "written_over" in t:
                check_written_over(f.graph, name, t, node,
                                   [x for x in node.inputs if x in f.tensors and f.root(x) == r])
        elif t["offset"] is None:
            if t["kind"] not in PERSISTENT:
                raise Violation(f"transient tensor {name!r} has no offset")
            if node is not None and node.op_type != "Constant":
                raise Violation(f"{name!r} is produced by node {node.name!r} but marked persistent "
                                f"({t['kind']}) with no offset")


def nothing_reads_what_an_in_place_write_replaced(f: Facts) -> None:
    """Per storage, its names by the step defining them, with the latest read of any defined so
    far: whether a writer's is late is one search, not a walk over the storage's names."""
    latest: dict[str, tuple[list[int], list[int]]] = {}
    for name, t in f.tensors.items():
        if t.get("kind") != "inplace" or "alias_of" not in t:
            continue
        w = f.step[f.producer[name].name]
        r = f.root(name)
        if r not in latest:
            by_step = sorted((f.produced_at.get(n, -1), max(f.readers.get(n, [-1]))) for n in f.group[r])
            latest[r] = [d for d, _ in by_step], list(itertools.accumulate((read for _, read in by_step), max))
        steps, last_read = latest[r]
        before = bisect.bisect_left(steps, w)  # the names defined before the writer
        if not before or last_read[before - 1] <= w:
            continue
        for other in f.group[r]:  # the late read, named as the first of the storage's names read late
            if other == name or f.produced_at.get(other, -1) >= w:
                continue
            late = [s for s in f.readers.get(other, []) if s > w]
            if late:
                raise Violation(f"{name!r} overwrites the storage of {other!r} at step {w}, but {other!r} "
                                f"is read at step {late[0]}")


def each_tensor_in_its_tier(f: Facts) -> None:
    f.tier_of = check_tiers(f.graph, f.tiers, f.tensors, f.group, f.root, f.folded)
    f.stated = {DEVICE: (f.plan["arena_bytes"], f.plan["peak_live_bytes"], f.plan["persistent_bytes"])}
    if f.tiers is not None:
        slow = f.plan["tiers"]
        f.stated[f.tiers.slow] = (slow["arena_bytes"], slow["peak_live_bytes"], slow["persistent_bytes"])


def lifetimes_cover_every_use(f: Facts) -> None:
    """A storage lives from its producer's step to its last reader's (to the end when it is a
    graph output, or when nothing reads it: the runtime frees it then)."""
    outputs = set(f.graph.outputs)
    f.placed = {tier: [] for tier in f.stated}
    for r, names in f.group.items():
        t = f.tensors[r]
        if t["offset"] is None:
            continue
        first = f.produced_at.get(r)
        if first is None:
            raise Violation(f"{r!r} has an arena offset but no node produces it")
        need_last = first
        for n in names:
            need_last = max([need_last] + f.readers.get(n, []))
            if n in outputs and f.tensors[n].get("kind") != "inplace":
                need_last = f.last
        if not any(f.readers.get(n) for n in names):
            need_last = f.last
        if t["first_step"] > first or t["last_step"] < need_last:
            raise Violation(f"{r!r} lives over steps {t['first_step']}..{t['last_step']} in the plan, but is "
                            f"used over {first}..{need_last}")
        if t["last_step"] > f.last:
            raise Violation(f"{r!r} lives until step {t['last_step']}, past the plan's last step {f.last}")
        f.placed[f.tier_of[r]].append((t["first_step"], t["last_step"], t["offset"], t["bytes"], r))


def workspace_at_its_nodes_step(f: Facts) -> None:
    for w in f.plan.get("workspace", ()):
        if f.step.get(w["node"]) != w["step"]:
            raise Violation(f"workspace of {w['node']!r} is at step {w['step']}, but the node is at step "
                            f"{f.step.get(w['node'], 'none')}")
        f.scratch.append((w["step"], w["step"], w["offset"], w["bytes"], f"workspace of {w['node']!r}"))


def placements_aligned_inside_their_arena(f: Facts) -> None:
    alignment = f.plan["alignment"]
    for tier, placed in f.placed.items():
        for _, _, offset, size, r in placed:
            check_placement(repr(r), offset, size, alignment, f.stated[tier][0], f.arena_name(tier))
    for _, _, offset, size, where in f.scratch:
        check_placement(where, offset, size, alignment, f.stated[DEVICE][0], f.arena_name(DEVICE))


def no_two_live_tensors_overlap(f: Facts) -> None:
    for tier, placed in f.placed.items():
        check_overlaps(placed + (f.scratch if tier == DEVICE else []))


def stated_peaks_are_the_tensors(f: Facts) -> None:
    for tier, (_, stated_peak, _) in f.stated.items():
        f.peaks[tier] = peak_live(f.placed[tier], f.last)
        if stated_peak != f.peaks[tier]:
            where = "" if f.tiers is None else f" in the {tier} tier"
            raise Violation(f"plan states peak live {stated_peak} bytes{where}; its tensors give {f.peaks[tier]}")


def stated_persistent_bytes_are_the_tensors(f: Facts) -> None:
    for tier, (_, _, stated_persistent) in f.stated.items():
        persistent = sum(t["bytes"] for name, t in f.tensors.items()
                         if t["offset"] is None and "alias_of" not in t and f.tier_of[name] == tier)
        if stated_persistent != persistent:
            where = "" if f.tiers is None else f" in the {tier} tier"
            raise Violation(f"plan states {stated_persistent} persistent bytes{where}; its tensors give {persistent}")


def transfers_are_the_models(f: Facts) -> None:
    if f.tiers is not None:
        check_transfer_records(f.graph, f.tiers, f.plan.get("offload", {}).get("transfers", ()), f.step, f.readers)


# The invariants a plan must hold, checked in this order: the first broken one is the answer. Each
# rule raises Violation with its own message and may rely on what the rules above it established.
RULES = (
    the_plan_is_this_models,
    each_node_once_in_the_order,
    each_input_made_before_it_is_read,
    shape_nodes_run_first,
    collectives_are_the_ranks,
    tiers_are_the_models,
    copies_recompute_their_originals,
    each_tensor_listed_with_its_bytes,
    aliases_are_their_nodes,
    nothing_reads_what_an_in_place_write_replaced,
    each_tensor_in_its_tier,
    lifetimes_cover_every_use,
    workspace_at_its_nodes_step,
    placements_aligned_inside_their_arena,
    no_two_live_tensors_overlap,
    stated_peaks_are_the_tensors,
    stated_persistent_bytes_are_the_tensors,
    transfers_are_the_models,
)


def verify(graph: Graph, sha256: str, plan: dict) -> Summary:
    """Raise Violation naming the first broken rule; return a summary when the plan holds.
    `sha256` is the model file's: either member of the plan's pair passes."""
    f = Facts(graph, sha256, plan)
    for rule in RULES:
        rule(f)
    summary = Summary(len(graph.nodes), len(f.placed[DEVICE]), f.stated[DEVICE][0], f.peaks[DEVICE])
    if f.tiers is not None:
        slow = f.tiers.slow
        summary.slow = {"tier": slow, "placed": len(f.placed[slow]), "arena_bytes": f.stated[slow][0],
                        "peak_live_bytes": f.peaks[slow], "transfers": len(f.tiers.transfers)}
    return summary


def check_written_over(graph: Graph, name: str, t: dict, node: Node, same_storage: list[str]) -> None:
    """An output placed over an input of its node: an elementwise op's, over an input of the
    output's shape and element size in the same storage, no name of which the node reads
    broadcast (it would read elements it has written). That nothing reads the input afterwards is
    the in-place rule's check."""
    over = t["written_over"]
    where = f"{name!r} is written over {over!r}"
    if t["kind"] != "inplace" or node.domain not in ("", "ai.onnx") or node.op_type not in WRITTEN_OVER:
        raise Violation(f"{where}, but {node.op_type} node {node.name!r} does not write elementwise over an input")
    if over not in same_storage:
        raise Violation(f"{where}, which is not an input of node {node.name!r} in the storage it shares")
    out = graph.values[name]
    a = graph.values[over]
    if a.shape != out.shape or element_size(a.dtype) != element_size(out.dtype):
        raise Violation(f"{where}, but their shapes or element sizes differ ({a.shape} vs {out.shape})")
    broadcast = next((x for x in same_storage if graph.values[x].shape != out.shape), None)
    if broadcast is not None:
        raise Violation(f"{where}, but node {node.name!r} also reads {broadcast!r} of that storage broadcast")


def peak_live(placed: list[tuple[int, int, int, int, str]], last: int) -> int:
    delta = [0] * (last + 2)
    for first, end, _, size, _ in placed:
        delta[first] += size
        delta[end + 1] -= size
    live = peak = 0
    for s in range(last + 1):
        live += delta[s]
        peak = max(peak, live)
    return peak


def check_sharding(graph: Graph, plan: dict) -> None:
    """A plan for a rank step names its ranks, those of the model's record; a plan for any other
    step names none. Each collective's whole buffer is that many times the rank's part, and the
    plan's count and bytes of each kind of collective are the graph's."""
    recorded, planned = graph.metadata.get(SHARDING_KEY), plan.get("sharding")
    if recorded is None and planned is None:
        return
    try:
        ranks = json.loads(recorded)["ranks"] if recorded is not None else None
        assert ranks is None or isinstance(ranks, int) and ranks >= 1
    except (ValueError, KeyError, TypeError, AssertionError):
        raise Violation(f"the model's metadata {SHARDING_KEY!r} is not a record of a rank step ({{ranks, ...}})") from None
    if ranks is None or planned is None or planned["ranks"] != ranks:
        model = "is not a rank step" if ranks is None else f"is the step of one of {ranks} ranks"
        made = "records no sharding" if planned is None else f"is for {planned['ranks']} ranks"
        raise Violation(f"the plan {made}, but the model {model} ({SHARDING_KEY!r})")
    moved = {name: {"count": 0, "bytes": 0} for name in PLAN_NAMES.values()}
    for n in graph.nodes:
        sides = COLLECTIVES.get((n.domain, n.op_type))
        if sides is None:
            continue
        whole, part = (graph.values[(n.outputs if side == "output" else n.inputs)[0]] for side in sides)
        if whole.nbytes != ranks * part.nbytes:
            raise Violation(f"collective {n.name!r} ({n.op_type}) moves {whole.nbytes} bytes for a part of "
                            f"{part.nbytes}: not {ranks} ranks'")
        moved[PLAN_NAMES[(n.domain, n.op_type)]]["count"] += 1
        moved[PLAN_NAMES[(n.domain, n.op_type)]]["bytes"] += whole.nbytes
    for name, figures in moved.items():
        listed = planned.get("communication", {}).get(name)
        if listed is not None and (listed["count"], listed["bytes"]) != (figures["count"], figures["bytes"]):
            raise Violation(f"the plan lists {listed['count']} {name} collectives of {listed['bytes']} bytes; the model "
                            f"has {figures['count']} of {figures['bytes']}")


def read_tiers(graph: Graph, plan: dict) -> Tiers | None:
    """The model's record of tiers (None: one memory, the device's), which the plan's `tiers`
    must match; each transfer a copy of its input."""
    recorded, planned = graph.metadata.get(TIERS_KEY), plan.get("tiers")
    if recorded is None or planned is None:
        if recorded is not None or planned is not None:
            raise Violation(f"the plan has {'no' if planned is None else 'a ' + str(planned.get('slow'))} slow tier, "
                            f"but the model's metadata {'records' if recorded is not None else 'has no'} "
                            f"tiers ({TIERS_KEY!r})")
        return None
    try:
        meta = json.loads(recorded)
        tiers = Tiers(meta["tier"], dict(meta["transfers"]), frozenset(meta.get("host_nodes", ())),
                      frozenset(meta.get("homes", ())))
        assert tiers.slow in SLOW_TIERS and set(tiers.transfers.values()) <= {"to_host", "to_device"}
    except (ValueError, KeyError, TypeError, AssertionError):
        raise Violation(f"the model's metadata {TIERS_KEY!r} is not a record of tiers "
                        "({tier, transfers: {node: to_host|to_device}, host_nodes, homes})") from None
    if planned.get("slow") != tiers.slow:
        raise Violation(f"the plan's slow tier is {planned.get('slow')!r}, the model's {tiers.slow!r}")
    nodes = {n.name: n for n in graph.nodes}
    unknown = next((n for n in [*tiers.transfers, *tiers.host_nodes] if n not in nodes), None)
    if unknown is not None:
        raise Violation(f"the model's {TIERS_KEY!r} names node {unknown!r}, which the model does not have")
    if "host_nodes" in planned and set(planned["host_nodes"]) != tiers.host_nodes:
        raise Violation(f"the plan's host nodes differ from those the model's {TIERS_KEY!r} names")
    for name in tiers.transfers:
        n = nodes[name]
        source, copy = graph.values.get(n.inputs[0] if n.inputs else ""), graph.values.get(n.outputs[0])
        if n.op_type != TRANSFER_OP or len(n.outputs) != 1 or source is None or copy is None \
                or (source.dtype, source.shape) != (copy.dtype, copy.shape):
            raise Violation(f"transfer {name!r} is not a copy of its input ({TRANSFER_OP} to the input's own shape)")
    return tiers


def check_tiers(graph: Graph, tiers: Tiers | None, tensors: dict[str, dict], group: dict[str, list[str]],
                root, folded: set[str]) -> dict[str, str]:
    """Each tensor's tier (name -> tier), after checking that the plan says the same and that
    every node reads and writes only the tier it runs in (what ORT folds at load, `folded`, from
    any tier). A tensor of no bytes is in no tier."""
    def sides(node: str) -> tuple[str, str]:
        return (DEVICE, DEVICE) if tiers is None else tiers.sides(node)

    homes = frozenset() if tiers is None else tiers.homes
    producer = {out: n.name for n in graph.nodes for out in n.outputs}
    stray = next((h for h in sorted(homes) if h not in tensors or tensors[h]["offset"] is not None
                  or "alias_of" in tensors[h]), None)
    if stray is not None:
        raise Violation(f"the model keeps {stray!r} in the {tiers.slow} tier, but the plan has no persistent tensor "
                        "of that name")
    tier_of = {}
    for r, members in group.items():
        if tensors[r]["offset"] is None:
            tier = tiers.slow if r in homes else DEVICE
        else:
            tier = sides(producer[r])[1] if r in producer else DEVICE  # no producer: refused where it is placed
        for name in members:
            tier_of[name] = tier
            said = tensors[name].get("tier")
            if (said or DEVICE) != tier and (said is not None or name == r):
                raise Violation(f"the plan puts {name!r} in the {said or DEVICE} tier, but it lives in the {tier} "
                                f"tier ({'kept there by the model' if r in homes else 'where its producer writes'})")
    if tiers is None:
        return tier_of
    for n in graph.nodes:  # ORT holds what it folds at load itself: a node of either tier reads it where it is
        reads, writes = sides(n.name)
        for x in n.inputs if (n.domain, n.op_type) not in SHAPE_READERS else ():
            if x and graph.values[x].nbytes and tier_of[x] != reads and x not in folded:
                raise Violation(f"node {n.name!r} reads the {reads} tier, but {x!r} lives in the {tier_of[x]} tier "
                                "(no transfer brings it there)")
        for out in n.outputs:
            if out and graph.values[out].nbytes and root(out) != out and tier_of[out] != writes:
                raise Violation(f"node {n.name!r} writes the {writes} tier, but {out!r} shares the storage of "
                                f"{root(out)!r} in the {tier_of[out]} tier")
    return tier_of


def check_transfer_records(graph: Graph, tiers: Tiers, records, step: dict[str, int],
                           readers: dict[str, list[int]]) -> None:
    """Each transfer the plan lists is one of the model's, in its direction, with its bytes, at its
    step, and needed at the step of its output's first reader."""
    nodes = {n.name: n for n in graph.nodes}
    for record in records:
        name = record["node"]
        recorded = tiers.transfers.get(name)
        if recorded != record["direction"]:
            raise Violation(f"the plan lists transfer {name!r} {record['direction']}, but the model's {TIERS_KEY!r} "
                            f"has {'no such transfer' if recorded is None else 'it ' + recorded}")
        out = nodes[name].outputs[0]
        first_reader = min(readers.get(out, ()), default=None)
        actual = {"bytes": graph.values[out].nbytes, "step": step[name], "needed_at": first_reader}
        for key, value in actual.items():
            if (key == "bytes" and record[key] < value) or (key != "bytes" and record[key] != value):
                raise Violation(f"the plan lists transfer {name!r} with {key} {record[key]}, but it is {value}")


def check_recompute(graph: Graph, record: dict, step: dict[str, int], moved: dict[str, str] | None = None) -> None:
    """Each copy the plan lists is its original's op reading the same tensors or their listed
    recomputed versions, so it computes the same values (a Dropout's replay: DropoutGrad on the
    Dropout's input and mask, or the standard nodes `standard_replay` checks); each recomputed
    tensor is its copy's output in its original's place, produced before every step that reads it.
    `moved`: transfer output -> its input; the same tensor in another tier."""
    moved = moved or {}

    def value(x: str) -> str:
        while x in moved:
            x = moved[x]
        return x

    nodes = {n.name: n for n in graph.nodes}
    replaces = {t["name"]: t["of"] for t in record["tensors"]}
    copy_of = {}
    chains: dict[str, list[Node]] = {}
    for entry in record["nodes"]:
        copy, original = nodes.get(entry["node"]), nodes.get(entry["of"])
        if copy is None or original is None:
            missing = entry["node"] if copy is None else entry["of"]
            raise Violation(f"the plan's recompute record names node {missing!r}, which the model does not have")
        if (original.domain, original.op_type) == ("", "Dropout") and (copy.domain, copy.op_type) in STANDARD_REPLAY:
            chains.setdefault(original.name, []).append(copy)
            copy_of[copy.name] = original
            continue
        if (copy.domain, copy.op_type) == DROPOUT_REPLAY and (original.domain, original.op_type) == ("", "Dropout") \
                and len(original.inputs) == 3 and len(original.outputs) == 2:
            # DropoutGrad(input, mask, ratio, training_mode): the Dropout's output from its own mask
            expected = (original.inputs[0], original.outputs[1], *original.inputs[1:])
        elif (copy.domain, copy.op_type) == (original.domain, original.op_type):
            expected = original.inputs
        else:
            raise Violation(f"recomputing node {copy.name!r} is not a copy of {original.name!r}")
        if len(copy.inputs) != len(expected):
            raise Violation(f"recomputing node {copy.name!r} reads {len(copy.inputs)} tensors, {original.name!r} "
                            f"{len(expected)}")
        for mine, theirs in zip(copy.inputs, expected):
            mine_value, their_value = value(mine), value(theirs)
            if mine_value != their_value and replaces.get(mine_value) != their_value:
                raise Violation(f"recomputing node {copy.name!r} reads {mine!r} where {original.name!r} reads {theirs!r}")
        copy_of[copy.name] = original
    for name, chain in chains.items():
        standard_replay(nodes[name], chain, set(graph.initializers), replaces)
    producers = {out: (n, k) for n in graph.nodes for k, out in enumerate(n.outputs)}
    for t in record["tensors"]:
        made = producers.get(t["name"])
        if made is None or made[0].name not in copy_of or copy_of[made[0].name].outputs[made[1]] != t["of"]:
            raise Violation(f"recomputed tensor {t['name']!r} is not made by a copy of the node making {t['of']!r}")
        at = step[made[0].name]
        for reader in t.get("readers", ()):
            if reader not in step or reader not in nodes or t["name"] not in nodes[reader].inputs:
                raise Violation(f"recomputed tensor {t['name']!r} lists reader {reader!r}, which does not read it")
            if step[reader] <= at:
                raise Violation(f"recomputed tensor {t['name']!r} is read by {reader!r} at step {step[reader]}, "
                                f"before it is recomputed at step {at}")


def standard_replay(dropout: Node, chain: list[Node], initializers: set[str], replaces: dict[str, str]) -> None:
    """A Dropout's replay in standard ONNX is these four nodes and no others, its scalars
    initializers: kept = Sub(one, ratio); keep = Where(mode, kept, one); scaled = Div(input, keep);
    output = Where(mask, scaled, zero) -- mask ? input / (1 - ratio) : 0, as the Dropout computed."""
    data, ratio, mode = dropout.inputs if len(dropout.inputs) == 3 else ("", "", "")
    made = {out: n for n in chain for out in n.outputs}
    last = [n for n in chain if n.outputs and replaces.get(n.outputs[0]) == dropout.outputs[0]]

    def node(name: str, op: str) -> Node:
        n = made.get(name)
        if n is None or n.op_type != op or len(n.inputs) != (3 if op == "Where" else 2):
            raise Violation(f"the replay of {dropout.name!r} does not compute its output: {name!r} is not a {op}")
        return n

    if len(last) != 1 or len(chain) != 4 or len(dropout.outputs) != 2:
        raise Violation(f"the replay of {dropout.name!r} is not the four nodes that compute its output")
    out = node(last[0].outputs[0], "Where")
    scaled = node(out.inputs[1], "Div")
    keep = node(scaled.inputs[1], "Where")
    kept = node(keep.inputs[1], "Sub")
    one, zero = keep.inputs[2], out.inputs[2]
    if not (out.inputs[0] == dropout.outputs[1] and data in (scaled.inputs[0], replaces.get(scaled.inputs[0]))
            and keep.inputs[0] == mode and kept.inputs == (one, ratio) and {one, zero} <= initializers):
        raise Violation(f"the replay of {dropout.name!r} reads other tensors than its input, mask, ratio and mode")


def folded_at_load(graph: Graph) -> set[str]:
    """Initializers, constants and what is computed from them alone: ONNX Runtime folds these at
    the session's start and holds them itself."""
    folded = set(graph.constants) | set(graph.initializers)
    for n in graph.nodes:
        if n.inputs and all(x in folded for x in n.inputs if x):
            folded.update(n.outputs)
    return folded


def check_shape_nodes_first(graph: Graph, order: list[str], step: dict[str, int], produced_at: dict[str, int],
                            folded: set[str]) -> None:
    """The order is the one that runs: ONNX Runtime's priority-based order (what a plan's order
    runs under) takes Shape and Size first among the nodes ready to run, so each comes right after
    the node producing its input, with only other such nodes between (before every other node when
    the input is a graph input). One whose input ORT computes at load (`folded`) is exempt."""
    shape_nodes = {n.name for n in graph.nodes if (n.domain, n.op_type) in SHAPE_READERS}
    following = [len(order)] * (len(order) + 1)  # per step, the first step from it not a Shape or Size node's
    for s in reversed(range(len(order))):
        following[s] = following[s + 1] if order[s] in shape_nodes else s
    for n in graph.nodes:
        if n.name not in shape_nodes or not n.inputs or n.inputs[0] in folded:
            continue
        ready = produced_at.get(n.inputs[0], -1) + 1
        if following[ready] < step[n.name]:
            other = order[following[ready]]
            raise Violation(f"{n.op_type} node {n.name!r} is at step {step[n.name]}, after {other!r}, but ONNX "
                            f"Runtime runs it as soon as its input {n.inputs[0]!r} exists (step {ready}): the "
                            "plan's order is not the order that runs")


def check_placement(what: str, offset: int, size: int, alignment: int, arena: int, arena_name: str = "arena") -> None:
    if offset % alignment:
        raise Violation(f"{what} offset {offset} is not a multiple of the alignment {alignment}")
    if offset + size > arena:
        raise Violation(f"{what} ends at {offset + size}, past the {arena_name} ({arena} bytes)")


def check_overlaps(placed: list[tuple[int, int, int, int, str]]) -> None:
    """Sweep over steps keeping the live tensors sorted by offset: a new tensor can only collide
    with its neighbours in address order, because the live ones never overlap each other."""
    events = sorted((p for p in placed if p[3] > 0), key=lambda p: (p[0], p[2]))
    live_offsets: list[int] = []
    live: list[tuple[int, int, str]] = []  # (offset, end, name), sorted by offset
    expiry: list[tuple[int, int]] = []  # heap of (last_step, offset)
    for first, last_step, offset, size, name in events:
        while expiry and expiry[0][0] < first:
            _, gone = heapq.heappop(expiry)
            k = bisect.bisect_left(live_offsets, gone)
            del live[k], live_offsets[k]
        k = bisect.bisect_left(live_offsets, offset)
        for neighbour in live[max(0, k - 1): k + 1]:
            if neighbour[0] < offset + size and offset < neighbour[1]:
                raise Violation(f"{name!r} [{offset}, {offset + size}) overlaps {neighbour[2]!r} "
                                f"[{neighbour[0]}, {neighbour[1]}) while both are live at step {first}")
        live.insert(k, (offset, offset + size, name))
        live_offsets.insert(k, offset)
        heapq.heappush(expiry, (last_step, offset))


def require(graph: Graph, sha256: str, plan: dict) -> Summary:
    """verify() for the commands that run a plan (train, execute): one that does not hold stops
    them before their first step, with the broken rule (CheckFailed: exit 1)."""
    try:
        return verify(graph, sha256, plan)
    except Violation as v:
        raise CheckFailed(f"the plan does not hold for this model: {v}") from None
