"""`roam tradeoff`: the memory / extra-FLOPs front of a training step, each point a verified plan.

The points run from the plan that keeps everything (no extra FLOPs) through `--recompute free`
to the most recomputation roam can plan (the fewest bytes any recompute keeps across the
forward/backward boundary). Between them, the budget program (`recompute.within`) chooses the
cheapest recomputation that keeps at most L bytes across the boundary, for limits L bisecting the
widest gap left between the choices found, until the front has the points asked for or no gap is
left to split. Each distinct choice is ordered and laid out (`pipeline.plan_choice`) and checked by the
independent verifier on the source model rewritten again from the plan's record, as `roam
verify STEP.onnx plan.json` does. A plan's memory is what `--budget` counts: persistent + arena.

Ordering does not follow the boundary's bytes exactly, so a plan can need more memory than
another that recomputes less: such a point is dominated, and is dropped from the front and
reported. What is left is monotone: less memory, more extra FLOPs.

On a rank step (roam shard) the cost of a point is its price: the FLOPs it recomputes and, for
each parameter gathered again in the backward, the ring's time on the device profile's
interconnect as FLOPs of the device (recompute/problem.py). The front then runs from every
gathered parameter kept (FSDP2 with reshard_after_forward=False) to every one gathered again
(FSDP2's reshard) and past it; each point says what its rank sends per step and the
communication the compute waits for."""

import time
from dataclasses import dataclass, replace
from pathlib import Path

from roam_cli import order, pipeline, recompute
from roam_cli.core import memory
from roam_cli.core import plan as plan_io
from roam_cli.core.collectives import sharding
from roam_cli.core.errors import RoamError
from roam_cli.core.forking import parallel_map
from roam_cli.core.units import format_bytes
from roam_cli.frontend.onnx_import import import_model
from roam_cli.offload import planner as offload_planner
from roam_cli.offload import policies as offload_policies
from roam_cli.verify import Violation, verify

MIN_POINTS = 2  # the two ends
PROBES_PER_POINT = 4  # budget programs solved per point asked for, at most, before giving up on a gap
# A point's order search visits at most this many down-sets per leaf, a third of optimize's: the
# sample's front in a third of the time, within 0.5 % of the full search's at every point but one
# (docs/benchmarks/scale.md, "The README's commands on its sample"); optimize at a point's budget searches fully.
POINT_LEAF_STATES = 80_000


@dataclass
class Point:
    label: str  # "keep all", "free", "fewest bytes", or the boundary limit the program met
    limit: int | None  # the boundary's byte limit the budget program was given
    plan: dict
    verified: bool
    violation: str | None = None
    dominated_by: str | None = None

    @property
    def total(self) -> int:
        return plan_io.needed_bytes(self.plan)

    @property
    def extra_flops(self) -> int:
        return self.plan["recompute"]["extra_flops"]

    @property
    def price(self) -> int:
        """What the budget program weighs: extra_flops, and on a rank step each gather again's
        communication (recompute/problem.py)"""
        return self.plan["recompute"]["price"]

    def record(self) -> dict:
        r = self.plan["recompute"]
        step = r["step_flops"]
        communication = self.plan.get("sharding", {}).get("communication")
        return {"label": self.label, "boundary_limit_bytes": self.limit, "persistent_bytes": self.plan["persistent_bytes"],
                "arena_bytes": self.plan["arena_bytes"], "total_bytes": self.total, "extra_flops": self.extra_flops,
                "extra_flops_pct": 100 * self.extra_flops / step if step else 0.0, "price": self.price,
                "price_pct": 100 * self.price / step if step else 0.0, "step_flops": step,
                **({"sent_bytes": communication["sent_bytes"], "exposed_seconds": communication["exposed_seconds"]}
                   if communication else {}),
                "kept_bytes": r["kept_bytes"]["after"], "nodes_added": len(r["nodes"]), "verified": self.verified,
                **({"violation": self.violation} if self.violation else {}),
                **({"dominated_by": self.dominated_by} if self.dominated_by else {})}


def front_of(points: list[Point]) -> tuple[list[Point], list[Point]]:
    """(the front, the dominated points): a point is dominated by one that needs no more memory
    and costs no more (its price: extra FLOPs, a gather again's communication) and is not the
    same on both. The front is sorted by memory, most first; along it the price strictly rises as
    memory strictly falls."""
    ranked = sorted(points, key=lambda p: (p.price, p.total))
    front, dominated = [], []
    for p in ranked:  # cheapest first: p is on the front when it needs less than all before it
        if front and front[-1].total <= p.total:
            p.dominated_by = front[-1].label
            dominated.append(p)
        else:
            front.append(p)
    return front, dominated


