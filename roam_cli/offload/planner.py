"""Plans with a slower memory tier (`roam optimize --offload host|storage [--budget B] [--device P]`).

Each candidate is a placement planned in full, order and both layouts (by the pipeline's
`plan_model`, passed in: the planner sits below the pipeline that calls it), and
its step estimated on the device profile. The fixed policies users know are candidates as they
are: keep (everything on the device), save_on_cpu, ZeRO-Offload, every persistent byte on the host,
and recompute only (roam's least-memory recomputation, nothing moved). From each placement that
does not fit, on the graph as it is and on the graph with `free` recomputation, the planner
offloads more forward values (those the device holds at its peak, then those whose round trip the
compute hides best) or moves more parameters' updates to the host, replanning until the device's
bytes (its persistent bytes + its arena) fit the budget. The plan is the
fitting candidate of the least estimated time (or energy); CheckFailed (exit 1) when none fits,
naming the least found or the node no placement can fit."""

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
    """Every candidate planned: the fixed policies, and for each budget the placements grown to fit
    it from each base (bases), but those whose plan is already slower than one that fits.
    `plan_model(imported, mm, options[, given])` orders and lays out a graph and returns the
    pipeline's Result. A placement is planned once, however many budgets grow through it."""
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

        def hoisted(order: list[int]) -> tuple[list[int], dict]:
            """the fetches moved earlier, before the order is laid out (laid out once)"""
            early = prefetch.hoist(rewritten.graph, new_mm, order, profile)
            return early, {"prefetch_moved_steps": sum(a != b for a, b in zip(order, early))}

        result = plan_model(rewritten, new_mm, each, hoisted)
        index = rewritten.graph.node_index()
        order = [index[name] for name in result.plan["order"]]
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
    if not budgets:
        return candidates, profile
    free = recompute.free(graph, mm)
    cheap, cheap_record = recompute.apply(imported, mm, free, "free")
    cheap_mm = memory.build(cheap.graph, options.alignment, options.inplace, options.loss)
    # the placements grown, each on the graph as it is and with `free` recomputation: forward values
    # offloaded from each placement (None: the optimizer on the device; False: ZeRO-Offload's;
    # True: every persistent byte on the host), and parameters' updates moved to the host one
    # by one ("updates")
    bases = [(source, source_mm, everything, record)
             for everything in (None, False, True, "updates")
             for source, source_mm, record in ((imported, mm, None), (cheap, cheap_mm, cheap_record))]

    for budget in sorted(budgets, reverse=True):
        started = [(planned(GROWN[None if everything == "updates" else everything] + ("+free" if record else ""),
                            source, source_mm,
                            base_placement(source, source_mm, slow, None if everything == "updates" else everything),
                            record), source, source_mm, everything, record)
                   for source, source_mm, everything, record in bases]
        for c, *_ in started:
            if c not in candidates:
                candidates.append(c)
        started.sort(key=lambda b: cost(b[0], options.objective))
        for start_from, source, source_mm, everything, record in started:
            best = min((cost(c, options.objective) for c in candidates if c.device_bytes <= budget), default=None)
            if best is not None and cost(start_from, options.objective) >= best:
                continue  # offloading more only adds transfers to a plan already slower than one that fits
            grown = (grow_updates(planned, start_from, source, source_mm, slow, budget, record)
                     if everything == "updates" else
                     grow(planned, start_from, source, source_mm, slow, everything, budget, record, profile))
            candidates.extend(c for c in grown if c not in candidates)
    return candidates, profile


