"""Plans with a slower memory tier (`roam optimize --offload host|storage [--budget B] [--device P]`).

Each candidate is a placement planned in full, order and both layouts (by the pipeline's
`plan_model`, passed in: the planner sits below the pipeline that calls it), and
its step estimated on the device profile. The fixed policies users know are candidates as they
are: keep (everything on the device), save_on_cpu, ZeRO-Offload, every persistent byte on the host,
and recompute only (roam's least-memory recomputation, nothing moved). From each placement that
does not fit, the planner offloads more forward values, the largest first, replanning until the
device's bytes (its persistent bytes + its arena) fit the budget, on the same graph and on the
graph with `free` recomputation. The plan is the fitting candidate of the least estimated time
(or energy); CheckFailed (exit 1) when none fits, naming the least found or the node no placement
can fit."""

import time
from dataclasses import dataclass, replace
from typing import Any

from roam_cli import recompute
from roam_cli.core import memory, plan as plan_io
from roam_cli.core.errors import CheckFailed, RoamError
from roam_cli.cost import profile as profile_mod
from roam_cli.cost.estimate import Estimate
from roam_cli.frontend.onnx_import import Imported
from roam_cli.offload import policies, prefetch, rewrite, timing
from roam_cli.offload.rewrite import Placement

OBJECTIVES = ("time", "energy")
GROW_ROUNDS = 6  # plans made growing one placement's offloaded values before giving it up


@dataclass
class Candidate:
    policy: str
    result: Any  # the pipeline's Result: its plan, graph and memory model
    estimate: Estimate
    offloaded: tuple[str, ...]
    transfers: list[dict]
    recompute: dict | None  # the plan's `recompute` record, when its graph recomputes

    @property
    def device_bytes(self) -> int:
        return plan_io.needed_bytes(self.result.plan)

    def summary(self, budget: int | None) -> dict:
        return {"policy": self.policy, "device_bytes": self.device_bytes,
                "slow_bytes": self.result.plan["tiers"]["arena_bytes"] + self.result.plan["tiers"]["persistent_bytes"],
                "fits": budget is None or self.device_bytes <= budget, "transfers": len(self.transfers),
                "estimate": self.estimate.as_dict()}


def weigh(imported: Imported, mm: memory.MemoryModel, options, plan_model, say, budgets: list[int]
          ) -> tuple[list[Candidate], profile_mod.Profile]:
    """Every candidate planned: the fixed policies, and for each budget none of them fits (but
    save_on_cpu, the most transfers) the placements grown to fit it. `plan_model(imported, mm,
    options[, given])` orders and lays out a graph and returns the pipeline's Result. A placement
    is planned once, however many budgets grow through it."""
    profile = profile_mod.load(options.device or profile_mod.DEFAULT)
    if options.objective not in OBJECTIVES:
        raise RoamError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {options.objective!r}")
    if options.objective == "energy" and profile.energy_per_flop is None:
        raise RoamError(f"--objective energy: device profile {profile.name!r} has no energy figures")
    slow = options.offload
    floor, node = policies.working_set(imported.graph, mm)
    if budgets and min(budgets) < floor:
        raise CheckFailed(f"--budget {min(budgets)} bytes is below node {node!r}'s working set: {floor} bytes of its "
                          "inputs and outputs are on the device at once, wherever the rest lives")
    each = replace(options, time_limit=None if options.time_limit is None else max(options.time_limit / 12, 1.0))
    made: dict[tuple, Candidate] = {}

    def planned(policy: str, source: Imported, source_mm: memory.MemoryModel, placement: Placement,
                recomputing: dict | None = None) -> Candidate:
        key = (id(source), placement)
        if key in made:
            return made[key]
        say(f"planning {policy}" + (f", {len(placement.offloaded)} values offloaded" if placement.offloaded else ""))
        rewritten, transfers = rewrite.rewrite(source, source_mm, placement)
        new_mm = memory.build(rewritten.graph, options.alignment, options.inplace, options.loss)
        result = plan_model(rewritten, new_mm, each)
        index = rewritten.graph.node_index()
        order = [index[name] for name in result.plan["order"]]
        early = prefetch.hoist(rewritten.graph, new_mm, order, profile)
        if early != order:
            stats = {k: v for k, v in result.plan["stats"]["order"].items() if k not in ("strategy", "baselines")}
            moved = sum(a != b for a, b in zip(order, early))
            result = plan_model(rewritten, new_mm, each, (early, stats | {"prefetch_moved_steps": moved}))
            order = early
        made[key] = Candidate(policy, result, timing.planned(rewritten.graph, new_mm, order, profile),
                              tuple(sorted(placement.offloaded)), transfers, recomputing)
        return made[key]

    graph = imported.graph
    fewest = recompute.fewest_bytes(graph, mm)
    recomputed, recompute_record = recompute.apply(imported, mm, fewest, "budget")
    recomputed_mm = memory.build(recomputed.graph, options.alignment, options.inplace, options.loss)
    candidates = [
        planned("keep", imported, mm, Placement(slow)),
        planned("save_on_cpu", imported, mm, policies.save_on_cpu(graph, mm, slow)),
        planned("zero_offload", imported, mm, policies.update_on_host(graph, mm, slow, everything=False)),
        planned("all_on_host", imported, mm, policies.update_on_host(graph, mm, slow, everything=True)),
        planned("recompute_only", recomputed, recomputed_mm, Placement(slow), recompute_record),
    ]
    fixed = {c.policy: c for c in candidates}
    cheap = None
    for budget in sorted(budgets, reverse=True):
        if any(c.device_bytes <= budget for c in fixed.values() if c.policy != "save_on_cpu"):
            continue
        if cheap is None:
            free = recompute.free(graph, mm)
            cheap_graph, cheap_record = recompute.apply(imported, mm, free, "free")
            cheap = (cheap_graph, memory.build(cheap_graph.graph, options.alignment, options.inplace, options.loss),
                     cheap_record)
        for source, source_mm, everything, start_from, recomputing in (
                (imported, mm, None, fixed["keep"], None), (imported, mm, False, fixed["zero_offload"], None),
                (imported, mm, True, fixed["all_on_host"], None), (cheap[0], cheap[1], True, None, cheap[2])):
            grown = grow(planned, source, source_mm, slow, everything, budget, start_from, recomputing)
            candidates.extend(c for c in grown if c not in candidates)
            if grown and grown[-1].device_bytes <= budget and everything is None:
                break  # activations alone were enough: the optimizer stays on the device
    return candidates, profile


