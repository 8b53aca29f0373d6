"""Determinism: the same model and options give a byte-identical plan (`optimize --reproducible`),
parallel solving included; without the flag, wall-clock figures are the only difference."""

import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import SAMPLE, roam
from onnx_builder import save
from small_models import small_training_step

from roam_cli import layout, order, pipeline
from roam_cli.core import plan as plan_io
from roam_cli.layout import search


def written(plan: dict, path: Path) -> bytes:
    plan_io.write(plan, path)
    return path.read_bytes()


@pytest.mark.parametrize("order_strategy", order.STRATEGIES)
def test_every_strategy_gives_the_same_bytes_twice(tmp_path, order_strategy):
    path = Path(save(small_training_step(), tmp_path / "m.onnx"))
    for layout_strategy in layout.STRATEGIES:
        options = pipeline.Options(order=order_strategy, layout=layout_strategy, time_limit=20, reproducible=True)
        first, second = (written(pipeline.run(path, tmp_path / "plan.json", options).plan, tmp_path / "plan.json")
                         for _ in range(2))
        assert first == second, layout_strategy
        assert json.loads(first)["stats"]["reproducible"] is True


@pytest.mark.parametrize("jobs", [1, 2])
def test_cli_reproducible_plans_and_annotated_models_are_byte_identical(tmp_path, jobs):
    # the plan names its annotated model: each run writes the same names, in a folder of its own
    runs = [tmp_path / f"run{k}" for k in range(2)]
    for folder in runs:
        folder.mkdir()
    with ThreadPoolExecutor(max_workers=2) as pool:  # side by side, as a loaded CI machine runs them
        codes = list(pool.map(lambda d: roam("optimize", SAMPLE, "-o", d / "p.json", "--annotated-model", d / "a.onnx",
                                             "--reproducible", "--jobs", jobs, "--time-limit", 60).code, runs))
    assert codes == [0, 0]
    for name in ("p.json", "a.onnx"):
        assert (runs[0] / name).read_bytes() == (runs[1] / name).read_bytes(), name
    stats = json.loads((runs[0] / "p.json").read_text())["stats"]
    assert stats["seconds"] == {} and "seconds" not in json.dumps({k: v for k, v in stats.items() if k != "seconds"})


def test_without_the_flag_only_wall_clock_figures_differ(tmp_path):
    path = Path(save(small_training_step(), tmp_path / "m.onnx"))
    plans = [pipeline.run(path, tmp_path / "plan.json", pipeline.Options(time_limit=20)).plan for _ in range(2)]
    assert set(plans[0]["stats"]["seconds"]) >= {"import", "order", "layout"}
    same = [{**p, "stats": plan_io.without_wall_clock(p["stats"])} for p in plans]
    assert same[0] == same[1]
    assert plan_io.without_wall_clock({"a": [{"seconds": 1.5, "n": 2}], "time_limit": 3, "seconds": {"x": 1}}) == \
        {"a": [{"n": 2}], "seconds": {}, "reproducible": True}


def random_buffers(seed: int, count: int = 80) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        lower = rng.randrange(60)
        out.append((lower, rng.randrange(lower + 1, 61), rng.choice([256, 512, 768, 1024, 4096]) * rng.randint(1, 4)))
    return out


def test_parallel_layout_does_not_depend_on_which_worker_finishes_first(monkeypatch):
    """Slow down one worker, then the other: the layout must not change. (The portfolio deals its
    rankings round-robin to the workers, so slowing the even-numbered rankings slows worker 0.)"""
    real = search.CanonicalSearch.solve
    slow_half = {"parity": 0}

    def solve(self, capacity, deadline=None, heuristic="TWA", *args, **kwargs):
        if search.DEFAULT_HEURISTICS.index(heuristic) % 2 == slow_half["parity"]:
            time.sleep(0.3)
        return real(self, capacity, deadline, heuristic, *args, **kwargs)

    monkeypatch.setattr(search.CanonicalSearch, "solve", solve)
    buffers = random_buffers(seed=1)
    layouts = []
    for parity in (0, 1):
        slow_half["parity"] = parity
        layouts.append(layout.place(buffers, "roam", jobs=2, time_limit=20).offsets)
    assert layouts[0] == layouts[1]
