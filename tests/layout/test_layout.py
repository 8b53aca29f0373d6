"""Layout strategies: validity on random instances, the roam engine's guarantees, capacity."""

import importlib
import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roam_cli import layout
from roam_cli.layout import heuristics
from roam_cli.layout.roam import split_components
from roam_cli.layout.search import CanonicalSearch, SearchAborted, sections_of

FAST = settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])


def assert_valid(buffers, placed):
    assert len(placed.offsets) == len(buffers)
    for i, ((lo, hi, size), off) in enumerate(zip(buffers, placed.offsets)):
        assert isinstance(off, int) and off >= 0
        for j in range(i):
            lo2, hi2, size2 = buffers[j]
            if size and size2 and lo < hi2 and lo2 < hi:
                o2 = placed.offsets[j]
                assert off + size <= o2 or o2 + size2 <= off, (i, j, buffers[i], buffers[j], off, o2)
    assert placed.arena == max((o + b[2] for o, b in zip(placed.offsets, buffers) if b[2] > 0), default=0)


@st.composite
def instances(draw, max_buffers=30, max_step=20):
    out = []
    for _ in range(draw(st.integers(0, max_buffers))):
        lo = draw(st.integers(0, max_step - 1))
        hi = draw(st.integers(lo + 1, max_step))
        size = draw(st.one_of(st.just(0), st.integers(1, 64).map(lambda k: k * 256), st.integers(1, 50_000)))
        out.append((lo, hi, size))
    return out


@FAST
@given(instances())
def test_every_strategy_gives_a_valid_layout(buffers):
    peak = layout.peak_live(buffers)
    arenas = {}
    for strategy in layout.STRATEGIES:
        placed = layout.place(buffers, strategy, time_limit=1.0)
        assert_valid(buffers, placed)
        assert placed.arena >= peak
        assert placed.stats["lower_bound"] == peak
        arenas[strategy] = placed.arena
    # roam is never worse than any heuristic it runs
    assert arenas["roam"] <= min(arenas["first-fit"], arenas["best-fit"], arenas["greedy-size"])


def test_empty_and_degenerate_inputs():
    for strategy in layout.STRATEGIES:
        assert layout.place([], strategy).arena == 0
        placed = layout.place([(0, 1, 0), (3, 3, 0), (0, 2, 0)], strategy)
        assert placed.offsets == [0, 0, 0] and placed.arena == 0
    with pytest.raises(ValueError):
        layout.place([(0, 1, -5)])
    with pytest.raises(ValueError):
        layout.place([(3, 1, 5)])
    with pytest.raises(ValueError):
        layout.place([(0, 1.5, 5)])
    with pytest.raises(ValueError):
        layout.place([(0, 1, 5)], "no-such-strategy")


def test_peak_live_half_open():
    # [0,2) and [2,4) never live together; [1,3) overlaps both
    assert layout.peak_live([(0, 2, 10), (2, 4, 10)]) == 10
    assert layout.peak_live([(0, 2, 10), (2, 4, 10), (1, 3, 5)]) == 15
    assert layout.peak_live([]) == 0


def perfect_packing(seed, leaves=14, width=24, height=64):
    """Guillotine-cut a width x height rectangle (time x 256-byte units) into buffers, so the
    peak live bytes are exactly height*256 at every step and a zero-fragmentation layout exists."""
    rng = random.Random(seed)
    rects = [(0, width, 0, height)]
    while len(rects) < leaves:
        k = max(range(len(rects)), key=lambda r: (rects[r][1] - rects[r][0]) * (rects[r][3] - rects[r][2]))
        t0, t1, y0, y1 = rects.pop(k)
        if (t1 - t0 >= 2 and rng.random() < 0.5) or y1 - y0 < 2:
            c = rng.randint(t0 + 1, t1 - 1)
            rects += [(t0, c, y0, y1), (c, t1, y0, y1)]
        else:
            c = rng.randint(y0 + 1, y1 - 1)
            rects += [(t0, t1, y0, c), (t0, t1, c, y1)]
    rng.shuffle(rects)
    return [(t0, t1, (y1 - y0) * 256) for t0, t1, y0, y1 in rects], height * 256


@pytest.mark.parametrize("seed", range(12))
def test_roam_reaches_the_lower_bound_when_it_is_achievable(seed):
    buffers, height = perfect_packing(seed)
    assert layout.peak_live(buffers) == height
    placed = layout.place(buffers, "roam", time_limit=10.0)
    assert_valid(buffers, placed)
    assert placed.arena == height
    assert placed.stats["solver_status"] == "optimal"
    assert placed.stats["fragmentation"] == 0.0


