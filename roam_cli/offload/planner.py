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
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from roam_cli import recompute
from roam_cli.core import memory
from roam_cli.core import plan as plan_io
from roam_cli.core.collectives import sharding
from roam_cli.core.errors import CheckFailed, RoamError
from roam_cli.core.forking import beside
from roam_cli.cost import profile as profile_mod
from roam_cli.cost.estimate import Estimate
from roam_cli.frontend.onnx_import import Imported
from roam_cli.offload import policies, prefetch, rewrite, timing
from roam_cli.offload.rewrite import Placement


class Ordering(NamedTuple):
    """What the planner takes from the order stage, which runs after it and is passed in as
    plan_model is: the least bytes any order of a memory model holds live at one step (the order
    search's lower bound), and the seconds its searches share without --time-limit."""

    least_live: Callable[[memory.MemoryModel], int]
    seconds: float


OBJECTIVES = ("time", "energy")
GROW_ROUNDS = 6  # plans made growing one placement's offloaded values before giving it up


@dataclass(eq=False)  # one per placement planned: the same by identity
class Candidate:
    policy: str
    result: Any  # the pipeline's Result: its plan, graph and memory model; None: not planned
    estimate: Estimate | None  # None: not planned, and its time depends on the order it would run in
    offloaded: tuple[str, ...]
    transfers: list[dict] | None  # None: not planned
    recompute: dict | None  # the plan's `recompute` record, when its graph recomputes
    persistent_bytes: int = 0  # its persistent bytes on the device: its placement's, whatever the order
    skipped: str | None = None  # why it was not planned (None: planned)
    least_bytes: int = 0  # no order or layout puts fewer bytes on the device (least_device_bytes)
    replan: Any = None  # seconds -> (result, estimate): planned again with that time limit
    bounded: bool = False  # least_bytes and floor_seconds computed
    floor_seconds: float | None = None  # no order is estimated faster (timing.floor); None: not computed

    @property
    def planned(self) -> bool:
        return self.result is not None

    @property
    def device_bytes(self) -> int | None:
        """persistent + arena on the device; None when not planned (at least persistent_bytes)"""
        return plan_io.needed_bytes(self.result.plan) if self.planned else None

    def fits(self, budget: int | None) -> bool:
        return self.planned and (budget is None or self.device_bytes <= budget)

    def summary(self, budget: int | None) -> dict:
        if not self.planned:  # what is known without an order, the rest left out
            return {"policy": self.policy, "planned": False, "why": self.skipped, "device_bytes": None,
                    "persistent_bytes": self.persistent_bytes, "least_device_bytes": self.least_bytes,
                    "slow_bytes": None, "fits": False, "transfers": None,
                    "estimate": None if self.estimate is None else self.estimate.as_dict(),
                    "least_seconds": self.floor_seconds}
        return {"policy": self.policy, "device_bytes": self.device_bytes,
                "slow_bytes": self.result.plan["tiers"]["arena_bytes"] + self.result.plan["tiers"]["persistent_bytes"],
                "fits": self.fits(budget), "transfers": len(self.transfers),
                "estimate": self.estimate.as_dict()}


