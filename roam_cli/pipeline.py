"""onnx -> graph -> memory model -> order -> layout -> plan: the whole of `roam optimize`."""

import hashlib
import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from roam_cli import layout, order, recompute
from roam_cli.core import annotate, memory
from roam_cli.core import plan as plan_io
from roam_cli.core.collectives import sharding as sharding_of
from roam_cli.core.errors import CheckFailed
from roam_cli.core.fileio import check_output_path
from roam_cli.core.forking import beside
from roam_cli.cost import profile as cost_profile
from roam_cli.frontend.onnx_import import Imported, import_model, load_model
from roam_cli.lower import LOWERED_FROM_KEY
from roam_cli.offload import planner, prefetch
from roam_cli.order.bounds import lower_bound
from roam_cli.order.problem import from_memory_model
from roam_cli.shard import record as shard_record

ORT_LEVELS = ("basic", "extended")  # ONNX Runtime's graph optimisation levels that --ort-optimized applies


@dataclass
class Options:
    dims: dict[str, int] = field(default_factory=dict)
    alignment: int = 256
    order: str = "roam"
    layout: str = "first-fit"
    shapes_from_run: bool = False
    inplace: dict[str, str] = field(default_factory=dict)  # graph output -> state it replaces
    loss: str | None = None
    time_limit: float | None = None
    # The order search stops within this fraction of its bound, the layout within LAYOUT_SHARE_OF_GAP
    # times it of the peak of live bytes (0: proven or out of time). Peaks and bounds are sums of
    # aligned sizes, so a gap under one alignment unit is closed by proof: on a 1 MiB step 0.1 % is
    # four units, and the last four are what the search spends its minutes proving.
    gap: float = 0.001
    jobs: int = 1
    solver: str = "cbc"  # MILP solver of the ordering and layout ILPs: cbc | highs
    reproducible: bool = False  # leave wall-clock figures out of the plan (byte-identical reruns)
    ort_optimized: str | None = None  # plan ONNX Runtime's optimisation at this level: basic | extended
    provider: str = "cpu"  # ... for this execution provider: cpu | cuda
    recompute: str = "off"  # off | free | budget (recompute.MODES)
    budget: int | None = None  # bytes the plan must fit (persistent + arena) with recompute "budget"
    workspace: dict[str, list[int]] = field(default_factory=dict)  # node -> its kernels' scratch bytes (calibrate)
    offload: str | None = None  # the slower tier to plan with (roam_cli.offload.planner): host | storage
    device: str | None = None  # the device profile of the estimates (roam_cli.cost.profile; None: its default):
    # --offload's, and a rank step's communication
    objective: str = "time"  # what the tiered planner minimises: time | energy
    # recompute "budget": the order search stops once the plan's peak leaves persistent + peak within
    # the budget (whether a plan fits is all the budget's choice needs; None: search as optimize does)
    stop_at_budget: bool = False
    # the down-sets each leaf of the order search may visit (None: order's default); tradeoff's points
    # search with fewer than optimize does
    leaf_states: int | None = None


@dataclass
class Result:
    plan: dict
    imported: Imported  # the graph the plan orders
    mm: memory.MemoryModel
    notes: list[str]
    source: Path  # the model file optimize read
    weights: Path | None = None  # the external data of ORT's optimised graph, to move beside the annotated model


def layout_buffers(mm: memory.MemoryModel, order_: list[int]) -> list[tuple[int, int, int]]:
    """Transient storages as layout buffers: (lower, upper, size), lifetimes half-open."""
    return [(first, last + 1, s.bytes) for s, (first, last) in zip(mm.storages, memory.lifetimes(mm, order_))]


def workspace_buffers(graph, order_: list[int], workspace: dict[str, list[int]]) -> list[tuple[str, int, int]]:
    """(node, step, bytes) of each workspace buffer of the graph's nodes, in plan order: live at its
    node's step only. A node recompute added was not calibrated: it takes the most workspace of a
    calibrated node of its kernel (op, input and output types and shapes), its original's for a
    copy; a replayed Dropout's Where, that of the backward's Where of the same shapes. Other nodes
    the calibrated graph lacks have none."""
    if not workspace:  # not calibrated: nothing to match kernels to
        return []
    added = memory.recompute_copies(graph)

    def kernel(n) -> tuple:
        return n.op_type, n.domain, *((v.dtype, v.shape) if v else None
                                      for v in map(graph.values.get, n.inputs + n.outputs))

    of_kernel: dict[tuple, list[int]] = {}
    for n in graph.nodes:
        if n.name not in added:
            mine, known = workspace.get(n.name, []), of_kernel.get(kernel(n), [])
            of_kernel[kernel(n)] = max(mine, known, key=sum)
    needs = {n.name: of_kernel.get(kernel(n), []) if n.name in added else workspace.get(n.name, []) for n in graph.nodes}
    return [(graph.nodes[i].name, step, b) for step, i in enumerate(order_) for b in needs[graph.nodes[i].name]]


