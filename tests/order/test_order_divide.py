"""Tree-based division: segments are independent problems whose orders stitch back exactly;
identical blocks share one canonical form."""

import random

from order_cases import cases, topological_orders
from roam_cli.order import blocks, divide, rules
from roam_cli.order.problem import Buffer, Problem, from_memory_model, is_topological, kahn, peak, profile

CASES = cases(60, seed=5)


def test_a_segment_reordered_changes_only_its_own_steps_and_they_equal_the_subproblem():
    rng = random.Random(1)
    for _, mm in CASES:
        for problem in (from_memory_model(mm), rules.reduce(from_memory_model(mm)).problem):
            if problem.n < 2:
                continue
            order = kahn(problem)
            start = rng.randrange(problem.n - 1)
            seg = divide.Segment(start, rng.randrange(start + 1, problem.n + 1))
            sub = divide.subproblem(problem, order, seg)
            before = profile(problem, order)
            for local in topological_orders(list(sub.preds)):
                stitched = divide.stitch(order, seg, local)
                assert is_topological(problem, stitched)
                after = profile(problem, stitched)
                assert after[seg.start:seg.stop] == profile(sub, local)
                assert after[:seg.start] == before[:seg.start] and after[seg.stop:] == before[seg.stop:]


def test_buffers_crossing_a_segment_become_constants_entries_and_exits():
    # 0 -> 1 -> 2 -> 3 ; segment [1, 3)
    problem = Problem(((), (0,), (1,), (2,)),
                      (Buffer(1, (0,), (3,)),  # allocated before, freed after: passes through
                       Buffer(2, (0,), (1,)),  # allocated before, read inside: enters live
                       Buffer(4, (2,), (3,)),  # allocated inside, read after: lives to the end
                       Buffer(8, (1,), (2,))))  # inside only
    sub = divide.subproblem(problem, [0, 1, 2, 3], divide.Segment(1, 3))
    assert sub == Problem(((), (0,)), (Buffer(2, (), (0,)), Buffer(4, (1,), (), True), Buffer(8, (0,), (1,))), base=1)


def test_the_division_tree_covers_the_order_with_bounded_leaves():
    scores = [0, 5, 5, 1, 5, 5, 0, 5, 5, 5, 2, 5, 5]  # 12 nodes: cuts at positions 0..12
    leaves = divide.split(12, scores, leaf_size=4)
    assert [(s.start, s.stop) for s in leaves] == [(0, 3), (3, 6), (6, 10), (10, 12)]
    assert divide.parents(leaves) == [divide.Segment(0, 6), divide.Segment(6, 12)]
    assert divide.parents(divide.parents(leaves)) == [divide.Segment(0, 12)]


def test_crossing_scores_count_short_lived_buffers_only():
    problem = Problem(((), (0,), (1,), (2,)), (Buffer(1, (0,), (1,)), Buffer(1, (0,), (3,))))
    # buffer 0 lives [0, 1] and crosses cut 1; buffer 1 lives [0, 3]: with reach 2 it counts
    # only at cut 2 (allocated at most 2 steps before the cut, freed fewer than 2 steps after)
    assert divide.crossing_scores(problem, [0, 1, 2, 3], reach=2) == [0, 1, 1, 0, 0]


def test_identical_blocks_share_a_canonical_form_and_orders_transfer():
    # the same diamond twice, numbered differently, with different constants passing through
    a = Problem(((), (0,), (0,), (1, 2)),
                (Buffer(5, (0,), (1, 2)), Buffer(7, (1,), (3,)), Buffer(3, (2,), (3,))), base=1)
    perm = [0, 2, 1, 3]  # node i of b is node perm[i] of a
    inv = {v: i for i, v in enumerate(perm)}
    b = Problem(tuple(tuple(sorted(inv[u] for u in a.preds[perm[i]])) for i in range(4)),
                tuple(Buffer(x.bytes, tuple(sorted(inv[v] for v in x.alloc)), tuple(sorted(inv[v] for v in x.readers)))
                      for x in a.buffers), base=99)
    key_a, num_a = blocks.canonical(a)
    key_b, num_b = blocks.canonical(b)
    assert key_a == key_b
    canon = Problem(key_a[0], tuple(Buffer(*x) for x in key_a[1]))
    for o in topological_orders(list(canon.preds)):
        in_a, in_b = [num_a[i] for i in o], [num_b[i] for i in o]
        assert peak(a, in_a) - a.base == peak(b, in_b) - b.base == peak(canon, o)
    different = Problem(a.preds, (Buffer(6, (0,), (1, 2)),) + a.buffers[1:])
    assert blocks.canonical(different)[0] != key_a