def weigh(imported: Imported, mm: memory.MemoryModel, options, plan_model, ordering: Ordering, say,
          budgets: list[int], made: dict | None = None) -> tuple[list[Candidate], profile_mod.Profile]:
    """Every candidate: the fixed policies, and for each budget the placements grown to fit it from
    each base (bases), but those whose plan is already slower than one that fits.
    `plan_model(imported, mm, options[, refine])` orders and lays out a graph and returns the
    pipeline's Result. A placement is planned once, however many budgets grow through it (`made`:
    the placements planned, shared by calls on one model). With budgets, a placement whose
    persistent bytes on the device alone exceed the largest (a fixed policy) or the one it is grown
    for is not planned: no order or layout can fit it, and offloading forward values does not move
    a persistent byte; it is listed, not planned, with the estimate only where no order changes it
    (nothing moved, nothing on the host)."""
    profile = profile_mod.for_step(options.device, sharding(imported.graph.metadata) is not None)
    if options.objective not in OBJECTIVES:
        raise RoamError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {options.objective!r}")
    if options.objective == "energy" and profile.energy_per_flop is None:
        raise RoamError(f"--objective energy: device profile {profile.name!r} has no energy figures")
    slow = options.offload
    floor, node = policies.working_set(imported.graph, mm)
    if budgets and min(budgets) < floor:
        raise CheckFailed(f"--budget {min(budgets)} bytes is below node {node!r}'s working set: {floor} bytes of its "
                          "inputs and outputs are on the device at once, wherever the rest lives")
    each = replace(options, time_limit=max(total_seconds(options, ordering) / SHARES, 1.0))
    made = {} if made is None else made  # (graph, placement) -> its Candidate; (graph, placement, None): not planned

    def planned(policy: str, graph_name: str, source: Imported, source_mm: memory.MemoryModel, placement: Placement,
                recomputing: dict | None = None, limit: int | None = None) -> Candidate:
        """The candidate of `placement` on `source` (graph_name: "as is", "fewest" or "free"), planned
        unless its persistent bytes on the device exceed `limit`."""
        key = (graph_name, placement)
        c = made.get(key)
        if c is not None and (c.planned or (limit is not None and c.least_bytes > limit)):
            return c
        if c is None:
            persistent = device_persistent(source_mm, placement)
            c = made[key] = Candidate(policy, None, order_free_estimate(source, source_mm, placement, profile),
                                      tuple(sorted(placement.offloaded)), None, recomputing, persistent,
                                      least_bytes=persistent)
        if limit is not None and c.persistent_bytes > limit:
            c.skipped = f"not planned: {c.persistent_bytes} persistent bytes on the device, more than the budget"
            return c
        rewritten, transfers = rewrite.rewrite(source, source_mm, placement)
        new_mm = memory.build(rewritten.graph, options.alignment, options.inplace, options.loss)
        if c.floor_seconds is None:
            c.floor_seconds = timing.floor(rewritten.graph, new_mm, profile)
        if limit is not None:
            if not c.bounded:
                say(f"bounding {policy}")
                least = least_device_bytes(rewritten.graph, new_mm, ordering.least_live)
                c.least_bytes, c.bounded = max(c.least_bytes, least), True
            if c.least_bytes > limit:
                c.skipped = (f"not planned: no order or layout puts fewer than {c.least_bytes} bytes on the device "
                             "(persistent + the order's lower bound on live bytes), more than the budget")
                return c
        say(f"planning {policy}" + (f", {len(placement.offloaded)} values offloaded" if placement.offloaded else ""))

        def hoisted(order: list[int]) -> tuple[list[int], dict]:
            """the fetches moved earlier, before the order is laid out (laid out once)"""
            early = prefetch.hoist(rewritten.graph, new_mm, order, profile)
            return early, {"prefetch_moved_steps": sum(a != b for a, b in zip(order, early))}

        def plan_it(seconds: float) -> tuple[Any, Estimate]:
            result = plan_model(rewritten, new_mm, replace(options, time_limit=seconds), hoisted)
            index = rewritten.graph.node_index()
            return result, timing.planned(rewritten.graph, new_mm, [index[name] for name in result.plan["order"]],
                                          profile)

        # a candidate listed as not planned becomes planned in place (the lists holding it see it)
        (c.result, c.estimate), c.transfers, c.skipped, c.replan = plan_it(each.time_limit), transfers, None, plan_it
        return c

    graph = imported.graph
    most = max(budgets, default=None)
    if budgets:
        free = recompute.free(graph, mm, options.device)
        cheap, cheap_record = recompute.apply(imported, mm, free, "free")
        cheap_mm = memory.build(cheap.graph, options.alignment, options.inplace, options.loss)
        if options.jobs > 1:  # every fixed policy's and base's bounds at once, half in a process beside
            fixed = [("zero_offload", "as is", imported, mm, policies.update_on_host(graph, mm, slow, everything=False),
                      None),
                     ("all_on_host", "as is", imported, mm, policies.update_on_host(graph, mm, slow, everything=True),
                      None)]
            fixed += [(GROWN[everything] + "+free", "free", cheap, cheap_mm,
                       base_placement(cheap, cheap_mm, slow, everything), cheap_record) for everything in (False, True)]
            # the first updates' placements grown, where keeping their state on the device cannot fit
            for graph_name, source, source_mm, record in (("as is", imported, mm, None),
                                                          ("free", cheap, cheap_mm, cheap_record)):
                if device_persistent(source_mm, Placement(slow)) > most:
                    _, placement, lo = fewest_updates(source, source_mm, slow, most)
                    if lo is not None:
                        fixed.append((GROWN["updates"] + ("+free" if record else ""), graph_name, source, source_mm,
                                      placement(lo), record))
            todo = []
            for policy, graph_name, source, source_mm, placement, record in fixed:
                c = made.setdefault((graph_name, placement), Candidate(
                    policy, None, order_free_estimate(source, source_mm, placement, profile),
                    tuple(sorted(placement.offloaded)), None, record, device_persistent(source_mm, placement)))
                if not c.planned and not c.bounded and c.persistent_bytes <= most:
                    todo.append((c, source, source_mm, placement))
            say(f"bounding {len(todo)} placements")
            for (c, *_), (least, floor_seconds) in zip(todo, bounds_of([t[1:] for t in todo], options, profile, ordering.least_live)):
                c.least_bytes, c.floor_seconds, c.bounded = max(c.persistent_bytes, least), floor_seconds, True
    candidates = [
        planned("keep", "as is", imported, mm, Placement(slow), limit=most),
        planned("save_on_cpu", "as is", imported, mm, policies.save_on_cpu(graph, mm, slow), limit=most),
        planned("zero_offload", "as is", imported, mm, policies.update_on_host(graph, mm, slow, everything=False),
                limit=most),
        planned("all_on_host", "as is", imported, mm, policies.update_on_host(graph, mm, slow, everything=True),
                limit=most),
    ]
    kept = device_persistent(mm, Placement(slow))
    if ("fewest", Placement(slow)) not in made and most is not None and kept > most:
        # recomputing moves no persistent byte: not planned, and its graph (with the copies, whose
        # time is not known without them) not made
        candidates.append(Candidate("recompute_only", None, None, (), None, None, kept,
                                    f"not planned: {kept} persistent bytes on the device, more than the budget",
                                    least_bytes=kept))
    else:
        fewest = recompute.fewest_bytes(graph, mm, options.device)
        recomputed, recompute_record = recompute.apply(imported, mm, fewest, "budget")
        recomputed_mm = memory.build(recomputed.graph, options.alignment, options.inplace, options.loss)
        candidates.append(planned("recompute_only", "fewest", recomputed, recomputed_mm, Placement(slow),
                                  recompute_record, limit=most))
    if not budgets:
        return candidates, profile
    # the placements grown, each on the graph as it is and with `free` recomputation: forward values
    # offloaded from each placement (None: the optimizer on the device; False: ZeRO-Offload's;
    # True: every persistent byte on the host), and parameters' updates moved to the host one
    # by one ("updates")
    bases = [(graph_name, source, source_mm, everything, record)
             for everything in (None, False, True, "updates")
             for graph_name, source, source_mm, record in (("as is", imported, mm, None),
                                                           ("free", cheap, cheap_mm, cheap_record))]

    for budget in sorted(budgets, reverse=True):
        def start(graph_name, source, source_mm, everything, record, limit) -> Candidate:
            kind = None if everything == "updates" else everything
            return planned(GROWN[kind] + ("+free" if record else ""), graph_name, source, source_mm,
                           base_placement(source, source_mm, slow, kind), record, limit=limit)

        started = [(start(*b, budget), *b) for b in bases]
        for c, *_ in started:
            if c not in candidates:
                candidates.append(c)
        started.sort(key=lambda b: least_cost(b[0], options.objective))
        for start_from, graph_name, source, source_mm, everything, record in started:
            if everything != "updates" and start_from.persistent_bytes > budget:
                continue  # its persistent bytes alone exceed the budget: offloading forward values leaves them
            best = min((cost(c, options.objective) for c in candidates if c.fits(budget)), default=None)
            if (best is not None and not start_from.planned and start_from.estimate is None
                    and least_cost(start_from, options.objective) >= best * (1 - TIE)):
                continue  # no order of it is faster than a plan that fits (ties: the estimate's float rounding)
            if everything != "updates" and not start_from.planned:  # its plan's order is where growing starts
                start_from = start(graph_name, source, source_mm, everything, record, None)
            if best is not None and cost(start_from, options.objective) >= best:
                continue  # offloading more only adds transfers to a plan already slower than one that fits

            # updates' rounds are not planned where they cannot fit; offloading's, whose next round
            # starts from the last plan's order, are (called within this iteration)
            name = GROWN["updates" if everything == "updates" else everything] + ("+free" if record else "")
            limit = budget if everything == "updates" else None

            def grown_plan(placement: Placement, name=name, graph_name=graph_name, source=source,
                           source_mm=source_mm, record=record, limit=limit) -> Candidate:
                return planned(name, graph_name, source, source_mm, placement, record, limit=limit)

            grown = (grow_updates(grown_plan, start_from, source, source_mm, slow, budget)
                     if everything == "updates" else
                     grow(grown_plan, start_from, source, source_mm, slow, everything, budget, profile))
            candidates.extend(c for c in grown if c not in candidates)
    return candidates, profile