def plan(imported: Imported, mm: memory.MemoryModel, options, plan_model, say) -> Any:
    """The plan of the least estimated cost (options.objective) that fits options.budget (see weigh)."""
    start = time.perf_counter()
    budget, slow, objective = options.budget, options.offload, options.objective
    candidates, profile = weigh(imported, mm, options, plan_model, say, [] if budget is None else [budget])

    fitting = [c for c in candidates if budget is None or c.device_bytes <= budget]
    if not fitting:
        least = min(candidates, key=lambda c: c.device_bytes)
        raise CheckFailed(f"--budget {budget} bytes cannot be met with --offload {slow}: the smallest plan roam "
                          f"found ({least.policy}) holds {least.device_bytes} bytes on the device "
                          f"(persistent {least.result.plan['persistent_bytes']} + arena {least.result.plan['arena_bytes']})")
    chosen = min(fitting, key=lambda c: (cost(c, objective), c.device_bytes))
    result = chosen.result
    p = result.plan
    if chosen.recompute is not None:
        p["recompute"] = chosen.recompute
    positions = {name: step for step, name in enumerate(p["order"])}
    graph = result.imported.graph
    p["offload"] = {
        "policy": chosen.policy, "profile": profile.name, "objective": objective, "budget_bytes": budget,
        "offloaded": list(chosen.offloaded),
        "transfers": [t | {"step": positions[t["node"]],
                           "needed_at": min(positions[graph.nodes[u].name] for u in graph.consumers[t["node"]]),
                           "readers": sorted(graph.nodes[u].name for u in graph.consumers[t["node"]])}
                      for t in chosen.transfers],
        "estimate": chosen.estimate.as_dict(),
        "candidates": [c.summary(budget) for c in candidates],
    }
    if not options.reproducible:
        p["stats"]["seconds"]["offload"] = time.perf_counter() - start - p["stats"]["seconds"]["order"] - \
            p["stats"]["seconds"]["layout"]
    return result


def cost(c: Candidate, objective: str) -> float:
    """What the planner minimises; energy a profile cannot estimate counts as unbounded."""
    value = c.estimate.seconds if objective == "time" else c.estimate.energy_joules
    return float("inf") if value is None else value


GROWN = {None: "planned", False: "planned+zero_offload", True: "planned+all_on_host"}


def base_placement(source: Imported, source_mm: memory.MemoryModel, slow: str, everything: bool | None) -> Placement:
    """A grown placement's start (`everything` None: the optimizer on the device; False:
    ZeRO-Offload's; True: every persistent byte on the host), nothing offloaded yet."""
    if everything is None:
        return Placement(slow)
    return policies.update_on_host(source.graph, source_mm, slow, everything=everything)


def grow_updates(planned, start_from: Candidate, source: Imported, source_mm: memory.MemoryModel, slow: str,
                 budget: int, recomputing: dict | None) -> list[Candidate]:
    """Plans with more and more parameters' updates run by the host with their state there
    (ZeRO-Offload a parameter at a time: policies.update_groups), the most state first, each round
    moving at least the last plan's excess of state, until one fits or every update has moved. The
    last plan made is the last of the list."""
    groups = policies.update_groups(source.graph, source_mm)
    name = "planned+updates" + ("+free" if recomputing else "")
    made: list[Candidate] = []
    taken, last = 0, start_from
    for _ in range(GROW_ROUNDS):
        excess = last.device_bytes - budget
        if excess <= 0 or taken == len(groups):
            break
        moved = 0
        while taken < len(groups) and moved < excess:
            moved += groups[taken][1]
            taken += 1
        host = frozenset().union(*(nodes for nodes, _ in groups[:taken]))
        last = planned(name, source, source_mm, policies.update_on_host(source.graph, source_mm, slow, False, host),
                       recomputing)
        made.append(last)
    return made


def grow(planned, start_from: Candidate, source: Imported, source_mm: memory.MemoryModel, slow: str,
         everything: bool | None, budget: int, recomputing: dict | None, profile) -> list[Candidate]:
    """Plans of a placement (start_from's) with more and more forward values offloaded, each round
    offloading at least the last plan's excess more, until one fits or nothing is left to offload.
    Each round takes first the values that the last plan holds on the device at its peak (only
    those lower it), among them those whose round trip the compute hides best (timing.hidden_share),
    the largest first among equals. The last plan made is the last of the list."""
    sizes = policies.offloadable(source.graph, source_mm)
    base = base_placement(source, source_mm, slow, everything)
    name = GROWN[everything] + ("+free" if recomputing else "")
    made: list[Candidate] = []
    taken: list[str] = []
    last = start_from
    for _ in range(GROW_ROUNDS):
        excess = last.device_bytes - budget
        left = [v for v in sizes if v not in taken]
        if excess <= 0 or not left:
            break
        graph, order = last.result.imported.graph, last.result.plan["order"]
        at_peak = timing.live_at(graph, order, left, last.result.plan["peak_step"])
        hidden = timing.hidden_share(graph, last.result.mm, order, {v: sizes[v] for v in left}, profile)
        added = 0
        for v in sorted(left, key=lambda v: (v not in at_peak, -hidden[v], -sizes[v], v)):
            if added >= excess:
                break
            taken.append(v)
            added += sizes[v]
        last = planned(name, source, source_mm, replace(base, offloaded=frozenset(taken)), recomputing)
        made.append(last)
    return made