def run(model_path: Path, plan_path: Path, options: Options, progress=None, ort_model: Path | None = None) -> Result:
    """Plan the model at model_path; with options.ort_optimized, plan ONNX Runtime's optimisation of
    it, written to `ort_model` (see scratch()), and plan the model as written too, for the
    comparison in stats.ort_optimization. Each of the two plans gets half of the time limit."""
    say = progress or (lambda message: None)
    if options.ort_optimized is None:
        fused = lowered_from(model_path)
        each = options if fused is None else replace(options, time_limit=options.time_limit / 2
                                                     if options.time_limit is not None else None)
        result = plan_graph(model_path, plan_path, each, say)
        result.plan["source_model"] = dict(result.plan["model"])
        if fused is not None:
            say("planning the fused graph it was lowered from")
            before = plan_graph(fused, plan_path, each, say)
            result.plan["stats"]["lowering"] = {"fused_model": before.plan["model"],
                                                "fused": graph_figures(before.plan),
                                                "lowered": graph_figures(result.plan)}
        return result
    from roam_cli.frontend import (
        ort_optimize,  # ONNX Runtime is loaded only when asked for
    )

    level, provider = options.ort_optimized, options.provider
    t = time.perf_counter()
    say(f"applying ONNX Runtime's {level} graph optimisations ({provider})")
    weights = ort_optimize.optimize(model_path, level, provider, ort_model)
    optimizing = time.perf_counter() - t
    each = replace(options, time_limit=options.time_limit / 2 if options.time_limit is not None else None)
    before = plan_graph(model_path, plan_path, each, say)
    result = replace(plan_graph(ort_model, plan_path, each, say), source=model_path, weights=weights)
    plan = result.plan
    plan["source_model"] = before.plan["model"]
    plan["ort_optimized"] = ort_optimize.record(level, provider)
    plan["stats"]["ort_optimization"] = {"before": graph_figures(before.plan), "after": graph_figures(plan)}
    if not options.reproducible:
        plan["stats"]["seconds"] |= {"ort_optimize": optimizing,
                                     "plan_unoptimized": sum(before.plan["stats"]["seconds"].values())}
    return result


def lowered_from(model_path: Path) -> Path | None:
    """The fused model a `roam lower` output was made from, when it is still there unchanged."""
    model, _ = load_model(model_path)
    meta = {p.key: p.value for p in model.metadata_props}
    try:
        source = json.loads(meta[LOWERED_FROM_KEY])
        path = model_path.parent / source["path"]
        same = path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == source["sha256"]
    except (KeyError, ValueError, TypeError, OSError):
        return None
    return path if same else None


def graph_figures(plan: dict) -> dict:
    """What ORT's optimisations change: the graph's size and the plan's memory."""
    return {"nodes": len(plan["order"]), "peak_live_bytes": plan["peak_live_bytes"], "arena_bytes": plan["arena_bytes"]}


# the order stage, for the offload planner that runs before it: its lower bound and time
ORDERING = planner.Ordering(lambda mm: lower_bound(from_memory_model(mm)), order.DEFAULT_SECONDS)


def plan_graph(model_path: Path, plan_path: Path, options: Options, say) -> Result:
    """Import the model and plan it, recomputing as options.recompute says."""
    t = time.perf_counter()
    say("importing the model")
    imported = import_model(model_path, options.dims, options.shapes_from_run)
    imported_seconds = time.perf_counter() - t
    t = time.perf_counter()
    mm = memory.build(imported.graph, options.alignment, options.inplace, options.loss)
    seconds = {"import": imported_seconds, "memory_model": time.perf_counter() - t}
    if options.offload is not None:
        return planner.plan(imported, mm, options, lambda i, m, o, refine=None: plan_model(
            i, m, model_path, plan_path, o, dict(seconds), lambda _m: None, refine), ORDERING, say)
    if options.recompute == "off":
        return plan_model(imported, mm, model_path, plan_path, options, seconds, say)
    return plan_recomputed(imported, mm, model_path, plan_path, options, seconds, say)


