"""The reduction rules keep an optimum (exhaustive search on small graphs), expansion is exact,
and each rule catches the training-graph pattern it is for."""

import pytest
from order_cases import cases, topological_orders

from roam_cli.core import memory
from roam_cli.core.graph import Graph, Node, Value
from roam_cli.order import rules
from roam_cli.order.greedy import list_schedule
from roam_cli.order.problem import Buffer, Problem, from_memory_model, is_topological, peak

CASES = cases(120, seed=99)
KB = 1024


def optimum(problem: Problem) -> int:
    return min(peak(problem, o) for o in topological_orders(list(problem.preds)))


@pytest.mark.parametrize("enabled", [("after",), ("before",), rules.RULES])
def test_reduction_keeps_the_optimum_and_expansion_is_exact(enabled):
    used = dict.fromkeys(enabled, 0)
    for _, mm in CASES:
        problem = from_memory_model(mm)
        red = rules.reduce(problem, enabled)
        for _, rule, _ in red.removed:
            used[rule] += 1
        assert optimum(red.problem) == optimum(problem)
        for o in topological_orders(list(red.problem.preds)):
            full = red.expand(o)
            assert is_topological(problem, full)
            assert peak(problem, full) == peak(red.problem, o)
    assert all(count > 50 for count in used.values()), used  # every enabled rule was exercised


def graph(nodes: list[Node], sizes: dict[str, int], inputs: list[str], outputs: list[str]) -> Graph:
    """float32 tensors of the given element counts."""
    return Graph(nodes, {k: Value(k, 1, (v,)) for k, v in sizes.items()}, inputs, [], outputs)


def test_after_rule_runs_views_and_in_place_writers_right_after_their_inputs():
    # p = f(x); a = g(p) frees p; v = Identity(a) (a view); b = h(x); w.out = Add(w, v) writes the
    # state w in place. The view and the in-place writer allocate nothing: "after" removes them.
    # p only allocates (x is an input): "before" folds it into a.
    g = graph([Node("p", "Relu", "", ("x",), ("p",)), Node("a", "Erf", "", ("p",), ("a",)),
               Node("v", "Identity", "", ("a",), ("v",)), Node("b", "Erf", "", ("x",), ("b",)),
               Node("upd", "Add", "", ("w", "v"), ("w.out",))],
              {"x": 256, "p": 256, "a": 256, "v": 256, "b": 256, "w": 256, "w.out": 256}, ["x", "w"], ["w.out", "b"])
    red = rules.reduce(from_memory_model(memory.build(g)))
    assert red.removed == ((0, "before", (1,)), (2, "after", (1,)), (4, "after", (1,)))
    assert red.kept == (1, 3)
    assert red.expand([1, 0]) == [3, 0, 1, 2, 4]  # b first, then p right before a, the view and update right after


def test_before_rule_keeps_state_only_work_out_of_the_forward_pass():
    # t = m * beta reads only optimizer state and allocates 16 KiB that the last node reads;
    # meanwhile a 128 KiB activation is made and reduced to 1 KiB. XLA's list scheduler runs t
    # first (it allocates the least) and carries it through the peak; the rule moves it to
    # right before its reader.
    g = graph([Node("t", "Mul", "", ("m",), ("t",)), Node("big", "Relu", "", ("x",), ("big",)),
               Node("small", "Relu", "", ("big",), ("small",)), Node("end", "Add", "", ("small", "t"), ("out",))],
              {"m": 4096, "t": 4096, "x": 256, "big": 32768, "small": 256, "out": 256}, ["x", "m"], ["out"])
    problem = from_memory_model(memory.build(g))
    red = rules.reduce(problem)
    assert red.removed == ((0, "before", (3,)), (1, "before", (2,)))
    assert peak(problem, list_schedule(problem)) == 16 * KB + 128 * KB + KB
    reduced_then_expanded = red.expand(list_schedule(red.problem))
    assert reduced_then_expanded == [1, 2, 0, 3]
    assert peak(problem, reduced_then_expanded) == 128 * KB + KB


def test_the_accumulator_is_no_rule_its_flag_can_cost_more_than_waiting():
    # Why "accumulate right after the gradient" is not a reduction rule: its 1-element flag lives
    # to the end. Here w frees a big tensor and allocates nothing: running the accumulator u
    # before w adds the flag to w's step, which is the peak.
    problem = Problem(((), (0,), (0,)),  # z; w after z; u after z
                      (Buffer(1000, (0,), (1,)),  # big: z -> w
                       Buffer(10, (0,), (2,)),  # the gradient: z -> u
                       Buffer(10, (2,), (), to_end=True)))  # u's flag
    assert peak(problem, [0, 2, 1]) == 1010 + 10 > peak(problem, [0, 1, 2]) == 1010
    # so no rule moves u next to z: u allocates its flag (no "after") and has no successor (no
    # "before"), and the reduced problem keeps the optimum of 1010, whichever rules run
    for enabled in (("after",), ("before",), rules.RULES):
        red = rules.reduce(problem, enabled)
        assert 2 in red.kept, enabled
        assert min(peak(problem, red.expand(o)) for o in topological_orders(list(red.problem.preds))) == 1010, enabled
