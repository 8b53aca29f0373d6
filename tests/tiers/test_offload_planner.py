"""The offload planner's parts on hand-built graphs (fetches moved earlier within the device's
peak; the share of a round trip the compute hides), and the planner on the sample's step: the plan
fits, and no fitting candidate weighed is estimated faster."""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from onnx import TensorProto

from roam_cli.core import memory
from roam_cli.core.collectives import SHARDING_KEY
from roam_cli.core.graph import Graph, Node, Value
from roam_cli.cost.profile import Interconnect, Profile
from roam_cli.offload import prefetch, timing

# Every compute node takes exactly 1 s (its overhead; its FLOPs and bytes are next to nothing at
# these rates); a transfer 1.5 s (its latency; its bytes next to nothing).
SECOND_PER_NODE = Profile(
    name="toy", description="hand-checkable", source="made up",
    device_flops={"matmul": 1e12, "conv": 1e12, "other": 1e12}, device_memory_bandwidth=1e12, device_memory_bytes=10**9,
    host_flops=1e12, host_memory_bandwidth=1e12, host_memory_bytes=10**9, link="host",
    to_host_bandwidth=1e12, to_device_bandwidth=1e12, link_latency=1.5, duplex=True, overlap=True,
    kernel_overhead=1.0, energy_per_flop=None, energy_per_byte_moved=None, energy_per_byte_accessed=None)