def plan_recomputed(imported: Imported, mm: memory.MemoryModel, model_path: Path, plan_path: Path,
                    options: Options, seconds: dict, say) -> Result:
    """Plan the model as it is and with recomputation (`free`: the min-cut's choice; `budget`:
    the cheapest whose plan fits options.budget: fewest FLOPs, on a rank step least
    communication too); the plan's `recompute` records the copies,
    stats.recompute both plans' figures. The time limit is shared by every plan made."""
    start = time.perf_counter()
    deadline = start + (options.time_limit if options.time_limit is not None else order.DEFAULT_SECONDS * 4)

    def share(parts: int) -> Options:
        """A plan's options: `parts` of the time left of --time-limit; without one, each plan has
        the default a plan alone has"""
        if options.time_limit is None:
            return options
        return replace(options, time_limit=max(deadline - time.perf_counter(), 1.0) / parts)

    say("planning the model as it is")
    if options.recompute == "free":
        # the plan without recomputation: with cores to spare, made beside the recomputing plan (a
        # third of a 70B-class step's planning time)
        kept_options = share(2)
        with beside(lambda: plan_model(imported, mm, model_path, plan_path, kept_options, dict(seconds),
                                       lambda _m: None).plan, options.jobs > 1) as before:
            choice = recompute.free(imported.graph, mm, options.device)
            result = plan_choice(imported, mm, choice, model_path, plan_path, share(1), seconds, say)
            kept = before()
        before_figures = graph_figures(kept)
        if plan_io.needed_bytes(kept) < plan_io.needed_bytes(result.plan):
            # fewer bytes kept across the boundary, but the backward's own peak is the plan's: never
            # worse than the plan as it is
            more = plan_io.needed_bytes(result.plan) - plan_io.needed_bytes(kept)
            kept["recompute"] = recompute.apply(imported, mm, recompute.keep_all(imported.graph, mm, options.device),
                                                options.recompute)[1]
            result = Result(kept, imported, mm, imported.notes + mm.notes + [
                f"recomputing {len(choice.copied)} nodes would need {more} bytes more than the plan without "
                "recomputation, which is this plan"], model_path)
    else:
        # searched to its end: when it fits, it is the plan, and the same as optimize's without --recompute
        kept = plan_model(imported, mm, model_path, plan_path, share(2), dict(seconds), say)
        result = plan_within_budget(imported, mm, kept, model_path, plan_path, options, seconds, deadline, share, say)
        before_figures = graph_figures(kept.plan)
    plan = result.plan
    plan["stats"]["recompute"] = {"before": before_figures, "after": graph_figures(plan)}
    if not options.reproducible:  # choosing, and the plans made besides this one
        spent = plan["stats"]["seconds"]
        spent["recompute"] = time.perf_counter() - start - spent["order"] - spent["layout"]
    return result


def plan_to_fit(make, options: Options) -> Result:
    """make(options)'s plan, its order search stopped once the plan's peak fits options.budget
    (`stop_at_budget`): which choice fits is all --recompute budget asks of a plan, and a search
    that reaches the budget reaches it at the same point of its (deterministic) course with or
    without the stop. When the layout then leaves the arena above the peak and the plan over the
    budget, the plan is made again with the search run to its end."""
    result = make(options)
    plan = result.plan
    if plan["stats"]["order"].get("stopped_at_target") and plan_io.needed_bytes(plan) > options.budget:
        result = make(replace(options, stop_at_budget=False))
    return result


def plan_choice(imported: Imported, mm: memory.MemoryModel, choice: recompute.Choice, model_path: Path,
                plan_path: Path, options: Options, seconds: dict, say) -> Result:
    say(f"recomputing {len(choice.copied)} nodes")
    rewritten, record = recompute.apply(imported, mm, choice, options.recompute)
    new_mm = memory.build(rewritten.graph, options.alignment, options.inplace, options.loss)
    result = plan_model(rewritten, new_mm, model_path, plan_path, options, dict(seconds), say)
    result.plan["recompute"] = record
    return result