TIE = 1e-9  # estimates this close (relative) are one: the float rounding of sums over 100,000 steps


def least_device_bytes(graph, mm: memory.MemoryModel, least_live: Callable[[memory.MemoryModel], int]) -> int:
    """No order or layout of the graph puts fewer bytes on the device: its persistent bytes there,
    plus the order search's lower bound on the peak of live bytes (order.bounds: what every order
    holds at one step), less the largest output an in-place kernel may write into its input (the
    plan's memory model joins those the chosen order allows, which saves at most that output at
    the one step of its node; memory.kernels_in_place). The arena holds at least the peak."""
    joined = max((mm.tensor_bytes[n.outputs[h[0]]] for n in graph.nodes
                  if (h := memory.MAY_OVERWRITE.get((n.domain, n.op_type))) is not None and len(n.outputs) > h[0]),
                 default=0)
    return mm.persistent_bytes + max(least_live(mm) - joined, 0)


def bounds_of(items: list[tuple], options, profile: profile_mod.Profile,
              least_live: Callable[[memory.MemoryModel], int]) -> list[tuple[int, float]]:
    """(least_device_bytes, timing.floor) of each (source, source_mm, placement) rewritten: with
    options.jobs > 1 (and fork), every other one in a forked process while this one makes the rest.
    A process that fails or dies without an answer costs its time only: its share is then made
    here. The process does not outlive the call."""
    def one(source: Imported, source_mm: memory.MemoryModel, placement: Placement) -> tuple[int, float]:
        rewritten, _ = rewrite.rewrite(source, source_mm, placement)
        m = memory.build(rewritten.graph, options.alignment, options.inplace, options.loss)
        return least_device_bytes(rewritten.graph, m, least_live), timing.floor(rewritten.graph, m, profile)

    with beside(lambda: [one(*item) for item in items[1::2]], options.jobs > 1 and len(items) > 1) as theirs:
        ours = [one(*item) for item in items[0::2]]
        answer = theirs()
    out = [None] * len(items)
    out[0::2], out[1::2] = ours, answer
    return out