# An instance whose optimum (31) is above its peak live bytes (30); found by random search.
ABOVE_BOUND = [(0, 2, 4), (0, 4, 10), (0, 5, 4), (1, 3, 10), (2, 7, 5), (3, 5, 3), (3, 7, 5), (4, 5, 9),
               (4, 7, 4), (6, 7, 6), (6, 7, 10)]


def test_search_proves_infeasibility_and_roam_finds_the_optimum():
    cs = CanonicalSearch(ABOVE_BOUND)
    assert cs.lower_bound == 30
    assert cs.solve(30) is None  # exhausted: a proof
    off = cs.solve(31)
    assert off is not None and max(o + b[2] for o, b in zip(off, ABOVE_BOUND)) <= 31
    placed = layout.place(ABOVE_BOUND, "roam", time_limit=10.0)
    assert placed.arena == 31 and placed.stats["solver_status"] == "optimal"


# Peak live 19 (at step 4: 3 + 5 + 1 + 10); every heuristic needs 20; the search fits 19.
NEAR_BOUND = [(4, 5, 3), (0, 7, 5), (6, 8, 1), (2, 4, 7), (2, 6, 1), (4, 8, 10), (3, 4, 4)]


def test_the_search_stops_once_the_arena_is_within_the_gap():
    exact = layout.place(NEAR_BOUND, "roam", time_limit=10.0)
    assert exact.stats["heuristic_arena"] == 20 and exact.arena == 19 and exact.stats["searched"] == 1
    # 20 is within 1/19 of 19: the heuristics' layout would do; one short probe at the bound
    # still runs, and here it fits
    near = layout.place(NEAR_BOUND, "roam", time_limit=10.0, gap=1 / 19)
    assert near.arena == 19 and [p["target"] for p in near.stats["pieces"][0]["probes"]] == [19]
    # a gap that 20 exceeds: the search runs and reaches the bound as before
    assert layout.place(NEAR_BOUND, "roam", time_limit=10.0, gap=0.05).arena == 19
    # ABOVE_BOUND's bound (30) is infeasible: with a gap of 1/30 the probe at the bound fails (a
    # proof), the one at 31, the gap's height, fits: two probes
    above = layout.place(ABOVE_BOUND, "roam", time_limit=10.0, gap=1 / 30)
    assert [(p["target"], p["status"]) for p in above.stats["pieces"][0]["probes"]] == [(30, "infeasible"),
                                                                                           (31, "solved")]
    assert above.arena == 31 and above.stats["solver_status"] == "optimal"


def test_ilp_finds_the_same_optimum():
    from roam_cli.layout.heuristics import best_fit
    from roam_cli.layout.ilp import solve_ilp
    warm = best_fit(ABOVE_BOUND)
    upper = max(o + b[2] for o, b in zip(warm, ABOVE_BOUND))
    off, info = solve_ilp(ABOVE_BOUND, upper=upper, lower=30, warm=warm, time_limit=30)
    if off is None and "not available" in info["status"]:
        pytest.skip("CBC is not available")
    assert info["status"] == "optimal" and info["height"] == 31


def test_roam_records_the_fallback_when_search_cannot_run(monkeypatch):
    """A broken search must leave the best heuristic in place and say why. ABOVE_BOUND's best
    heuristic (first-fit, 33) is above the peak-live bound (30), so its one piece is searched."""
    import roam_cli.layout.roam as roam_mod

    calls = []

    def boom(*a, **k):
        calls.append(a)
        raise RuntimeError("solver exploded")

    monkeypatch.setattr(roam_mod, "decide", boom)
    placed = layout.place(ABOVE_BOUND, "roam", time_limit=2.0)
    assert len(calls) == 1  # the search was tried, once: its failure ends the piece
    assert_valid(ABOVE_BOUND, placed)
    assert placed.arena == layout.place(ABOVE_BOUND, "first-fit").arena == 33
    assert placed.stats["fallback"] == "search failed: RuntimeError: solver exploded"
    assert placed.stats["solver_status"] == "heuristic"


def test_capacity_is_a_decision():
    buffers, height = perfect_packing(5, leaves=20)
    fits = layout.place(buffers, "roam", capacity=height, time_limit=10.0)
    assert fits.stats["fits"] is True and fits.arena <= height
    roomy = layout.place(buffers, "roam", capacity=10 * height, time_limit=10.0)
    assert roomy.stats["fits"] is True and roomy.arena <= 10 * height
    too_small = layout.place(buffers, "roam", capacity=height - 256, time_limit=2.0)
    assert too_small.stats["fits"] is False
    assert "below the peak" in too_small.stats["fallback"]
    assert_valid(buffers, too_small)
    # other strategies report fits too
    ff = layout.place(buffers, "first-fit", capacity=height)
    assert ff.stats["fits"] == (ff.arena <= height)


