"""Budgets and max-batch: hand-computed sizes on a model with a symbolic batch dimension."""

import numpy as np
import pytest
from conftest import roam
from onnx_builder import model, node, save
from small_models import W_BYTES, chain_model

from roam_cli import layout
from roam_cli.budget import check, largest_fitting
from roam_cli.core.errors import RoamError


def needs(batch: int) -> int:
    return W_BYTES + 768 * batch


def test_check_says_whether_a_plan_fits_and_by_how_much():
    plan = {"persistent_bytes": 300, "arena_bytes": 700}
    assert check(plan, 1000) == {"budget_bytes": 1000, "needed_bytes": 1000, "fits": True, "headroom_bytes": 0}
    assert check(plan, 999)["fits"] is False and check(plan, 999)["headroom_bytes"] == -1


def test_largest_fitting_gallops_then_bisects():
    def needed(n):
        return 100 + 10 * n  # fits 1000 up to n = 90

    best, probes = largest_fitting(needed, 1000)
    assert best == 90 and probes[90] <= 1000 < probes[91]
    assert list(probes)[:8] == [1, 2, 3, 5, 9, 17, 33, 65]  # strides 1, 2, 4, ... from 1
    assert len(probes) <= 2 * 8
    for start in (85, 90, 91, 120):  # from either side of the answer, in few probes
        best, probes = largest_fitting(needed, 1000, start)
        assert best == 90 and 91 in probes and len(probes) <= 2 * 6, (start, probes)
    assert largest_fitting(needed, 1000, 91)[1].keys() == {91, 90}
    assert largest_fitting(needed, 99) == (0, {1: 110})
    assert largest_fitting(needed, 99, start=7)[0] == 0
    with pytest.raises(RoamError, match="barely depends"):
        largest_fitting(lambda n: 5, 1000, limit=64)


def test_max_batch_returns_a_batch_that_fits_while_the_next_does_not(tmp_path):
    path = chain_model(tmp_path / "chain.onnx")
    budget = 100_000
    result = roam("max-batch", path, "--dim-name", "batch", "--budget", budget, "--json").json()
    original, chosen = result["results"]  # the original order beside the default strategy
    assert (original["order"], chosen["order"]) == ("original", "roam")
    for row in (original, chosen):  # a chain has one order only
        assert row["max_value"] == (budget - W_BYTES) // 768 == 108
        assert row["at_max"]["needed_bytes"] == needs(108) <= budget < needs(109) == row["next_needed_bytes"]
        assert row["at_max"]["arena_bytes"] == 512 * 108
    assert [n for n, _ in chosen["probes"]] == [108, 109]  # seeded with the original order's answer


def branches_model(path):
    """x[batch, 64] feeds two chains, u_i = x @ up_i [batch, 256] (1 KiB a row), v_i = u_i @ down_i
    [batch, 64] (256 B a row), then y = v1 + v2. The file order runs u1, u2, v1, v2: both wide
    tensors are live at once, peak 2304 B a row (u1 + u2 + v1). Running one chain after the
    other peaks at 1536 B a row (u2 + v1 + v2). Persistent: the four weights (64 KiB each) and x."""
    up, down = np.ones((64, 256), np.float32), np.ones((256, 64), np.float32)
    m = model([node("MatMul", ["x", "up1"], ["u1"]), node("MatMul", ["x", "up2"], ["u2"]),
               node("MatMul", ["u1", "down1"], ["v1"]), node("MatMul", ["u2", "down2"], ["v2"]),
               node("Add", ["v1", "v2"], ["y"])],
              [("x", ["batch", 64])], [("y", ["batch", 64])],
              initializers={"up1": up, "up2": up, "down1": down, "down2": down})
    return save(m, path)


def test_roam_order_fits_a_larger_batch_than_the_original_order(tmp_path):
    path = branches_model(tmp_path / "branches.onnx")
    weights, budget = 4 * 64 * 1024, 2**20

    def needs(batch, peak_per_row):  # the roam layout packs this arena to its peak
        return weights + 256 * batch + peak_per_row * batch

    original, chosen = roam("max-batch", path, "--budget", "1MiB", "--json").json()["results"]
    assert (original["order"], chosen["order"]) == ("original", "roam")
    assert original["max_value"] == (budget - weights) // (256 + 2304) == 307
    assert chosen["max_value"] == (budget - weights) // (256 + 1536) == 438
    assert chosen["at_max"]["needed_bytes"] == needs(438, 1536) <= budget < needs(439, 1536)
    assert chosen["next_needed_bytes"] == needs(439, 1536)
    assert original["next_needed_bytes"] == needs(308, 2304) > budget
    # and the plans optimize makes at those batches agree
    r = roam("optimize", path, "-o", tmp_path / "p438.json", "--dim", "batch=438", "--budget", "1MiB")
    assert r.code == 0 and "fits the budget" in r.out, r.err
    r = roam("optimize", path, "-o", tmp_path / "p439.json", "--dim", "batch=439", "--budget", "1MiB")
    assert r.code == 1 and "does NOT fit" in r.err and f"{needs(439, 1536) - budget} B over" in r.err
    assert (tmp_path / "p439.json").exists()  # the plan is still written: only the check failed


def test_max_batch_table_and_failures(tmp_path):
    path = chain_model(tmp_path / "chain.onnx")
    r = roam("max-batch", path, "--budget", needs(4))
    assert r.code == 0 and f"--dim batch=4 --order roam --layout {layout.STRATEGIES[0]}" in r.out, r.err
    r = roam("max-batch", path, "--budget", needs(1) - 1)
    assert r.code == 1 and "not even at batch=1" in r.err
    r = roam("max-batch", path, "--dim-name", "seq", "--budget", "1GiB")
    assert r.code == 2 and "symbolic dimension 'seq'" in r.err and "batch" in r.err
    r = roam("max-batch", path, "--budget", "lots")
    assert r.code == 2 and "not a byte size" in r.err
    r = roam("max-batch", path, "--budget", "1GiB", "--dim", "batch=4")
    assert r.code == 2 and "leave it out" in r.err
