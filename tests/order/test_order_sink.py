"""Sinking (order/sink.py): computations that only add bytes moved to just before their reader."""

import random

from order_cases import random_problem

from roam_cli.order.problem import Buffer, Problem, is_topological, peak, profile
from roam_cli.order.sink import Sinking, sink


def test_a_node_that_only_allocates_runs_just_before_its_reader():
    # j allocates J (8 B) for z; x allocates X (100 B) for y; y allocates Y (10 B) for z.
    # [j, x, y, z]: 8, 108, 118, 18 -> peak 118; j just before z: [x, y, j, z]: 100, 110, 18, 18.
    problem = Problem(((), (), (1,), (0, 2)),
                      (Buffer(8, (0,), (3,)), Buffer(100, (1,), (2,)), Buffer(10, (2,), (3,))))
    assert profile(problem, [0, 1, 2, 3]) == [8, 108, 118, 18]
    assert sink(problem, [0, 1, 2, 3]) == [1, 2, 0, 3]
    assert profile(problem, [1, 2, 0, 3]) == [100, 110, 18, 18]


def test_a_chain_moves_as_one_group():
    # j0 -> j1 -> z: j1 frees what it allocates (J0 8 B for J1 8 B), so j1 alone would lower no
    # step and leave j0 nowhere to go; together they leave X (100 B) and Y (10 B) alone at their
    # steps: the highest step falls from 118 to 110 (the total rises: 250 -> 254).
    # [j0, j1, x, y, z]: 8, 16, 108, 118, 18 -> [x, y, j0, j1, z]: 100, 110, 18, 26, 18.
    problem = Problem(((), (0,), (), (2,), (1, 3)),
                      (Buffer(8, (0,), (1,)), Buffer(8, (1,), (4,)), Buffer(100, (2,), (3,)), Buffer(10, (3,), (4,))))
    assert sink(problem, [0, 1, 2, 3, 4]) == [2, 3, 0, 1, 4]
    assert profile(problem, [2, 3, 0, 1, 4]) == [100, 110, 18, 26, 18]


def test_a_move_that_would_raise_the_peak_is_not_made():
    # j's output (50 B) is read by z, which runs where X (100 B) peaks: j at z's step would make
    # it 100 + 50 + Z; where it is (step 0, alone), it costs the peak nothing.
    # [j, x, z]: 50, 150, 151: sinking j gives [x, j, z]: 100, 150, 151: the same peak, and a
    # higher step besides it (100 > 50): kept.
    problem = Problem(((), (), (0, 1)), (Buffer(50, (0,), (2,)), Buffer(100, (1,), (2,)), Buffer(1, (2,), ())))
    assert sink(problem, [0, 1, 2]) == [0, 1, 2]


def test_sinking_keeps_the_order_topological_never_raises_a_peak_and_tracks_every_step():
    rng = random.Random(7)
    moved = 0
    for _ in range(300):
        problem = random_problem(rng, rng.randint(2, 14))
        order = topological(problem, rng)
        sinking = Sinking(problem, order)
        found = sinking.run()
        assert is_topological(problem, found)
        assert peak(problem, found) <= peak(problem, order)
        # the steps it weighed moves on are the order's own
        assert sinking.live.tolist() == profile(problem, found)
        moved += found != order
        # each move lowers the steps, highest first: so does the whole
        assert found == order or sorted(profile(problem, found), reverse=True) < sorted(profile(problem, order),
                                                                                         reverse=True)
    assert moved > 30  # the cases test moves, not only orders left alone


def topological(problem: Problem, rng: random.Random) -> list[int]:
    """A random topological order."""
    left = [len(p) for p in problem.preds]
    ready = [v for v in range(problem.n) if not left[v]]
    out = []
    while ready:
        v = ready.pop(rng.randrange(len(ready)))
        out.append(v)
        for w in problem.succs[v]:
            left[w] -= 1
            if not left[w]:
                ready.append(w)
    return out