def test_capacity_infeasible_above_the_bound_is_proven():
    placed = layout.place(ABOVE_BOUND, "roam", capacity=30, time_limit=5.0)
    assert placed.stats["fits"] is False
    assert placed.stats["pieces"][0]["probes"][-1]["status"] == "infeasible"


def test_independent_pieces_are_split_and_solved():
    a, ha = perfect_packing(1)
    b, hb = perfect_packing(2)
    shift = 100
    buffers = a + [(lo + shift, hi + shift, s) for lo, hi, s in b]
    comps = split_components(buffers, list(range(len(buffers))))
    assert len(comps) >= 2
    assert all(max(comp) < len(a) or min(comp) >= len(a) for comp in comps)  # never mixed
    for comp in comps:  # nothing live across the boundary of a piece
        t0 = min(buffers[i][0] for i in comp)
        t1 = max(buffers[i][1] for i in comp)
        assert all(buffers[j][1] <= t0 or buffers[j][0] >= t1 for j in range(len(buffers)) if j not in comp)
    placed = layout.place(buffers, "roam", time_limit=10.0)
    assert_valid(buffers, placed)
    assert placed.arena == max(ha, hb)
    assert placed.stats["subproblems"] == len(comps)


def test_the_heuristics_give_the_same_layouts_in_parallel():
    from roam_cli.layout.roam import PARALLEL_HEURISTICS, _run_heuristics
    rng = random.Random(7)
    buffers = []
    for _ in range(PARALLEL_HEURISTICS):
        lo = rng.randrange(1000)
        buffers.append((lo, lo + rng.randint(1, 50), rng.randint(1, 4096)))
    alone = [(name, off, failure) for name, off, failure, _ in _run_heuristics(buffers, 1)]
    assert [(name, off, failure) for name, off, failure, _ in _run_heuristics(buffers, 2)] == alone
    assert all(failure is None for _, _, failure in alone)


def test_parallel_jobs_give_valid_optimal_layouts():
    import time

    from roam_cli.layout.roam import decide
    buffers, height = perfect_packing(7, leaves=60, width=40, height=128)
    placed = layout.place(buffers, "roam", time_limit=20.0, jobs=2)
    assert_valid(buffers, placed)
    assert placed.arena == height
    # the parallel portfolio itself (two processes, first answer wins)
    off, status, _nodes = decide(buffers, height, time.perf_counter() + 20.0, jobs=2)
    assert status == "solved"
    assert_valid(buffers, layout.Layout(off, max(o + b[2] for o, b in zip(off, buffers))))
    off, status, _nodes = decide(ABOVE_BOUND * 5, 29, time.perf_counter() + 20.0, jobs=2)
    assert off is None and status == "infeasible"  # below the peak: refused at once


def test_sections_are_maximal_cliques():
    # [0,3) [1,2) [2,4): cliques {0,1} at t=1 and {0,2} at t=2; [4,5) alone
    slo, shi, members = sections_of([0, 1, 2, 4], [3, 2, 4, 5])
    assert [sorted(m) for m in members] == [[0, 1], [0, 2], [3]]
    assert (slo, shi) == ([0, 0, 1, 2], [2, 1, 2, 3])


def test_fixed_buffers_stay_put():
    buffers, height = perfect_packing(4)
    cs = CanonicalSearch(buffers)
    free = cs.solve(height)
    assert free is not None
    pinned = {0: free[0], 1: free[1]}
    off = cs.solve(height, fixed=pinned)
    assert off is not None and off[0] == free[0] and off[1] == free[1]
    # pinning a buffer to an impossible place makes the search fail, not overlap
    lo, hi, size = buffers[0]
    assert cs.solve(height, fixed={0: height - size + 256}) is None


def test_search_respects_node_limit():
    buffers, height = perfect_packing(8, leaves=40)
    with pytest.raises(SearchAborted):
        CanonicalSearch(buffers).solve(height - 256 * 0, node_limit=1)


@pytest.mark.parametrize("solver", ["cbc", "highs"])
def test_offset_ilp_reaches_the_peak_with_either_solver(solver):
    if solver == "highs":
        pytest.importorskip("highspy")
    from roam_cli.layout.ilp import solve_ilp
    # live at step 2: 512 + 256 + 768 + 256 = 1792 bytes, the most at any step
    buffers = [(0, 3, 512), (1, 4, 256), (2, 5, 768), (0, 2, 256), (3, 6, 512), (1, 6, 256)]
    offsets, info = solve_ilp(buffers, upper=4096, time_limit=20, solver=solver)
    assert info["status"] == "optimal" and info["height"] == 1792
    assert max(o + b[2] for o, b in zip(offsets, buffers)) == 1792