def sweep(model_path: Path, options: pipeline.Options, points: int, plans_dir: Path, say=lambda m: None) -> dict:
    """The front of the step at model_path: at least `points` verified plans when the step has
    them, in `points`, most memory first; the dominated ones and any plan the verifier refused
    beside. The front's plans come back in `plans`, in its order, for the caller to write into
    `plans_dir` (their `model` paths are relative to it)."""
    if points < MIN_POINTS:
        raise RoamError(f"--points must be at least {MIN_POINTS} (the two ends), got {points}")
    start = time.perf_counter()
    imported = import_model(model_path, options.dims, options.shapes_from_run)
    mm = memory.build(imported.graph, options.alignment, options.inplace, options.loss)
    graph = imported.graph
    if options.device is not None and sharding(graph.metadata) is None:
        raise RoamError("--device weighs --offload's plans or a rank step's communication: give --offload "
                        "host|storage, or a rank step (roam shard)")
    keep_all = recompute.keep_all(graph, mm, options.device)
    if not keep_all.problem.needed:
        raise RoamError(f"{model_path}: no forward value is read after the forward: not a training step, "
                        "nothing to recompute")
    seconds = options.time_limit if options.time_limit is not None else order.DEFAULT_SECONDS * points
    deadline = start + seconds
    fewest = recompute.fewest_bytes(graph, mm, options.device)
    made: dict[tuple, Point] = {}  # choice -> its point

    def add(batch: list[tuple[str, recompute.Choice, str, int | None]]) -> None:
        """Plan and verify the batch's choices not planned yet: in `options.jobs` processes at
        once when there are several (each plan's own search then runs in one), else here."""
        fresh: dict[tuple, tuple] = {}
        for label, choice, mode, limit in batch:
            key = (choice.saved, choice.copied, choice.replayed)
            if key not in made and key not in fresh:
                fresh[key] = (label, choice, mode, limit)
        if not fresh:
            return
        left = max(deadline - time.perf_counter(), 1.0)
        share = None if options.time_limit is None else left / max(points - len(made), 2)
        # parallel plans share the cores: each gets the share of a plan made alone, in a process of its own
        workers = min(options.jobs, len(fresh))
        each = replace(options, time_limit=share, jobs=1 if workers > 1 else options.jobs,
                       leaf_states=options.leaf_states or POINT_LEAF_STATES)
        tasks = list(fresh.values())
        for k, (label, *_rest) in enumerate(tasks):
            say(f"planning point {len(made) + k + 1}: {label}")
        planned = parallel_map(lambda task: plan_point(task, each), tasks, workers)
        for key, (label, _, _, limit), (plan, ok, violation) in zip(fresh, tasks, planned):
            made[key] = Point(label, limit, plan, ok, violation)

    def plan_point(task: tuple, each: pipeline.Options) -> tuple[dict, bool, str | None]:
        label, choice, mode, _ = task
        result = pipeline.plan_choice(imported, mm, choice, model_path, plans_dir / "plan.json",
                                      replace(each, recompute=mode), {}, lambda _m: None)
        plan = result.plan
        plan["source_model"] = dict(plan["model"])
        return (plan, *check(plan))

    def check(plan: dict) -> tuple[bool, str | None]:
        """verify's verdict, on the source model rewritten again from the plan's record"""
        try:
            verify(recompute.reapply(imported, plan["recompute"]).graph, imported.sha256, plan)
        except Violation as v:
            return False, str(v)
        return True, None

    add([("keep all", keep_all, "budget", None), ("free", recompute.free(graph, mm, options.device), "free", None),
         ("fewest bytes", fewest, "budget", None)])
    # bisect the boundary bytes next to the front's points, widest gap first: the limits tried
    # and the bytes each choice keeps mark where the program has been. With --jobs N, a round
    # splits the N widest such gaps (each limit tried is a mark for the next gap's choice) and
    # plans their choices at once; with one job it is one gap a round.
    marks = {p.plan["recompute"]["kept_bytes"]["after"] for p in made.values()}
    probes = 0
    while probes < PROBES_PER_POINT * points and time.perf_counter() < deadline:
        front = front_of(verified(made))[0]
        if len(front) >= points:
            break
        on_front = {p.plan["recompute"]["kept_bytes"]["after"] for p in front}
        batch, gaps = [], []
        # as many gaps as jobs, even with fewer points missing: a second core plans the spare one meanwhile
        for _ in range(min(max(options.jobs, 1), PROBES_PER_POINT * points - probes)):
            ordered = sorted(marks)
            gaps = [(hi - lo, lo, hi) for lo, hi in zip(ordered, ordered[1:])
                    if hi - lo > options.alignment and (lo in on_front or hi in on_front)]
            if not gaps:
                break
            _, lo, hi = max(gaps)
            limit = (lo + hi) // 2
            marks.add(limit)
            probes += 1
            say(f"choosing the cheapest recomputation that keeps at most {limit} bytes")
            ilp_deadline = time.perf_counter() + pipeline.BUDGET_ILP_SHARE * max(deadline - time.perf_counter(), 1.0)
            choice = recompute.within(fewest, limit, ilp_deadline, options.solver)
            if choice is not None:
                marks.add(choice.kept_bytes)
                batch.append((f"boundary ≤ {format_bytes(limit)}", choice, "budget", limit))
        if not batch and not gaps:
            break
        add(batch)
    front, dominated = front_of(verified(made))
    return {"model": str(model_path), "dims": options.dims, "points": [p.record() for p in front],
            "dominated": [p.record() for p in dominated],
            "unverified": [p.record() for p in made.values() if not p.verified], "probes": probes,
            "seconds": time.perf_counter() - start, "plans": [p.plan for p in front]}