def plan_within_budget(imported: Imported, mm: memory.MemoryModel, kept: Result, model_path: Path, plan_path: Path,
                       options: Options, seconds: dict, deadline: float, share, say) -> Result:
    """The plan of the fewest recomputed FLOPs that fits options.budget. The bytes kept across
    the forward/backward boundary are what recomputation changes; the rest of a plan's needs
    (persistent bytes, the backward's own tensors) are estimated from the last plan made, and
    the boundary's limit lowered by each plan's excess until one fits, or until it is the fewest
    bytes any recompute can keep; then `free`'s choice is planned too. CheckFailed (exit 1) when
    no plan made fits, with the size the smallest needs."""
    budget = options.budget
    as_it_is = recompute.keep_all(imported.graph, mm, options.device)
    if plan_io.needed_bytes(kept.plan) <= budget:
        say("the plan fits the budget without recomputing")
        kept.plan["recompute"] = recompute.apply(imported, mm, as_it_is, options.recompute)[1] | {"budget_bytes": budget}
        return kept
    fewest = recompute.fewest_bytes(imported.graph, mm, options.device)
    limit = budget - (plan_io.needed_bytes(kept.plan) - as_it_is.kept_bytes)
    tried = []
    for attempt in range(BUDGET_ROUNDS):
        limit = max(limit, fewest.kept_bytes)
        say(f"choosing what to recompute to keep at most {limit} bytes")
        # the program's choice (its warm start when out of time), with the gathers it has room for kept
        choice = recompute.gathers_kept(recompute.within(fewest, limit, time.perf_counter() + BUDGET_ILP_SHARE *
                                                         max(deadline - time.perf_counter(), 1.0), options.solver)
                                        or fewest, limit)
        tried.append(plan_to_fit(lambda o: plan_choice(imported, mm, choice, model_path, plan_path, o, seconds, say),
                                 replace(share(2), stop_at_budget=True)))
        excess = plan_io.needed_bytes(tried[-1].plan) - budget
        if excess <= 0 or limit == fewest.kept_bytes:
            break
        # the plan's other bytes need not follow the boundary's one for one (a choice a few bytes
        # smaller can be laid out no better): each round after the first lowers the limit by
        # twice as much as the excess asks
        limit -= excess * 2 ** max(attempt - 1, 0)
    if plan_io.needed_bytes(tried[-1].plan) > budget:
        # keeping the fewest bytes is not always the smallest plan (a recomputed product's
        # backward can outgrow it); the cheap ops' choice is one more candidate
        say("planning the min-cut of the cheap ops")
        tried.append(plan_choice(imported, mm, recompute.free(imported.graph, mm, options.device), model_path, plan_path,
                                 share(1), seconds, say))
    result = min(tried, key=lambda r: (plan_io.needed_bytes(r.plan) > budget, r.plan["recompute"]["price"]
                                       if plan_io.needed_bytes(r.plan) <= budget else plan_io.needed_bytes(r.plan)))
    result.plan["recompute"]["budget_bytes"] = budget
    if plan_io.needed_bytes(result.plan) <= budget:
        return result
    raise CheckFailed(f"--budget {budget} bytes cannot be met: the smallest plan roam found, recomputing "
                      f"{len(result.plan['recompute']['nodes'])} nodes, needs {plan_io.needed_bytes(result.plan)} bytes "
                      f"(persistent {result.plan['persistent_bytes']} + arena {result.plan['arena_bytes']})")


BUDGET_ROUNDS = 6  # plans made to meet a budget before giving up on it
BUDGET_ILP_SHARE = 0.2  # of the time left, what one recompute ILP may take
# --gap F lets the order stop within F of its bound, the layout within a tenth of F of the peak of
# live bytes: fragmentation is memory no order can win back, and on 70B- and 405B-class steps one
# descent of the layout search reaches a tenth of a 1 % gap (a probe at the peak itself runs out
# of time). The arena ends within F + F/10 of the order's bound.
LAYOUT_SHARE_OF_GAP = 0.1