def _decide(cs, capacity, heuristic, node_limit, fixed, engine):
    """One solve with fresh weights: (answer, nodes, backtracks, weights learnt)."""
    weights = [0] * len(cs.members)
    nodes, backtracks = cs.nodes, cs.backtracks
    try:
        answer = cs.solve(capacity, None, heuristic, node_limit, fixed=fixed, weights=weights, engine=engine)
    except SearchAborted as e:
        answer = str(e)
    return answer, cs.nodes - nodes, cs.backtracks - backtracks, weights


@pytest.mark.parametrize("chunk", [256, 2, 1])  # candidates a C node gathers at a time: the same search
def test_c_search_visits_the_same_nodes_as_the_python_reference(chunk, monkeypatch):
    from roam_cli.layout import search
    monkeypatch.setattr(search, "CANDIDATE_CHUNK", chunk)
    rng = random.Random(7)
    for _ in range(120):
        buffers = []
        for _ in range(rng.randint(1, 20)):
            lo = rng.randint(0, 15)
            buffers.append((lo, lo + rng.randint(1, 6), rng.choice([1, 2, 3, 5, 8])))
        cs = CanonicalSearch(buffers)
        fixed = {0: rng.randint(0, 2)} if rng.random() < 0.2 else None
        for capacity in (cs.lower_bound, cs.lower_bound + 2):
            for heuristic in ("TWA", "KWAT:3"):
                python = _decide(cs, capacity, heuristic, 150, fixed, "python")
                assert _decide(cs, capacity, heuristic, 150, fixed, "c") == python
    # the hand-checked instance: both engines prove 30 infeasible in the same nodes
    cs = CanonicalSearch(ABOVE_BOUND)
    assert _decide(cs, 30, "TWA", None, None, "c") == _decide(cs, 30, "TWA", None, None, "python")


def test_c_overlaps_are_the_python_references():
    from array import array

    from roam_cli.layout.search import overlaps_of
    _search = pytest.importorskip("roam_cli.layout._search")  # an install without it has only the reference
    rng = random.Random(11)
    for _ in range(200):
        lowers = [rng.randint(0, 30) for _ in range(rng.randint(0, 40))]
        uppers = [lo + rng.randint(1, 10) for lo in lowers]
        starts, ovl = (array("q", a) for a in _search.overlaps(array("q", lowers), array("q", uppers)))
        assert [list(ovl[starts[i]:starts[i + 1]]) for i in range(len(lowers))] == overlaps_of(lowers, uppers)
    # hand-checked: [0,2) meets [1,3); [1,3) meets both; [2,4) meets [1,3) only (half-open)
    starts, ovl = (array("q", a) for a in _search.overlaps(array("q", [0, 1, 2]), array("q", [2, 3, 4])))
    assert list(starts) == [0, 1, 3, 4] and list(ovl) == [1, 0, 2, 1]


@pytest.mark.skipif(heuristics._search is None, reason="the C extension is not built (ROAM_NO_EXTENSIONS=1)")
def test_the_heuristics_loop_in_c_places_what_its_numpy_reference_places():
    first_fit_module = importlib.import_module("roam_cli.layout.first_fit")
    rng = random.Random(3)
    for trial in range(1000):
        buffers = []
        for _ in range(rng.randint(0, 30)):
            lo = rng.randint(0, 20)  # empty and reversed lifetimes, zero sizes and ties included
            buffers.append((lo, lo + rng.randint(-1, 8), rng.choice([0, 1, 2, 3, 5, 8, 256])))
        order = list(range(len(buffers)))
        rng.shuffle(order)
        for smallest_gap, heap_gap in itertools.product((True, False), repeat=2):
            assert (heuristics._place_in_order(buffers, order, smallest_gap, heap_gap)
                    == heuristics._place_in_order_numpy(buffers, order, smallest_gap, heap_gap)), trial
        by_lower = sorted(range(len(buffers)), key=lambda i: (buffers[i][0], i))
        assert first_fit_module.first_fit(buffers) == first_fit_module.first_fit_scan(buffers, by_lower), trial


def test_first_fit_and_best_fit_by_hand():
    # a: [0, 4) 4 B, b: [0, 2) 2 B, c: [2, 4) 2 B, d: [1, 3) 3 B. First fit by lower: a at 0, b at 4,
    # d (overlaps a and b) at 6, c (overlaps a and d; b has ended) in the gap [4, 6) below d.
    buffers = [(0, 4, 4), (0, 2, 2), (2, 4, 2), (1, 3, 3)]
    assert importlib.import_module("roam_cli.layout.first_fit").first_fit(buffers) == [0, 4, 4, 6]
    # best fit, largest first: a 0, d 4 (on a), b and c 2 B each: b overlaps a and d, on top at 7;
    # c overlaps a, d: the heap's top (9) is above d's top (7): 2 B fit there, the smallest gap
    assert heuristics.best_fit(buffers) == [0, 7, 7, 4]