def least_cost(c: Candidate, objective: str) -> float:
    """What c costs at the least: its estimate when known, else the least any order of it costs
    (time: timing.floor); 0 where nothing is known."""
    if c.estimate is not None:
        return cost(c, objective)
    if objective == "time" and c.floor_seconds is not None:
        return c.floor_seconds
    return 0.0  # nothing known: the least, so that nothing is skipped for it


def device_persistent(mm: memory.MemoryModel, placement: Placement) -> int:
    """The persistent bytes a placement leaves on the device, whatever the order: those of every
    persistent tensor not kept in the slow tier (a rewrite adds none with bytes)."""
    return sum(mm.tensor_bytes[name] for name in mm.persistent if name not in placement.homes)


def order_free_estimate(source: Imported, source_mm: memory.MemoryModel, placement: Placement,
                        profile: profile_mod.Profile) -> Estimate | None:
    """The estimate of a placement that moves nothing and runs nothing on the host, in any order:
    every step is on the device's compute stream, one after another, so the step time is the sum of
    their times (energy counts FLOPs and bytes); None for a placement that moves something."""
    if placement.offloaded or placement.homes or placement.host_nodes:
        return None
    return timing.planned(source.graph, source_mm, list(range(len(source.graph.nodes))), profile)  # node order


def plan(imported: Imported, mm: memory.MemoryModel, options, plan_model, ordering: Ordering, say) -> Any:
    """The plan of the least estimated cost (options.objective) that fits options.budget (see weigh)."""
    start = time.perf_counter()
    budget, slow, objective = options.budget, options.offload, options.objective
    candidates, profile = weigh(imported, mm, options, plan_model, ordering, say, [] if budget is None else [budget])

    fitting = [c for c in candidates if c.fits(budget)]
    if not fitting:
        made = [c for c in candidates if c.planned]
        if not made:
            least = min(candidates, key=lambda c: c.persistent_bytes)
            raise CheckFailed(f"--budget {budget} bytes cannot be met with --offload {slow}: every placement roam "
                              f"weighs keeps more persistent bytes on the device, the fewest {least.persistent_bytes} "
                              f"({least.policy})")
        least = min(made, key=lambda c: c.device_bytes)
        raise CheckFailed(f"--budget {budget} bytes cannot be met with --offload {slow}: the smallest plan roam "
                          f"found ({least.policy}) holds {least.device_bytes} bytes on the device "
                          f"(persistent {least.result.plan['persistent_bytes']} + arena {least.result.plan['arena_bytes']})")
    chosen = min(fitting, key=lambda c: (cost(c, objective), c.device_bytes))
    left = total_seconds(options, ordering) - (time.perf_counter() - start)
    if options.time_limit is not None and left > 2 * max(total_seconds(options, ordering) / SHARES, 1.0):
        # what is left of --time-limit searches the chosen placement's order and layout again; the
        # plan kept is the better of the two (the search starts from the baselines the first did)
        say(f"planning {chosen.policy} again, for the {left:.0f} s left")
        again, estimate = chosen.replan(left)
        fits = budget is None or plan_io.needed_bytes(again.plan) <= budget
        if fits and (cost_of(estimate, objective), plan_io.needed_bytes(again.plan)) < (cost(chosen, objective),
                                                                                      chosen.device_bytes):
            chosen.result, chosen.estimate = again, estimate
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
    return cost_of(c.estimate, objective)


