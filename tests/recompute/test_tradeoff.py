"""`roam tradeoff`: the memory / extra-FLOPs front. Dominated points dropped (by hand); on a
hand-built step whose every recompute choice is worked out by hand, the front's points are the
knapsack's optima, monotone, and each plan verifies; on the tiny GPT-2 fixture's full step, at
least 8 verified, monotone points; bad input refused with exit 2 and nothing written."""

import itertools
import json

import pytest
from conftest import ROOT, roam
from onnx_builder import model, node, save

from roam_cli import tradeoff
from roam_cli.tradeoff import Point, front_of, mark

N = 1024  # floats: 4,096 bytes, a multiple of the alignment
SIZES = (1, 2, 4, 8, 16)  # W_i has SIZES[i] * N floats


def exps(path):
    """e_i = Exp(W_i), loss = the sum of ReduceSum(e_i); the backward reads each e_i with the loss
    (W_i_grad = ReduceSum(e_i * loss)). Keeping e_i costs 4 * SIZES[i] * N bytes across the
    boundary, recomputing it SIZES[i] * N FLOPs (one Exp per element): the bytes kept and the
    FLOPs recomputed always add up to 4 bytes per element of all e_i, and the fewest FLOPs that
    keep at most L bytes are the smallest subset sum of SIZES covering the rest."""
    nodes = []
    for i in range(len(SIZES)):
        nodes += [node("Exp", [f"W{i}"], [f"e{i}"]), node("ReduceSum", [f"e{i}"], [f"r{i}"], keepdims=0)]
    total = "r0"
    for i in range(1, len(SIZES)):
        nodes.append(node("Add", [total, f"r{i}"], [f"a{i}"]))
        total = f"a{i}"
    nodes.append(node("Identity", [total], ["loss"]))
    for i in range(len(SIZES)):
        nodes += [node("Mul", [f"e{i}", "loss"], [f"t{i}"]), node("ReduceSum", [f"t{i}"], [f"W{i}_grad"], keepdims=0)]
    m = model(nodes, [(f"W{i}", [s * N]) for i, s in enumerate(SIZES)],
              [("loss", [])] + [(f"W{i}_grad", []) for i in range(len(SIZES))])
    return save(m, path)


def check_monotone(points: list[dict]) -> None:
    for more, less in zip(points, points[1:]):  # most memory first
        assert less["total_bytes"] < more["total_bytes"] and less["extra_flops"] > more["extra_flops"], (more, less)


# --- the front: dominated points dropped ---------------------------------------------------------

def test_front_keeps_what_no_other_point_beats_on_both_memory_and_price():
    def point(label, total, price):
        return Point(label, None, {"persistent_bytes": 0, "arena_bytes": total,
                                   "recompute": {"extra_flops": price, "price": price}}, True)

    points = [point("A", 100, 0), point("B", 90, 5), point("C", 95, 10), point("D", 80, 20), point("E", 80, 30),
              point("F", 90, 5), point("G", 85, 20)]
    front, dominated = front_of(points)
    # C: B needs less at a lower price; E: D the same memory at less; F: B's twin; G: D less at as much
    assert [p.label for p in front] == ["A", "B", "D"]
    assert sorted((p.label, p.dominated_by) for p in dominated) == [("C", "B"), ("E", "D"), ("F", "B"), ("G", "D")]


def test_a_reference_mark_takes_a_share_or_a_count_of_the_step():
    assert mark("eager", 3 << 30, None, 1000) == {"name": "eager", "total_bytes": 3 << 30, "extra_flops_pct": 0.0}
    assert mark("ckpt", 2 << 30, "23.5%", 1000)["extra_flops_pct"] == 23.5
    assert mark("ckpt", 2 << 30, "250", 1000)["extra_flops_pct"] == 25.0


# --- a hand-built step ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    d = tmp_path_factory.mktemp("exps")
    src = exps(d / "exps.onnx")
    # first-fit: every choice's peak of live bytes on this step is within 1 KiB of the others'
    # (132,352 B keeping every e_i, 131,328 B recomputing them all), so tradeoff's default layout,
    # which reaches the peak, gives a flat front of 5 points; first-fit's arena grows with the bytes
    # kept, which spreads the choices into the 8 points the checks below need
    r = roam("tradeoff", src, "-o", d / "front.json", "--points", "8", "--plans", d / "plans", "--plot", d / "pictures",
             "--mark", "eager=400KiB", "--mark", "checkpointing=300KiB@25%", "--layout", "first-fit")
    assert r.code == 0, r.err
    return d, src, json.loads((d / "front.json").read_text())


def test_each_point_recomputes_the_fewest_flops_for_its_bytes(swept):
    _, _, front = swept
    points = front["points"]
    assert len(points) >= 8
    everything = 4 * N * sum(SIZES)
    for p in points:
        # every element of an e_i is kept (4 bytes) or recomputed (one FLOP)
        assert p["kept_bytes"] + 4 * p["extra_flops"] == everything, p
        if p["boundary_limit_bytes"] is not None:
            deficit = max(everything - p["boundary_limit_bytes"], 0)
            fewest = min(4 * N * sum(c) for k in range(len(SIZES) + 1) for c in itertools.combinations(SIZES, k)
                         if 4 * N * sum(c) >= deficit)
            assert 4 * p["extra_flops"] == fewest, p
    assert points[0]["label"] == "keep all" and points[0]["extra_flops"] == 0
    assert points[-1]["label"] == "free" and points[-1]["kept_bytes"] == 0  # Exp is cheap: free recomputes all