def plan_model(imported: Imported, mm: memory.MemoryModel, model_path: Path, plan_path: Path, options: Options,
               seconds: dict, say, refine=None) -> Result:
    """Order and lay out the graph of `imported`, whose memory model is `mm`: the plan. `refine`:
    a change to the order found, made before it is laid out (the offload planner's fetches moved
    earlier: order -> (order, figures for the order's stats)); its order is laid out as ONNX
    Runtime runs it (`order.runs`). A rank step's all-gathers are moved earlier so (`prefetch`)
    when no `refine` is given."""
    t = time.perf_counter()
    if refine is None and sharding_of(imported.graph.metadata) is not None:
        refine = gathers_hoisted(imported, mm, options)
    say(f"ordering {len(imported.graph.nodes)} nodes: baselines")
    op_types = [n.op_type for n in imported.graph.nodes]
    measured = order.baselines(mm, op_types)
    say(f"ordering {len(imported.graph.nodes)} nodes ({options.order})")
    # the ordering gets half of --time-limit, the layout what is left
    order_limit = options.time_limit / 2 if options.time_limit is not None else None
    # (kernels' scratch shares the arena at steps of its own: no target where there is any)
    target = (options.budget - mm.persistent_bytes if options.stop_at_budget and options.budget is not None
              and mm.tiers is None and not options.workspace else None)
    chosen_order, order_stats = order.solve(mm, options.order, op_types=op_types, time_limit=order_limit,
                                            jobs=options.jobs, solver=options.solver, measured=measured,
                                            progress=say, gap=options.gap, target=target,
                                            leaf_states=options.leaf_states)
    if refine is not None:
        refined, figures = refine(chosen_order)
        order_stats |= figures
        if refined != chosen_order:
            chosen_order = order.runs(mm, refined)
    order_stats["baselines"] = [{"strategy": k, "peak_live_bytes": v["peak_live_bytes"], "seconds": v["seconds"]}
                                for k, v in measured.items()]
    # ONNX Runtime writes a kernel's output into its input where this order runs the kernel last
    # among the input's readers (a recomputing copy reading a saved value): one storage, not two
    if memory.kernel_joins(imported.graph, options.inplace, chosen_order) != mm.kernel_joins:
        ran = memory.build(imported.graph, options.alignment, options.inplace, options.loss, chosen_order)
        if len(ran.storages) < len(mm.storages):
            mm = ran
    seconds["order"] = time.perf_counter() - t

    t = time.perf_counter()
    say(f"placing {len(mm.storages)} tensors ({options.layout})")
    layout_limit = max(options.time_limit - seconds["order"], 0.0) if options.time_limit is not None else None
    scratch = workspace_buffers(imported.graph, chosen_order, options.workspace)
    buffers = layout_buffers(mm, chosen_order)
    device = mm.on(memory.DEVICE)
    placed = layout.place([buffers[k] for k in device] + [(s, s + 1, b) for _, s, b in scratch], options.layout,
                          time_limit=layout_limit, jobs=options.jobs, solver=options.solver,
                          gap=options.gap * LAYOUT_SHARE_OF_GAP)
    offsets = [0] * len(mm.storages)
    for k, o in zip(device, placed.offsets):
        offsets[k] = o
    if mm.tiers is not None:  # the slow tier's arena: its own offsets, first fit (it is the larger memory)
        slow = mm.on(mm.tiers.slow)
        for k, o in zip(slow, layout.place([buffers[k] for k in slow], "first-fit").offsets):
            offsets[k] = o
    workspace = [{"node": node, "step": s, "bytes": b, "offset": o}
                 for (node, s, b), o in zip(scratch, placed.offsets[len(device):])]
    seconds["layout"] = time.perf_counter() - t

    # What eager PyTorch would need, for the report to compare with: the original order through
    # PyTorch's caching allocator (a replay, milliseconds even on GPT-2 small).
    t = time.perf_counter()
    eager_buffers = layout_buffers(mm, measured["original"]["order"])
    eager = layout.place([eager_buffers[k] for k in device], "pytorch")
    pytorch_like = {"order": "original", "layout": "pytorch",
                    "peak_live_bytes": measured["original"]["peak_live_bytes"], "arena_bytes": eager.arena,
                    "seconds": time.perf_counter() - t}

    stats = {
        "order": {"strategy": options.order, **order_stats},
        "layout": {"strategy": options.layout, **placed.stats},
        "seconds": seconds,
        "baselines": [pytorch_like],
        "tensors": {"transient_storages": len(mm.storages), "persistent": len(mm.persistent),
                    "aliases": len(mm.alias)},
        "node_classes": {c: mm.node_class.count(c) for c in memory.NODE_CLASSES},
    }
    if options.reproducible:
        stats = plan_io.without_wall_clock(stats)
    result = plan_io.build(imported.graph, mm, chosen_order, offsets, model_path=model_path,
                           model_sha256=imported.sha256, plan_path=plan_path, dims=options.dims, stats=stats,
                           workspace=workspace)
    sharding = shard_record.record(imported.graph, mm, chosen_order, options.device)  # a rank step's layout
    if sharding is not None:
        result["sharding"] = sharding
    return Result(result, imported, mm, imported.notes + mm.notes, model_path)