def fetching_graph(a: int, c: int) -> Graph:
    """x -> p:Neg -> a -> m1:Erf -> b -> m2:ReduceMax -> c -> use:Add(c, h_dev) -> y, where h (256
    bytes, kept on the host) comes to the device by the transfer t. a and b are `a` bytes, c and y
    `c` bytes (float32 elements x 4)."""
    f = TensorProto.FLOAT
    values = {"x": Value("x", f, (a // 4,)), "a": Value("a", f, (a // 4,)), "b": Value("b", f, (a // 4,)),
              "c": Value("c", f, (c // 4,)), "y": Value("y", f, (c // 4,)), "h": Value("h", f, (64,)),
              "h_dev": Value("h_dev", f, (64,)), "s": Value("s", TensorProto.INT64, (0,))}
    nodes = [Node("p", "Neg", "", ("x",), ("a",)), Node("t", "Expand", "", ("h", "s"), ("h_dev",)),
             Node("m1", "Erf", "", ("a",), ("b",)), Node("m2", "ReduceMax", "", ("b",), ("c",)),
             Node("use", "Add", "", ("c", "h_dev"), ("y",))]
    tiers = {"tier": "host", "transfers": {"t": "to_device"}, "host_nodes": [], "homes": ["h"]}
    return Graph(nodes, values, ["x"], ["h", "s"], ["y"], metadata={memory.TIERS_KEY: json.dumps(tiers)})


P, T, M1, M2, USE = range(5)


def test_a_fetch_moves_back_over_the_compute_that_hides_it():
    # order p, m1, m2, t, use (the fetch right before its reader). Device bytes per step: p 1024
    # (a); m1 2048 (a, b); m2 2048 (b, c); t 1280 (c, h_dev); use 2304 (c, h_dev, y): peak 2304.
    # The fetch needs 1.5 s: m2 covers 1 s, m1 another, so it moves before m1, where it adds 256
    # to 2048 (2304 <= the peak) and to m2's 2048: the order p, t, m1, m2, use, peak unchanged.
    g = fetching_graph(1024, 1024)
    mm = memory.build(g)
    assert [s.tier for s in mm.storages] == ["device"] * 5 and mm.persistent_bytes == 1024 and mm.slow_persistent_bytes == 256
    given = [P, M1, M2, T, USE]
    early = prefetch.hoist(g, mm, given, SECOND_PER_NODE)
    assert early == [P, T, M1, M2, USE]
    assert memory.peak_live(mm, memory.lifetimes(mm, early))[0] == memory.peak_live(mm, memory.lifetimes(mm, given))[0] == 2304


def test_a_fetch_stops_where_it_would_raise_the_peak():
    # a and b 2048 bytes: m1 holds 4096, the peak; m2 3072 (b 2048, c 1024). The fetch may pass
    # m2 (3072 + 256 <= 4096) but not m1 (4096 + 256 > 4096): p, m1, t, m2, use.
    g = fetching_graph(2048, 1024)
    mm = memory.build(g)
    assert prefetch.hoist(g, mm, [P, M1, M2, T, USE], SECOND_PER_NODE) == [P, M1, T, M2, USE]


# The same toy with an interconnect between 2 ranks: a ring of N - 1 = 1 hop of 1.5 s (its bytes next to nothing).
TWO_RANKS = replace(SECOND_PER_NODE, interconnect=Interconnect("toy link", 1e15, 1.5))


def rank_step(nodes: list[Node], values: dict[str, Value], inputs: list[str], outputs: list[str]) -> Graph:
    record = {"ranks": 2, "parameters": {"w": {"shape": [128], "numel": 128, "shard": 64}}}
    return Graph(nodes, values, [], inputs, outputs, metadata={SHARDING_KEY: json.dumps(record)})


def gathering_graph(a: int) -> Graph:
    """fetching_graph with the fetch an all-gather: w (a rank's shard, 256 bytes) -> g -> w_full (512
    bytes), read by use:Add(c, w_full); a and b `a` bytes, c and y 1024."""
    f = TensorProto.FLOAT
    values = {"x": Value("x", f, (256,)), "a": Value("a", f, (a // 4,)), "b": Value("b", f, (a // 4,)),
              "c": Value("c", f, (128,)), "y": Value("y", f, (128,)), "w": Value("w", f, (64,)),
              "w_full": Value("w_full", f, (128,))}
    nodes = [Node("p", "Neg", "", ("x",), ("a",)), Node("g", "AllGather", "com.microsoft", ("w",), ("w_full",)),
             Node("m1", "Abs", "", ("a",), ("b",)), Node("m2", "ReduceMax", "", ("b",), ("c",)),
             Node("use", "Add", "", ("c", "w_full"), ("y",))]
    return rank_step(nodes, values, ["x", "w"], ["y"])


def test_a_gather_is_issued_where_the_compute_before_its_reader_covers_its_ring():
    # order p, m1, m2, g, use. A collective starts when the step before it starts (the launch runs
    # ahead of the kernels, cost/estimate.py): the 1.5 s ring issued before m2 starts beside m1 at 1 s
    # and ends at 2.5 s, before use starts at 3 s; after m2 use waits for it until 3.5 s. Before m1 it
    # would hold its 512 bytes a step longer for nothing.
    g = gathering_graph(256)
    mm = memory.build(g)
    assert prefetch.hoist(g, mm, [P, M1, M2, T, USE], TWO_RANKS) == [P, M1, T, M2, USE]
    assert timing.planned(g, mm, [P, M1, T, M2, USE], TWO_RANKS).seconds == pytest.approx(4.0, abs=1e-6)
    assert timing.planned(g, mm, [P, M1, M2, T, USE], TWO_RANKS).seconds == pytest.approx(4.5, abs=1e-6)


def test_a_gather_stops_where_it_would_raise_the_peak():
    # A 2.5 s ring must start by 0.5 s: issued before m1 (beside p, at 0 s). With a and b 256 bytes
    # it goes there (the peak is use's 1536: c, w_full, y; m1's 512 + 512 is under it). With a and b
    # 2048 bytes m1 holds 4096, the peak, and 4096 + 512 is over it: it stops before m2 (b, c: 2560
    # + 512), and use waits 0.5 s.
    slow = replace(SECOND_PER_NODE, interconnect=Interconnect("toy link", 1e15, 2.5))
    for a, expected in ((256, [P, T, M1, M2, USE]), (2048, [P, M1, T, M2, USE])):
        g = gathering_graph(a)
        assert prefetch.hoist(g, memory.build(g), [P, M1, M2, T, USE], slow) == expected


def test_an_update_waits_for_its_reduce_scatter_behind_the_compute_that_covers_it():
    # b0 makes big (2048 bytes: the peak, with t), b1 reduces it to t. gr -> rs (the ring, 1.5 s) ->
    # shard (256 bytes) -> u (an update) -> w_new; k1 and k2 (1 s each) compute z from x and t
    # meanwhile. Order b0, b1, rs, u, k1, k2: u waits for the ring until 3.5 s, the step ends at 5.5 s.
    # Behind k1 and k2 (2 s >= 1.5 s, the shard held beside z1 and z, far under the peak) u waits for
    # nothing: 5 s.
    f = TensorProto.FLOAT
    values = {"gr": Value("gr", f, (128,)), "shard": Value("shard", f, (64,)), "w": Value("w", f, (64,)),
              "w_new": Value("w_new", f, (64,)), "x": Value("x", f, (64,)), "big": Value("big", f, (512,)),
              "t": Value("t", f, (1,)), "z1": Value("z1", f, (64,)), "z": Value("z", f, (64,))}
    nodes = [Node("b0", "Tile", "", ("x", "reps"), ("big",)), Node("b1", "ReduceMax", "", ("big",), ("t",)),
             Node("rs", "ReduceScatter", "ai.roam.collective", ("gr",), ("shard",)),
             Node("u", "Sub", "", ("w", "shard"), ("w_new",)), Node("k1", "Add", "", ("x", "t"), ("z1",)),
             Node("k2", "Neg", "", ("z1",), ("z",))]
    values["reps"] = Value("reps", TensorProto.INT64, (1,))
    g = rank_step(nodes, values, ["gr", "w", "x", "reps"], ["w_new", "z"])
    mm = memory.build(g)
    mm.node_class = ["backward", "backward", "backward", "update", "backward", "backward"]
    B0, B1, RS, U, K1, K2 = range(6)
    assert prefetch.hoist(g, mm, [B0, B1, RS, U, K1, K2], TWO_RANKS) == [B0, B1, RS, K1, K2, U]
    assert timing.planned(g, mm, [B0, B1, RS, K1, K2, U], TWO_RANKS).seconds == pytest.approx(5.0, abs=1e-6)
    assert timing.planned(g, mm, [B0, B1, RS, U, K1, K2], TWO_RANKS).seconds == pytest.approx(5.5, abs=1e-6)


def test_the_share_of_a_round_trip_the_compute_hides():
    # x -> p -> a -> q -> d -> r -> e, and use:Add(a, e) after the forward. a's round trip (out
    # after q, its last forward reader; back before use) takes 2 x 1.5 s; between them r computes
    # for 1 s: a third of it is hidden. d is read by r only: it never comes back, nothing hides.
    f = TensorProto.FLOAT
    values = {v: Value(v, f, (256,)) for v in "xadey"}
    g = Graph([Node("p", "Neg", "", ("x",), ("a",)), Node("q", "Neg", "", ("a",), ("d",)),
               Node("r", "Neg", "", ("d",), ("e",)), Node("use", "Add", "", ("a", "e"), ("y",))],
              values, ["x"], [], ["y"])
    mm = memory.build(g)
    mm.node_class = ["forward", "forward", "forward", "backward"]
    share = timing.hidden_share(g, mm, ["p", "q", "r", "use"], {"a": 1024, "d": 1024}, SECOND_PER_NODE)
    assert share["a"] == pytest.approx(1 / 3, rel=1e-6) and share["d"] == 0.0


@pytest.mark.slow  # half a minute: tests/tiers/test_tiers.py plans and verifies the sample's step with --offload too
def test_the_planner_picks_the_fastest_plan_that_fits(tmp_path):
    roam = [sys.executable, "-m", "roam_cli"]
    sample = Path(__file__).resolve().parents[2] / "sample_models" / "gpt2_tiny" / "training_model.onnx"
    step = tmp_path / "step.onnx"
    subprocess.run(roam + ["-q", "make-training-graph", str(sample), "-o", str(step), "--in-graph-optimizer"], check=True)
    plan_path = tmp_path / "plan.json"
    budget = 1_400_000  # about half of what keeping everything on the device needs (2.6 MiB)
    done = subprocess.run(roam + ["-q", "optimize", str(step), "-o", str(plan_path), "--offload", "host",
                                  "--budget", str(budget), "--time-limit", "60"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    plan = json.loads(plan_path.read_text())
    assert plan["persistent_bytes"] + plan["arena_bytes"] <= budget
    o = plan["offload"]
    fitting = [c for c in o["candidates"] if c["fits"]]
    assert {c["policy"] for c in o["candidates"]} >= {"keep", "save_on_cpu", "zero_offload", "all_on_host",
                                                        "recompute_only"}
    assert o["estimate"]["seconds"] == min(c["estimate"]["seconds"] for c in fitting)
    assert all(c["device_bytes"] <= budget for c in fitting)
    checked = subprocess.run(roam + ["verify", str(plan_path.with_name("plan.annotated.onnx")), str(plan_path)],
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.slow  # a minute: it plans every candidate at several budgets
def test_the_offload_front_is_a_front_and_names_what_beats_each_policy(tmp_path):
    roam = [sys.executable, "-m", "roam_cli"]
    sample = Path(__file__).resolve().parents[2] / "sample_models" / "gpt2_tiny" / "training_model.onnx"
    step = tmp_path / "step.onnx"
    subprocess.run(roam + ["-q", "make-training-graph", str(sample), "-o", str(step), "--in-graph-optimizer"], check=True)
    done = subprocess.run(roam + ["-q", "tradeoff", str(step), "-o", str(tmp_path / "front.json"), "--offload", "host",
                                  "--points", "2", "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    front = json.loads(done.stdout)
    points = front["points"]  # most device bytes first: each point needs fewer and takes longer
    assert all(a["device_bytes"] > b["device_bytes"] and a["seconds"] < b["seconds"] for a, b in zip(points, points[1:]))
    assert [p["policy"] for p in front["policies"]] == ["keep", "save_on_cpu", "zero_offload", "all_on_host",
                                                         "recompute_only"]
    for p in front["policies"]:
        by = p["dominated_by"]
        assert by is None or (by in points and by["device_bytes"] < p["device_bytes"] and by["seconds"] <= p["seconds"])


def test_the_floor_is_the_busiest_streams_total():
    # fetching_graph at one second a node: four device nodes (4 s on the device's stream) and one
    # fetch (1.5 s on the link's): no order is estimated under 4 s, and the fetch moved early
    # (p, t, m1, m2, use) reaches it.
    g = fetching_graph(1024, 1024)
    mm = memory.build(g)
    assert timing.floor(g, mm, SECOND_PER_NODE) == pytest.approx(4.0)
    for order in ([P, M1, M2, T, USE], [P, T, M1, M2, USE], [T, P, M1, M2, USE]):
        assert timing.planned(g, mm, order, SECOND_PER_NODE).seconds >= 4.0
    assert timing.planned(g, mm, [P, T, M1, M2, USE], SECOND_PER_NODE).seconds == pytest.approx(4.0)


def chain(tmp_path) -> tuple:
    """x, w1, w2, w3 [1, 64] (256 bytes each, graph inputs: 1024 persistent bytes) -> h1 = x * w1 ->
    h2 = h1 * w2 -> h3 = h2 * w3 -> loss = sum(h3): the forward; y = h1 * h2: the backward. No node
    holds more than 768 bytes at once (two inputs, one output), the placements keeping the inputs
    on the device hold 1024 persistent bytes, every persistent byte on the host none."""
    from onnx_builder import model, node, save

    from roam_cli.frontend.onnx_import import import_model
    m = model([node("Mul", ["x", "w1"], ["h1"]), node("Mul", ["h1", "w2"], ["h2"]), node("Mul", ["h2", "w3"], ["h3"]),
               node("ReduceSum", ["h3"], ["loss"], keepdims=0), node("Mul", ["h1", "h2"], ["y"])],
              [("x", [1, 64]), ("w1", [1, 64]), ("w2", [1, 64]), ("w3", [1, 64])], [("loss", []), ("y", [1, 64])])
    imported = import_model(save(m, tmp_path / "chain.onnx"), {}, False)
    return imported, memory.build(imported.graph)


def test_a_placement_whose_persistent_bytes_exceed_the_budget_is_not_planned(tmp_path):
    from roam_cli import pipeline
    from roam_cli.offload import planner
    from roam_cli.outputs.report import offload_rows

    imported, mm = chain(tmp_path)
    assert mm.node_class == ["forward"] * 4 + ["backward"] and mm.persistent_bytes == 1024
    planned = []  # the graphs plan_model was given: which placements were planned

    def plan_model(i, m, o, refine=None):
        planned.append(m.persistent_bytes)
        return pipeline.plan_model(i, m, tmp_path / "chain.onnx", tmp_path / "plan.json", o, {}, lambda _m: None,
                                   refine)

    options = pipeline.Options(offload="host", time_limit=12.0)
    budget = 900  # over the working set (768), under the 1024 persistent bytes the inputs kept on the device hold
    candidates, _ = planner.weigh(imported, mm, options, plan_model, pipeline.ORDERING, lambda _m: None, [budget])
    by = {c.policy: c for c in candidates}
    # keep, save_on_cpu, ZeRO-Offload (this graph has no optimizer: nothing moves to the host, the
    # placement is keep's, weighed once) and recompute only keep the 1024 persistent bytes on the
    # device: none is planned, each listed so
    assert candidates[2] is candidates[0]
    for policy in ("keep", "save_on_cpu", "recompute_only"):
        c = by[policy]
        assert not c.planned and c.persistent_bytes == 1024 and not c.fits(budget) and "persistent" in c.skipped
        assert c.summary(budget) | {"estimate": None, "least_seconds": None} == {
            "policy": policy, "planned": False, "why": c.skipped, "device_bytes": None, "persistent_bytes": 1024,
            "least_device_bytes": 1024, "slow_bytes": None, "fits": False, "transfers": None, "estimate": None,
            "least_seconds": None}
    assert by["all_on_host"].planned and by["all_on_host"].persistent_bytes == 0
    assert 1024 not in planned  # no plan was made with the inputs on the device
    # keeping everything moves nothing: its time is the same in every order, known without a plan
    # (save_on_cpu's is not: it is left out)
    kept, _ = planner.weigh(imported, mm, options, plan_model, pipeline.ORDERING, lambda _m: None, [])
    assert by["keep"].estimate.seconds == pytest.approx(kept[0].estimate.seconds, rel=1e-12)
    assert by["save_on_cpu"].estimate is None
    rows = {row[0]: row for row in offload_rows({"candidates": [c.summary(budget) for c in candidates]})}
    assert rows["keep everything on the device"][1:] == ("≥ 1.00 KiB", "—", "—", rows["keep everything on the device"][4],
                                                         "—", "no, not planned")
    assert rows["save_on_cpu (every saved activation offloaded)"][4] == "—"


def test_the_least_bytes_any_order_holds(tmp_path):
    # hand: x, w (512 persistent bytes); h = x * w, a = Relu(h), loss = sum(a); d = h * w, y = d + a.
    # At Add every order holds a, d (its inputs, made before it) and y: 768 bytes; the order
    # Mul, Relu, Mul, Add, ReduceSum holds no more anywhere. Relu may write a into h (ONNX
    # Runtime's in-place kernels, where the order runs it last among h's readers): one step saves
    # at most its 256 bytes. At least 512 + 768 - 256 on the device.
    from onnx_builder import model, node, save

    from roam_cli import pipeline
    from roam_cli.frontend.onnx_import import import_model
    from roam_cli.offload.planner import least_device_bytes
    m = model([node("Mul", ["x", "w"], ["h"]), node("Relu", ["h"], ["a"]), node("ReduceSum", ["a"], ["loss"], keepdims=0),
               node("Mul", ["h", "w"], ["d"]), node("Add", ["d", "a"], ["y"])],
              [("x", [1, 64]), ("w", [1, 64])], [("loss", []), ("y", [1, 64])])
    imported = import_model(save(m, tmp_path / "hand.onnx"), {}, False)
    mm = memory.build(imported.graph)
    assert least_device_bytes(imported.graph, mm, pipeline.ORDERING.least_live) == 512 + 768 - 256
