"""Property tests: whatever the graph, every order x layout strategy gives a plan `verify` accepts,
and every layout keeps live buffers apart inside the arena it reports.

A few hundred cases here; `python -m benchmarks run order_layout/fuzz` runs the same checks on 10,000+."""

import tempfile
import time
from pathlib import Path

import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from onnx_builder import model as make_model
from onnx_builder import node, save
from random_graphs import buffer_sets, training_graphs

from roam_cli import layout, order, pipeline
from roam_cli.core import plan as plan_io
from roam_cli.verify import Violation, verify

# Solver strategies get a small budget per plan: the property is validity, not optimality. The
# ordering gets half of it, and the ordering ILP does not start CBC with under a second left: any
# less and the ILP strategies would hand back their warm starts untested.
TIME_LIMIT = 4.0
CI = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)


def check_plans(model: onnx.ModelProto, time_limit: float = TIME_LIMIT) -> dict[tuple[str, str], float]:
    """Plan `model` with every order x layout strategy there is; fail unless each plan is
    schema-valid and passes the independent checker. Returns seconds per combination."""
    seconds = {}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "model.onnx"
        onnx.save(model, str(path))
        for o in order.STRATEGIES:
            for lay in layout.STRATEGIES:
                start = time.perf_counter()
                options = pipeline.Options(order=o, layout=lay, time_limit=time_limit, jobs=1)
                result = pipeline.run(path, Path(d) / "plan.json", options)
                plan_io.validate(result.plan, f"{o} x {lay}")
                verify(result.imported.graph, result.imported.sha256, result.plan)
                seconds[o, lay] = time.perf_counter() - start
    return seconds


def check_layouts(buffers: list[tuple[int, int, int]], time_limit: float = TIME_LIMIT) -> dict[str, float]:
    """Place `buffers` with every layout strategy; fail on a missing offset, an overlap between two
    buffers live at the same time, or a buffer past the reported arena."""
    seconds = {}
    peak = layout.peak_live(buffers)
    for lay in layout.STRATEGIES:
        start = time.perf_counter()
        placed = layout.place(buffers, lay, time_limit=time_limit, jobs=1)
        assert len(placed.offsets) == len(buffers), lay
        assert placed.arena >= peak, (lay, placed.arena, peak)
        for i, ((lo, hi, size), offset) in enumerate(zip(buffers, placed.offsets)):
            assert offset >= 0 and offset + size <= placed.arena, (lay, i, offset, size, placed.arena)
            for j in range(i):
                lo2, hi2, size2 = buffers[j]
                if size and size2 and lo < hi2 and lo2 < hi:
                    o2 = placed.offsets[j]
                    assert offset + size <= o2 or o2 + size2 <= offset, (lay, i, j, buffers[i], buffers[j])
        seconds[lay] = time.perf_counter() - start
    return seconds


@settings(CI, max_examples=10)  # each example makes 30 plans; benchmarks/order_layout/fuzz.py runs thousands
@given(training_graphs())
def test_every_strategy_plans_random_graphs_validly(model):
    check_plans(model)


@settings(CI, max_examples=200)
@given(buffer_sets())
def test_layouts_never_overlap_and_stay_in_the_arena(buffers):
    check_layouts(buffers)


def test_the_checks_can_fail(monkeypatch, tmp_path):
    """The layout check rejects two live buffers at one offset; verify rejects a moved tensor."""
    monkeypatch.setattr(layout, "place", lambda buffers, *a, **k: layout.Layout([0] * len(buffers), 256))
    with pytest.raises(AssertionError):
        check_layouts([(0, 2, 256), (1, 3, 256)])
    m = make_model([node("Relu", ["x"], ["a"]), node("Relu", ["a"], ["b"]), node("Add", ["a", "b"], ["c"])],
              [("x", [64])], [("c", [64])])
    result = pipeline.run(Path(save(m, tmp_path / "m.onnx")), tmp_path / "plan.json", pipeline.Options())
    tensors = {t["name"]: t for t in result.plan["tensors"]}
    tensors["b"]["offset"] = tensors["a"]["offset"]  # a and b are both live at the Add
    with pytest.raises(Violation, match="overlaps"):
        verify(result.imported.graph, result.imported.sha256, result.plan)