def plan(imported: Imported, mm: memory.MemoryModel, options, plan_model, say) -> Any:
    """The plan of the least estimated cost (options.objective) that fits options.budget (see weigh)."""
    start = time.perf_counter()
    budget, slow, objective = options.budget, options.offload, options.objective
    candidates, profile = weigh(imported, mm, options, plan_model, say, [] if budget is None else [budget])

    def cost(c: Candidate) -> float:
        return c.estimate.seconds if objective == "time" else c.estimate.energy_joules

    fitting = [c for c in candidates if budget is None or c.device_bytes <= budget]
    if not fitting:
        least = min(candidates, key=lambda c: c.device_bytes)
        raise CheckFailed(f"--budget {budget} bytes cannot be met with --offload {slow}: the smallest plan roam "
                          f"found ({least.policy}) holds {least.device_bytes} bytes on the device "
                          f"(persistent {least.result.plan['persistent_bytes']} + arena {least.result.plan['arena_bytes']})")
    chosen = min(fitting, key=lambda c: (cost(c), c.device_bytes))
    result = chosen.result
    p = result.plan
    if chosen.recompute is not None:
        p["recompute"] = chosen.recompute
    positions = {name: step for step, name in enumerate(p["order"])}
    readers = result.imported.graph.consumers
    index = result.imported.graph.node_index()
    p["offload"] = {
        "policy": chosen.policy, "profile": profile.name, "objective": objective, "budget_bytes": budget,
        "offloaded": list(chosen.offloaded),
        "transfers": [t | {"step": positions[t["node"]],
                           "needed_at": min(positions[result.imported.graph.nodes[u].name] for u in readers[t["node"]])}
                      for t in chosen.transfers if t["node"] in index and readers.get(t["node"])],
        "estimate": chosen.estimate.as_dict(),
        "candidates": [c.summary(budget) for c in candidates],
    }
    if not options.reproducible:
        p["stats"]["seconds"]["offload"] = time.perf_counter() - start - p["stats"]["seconds"]["order"] - \
            p["stats"]["seconds"]["layout"]
    return result


def grow(planned, source: Imported, source_mm: memory.MemoryModel, slow: str, everything: bool | None,
         budget: int, start_from: Candidate | None, recomputing: dict | None) -> list[Candidate]:
    """Plans of one placement (`everything` None: the optimizer on the device; False: ZeRO-Offload's;
    True: every persistent byte on the host) with more and more forward values offloaded, the
    largest first, each round offloading at least the last plan's excess, until one fits or
    nothing is left to offload. `start_from`: the placement's plan with nothing offloaded, when
    made already. The last plan made is the last of the list."""
    graph = source.graph
    base = (Placement(slow) if everything is None
            else policies.update_on_host(graph, source_mm, slow, everything=everything))
    sizes = policies.offloadable(graph, source_mm)
    ranked = sorted(sizes, key=lambda v: (-sizes[v], v))
    name = {None: "planned", False: "planned+zero_offload", True: "planned+all_on_host"}[everything]
    made: list[Candidate] = []
    taken, excess = 0, None if start_from is None else start_from.device_bytes - budget
    for _ in range(GROW_ROUNDS):
        if excess is not None:
            want = sum(sizes[v] for v in ranked[:taken]) + max(excess, 1)
            while taken < len(ranked) and sum(sizes[v] for v in ranked[:taken]) < want:
                taken += 1
        made.append(planned(name, source, source_mm, replace(base, offloaded=frozenset(ranked[:taken])),
                            recomputing))
        excess = made[-1].device_bytes - budget
        if excess <= 0 or taken == len(ranked):
            break
    return made
