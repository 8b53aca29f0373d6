"""Exactness of ROAM ordering and its exact solvers against brute force on random small graphs
(<= 10 nodes, random sizes, views, in-place accumulation and declared in-place updates)."""

import random
import time

import pytest
from order_cases import brute_force, cases, count_orders, random_problem, topological_orders

from roam_cli import order
from roam_cli.core import memory
from roam_cli.order import bounds, ideals, ilp, roam
from roam_cli.order.problem import (
    Buffer,
    Problem,
    from_memory_model,
    is_topological,
    kahn,
    peak,
    positions,
    profile,
    reachability,
)
from roam_cli.solvers import milp

CASES = cases(200, seed=2024)
OPTIMA = [brute_force(mm) for _, mm in CASES]


def test_the_cases_cover_views_in_place_updates_and_every_size():
    assert len(CASES) == 200
    assert sum(1 for _, mm in CASES if "view" in mm.alias.values()) > 30
    assert sum(1 for _, mm in CASES if "inplace" in mm.alias.values()) > 30
    assert sum(1 for _, mm in CASES if mm.extra_deps) > 20
    assert {len(g.nodes) for g, _ in CASES} == set(range(2, 11))


def test_problem_peak_is_the_memory_model_peak():
    rng = random.Random(7)
    for _, mm in CASES:
        problem = from_memory_model(mm)
        orders = list(topological_orders(list(mm.preds)))
        for o in rng.sample(orders, min(3, len(orders))):
            assert peak(problem, o) == memory.peak_live(mm, memory.lifetimes(mm, o))[0]


def test_roam_finds_the_brute_force_optimum_on_200_random_graphs():
    for (graph, mm), best in zip(CASES, OPTIMA):
        found, stats = order.solve(mm, "roam", op_types=[n.op_type for n in graph.nodes], time_limit=30)
        assert is_topological(from_memory_model(mm), found)
        assert order.peak_of(mm, found) == best, [n.name for n in graph.nodes]


@pytest.mark.parametrize("engine", ["c", "python"])
def test_down_set_search_is_exact_and_proves_it(engine):
    for (_, mm), best in zip(CASES, OPTIMA):
        problem = from_memory_model(mm)
        found = ideals.solve(problem, kahn(problem), max_states=10**6, deadline=float("inf"), engine=engine)
        assert found.optimal and found.peak == best == peak(problem, found.order)
        assert is_topological(problem, found.order)


@pytest.mark.skipif(ideals._ideals is None, reason="the C extension did not build")
@pytest.mark.slow  # 6 s of searches; the C search's answers are checked against the reference on small cases below
def test_the_c_search_is_the_reference_state_for_state():
    # same order, peak, proof and visited count, under budgets that stop it mid-search too, on
    # problems wider than one 64-bit word of nodes
    rng = random.Random(5)
    for trial in range(40):
        problem = random_problem(rng, rng.randint(2, 140))
        start = kahn(problem)
        for budget in (50, 3_000):
            c, py = (ideals.solve(problem, start, budget, float("inf"), engine=e) for e in ("c", "python"))
            assert (c.order, c.peak, c.optimal, c.states) == (py.order, py.peak, py.optimal, py.states), trial


def test_down_set_search_is_exact_on_the_general_form():
    # several allocators, entered live, readers before the allocator, dead and to-the-end buffers:
    # what the rules and the segments hand the search
    rng = random.Random(11)
    tested = 0
    while tested < 400:
        problem = random_problem(rng, rng.randint(2, 9))
        if count_orders(list(problem.preds), 3000) > 3000:
            continue
        best = min(peak(problem, o) for o in topological_orders(list(problem.preds)))
        found = ideals.solve(problem, kahn(problem), max_states=10**6, deadline=float("inf"))
        assert found.optimal and found.peak == best == peak(problem, found.order), problem
        tested += 1


def test_a_reader_that_runs_before_the_allocator_allocates_nothing():
    # node 0 reads the 5 bytes node 1 allocates; 0 first: steps 20 (its own 20) and 15 (5 + a dead
    # 10); 1 first: 15, then 5 + 20 = 25. The optimum runs 0 first.
    problem = Problem(((), ()), (Buffer(5, (1,), (0, 1)), Buffer(10, (1,), ()), Buffer(20, (0,), (0,))))
    found = ideals.solve(problem, [1, 0], max_states=100, deadline=float("inf"))
    assert found.optimal and found.order == [0, 1] and found.peak == 20


