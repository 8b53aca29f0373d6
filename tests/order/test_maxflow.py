"""The step bounds' minimum cut (solvers/maxflow.min_cut): in C where it is built, against
hand-computed cuts and against the Python Dinic it replaces."""

import random

import numpy as np
import pytest

from roam_cli.solvers import maxflow


def cut(edges, vertices, source=0, sink=1):
    tails, heads, caps = (np.array(x, dtype=np.int64) for x in zip(*edges))
    return maxflow.min_cut(vertices, tails, heads, caps, source, sink)


def test_a_hand_computed_cut():
    # s=0, t=1, a=2, b=3: s->a 3, s->b 2, a->b 1, a->t 2, b->t 3. Both edges out of s are full
    # (a sends 2 to t and 1 through b, which sends 3): flow 5, and the residual reaches s alone.
    flow, side = cut([(0, 2, 3), (0, 3, 2), (2, 3, 1), (2, 1, 2), (3, 1, 3)], 4)
    assert flow == 5
    assert side.tolist() == [True, False, False, False]


def test_an_infinite_edge_is_never_cut():
    # s->a infinite, a->t 4, s->t 1: flow 5; a stays with the source, t alone on the other side
    flow, side = cut([(0, 2, -1), (2, 1, 4), (0, 1, 1)], 3)
    assert (flow, side.tolist()) == (5, [True, False, True])


def test_an_infinite_flow_is_refused():
    with pytest.raises((ValueError, OverflowError)):
        cut([(0, 2, -1), (2, 1, -1)], 3)


@pytest.mark.skipif(maxflow._maxflow is None, reason="the C extension is not built (ROAM_NO_EXTENSIONS=1)")
def test_c_matches_the_python_dinic_on_random_networks():
    rng = random.Random(7)
    for trial in range(200):
        n = rng.randint(2, 30)
        edges = [(rng.randrange(n), rng.randrange(n), rng.choice([-1, rng.randint(0, 50)]))
                 for _ in range(rng.randint(0, 4 * n))]
        edges = [(a, b, c) for a, b, c in edges if a != b] or [(0, 1, 1)]
        reference = maxflow.Network(n)
        for a, b, c in edges:
            reference.add(a, b, maxflow.INF if c < 0 else c)
        try:
            expected = reference.max_flow(0, 1)
        except OverflowError:  # an infinite flow: no finite cut to compare
            continue
        flow, side = cut(edges, n)
        assert flow == expected, trial
        assert side.tolist() == reference.reachable(0), trial