def cost_of(estimate: Estimate, objective: str) -> float:
    value = estimate.seconds if objective == "time" else estimate.energy_joules
    return float("inf") if value is None else value


# The planner's searches share --time-limit, or without one a plan alone's default search time
# (order.DEFAULT_SECONDS): each plan a SHARES-th of it (the fixed policies, the bases, a few rounds
# grown). With --time-limit, the chosen placement is searched again for what is left of it, if
# that is more than two shares (the better of its two plans kept); without, the plans made are
# the plans (on a 70B-class step the longer search found the same plan, in three minutes).
SHARES = 12


def total_seconds(options, ordering: Ordering) -> float:
    return options.time_limit if options.time_limit is not None else ordering.seconds


GROWN = {None: "planned", False: "planned+zero_offload", True: "planned+all_on_host", "updates": "planned+updates"}


def base_placement(source: Imported, source_mm: memory.MemoryModel, slow: str, everything: bool | None) -> Placement:
    """A grown placement's start (`everything` None: the optimizer on the device; False:
    ZeRO-Offload's; True: every persistent byte on the host), nothing offloaded yet."""
    if everything is None:
        return Placement(slow)
    return policies.update_on_host(source.graph, source_mm, slow, everything=everything)


def grow_updates(planned, start_from: Candidate, source: Imported, source_mm: memory.MemoryModel, slow: str,
                 budget: int) -> list[Candidate]:
    """Plans with more and more parameters' updates run by the host with their state there
    (ZeRO-Offload a parameter at a time: policies.update_groups), the most state first, each round
    moving at least the last plan's excess of state, until one fits or every update has moved.
    The first round moves at least the fewest groups that bring the device's persistent bytes
    within the budget (bisected: each group moved only adds homes); fewer cannot fit, and are not
    planned. None when even every update on the host leaves too many. `planned(placement)` plans
    one. The last plan made is the last of the list."""
    groups, placement, lo = fewest_updates(source, source_mm, slow, budget)
    if lo is None:
        return []
    made: list[Candidate] = []
    taken, last = 0, start_from
    for _ in range(GROW_ROUNDS):
        # not planned: at least its least bytes' excess (0 where its persistent bytes were all it knew)
        excess = last.device_bytes - budget if last.planned else max(last.least_bytes - budget, 0)
        if (last.planned and excess <= 0) or taken == len(groups):
            break
        moved = 0
        while taken < len(groups) and moved < excess:
            moved += groups[taken][1]
            taken += 1
        taken = max(taken, lo)
        last = planned(placement(taken))
        made.append(last)
    return made


