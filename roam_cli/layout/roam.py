"""The ``roam`` layout strategy: heuristics, decomposition, exact search, ILP -- never worse
than the best heuristic.

Who does what, and why:

1. **Heuristics** (:mod:`heuristics`, :mod:`first_fit`): first-fit, XLA best-fit, greedy-by-size
   and two more first-fit orders are always run.  Their best layout is the incumbent and the
   fallback; their arenas go to ``stats["baselines"]``.  The peak of live bytes is the lower
   bound: when the incumbent meets it (or meets ``capacity``) we are done.
2. **Decomposition into independent subproblems.**  Time is cut wherever no buffer is live
   across the cut; the pieces never interact and each is laid out from offset 0.  The arena is
   the maximum over pieces, so only pieces whose incumbent is above the target (the peak-live
   bound, or ``capacity``) are searched at all -- on a training graph usually one or two.
   Inside a piece the exact search decomposes further on the fly (below).
3. **Exact combinatorial search** (:mod:`search`, MiniMalloc-style canonical search with
   spatial inference, dominance, dynamic temporal decomposition): decides "does this piece fit
   in ``target`` bytes?" and is the part that reaches zero fragmentation.  Long-lived buffers
   have the lowest minimum offsets and the largest areas, so it fixes them first, after which
   the short-lived remainder splits into independent time segments that are solved one by
   one -- the "long-lived first, then segments" decomposition falls out of the search itself.
   A portfolio of static rankings runs round-robin with a doubling node limit (minimalloc's
   restart scheme).  Every failed section check adds to that section's weight, and half of the
   rankings put the buffers of heavily failing sections first, so restarts learn where the
   instance is tight (a dom/wdeg-style heuristic).  The search itself runs in C
   (:mod:`roam_cli.layout._search`; :mod:`search` is its Python reference).  With ``jobs > 1`` the rankings run in parallel processes, and independent
   pieces are solved in parallel.
4. **Minimisation.**  Without ``capacity`` the target is the peak-live bound.  If a piece does
   not fit it (proven infeasible, or out of time), the height is bisected between the bound
   and the incumbent, each probe a time-limited decision search.  An exhausted search is a
   proof, so small pieces end with a proven optimum.  With a ``gap``, a height within that
   fraction of the bound will do: a short probe (a second at most) at the bound itself comes
   first, then, where the piece is not within the gap yet, one at that height (on a 70B-class
   step, one descent of the search reaches 0.1 %, where a probe at the bound runs out of time).
5. **ILP** (:mod:`ilp`, PuLP/CBC, big-M order disjunctions, warm-started from the incumbent):
   for small pieces (<= ``ILP_MAX_BUFFERS``) on which the search ran out of time without a
   proof, the offset ILP gets the remaining time to improve the incumbent or prove it optimal.
   It is not used on large pieces, where its linear relaxation is too weak to help.

Every failure (solver missing, infeasible, timeout, exception) leaves the incumbent in place
and is recorded in ``stats["fallback"]``.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing as mp
import queue
import time
import traceback
from collections.abc import Sequence

from roam_cli.layout import heuristics, peak_live
from roam_cli.layout.first_fit import first_fit
from roam_cli.layout.search import DEFAULT_HEURISTICS, CanonicalSearch, SearchAborted
from roam_cli.solvers import milp

ILP_MAX_BUFFERS = 24
TARGET_PROBE_SECONDS = 1.0  # with a gap, the probe at the target itself before the one at the gap's height


def default_time_limit(n: int) -> float:
    """Budget when the caller gives none: a few seconds for small instances, about a minute
    for ~10k buffers (the search needs one node per buffer on training graphs, each O(n))."""
    return min(90.0, 3.0 + n / 150.0)


def height_of(buffers, offsets, idx=None) -> int:
    it = range(len(buffers)) if idx is None else idx
    return max((offsets[i] + buffers[i][2] for i in it if buffers[i][2] > 0), default=0)


def split_components(buffers, idx: list[int]) -> list[list[int]]:
    """Maximal groups of buffers connected through overlapping lifetimes (time-contiguous)."""
    order = sorted(idx, key=lambda i: (buffers[i][0], buffers[i][1]))
    comps: list[list[int]] = []
    end = None
    for i in order:
        lo, hi, _ = buffers[i]
        if end is None or lo >= end:
            comps.append([i])
            end = hi
        else:
            comps[-1].append(i)
            if hi > end:
                end = hi
    return comps


# ------------------------------------------------------------------ portfolio search
FINAL = ("solved", "infeasible", "timeout", "recursion limit")  # the statuses that end a portfolio


def _attempts(cs, target, deadline, rankings, start_limit=None):
    """The portfolio's attempts on ``cs`` (a :class:`CanonicalSearch`), in order: round-robin
    over ``rankings`` with a node limit that doubles every round.  Yields ``(status,
    offsets|None, nodes)`` per attempt; the status is "node limit" or one of FINAL, after which
    nothing more is yielded.  An exhausted search ("infeasible") is a proof."""
    sub = cs.buffers
    if cs.lower_bound > target or max(b[2] for b in sub) > target:
        yield "infeasible", None, 0
        return
    limit = start_limit or max(2 * len(sub), 64)
    weights = [0] * len(cs.members)  # failures per section, learnt across the restarts
    while True:
        for h in rankings:
            if time.perf_counter() >= deadline:
                yield "timeout", None, 0
                return
            before = cs.nodes
            try:
                off = cs.solve(target, deadline, h, limit, weights=weights)
                status = "solved" if off is not None else "infeasible"
            except SearchAborted as e:
                off, status = None, "timeout" if "deadline" in str(e) else "node limit"
            except RecursionError:
                off, status = None, "recursion limit"
            yield status, off, cs.nodes - before
            if status in FINAL:
                return
        limit *= 2


def _worker(q, k, cs, target, deadline, rankings):
    """Worker ``k``: every attempt of its share of the rankings goes to ``q``."""
    try:
        for i, (status, off, nodes) in enumerate(_attempts(cs, target, deadline, rankings)):
            q.put((k, i, status, off, nodes))
    except BaseException as e:  # report, never hang the parent
        q.put((k, None, f"error: {type(e).__name__}: {e}", None, 0))


def decide(sub, target, deadline, jobs=1, rankings=DEFAULT_HEURISTICS, cs=None):
    """Does ``sub`` fit under ``target``?  Returns (offsets|None, status, nodes).

    ``cs`` is ``sub``'s :class:`CanonicalSearch` when the caller keeps one across probes: its
    sections and overlaps (O(overlapping pairs), millions on a 70B-class step) are built once,
    here before the workers fork, and never again in each worker or for each probe.

    With ``jobs`` > 1 the rankings are dealt round-robin to worker processes, and their attempts
    are taken in the order one process would make them: the answer is the first attempt in
    that order that settles the question, whichever worker finishes first.  So the offsets do
    not depend on process scheduling (only a deadline can cut a search short)."""
    jobs = max(1, min(int(jobs or 1), len(rankings)))
    cs = cs if cs is not None else CanonicalSearch(sub)
    if jobs == 1 or len(sub) < 50:
        nodes = 0
        for status, off, n in _attempts(cs, target, deadline, rankings):
            nodes += n
        return off, status, nodes
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
    q = ctx.Queue()
    shares = [rankings[k::jobs] for k in range(jobs)]
    cs.prepare()  # inherited by the forked workers
    procs = [ctx.Process(target=_worker, args=(q, k, cs, target, deadline, shares[k]), daemon=True)
             for k in range(jobs)]
    for p in procs:
        p.start()
    reported: dict[tuple[int, int], tuple] = {}
    nodes = 0
    try:
        for position in itertools.count():
            # one process's attempt number `position` is ranking g of round r, which is worker
            # k's attempt i
            r, g = divmod(position, len(rankings))
            k = g % jobs
            key = (k, r * len(shares[k]) + g // jobs)
            while key not in reported:
                try:
                    k2, i, status, off, n = q.get(timeout=max(deadline - time.perf_counter() + 5.0, 0.1))
                except queue.Empty:
                    return None, "timeout", nodes
                if i is None:  # the worker failed
                    return None, status, nodes
                reported[k2, i] = (status, off, n)
            status, off, n = reported.pop(key)
            nodes += n
            if status in FINAL:
                return off, status, nodes
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=1.0)


# ------------------------------------------------------------------ one piece
def solve_piece(sub, best_off, target, lb, deadline, jobs, minimise, say, solver, good):
    """Improve the incumbent ``best_off`` of one independent piece, until its height is at most
    ``good`` (``target``, or within the gap above it).  Returns (offsets, info)."""
    t0 = time.perf_counter()
    best_h = height_of(sub, best_off)
    info = {"buffers": len(sub), "lower_bound": lb, "heuristic": best_h, "nodes": 0, "probes": []}
    status_final = "heuristic"
    cs = CanonicalSearch(sub)  # one for every probe
    lo = max(lb, 0)
    # with a gap, a short probe at the target first: on a piece of a few thousand buffers it often
    # settles as fast as one at the gap's height (T5-small's free step: 0.075 % -> 0 in less time)
    # (every height is a sum of sizes, so a multiple of their gcd: where the gap is narrower than
    # that, a probe at its height is the probe at the target, and gets the long share)
    unit = math.gcd(*(b[2] for b in sub)) or 1
    at_target_first = minimise and good - target >= unit and best_h > target
    goal = target if at_target_first else good  # then the gap's height: any layout that low will do
    proven_lo = lo  # every height below this is proven impossible
    long_probes = 0
    while (best_h > good or at_target_first) and time.perf_counter() < deadline:
        left = deadline - time.perf_counter()
        # a decision (capacity) gets all the time; when minimising, the first long probe gets 60%
        # and each later probe half of what is left
        if not minimise:
            share = left
        elif at_target_first:
            share = min(left * 0.6, TARGET_PROBE_SECONDS)
        elif not long_probes:
            share = left * 0.6
        else:
            share = max(left * 0.5, 0.05)
        long_probes += not at_target_first
        probe_deadline = time.perf_counter() + share
        off, status, nodes = decide(sub, goal, probe_deadline, jobs, cs=cs)
        info["nodes"] += nodes
        info["probes"].append({"target": goal, "status": status})
        if status == "solved":
            h = height_of(sub, off)
            if h < best_h:
                best_off, best_h = off, h
        elif status == "infeasible":
            proven_lo = max(proven_lo, goal + 1)
        if not minimise:
            break  # a decision: one probe at the capacity
        if at_target_first:
            at_target_first, goal = False, good
            continue
        # bisection between the smallest height not yet ruled out and the incumbent (a probe
        # that ran out of time rules its target out too -- without proof)
        # (in multiples of the sizes' gcd, as every height is: a probe between two is wasted)
        if status != "solved":
            lo = -(-(goal + 1) // unit) * unit
        if lo >= best_h:
            break
        goal = max(lo, (lo + best_h - 1) // 2 // unit * unit)
    if best_h <= lb:
        status_final = "optimal"
    elif proven_lo >= best_h:
        status_final = "optimal"
    elif info["nodes"]:
        status_final = "feasible" if best_h < info["heuristic"] else "heuristic"
    info["proven_lower_bound"] = max(lb, proven_lo)
    # small pieces the search could not settle: the offset ILP gets what time is left
    proven_out = not minimise and proven_lo > target  # the capacity is proven infeasible
    if (status_final not in ("optimal",) and len(sub) <= ILP_MAX_BUFFERS and not proven_out
            and deadline - time.perf_counter() > 0.2 and best_h > good):
        from roam_cli.layout.ilp import solve_ilp
        off, ilp_info = solve_ilp(sub, upper=best_h, lower=info["proven_lower_bound"],
                                  warm=best_off, time_limit=deadline - time.perf_counter(), solver=solver)
        info["ilp"] = ilp_info
        if off is not None:
            h = height_of(sub, off)
            if h < best_h:
                best_off, best_h = off, h
            if ilp_info.get("status") == "optimal":
                status_final = "optimal"
            elif h < info["heuristic"]:
                status_final = "feasible"
    info["height"] = best_h
    info["status"] = status_final
    info["seconds"] = round(time.perf_counter() - t0, 4)
    return best_off, info


# ------------------------------------------------------------------ entry point
HEURISTICS = {
    "first-fit": first_fit,
    "best-fit": heuristics.best_fit,
    "greedy-size": heuristics.greedy_size,
    "first-fit-by-size": heuristics.first_fit_sizes,
    "first-fit-by-lifetime": heuristics.first_fit_long,
}
PARALLEL_HEURISTICS = 2000  # buffers from which the heuristics run in parallel (each O(n^2) numpy)


def _heuristic(name: str, buffers) -> tuple[str, list[int] | None, str | None, float]:
    """(name, offsets or None, why it failed or None, seconds) of one heuristic."""
    t = time.perf_counter()
    try:
        return name, HEURISTICS[name](buffers), None, time.perf_counter() - t
    except Exception as e:
        return name, None, f"{type(e).__name__}: {e}", time.perf_counter() - t


def _run_heuristics(buffers, jobs: int) -> list[tuple[str, list[int] | None, str | None, float]]:
    """Every heuristic on ``buffers``, in HEURISTICS order; in ``jobs`` forked processes on
    large instances (70B-class steps: seconds each)."""
    if jobs <= 1 or len(buffers) < PARALLEL_HEURISTICS or "fork" not in mp.get_all_start_methods():
        return [_heuristic(name, buffers) for name in HEURISTICS]
    with mp.get_context("fork").Pool(min(jobs, len(HEURISTICS))) as pool:
        return pool.starmap(_heuristic, [(name, buffers) for name in HEURISTICS])


def roam_layout(buffers: Sequence[tuple[int, int, int]], *, time_limit: float | None = None,
                jobs: int = 1, capacity: int | None = None, progress=None, solver: str = "cbc",
                gap: float = 0.0):
    """Returns (offsets, stats).  ``buffers`` must already be validated plain ints.  When
    minimising, the search stops once the arena is within ``gap`` (a fraction) of the peak of
    live bytes."""
    say = progress or (lambda _m: None)
    t_start = time.perf_counter()
    n = len(buffers)
    offsets = [0] * n
    active = [i for i, (lo, hi, sz) in enumerate(buffers) if sz > 0 and hi > lo]
    lb = peak_live(buffers)
    budget = default_time_limit(len(active)) if time_limit is None else max(float(time_limit), 0.0)
    deadline = t_start + budget
    stats: dict = {"lower_bound": lb, "time_limit": round(budget, 3), "gap": gap}
    fallback: list[str] = []

    # 1. heuristics (also the baselines of the report)
    say(f"layout: heuristics on {len(active)} buffers")
    sub_all = [buffers[i] for i in active]
    results = {}
    baselines = []
    for name, off, failure, seconds in _run_heuristics(sub_all, jobs):
        if failure:  # a broken heuristic must not take roam down
            fallback.append(f"heuristic {name} failed: {failure}")
            continue
        results[name] = off
        baselines.append({"strategy": name, "arena_bytes": height_of(sub_all, off), "seconds": round(seconds, 4)})
    if not results:
        raise RuntimeError("every layout heuristic failed: " + "; ".join(fallback))
    # the runtime allocators, replayed, as baselines only (their own figures)
    from roam_cli.layout import allocators
    for name, fn, key in (("pytorch", allocators.pytorch_caching, "peak_reserved"),
                          ("bfc", allocators.bfc_arena, "peak_allocated")):
        t = time.perf_counter()
        try:
            _off, sim = fn(sub_all)
            baselines.append({"strategy": name, "arena_bytes": sim[key],
                              "seconds": round(time.perf_counter() - t, 4)})
        except Exception as e:
            fallback.append(f"baseline {name} failed: {type(e).__name__}: {e}")
    best_name = min(results, key=lambda k: (height_of(sub_all, results[k]), k != "first-fit"))
    best_sub = results[best_name]
    best_h = height_of(sub_all, best_sub)
    stats["baselines"] = baselines
    stats["best_heuristic"] = best_name
    stats["heuristic_arena"] = best_h

    # 2. pieces
    pos = {i: k for k, i in enumerate(active)}
    comps = split_components(buffers, active)
    stats["subproblems"] = len(comps)
    minimise = capacity is None
    target = lb if minimise else int(capacity)
    good = target + int(target * gap) if minimise else target
    # per piece, the best heuristic restricted to the piece (pieces never interact)
    piece_off: list[list[int]] = []
    for comp in comps:
        sub = [buffers[i] for i in comp]
        best_local = None
        for name, off in results.items():
            local = [off[pos[i]] for i in comp]
            h = height_of(sub, local)
            if best_local is None or h < best_local[0]:
                best_local = (h, local)
        piece_off.append(best_local[1])
    todo = [k for k, comp in enumerate(comps)  # with a gap, those within it get a probe at the target
            if height_of([buffers[i] for i in comp], piece_off[k]) > target]
    if not minimise and lb > target:
        fallback.append(f"capacity {target} is below the peak of live bytes {lb}")
        todo = []
    stats["searched"] = len(todo)
    pieces_info = []
    if todo:
        say(f"layout: exact search on {len(todo)} of {len(comps)} independent piece(s)")
        todo.sort(key=lambda k: -len(comps[k]))
        results_by_piece = _solve_pieces(buffers, comps, piece_off, todo, target, good, deadline, jobs,
                                         minimise, say, solver)
        for k, (off, info) in results_by_piece.items():
            piece_off[k] = off
            pieces_info.append(info)
            if info.get("error"):
                fallback.append(info["error"])
            elif milp.failed(info.get("ilp", {}).get("status", "optimal")):
                fallback.append(f"ILP on a piece of {info['buffers']} buffers: {info['ilp']['status']}; "
                                "kept the search's layout")
            elif info["status"] not in ("optimal",) and info["height"] > good:
                last = info["probes"][-1]["status"] if info["probes"] else "no time"
                fallback.append(f"piece of {info['buffers']} buffers: search {last}, "
                                f"kept height {info['height']} (target {target})")
    for comp, off in zip(comps, piece_off):
        for i, o in zip(comp, off):
            offsets[i] = o
    arena = height_of(buffers, offsets)
    if arena > best_h:  # cannot happen (pieces only improve), but never return worse
        fallback.append("combined layout worse than the best heuristic; using the heuristic")
        for k, i in enumerate(active):
            offsets[i] = best_sub[k]
        arena = best_h
    stats["pieces"] = pieces_info[:20]
    stats["search_nodes"] = sum(p.get("nodes", 0) for p in pieces_info)
    if minimise:
        if arena <= lb:
            stats["solver_status"] = "optimal"
        elif pieces_info and all(p["status"] == "optimal" for p in pieces_info):
            stats["solver_status"] = "optimal"
        elif todo:
            stats["solver_status"] = "feasible" if arena < best_h else "heuristic"
        else:
            stats["solver_status"] = "heuristic"
    else:
        stats["solver_status"] = "fits" if arena <= target else "does not fit"
    if fallback:
        stats["fallback"] = "; ".join(fallback)
    return offsets, stats


def _solve_pieces(buffers, comps, piece_off, todo, target, good, deadline, jobs, minimise, say, solver):
    out = {}
    jobs = max(1, int(jobs or 1))
    if jobs > 1 and len(todo) > 1:
        # independent pieces in parallel, one process each; a piece gets one core
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
        q = ctx.Queue()
        running = {}
        pending = list(todo)
        while pending or running:
            while pending and len(running) < jobs:
                k = pending.pop(0)
                sub = [buffers[i] for i in comps[k]]
                lb = peak_live(sub)
                p = ctx.Process(target=_piece_worker,
                                args=(q, k, sub, piece_off[k], target, good, lb, deadline, minimise, solver),
                                daemon=True)
                p.start()
                running[k] = p
            try:
                k, off, info = q.get(timeout=max(deadline - time.perf_counter() + 10.0, 0.5))
            except Exception:
                break
            out[k] = (off, info)
            p = running.pop(k, None)
            if p is not None:
                p.join(timeout=1.0)
        for k, p in running.items():
            if p.is_alive():
                p.terminate()
            p.join(timeout=1.0)
            out.setdefault(k, (piece_off[k], _error_info([buffers[i] for i in comps[k]], piece_off[k],
                                                         "worker did not report")))
        for k in pending:
            out[k] = (piece_off[k], _error_info([buffers[i] for i in comps[k]], piece_off[k], "no time left"))
        return out
    for idx, k in enumerate(todo):
        sub = [buffers[i] for i in comps[k]]
        lb = peak_live(sub)
        left = deadline - time.perf_counter()
        piece_deadline = time.perf_counter() + max(left / (len(todo) - idx), 0.0)
        say(f"layout: piece {idx + 1}/{len(todo)}: {len(sub)} buffers, peak live {lb}")
        try:
            out[k] = solve_piece(sub, piece_off[k], target, lb, piece_deadline, jobs, minimise, say, solver, good)
        except Exception as e:
            out[k] = (piece_off[k], _error_info(sub, piece_off[k], f"search failed: {type(e).__name__}: {e}"))
    return out


def _error_info(sub, off, why):
    """A piece whose search failed: it keeps its heuristic layout `off`, whose height it reports."""
    return {"buffers": len(sub), "status": "heuristic", "height": height_of(sub, off), "probes": [],
            "nodes": 0, "error": why}


def _piece_worker(q, k, sub, off, target, good, lb, deadline, minimise, solver):
    try:
        res = solve_piece(sub, off, target, lb, deadline, 1, minimise, lambda _m: None, solver, good)
        q.put((k, res[0], res[1]))
    except BaseException as e:
        q.put((k, off, {**_error_info(sub, off, f"search failed: {type(e).__name__}: {e}"),
                        "trace": traceback.format_exc(limit=3)}))


__all__ = ["roam_layout", "default_time_limit", "split_components", "ILP_MAX_BUFFERS"]