def gathers_hoisted(imported: Imported, mm: memory.MemoryModel, options: Options):
    """A rank step's refinement of its order: each all-gather moved back over the compute that
    hides its ring on the profile's interconnect, within the order's peak (`prefetch`). Its peak
    of live bytes is the order's, but the longer lives can leave a layout more holes: the moved
    order is kept only where the layout heuristics place it in no more bytes than the order found."""
    profile = cost_profile.for_step(options.device, sharded=True)
    device = mm.on(memory.DEVICE)

    def arena(order_: list[int]) -> int:
        buffers = layout_buffers(mm, order_)
        return layout.place([buffers[k] for k in device], options.layout, time_limit=0).arena

    def refine(order_found: list[int]) -> tuple[list[int], dict]:
        early = prefetch.hoist(imported.graph, mm, order_found, profile)
        if early == order_found:
            return order_found, {"prefetch_moved_steps": 0}
        found, moved = arena(order.runs(mm, order_found)), arena(order.runs(mm, early))
        kept = early if moved <= found else order_found
        return kept, {"prefetch_moved_steps": sum(a != b for a, b in zip(order_found, kept)),
                      "prefetch_heuristic_arena": {"found": found, "moved": moved}}
    return refine


def default_annotated_path(plan_path: Path) -> Path:
    return plan_path.with_name(plan_path.stem + ".annotated.onnx")


@contextmanager
def scratch(annotated_path: Path | None) -> Iterator[Path | None]:
    """Where run() has ONNX Runtime write its optimised graph: a file named like the annotated model
    in a temporary folder beside it, so that the graph's weights file, which the graph names by file
    name, moves into place by a rename and keeps its name. None when `annotated_path` is None."""
    if annotated_path is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix=".roam-", dir=annotated_path.resolve().parent) as folder:
        yield Path(folder) / annotated_path.name


def files(result: Result, plan_path: Path, annotated_path: Path | None) -> dict[Path, bytes | str | Path]:
    """What optimize writes, as one set (see fileio.write_all_atomic): the annotated model, when
    asked for or when the plan's graph is not the source file as it is (generated node names,
    ORT's optimisations, recomputing copies), with the weights of ORT's graph; and the plan, which names both members
    of the pair and, as `model`, the one whose graph it orders."""
    plan = result.plan
    ort_graph = "ort_optimized" in plan
    changed = result.imported.renamed or ort_graph or "recompute" in plan or "tiers" in plan
    if annotated_path is None and changed:
        annotated_path = default_annotated_path(plan_path)
        check_output_path(annotated_path, [result.source], [plan_path])
    written: dict[Path, bytes | str | Path] = {}
    if annotated_path is not None:
        # ORT's graph names its weights file beside it, which moves beside the annotated model
        located = annotated_path if ort_graph else result.source
        proto = annotate.annotate(result.imported.model, result.imported.graph, plan, located, annotated_path)
        data = written[annotated_path] = proto.SerializeToString()
        # the plan can name the annotated model's digest: the plan digest in it does not cover `model`
        plan["annotated_model"] = plan_io.file_ref(annotated_path, hashlib.sha256(data).hexdigest(), plan_path)
        if changed:
            plan["model"] = dict(plan["annotated_model"])
            what = ("ONNX Runtime's optimised graph" if ort_graph else "the transfers between tiers" if "tiers" in plan
                    else "the recomputing copies" if "recompute" in plan else "the generated node names")
            result.notes.append(f"the plan refers to {annotated_path}, which carries {what}")
        if result.weights is not None:
            target = annotated_path.with_name(result.weights.name)
            check_output_path(target, [result.source], [plan_path])
            written[target] = result.weights
    written[plan_path] = plan_io.dumps(plan)
    return written
