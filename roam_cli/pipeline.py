"""onnx -> graph -> memory model -> order -> layout -> plan: the whole of `roam optimize`."""

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path

from roam_cli import annotate, layout, memory, order, plan as plan_io
from roam_cli.fileio import check_output_path
from roam_cli.onnx_import import Imported, import_model


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
    jobs: int = 1
    solver: str = "cbc"  # MILP solver of the ordering and layout ILPs: cbc | highs
    reproducible: bool = False  # leave wall-clock figures out of the plan (byte-identical reruns)


@dataclass
class Result:
    plan: dict
    imported: Imported  # the graph the plan orders
    mm: memory.MemoryModel
    notes: list[str]
    source: Path  # the model file optimize read


def layout_buffers(mm: memory.MemoryModel, order_: list[int]) -> list[tuple[int, int, int]]:
    """Transient storages as layout buffers: (lower, upper, size), lifetimes half-open."""
    return [(first, last + 1, s.bytes) for s, (first, last) in zip(mm.storages, memory.lifetimes(mm, order_))]


def run(model_path: Path, plan_path: Path, options: Options, progress=None) -> Result:
    say = progress or (lambda message: None)
    seconds = {}
    t = time.perf_counter()
    say("importing the model")
    imported = import_model(model_path, options.dims, options.shapes_from_run)
    seconds["import"] = time.perf_counter() - t

    t = time.perf_counter()
    mm = memory.build(imported.graph, options.alignment, options.inplace, options.loss)
    seconds["memory_model"] = time.perf_counter() - t

    t = time.perf_counter()
    say(f"ordering {len(imported.graph.nodes)} nodes: baselines")
    op_types = [n.op_type for n in imported.graph.nodes]
    measured = order.baselines(mm, op_types)
    say(f"ordering {len(imported.graph.nodes)} nodes ({options.order})")
    # the ordering gets half of --time-limit, the layout what is left
    order_limit = options.time_limit / 2 if options.time_limit is not None else None
    chosen_order, order_stats = order.solve(mm, options.order, op_types=op_types, time_limit=order_limit,
                                            jobs=options.jobs, solver=options.solver, measured=measured,
                                            progress=say)
    order_stats["baselines"] = [{"strategy": k, "peak_live_bytes": v["peak_live_bytes"], "seconds": v["seconds"]}
                                for k, v in measured.items()]
    seconds["order"] = time.perf_counter() - t

    t = time.perf_counter()
    say(f"placing {len(mm.storages)} tensors ({options.layout})")
    layout_limit = max(options.time_limit - seconds["order"], 0.0) if options.time_limit is not None else None
    placed = layout.place(layout_buffers(mm, chosen_order), options.layout, time_limit=layout_limit,
                          jobs=options.jobs, solver=options.solver)
    seconds["layout"] = time.perf_counter() - t

    # What eager PyTorch would need, for the report to compare with: the original order through
    # PyTorch's caching allocator (a replay, milliseconds even on GPT-2 small).
    t = time.perf_counter()
    eager = layout.place(layout_buffers(mm, measured["original"]["order"]), "pytorch")
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
    result = plan_io.build(imported.graph, mm, chosen_order, placed.offsets, model_path=model_path,
                        model_sha256=imported.sha256, plan_path=plan_path, dims=options.dims, stats=stats)
    result["source_model"] = dict(result["model"])
    return Result(result, imported, mm, imported.notes + mm.notes, model_path)


def default_annotated_path(plan_path: Path) -> Path:
    return plan_path.with_name(plan_path.stem + ".annotated.onnx")


def files(result: Result, plan_path: Path, annotated_path: Path | None) -> dict[Path, bytes | str]:
    """What optimize writes, as one set: the annotated model (when asked for, or when the plan's
    graph is not the source file as it is: generated node names) and the plan, which names both
    members of the pair and, as `model`, the one whose graph it orders."""
    plan = result.plan
    renamed = result.imported.renamed
    if annotated_path is None and renamed:
        annotated_path = default_annotated_path(plan_path)
        check_output_path(annotated_path, [result.source, plan_path])
    written: dict[Path, bytes | str] = {}
    if annotated_path is not None:
        proto = annotate.annotate(result.imported.model, result.imported.graph, plan, result.source, annotated_path)
        data = written[annotated_path] = proto.SerializeToString()
        # the plan can name the annotated model's digest: the plan digest in it does not cover `model`
        plan["annotated_model"] = plan_io.file_ref(annotated_path, hashlib.sha256(data).hexdigest(), plan_path)
        if renamed:
            plan["model"] = dict(plan["annotated_model"])
            result.notes.append(f"the plan refers to {annotated_path}, which carries the generated node names")
    written[plan_path] = plan_io.dumps(plan)
    return written