def chains() -> tuple[Problem, list[int]]:
    """Node 0 allocates three gradients of 100; chain i: x reads its gradient and allocates a
    temporary of 150, y reads the temporary. Every x first peaks at 550; the best order at 450."""
    preds: list[tuple[int, ...]] = [()]
    buffers = []
    for i in range(3):
        x, y = 1 + 2 * i, 2 + 2 * i
        preds += [(0,), (x,)]
        buffers += [Buffer(100, (0,), (x,)), Buffer(150, (x,), (y,))]
    return Problem(tuple(preds), tuple(buffers)), [0, 1, 3, 5, 2, 4, 6]


def test_an_update_chain_that_fits_runs_as_one_block():
    # Under 549 the search takes the whole step as one move (it ends at 0, its lowest point), in
    # the order that leaves the least live each time (x1 y1 x2 y2 x3 y3: 450). Under 449 no x
    # fits after node 0: two down-sets visited in all, where the chains have 2^3 interleavings.
    problem, every_x_first = chains()
    assert peak(problem, every_x_first) == 550
    found = ideals.solve(problem, every_x_first, max_states=100, deadline=float("inf"))
    assert found.optimal and found.order == [0, 1, 2, 3, 4, 5, 6] and found.peak == 450
    assert found.states == 2


@pytest.mark.parametrize("gap, expected", [(0.0, 450), (0.5, 450), (0.85, 550)])
def test_the_search_stops_once_the_peak_is_within_the_gap(gap, expected):
    # the bound is node 0's three gradients, 300: 450 is within 50 % of it, 550 within 85 %
    problem, every_x_first = chains()
    anc, desc = reachability(problem)
    bound = bounds.Bound(problem, anc, desc)
    stats = roam.Stats(lower_bound=bound.raised(every_x_first))
    assert stats.lower_bound == 300
    search = roam.Search(problem, bound, every_x_first, time.perf_counter() + 60, 1, None, stats,
                         lambda _: None, gap)
    assert peak(problem, search.run()) == expected


@pytest.mark.parametrize("solver", milp.SOLVERS)
def test_ilp_is_exact(solver):
    if solver == "highs":
        pytest.importorskip("highspy")
    step = 20 if solver == "cbc" else 40  # 10 and 5 graphs: each solve starts a solver process
    for (_, mm), best in list(zip(CASES, OPTIMA))[::step]:
        problem = from_memory_model(mm)
        sol = ilp.solve(problem, kahn(problem), deadline=float("inf"), solver=solver)
        assert sol.optimal and sol.peak == best == peak(problem, sol.order)
        assert is_topological(problem, sol.order)


def test_ilp_keeps_the_warm_start_when_it_cannot_improve_in_time():
    _, mm = max(CASES, key=lambda c: len(c[0].nodes))
    problem = from_memory_model(mm)
    start = kahn(problem)
    sol = ilp.solve(problem, start, deadline=0.0)  # already past
    assert sol.order == start and not sol.optimal


def step_live(problem: Problem, o: list[int], v: int) -> int:
    return profile(problem, o)[positions(o)[v]]


def test_lower_bounds_hold_and_the_step_minimum_is_exact():
    for (_, mm), best in list(zip(CASES, OPTIMA))[::4]:
        problem = from_memory_model(mm)
        assert bounds.lower_bound(problem, kahn(problem)) <= best
        # the step bound leaves out buffers nobody reads; without them it is exact
        read = Problem(problem.preds, tuple(b for b in problem.buffers if b.readers or b.to_end))
        anc, desc = reachability(read)
        orders = list(topological_orders(list(read.preds)))
        for v in range(read.n):
            assert bounds.step_minimum(read, v, anc, desc) == min(step_live(read, o, v) for o in orders)


def test_every_pair_bound_holds():
    for (_, mm), best in list(zip(CASES, OPTIMA))[::3]:
        problem = from_memory_model(mm)
        anc, desc = reachability(problem)
        for v in range(problem.n):
            for u in range(v):
                if not (anc[v] >> u & 1 or desc[v] >> u & 1):
                    assert bounds.pair(problem, v, u, anc, desc) <= best