def verified(made: dict) -> list[Point]:
    return [p for p in made.values() if p.verified]


def mark(name: str, total_bytes: int, extra: str | None, step_flops: int) -> dict:
    """A reference point for the picture: `extra` is its extra FLOPs, a count or a share of the
    step ("23.3%"); a count is taken as a share of this step's FLOPs as roam counts them."""
    if extra is None:
        pct = 0.0
    else:
        try:
            pct = float(extra[:-1]) if extra.endswith("%") else 100 * float(extra) / step_flops
        except (ValueError, ZeroDivisionError):
            raise RoamError(f"--mark {name}: extra FLOPs {extra!r} is neither a count nor a percentage") from None
    if pct < 0:
        raise RoamError(f"--mark {name}: extra FLOPs {extra!r} is negative")
    return {"name": name, "total_bytes": total_bytes, "extra_flops_pct": pct}


def offload_front(model_path: Path, options: pipeline.Options, points: int, say=lambda m: None) -> dict:
    """The device-memory / estimated-time front of the step with a slower tier (`roam tradeoff
    --offload`): the offload planner's candidates (offload.planner.weigh) at budgets from what
    keeping everything needs down to a fifth of it, each fixed policy's device bytes less one
    alignment unit among them (where a plan beats it, if any does). A point is on the front when
    no other needs no more device bytes and no more time; each fixed policy is reported with the
    front's point that dominates it (less device memory at no more estimated time), if one does."""
    if points < MIN_POINTS:
        raise RoamError(f"--points must be at least {MIN_POINTS} (the two ends), got {points}")
    start = time.perf_counter()
    imported = import_model(model_path, options.dims, options.shapes_from_run)
    mm = memory.build(imported.graph, options.alignment, options.inplace, options.loss)

    def plan_model(i, m, o, refine=None):
        return pipeline.plan_model(i, m, model_path, model_path.with_name("plan.json"), o, {}, lambda _m: None, refine)

    made: dict = {}  # the placements planned, planned once for both calls
    fixed, _ = offload_planner.weigh(imported, mm, options, plan_model, pipeline.ORDERING, say, [], made)
    keep = next(c.device_bytes for c in fixed if c.policy == "keep")
    floor = offload_policies.working_set(imported.graph, mm)[0]
    spread = [keep * (points - k) // points for k in range(1, points)]
    budgets = sorted({b for b in spread + [c.device_bytes - options.alignment for c in fixed] if b >= floor})
    candidates, profile = offload_planner.weigh(imported, mm, options, plan_model, pipeline.ORDERING, say, budgets,
                                                made)

    def row(c) -> dict:
        return {"policy": c.policy, "device_bytes": c.device_bytes, "seconds": c.estimate.seconds,
                "energy_joules": c.estimate.energy_joules, "transfers": len(c.transfers)}

    rows = [row(c) for c in candidates if c.planned]  # one not planned cannot fit any budget weighed
    front = []
    for r in sorted(rows, key=lambda r: (r["seconds"], r["device_bytes"])):  # fastest first
        if not front or r["device_bytes"] < front[-1]["device_bytes"]:
            front.append(r)
    policies = []
    for r in map(row, fixed):  # the fixed policies, each planned
        better = [p for p in front if p["device_bytes"] < r["device_bytes"] and p["seconds"] <= r["seconds"]]
        policies.append(r | {"dominated_by": min(better, key=lambda p: p["device_bytes"]) if better else None})
    return {"model": str(model_path), "dims": options.dims, "offload": options.offload, "profile": profile.name,
            "points": sorted(front, key=lambda r: -r["device_bytes"]), "policies": policies,
            "plans_weighed": len(rows), "budgets": budgets, "seconds": time.perf_counter() - start}