def test_the_front_is_monotone_and_every_plan_verifies(swept):
    d, src, front = swept
    check_monotone(front["points"])
    assert front["unverified"] == []
    for p in front["points"]:
        assert p["verified"] is True
        assert p["total_bytes"] == p["persistent_bytes"] + p["arena_bytes"]
        plan = json.loads((d / "plans" / p["plan"].rsplit("/", 1)[-1]).read_text())
        assert plan["persistent_bytes"] + plan["arena_bytes"] == p["total_bytes"]
        assert plan["recompute"]["extra_flops"] == p["extra_flops"]
        assert plan["stats"]["order"]["leaf_states"] == tradeoff.POINT_LEAF_STATES  # a point's lighter search
        r = roam("verify", src, p["plan"])
        assert r.code == 0, r.err
    for p in front["dominated"]:
        beaten = next(q for q in front["points"] if q["label"] == p["dominated_by"])
        assert beaten["total_bytes"] <= p["total_bytes"] and beaten["extra_flops"] <= p["extra_flops"]


def test_the_picture_and_the_marks(swept):
    d, _, front = swept
    assert sorted(f.name for f in (d / "pictures").iterdir()) == ["front.png", "front.svg"]
    assert front["marks"] == [{"name": "eager", "total_bytes": 400 * 1024, "extra_flops_pct": 0.0},
                              {"name": "checkpointing", "total_bytes": 300 * 1024, "extra_flops_pct": 25.0}]


# --- a real step: the tiny BERT fixture's full step ----------------------------------------------
# (Tiny GPT-2's front has 6 points once the memory model writes ONNX Runtime's in-place kernels
# into their inputs: every further budget gives a plan that one of them dominates, at any time limit.)

@pytest.mark.slow  # 25 s; the hand-built step above checks every point by hand
def test_the_tiny_bert_step_has_a_verified_monotone_front_of_8_points(tmp_path):
    step = tmp_path / "step.onnx"
    r = roam("make-training-graph", ROOT / "tests" / "fixtures" / "tiny_bert" / "forward.onnx", "-o", step,
             "--loss", "none", "--in-graph-optimizer")
    assert r.code == 0, r.err
    r = roam("tradeoff", step, "-o", tmp_path / "front.json", "--points", "8", "--time-limit", "60",
             "--plans", tmp_path / "plans")
    assert r.code == 0, r.err
    front = json.loads((tmp_path / "front.json").read_text())
    points = front["points"]
    assert len(points) >= 8
    check_monotone(points)
    assert points[0]["label"] == "keep all" and points[0]["extra_flops"] == 0
    assert any(p["label"] == "free" for p in points + front["dominated"])
    assert any(p["label"] == "fewest bytes" for p in points + front["dominated"])
    for p in points:
        assert p["verified"] is True
        assert roam("verify", step, p["plan"]).code == 0


# --- refusals -------------------------------------------------------------------------------------

def forward_only(path):
    return save(model([node("Exp", ["W"], ["e"]), node("ReduceSum", ["e"], ["loss"], keepdims=0)], [("W", [N])],
                      [("loss", [])]), path)


@pytest.mark.parametrize("args, message", [
    (["--points", "1"], "--points"),
    (["--mark", "eager"], "NAME=BYTES"),
    (["--mark", "eager=lots"], "eager"),
    (["--mark", "ckpt=1GiB@many"], "neither a count nor a percentage"),
    (["--time-limit", "0"], "--time-limit"),
])
def test_bad_options_exit_2_with_one_line_and_write_nothing(tmp_path, args, message):
    src = exps(tmp_path / "exps.onnx")
    r = roam("tradeoff", src, "-o", tmp_path / "front.json", *args)
    assert r.code == 2, (r.code, r.err)
    assert message in r.err and "Traceback" not in r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exps.onnx"]


def test_a_graph_without_a_backward_or_a_missing_file_or_the_input_as_output_is_refused(tmp_path):
    src = forward_only(tmp_path / "fwd.onnx")
    r = roam("tradeoff", src, "-o", tmp_path / "front.json")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "not a training step" in r.err, r.err
    r = roam("tradeoff", tmp_path / "missing.onnx", "-o", tmp_path / "front.json")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    r = roam("tradeoff", src, "-o", src)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fwd.onnx"]


# --- planning points at once ----------------------------------------------------------------------

def test_points_planned_at_once_come_back_in_order_and_a_dead_process_s_point_is_planned_here():
    import os

    from roam_cli.core.forking import parallel_map

    parent = os.getpid()

    def work(t):
        if t == 3 and os.getpid() != parent:
            os._exit(1)  # a worker that dies without an answer
        return t * t

    assert parallel_map(work, [1, 2, 3, 4, 5], 2) == [1, 4, 9, 16, 25]
    assert parallel_map(work, [3], 2) == [9]  # one task: no process
    assert parallel_map(work, [1, 2, 3], 1) == [1, 4, 9]