def test_a_pair_bound_prices_a_node_that_is_cheap_only_early():
    # c -> t makes T (100 B) from the weights alone (a weight copy, C, then its transpose), read by
    # r; the forward a -> f peaks at f (x 500 + y 50 + its scratch, 60). Run late, t's step
    # holds x + y + C + T = 750; run early, T lives through f's: 710, the optimum. Alone, t's step
    # costs 200 (first of all) and f's 610: the step bound is r's 660. pair(t, f): f first, t's step
    # is 750; t first, f's is 710: every order holds 710 somewhere.
    problem = Problem(((), (0,), (), (2,), (1, 3), (0, 4)),
                      (Buffer(500, (0,), (1, 5)), Buffer(50, (1,), (4,)), Buffer(60, (1,), (1,)),
                       Buffer(100, (2,), (3,)), Buffer(100, (3,), (4,)), Buffer(10, (4,), (5,))))
    late, early = [0, 1, 2, 3, 4, 5], [2, 3, 0, 1, 4, 5]
    assert profile(problem, late) == [500, 610, 650, 750, 660, 510]
    assert profile(problem, early) == [100, 200, 600, 710, 660, 510]
    assert min(peak(problem, list(o)) for o in topological_orders(list(problem.preds))) == 710
    anc, desc = reachability(problem)
    assert [bounds.step_minimum(problem, v, anc, desc) for v in range(6)] == [500, 610, 100, 200, 660, 510]
    assert bounds.pair(problem, 3, 1, anc, desc) == 710
    assert bounds.lower_bound(problem, late) == 710  # t, late's highest step, paired with f


def test_a_proven_bound_stops_the_search_at_once():
    # a chain: one order, so the bound is reached and nothing is searched
    problem = Problem(((), (0,), (1,)), (Buffer(100, (0,), (1,)), Buffer(50, (1,), (2,))))
    found = ideals.solve(problem, [0, 1, 2], max_states=1, deadline=float("inf"),
                         known_bound=bounds.lower_bound(problem, [0, 1, 2]))
    assert found.optimal and found.states == 0 and found.peak == 150


def test_every_sequence_bound_holds():
    rng = random.Random(11)
    for (_, mm), best in list(zip(CASES, OPTIMA))[::3]:
        problem = from_memory_model(mm)
        anc, desc = reachability(problem)
        for size in (2, 3, 4):
            members = rng.sample(range(problem.n), min(size, problem.n))
            assert bounds.sequenced(problem, members, anc, desc, bounds.Budget(10_000)) <= best
            assert bounds.sequenced(problem, members, anc, desc, bounds.Budget(2)) <= best  # cut short: still a bound


def three_tasks() -> Problem:
    """s makes x_A, x_B, x_C (10 B each); task t_X reads x_X and makes y_X (30 B), which f_X reads."""
    preds = ((), (0,), (1,), (0,), (3,), (0,), (5,))
    buffers = (Buffer(10, (0,), (1,)), Buffer(10, (0,), (3,)), Buffer(10, (0,), (5,)),
               Buffer(30, (1,), (2,)), Buffer(30, (3,), (4,)), Buffer(30, (5,), (6,)))
    return Problem(preds, buffers)


def test_the_sequence_bound_prices_tasks_that_compete_for_the_same_room():
    # Whichever task runs first runs beside all three inputs: 30 + 30 = 60 B, the optimum. Alone,
    # a task's step costs 40 (the other two run first); the pair bound prices only the second of
    # two (40, the third task run before both), their sequence both (50: the first beside the
    # other's input); only the sequence of all three sees 60.
    problem = three_tasks()
    order_ = [0, 1, 2, 3, 4, 5, 6]
    assert profile(problem, order_) == [30, 60, 50, 50, 40, 40, 30]
    assert min(peak(problem, list(o)) for o in topological_orders(list(problem.preds))) == 60
    anc, desc = reachability(problem)
    assert bounds.step_minimum(problem, 1, anc, desc) == 40
    assert bounds.pair(problem, 1, 3, anc, desc) == 40
    assert bounds.sequenced(problem, [1, 3], anc, desc, bounds.Budget(100)) == 50
    assert bounds.sequenced(problem, [1, 3, 5], anc, desc, bounds.Budget(100)) == 60
    assert bounds.lower_bound(problem, order_) == 40
    assert bounds.Bound(problem, anc, desc).sequenced(order_) == 60