def fewest_updates(source: Imported, source_mm: memory.MemoryModel, slow: str, budget: int) -> tuple:
    """(policies.update_groups, k -> the placement with the first k groups' updates on the host,
    the fewest k whose persistent bytes on the device fit the budget; None when none does)."""
    groups = policies.update_groups(source.graph, source_mm)
    readers = policies.readers_of(source.graph, source_mm)

    def placement(k: int) -> Placement:
        host = frozenset().union(*(nodes for nodes, _ in groups[:k]))
        return policies.update_on_host(source.graph, source_mm, slow, False, host, readers)

    if device_persistent(source_mm, placement(len(groups))) > budget:
        return groups, placement, None
    lo, hi = 0, len(groups)
    while lo < hi:
        mid = (lo + hi) // 2
        if device_persistent(source_mm, placement(mid)) <= budget:
            hi = mid
        else:
            lo = mid + 1
    return groups, placement, lo


def grow(planned, start_from: Candidate, source: Imported, source_mm: memory.MemoryModel, slow: str,
         everything: bool | None, budget: int, profile) -> list[Candidate]:
    """Plans of a placement (start_from's) with more and more forward values offloaded, each round
    offloading at least the last plan's excess more, until one fits or nothing is left to offload.
    Each round takes first the values that the last plan holds on the device at its peak (only
    those lower it), among them those whose round trip the compute hides best (timing.hidden_share),
    the largest first among equals. The last plan made is the last of the list."""
    sizes = policies.offloadable(source.graph, source_mm)
    base = base_placement(source, source_mm, slow, everything)
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
        last = planned(replace(base, offloaded=frozenset(taken)))
        made.append(last)
    return made
