"""`roam train` and `roam execute` with a plan that offloads: two pools, the device's and the host's,
each tensor at its plan offset in its own tier's pool (issue 32, "the plan runs")."""

import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import onnx
import pytest
from conftest import SAMPLE, roam

from roam_cli.core import plan as plan_io
from roam_cli.core.errors import RoamError

# ZeRO-Offload's placement of the sample's step (optimizer state and update on the host) fits this
# device budget; --workspace calibrate puts ORT's kernel scratch in the plan, so that every request
# is a planned one and the device pool is the plan's device arena to the byte
BUDGET = "1.8MiB"
# 21 s, most of it the tiered plan's search: the slow run (test_tiers checks the tiered plan in the default one)
pytestmark = pytest.mark.slow


def in_fresh_process(function, *args):
    """ONNX Runtime gives every session of a process the CPU allocator of its first session."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args).result()


@pytest.fixture(scope="module")
def tiered(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiered")
    r = roam("make-training-graph", SAMPLE, "-o", d / "step.onnx", "--in-graph-optimizer")
    assert r.code == 0, r.err
    r = roam("optimize", d / "step.onnx", "-o", d / "plan.json", "--annotated-model", d / "planned.onnx",
             "--offload", "host", "--budget", BUDGET, "--workspace", "calibrate")
    assert r.code == 0, r.err
    return d


def slow_placed(plan: dict) -> int:
    """The tensors the plan places in its slow tier's arena (persistent ones there have no offset),
    and those written over one of them (ORT requests them too)."""
    named = {t["name"]: t for t in plan["tensors"]}
    return sum(t.get("tier") is not None and (t["offset"] is not None and "alias_of" not in t or "written_over" in t
                                               and named[t["alias_of"]]["offset"] is not None)
               for t in plan["tensors"])


def test_a_tiered_plan_trains_in_two_pools_of_the_plans_sizes_as_plain_ort_does(tiered):
    d = tiered
    plan = json.loads((d / "plan.json").read_text())
    assert plan["tiers"]["slow"] == "host" and slow_placed(plan) > 0 and plan["offload"]["transfers"]
    r = roam("train", d / "planned.onnx", "--plan", d / "plan.json", "--steps", "3", "--compare", "--json")
    assert r.code == 0, r.err
    result = r.json()
    pools = result["arena"]["pools"]
    # each pool holds exactly its tier's plan arena
    assert pools["device"]["arena_bytes"] == pools["device"]["plan_arena_bytes"] == plan["arena_bytes"]
    assert pools["slow"]["arena_bytes"] == pools["slow"]["plan_arena_bytes"] == plan["tiers"]["arena_bytes"]
    # every tensor the plan puts in the host arena is a request of its own there: the transfers to the
    # host (Expand) are copies ORT allocates, not aliases, and the update the host runs writes there
    assert pools["slow"]["planned_requests"] == pools["slow"]["requests"] == slow_placed(plan)
    assert result["arena"]["workspace_requests"] == 0
    for step in result["per_step"][1:]:
        m = step["memory"]
        assert m["unplanned"] == 0 and m["conflicts"] == 0 and m["served"] == result["arena"]["requests"]
        for pool in ("device", "slow"):
            assert m["pools"][pool]["served"] == m["pools"][pool]["served_at_plan_offset"] == pools[pool]["requests"]
        assert m["pools"]["device"]["high_water"] <= plan["arena_bytes"]
        assert m["pools"]["slow"]["high_water"] <= plan["tiers"]["arena_bytes"]
        assert m["bytes_held"] == plan["arena_bytes"] and m["slow_pool_bytes"] == plan["tiers"]["arena_bytes"]
    c = result["compare"]
    assert c["outputs_max_rel"] == 0.0 and c["state_max_rel"] == 0.0  # bit for bit


def test_every_transfer_of_a_value_ort_computes_gets_a_buffer_of_its_own(tiered):
    requested, transfers, constants = in_fresh_process(requested_after_step_1, tiered)
    # ORT folds a transfer of a constant into a constant; every other one is an Expand it runs
    computed = {t["node"] for t in transfers if t["value"] not in constants}
    assert computed and computed <= requested


def requested_after_step_1(d: Path) -> tuple[set, list, set]:
    from roam_cli.runtime.train import PlannedSession, batch_for, starting_values

    plan = plan_io.read(d / "plan.json")
    s = PlannedSession(d / "planned.onnx", plan, log_arena=False)
    try:
        start, _ = starting_values(s, {}, 0, 1e-3, {t["name"]: t["kind"] for t in plan["tensors"]})
        s.set_state(start)
        s.step(batch_for(1, start, {}, s))
        requested = {s.arena.planned[m].name for m in s.arena.matched if m >= 0}
    finally:
        s.close()
    model = onnx.load(str(d / "planned.onnx"))
    constants = {i.name for i in model.graph.initializer} | {o for n in model.graph.node if n.op_type == "Constant"
                                                            for o in n.output}
    return requested, plan["offload"]["transfers"], constants


def test_a_request_of_the_host_tier_past_its_pools_end_is_refused(tiered):
    assert in_fresh_process(shrink_the_host_pool, tiered) == "refused"


def shrink_the_host_pool(d: Path) -> str:
    """Step 1 recorded on the plan, then loaded again with a host arena 256 bytes short of the plan's."""
    from roam_cli.runtime.train import PlannedSession, batch_for, starting_values

    plan = plan_io.read(d / "plan.json")
    s = PlannedSession(d / "planned.onnx", plan, log_arena=False)
    try:
        start, _ = starting_values(s, {}, 0, 1e-3, {t["name"]: t["kind"] for t in plan["tensors"]})
        s.set_state(start)
        s.step(batch_for(1, start, {}, s))
        device, host = s.arena.plan_arenas
        s.arena.plan_arenas = (device, host - 256)
        try:
            s.arena._load(s.arena.recording)
        except RoamError as e:
            assert "of the host arena, which holds" in str(e) and "past its end" in str(e), e
            return "refused"
        return "served"
    finally:
        s.close()


def test_a_plan_edited_past_its_host_arena_is_refused_in_one_line(tiered, tmp_path):
    plan = json.loads((tiered / "plan.json").read_text())
    last = max((t for t in plan["tensors"] if t.get("tier") and t["offset"] is not None),
               key=lambda t: t["offset"] + t["bytes"])
    plan["tiers"]["arena_bytes"] = last["offset"] + last["bytes"] - 256
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    r = roam("train", tiered / "planned.onnx", "--plan", tmp_path / "plan.json", "--steps", "2")
    assert r.code in (1, 2) and len(r.err.strip().splitlines()) == 1 and last["name"] in r.err, r.err


def test_requests_the_plan_does_not_name_are_fitted_into_their_nodes_pool(tiered):
    before, after = in_fresh_process(workspace_to_the_host, tiered)
    assert before["slow"] == before["slow_planned"] and after["slow"] == before["slow"] + 1
    assert after["served"] == after["requests"] and after["unplanned"] == 0


def workspace_to_the_host(d: Path) -> tuple[dict, dict]:
    """Step 1 recorded; one planned device tensor taken out of the plan, its node made a host node:
    its request is then fitted into the host pool, and step 2 is served from the pools."""
    from roam_cli.runtime.train import PlannedSession, batch_for, starting_values

    plan = plan_io.read(d / "plan.json")
    s = PlannedSession(d / "planned.onnx", plan, log_arena=False)
    try:
        start, _ = starting_values(s, {}, 0, 1e-3, {t["name"]: t["kind"] for t in plan["tensors"]})
        s.set_state(start)
        s.step(batch_for(1, start, {}, s))
        arena = s.arena
        before = {"slow": arena.layout["pools"]["slow"]["requests"],
                  "slow_planned": arena.layout["pools"]["slow"]["planned_requests"]}
        k = next(k for k, m in enumerate(arena.matched) if m >= 0 and arena.planned[m].tier == "device")
        node = arena.planned[arena.matched[k]].node
        arena.planned = [t for j, t in enumerate(arena.planned) if j != arena.matched[k]]
        arena.slow_nodes = frozenset({node})
        arena._load(arena.recording)
        m = s.step(batch_for(2, start, {}, s)).memory
        return before, {"slow": arena.layout["pools"]["slow"]["requests"], "served": m["served"],
                        "requests": m["requests"], "unplanned": m["unplanned"]}
    finally:
        s.close()


@pytest.mark.slow  # 30 s: the replay runs every node in a session of its own
def test_execute_replays_a_tiered_plan_in_both_arenas(tiered):
    r = roam("execute", tiered / "planned.onnx", "--plan", tiered / "plan.json", "--json")
    assert r.code == 0, r.err
    result = r.json()
    assert result["replay"]["passed"] and not result["failures"]
    assert result["plan"]["tiers"]["arena_bytes"] == json.loads((tiered / "plan.json").read_text())["tiers"]["arena_bytes"]


def test_a_kernels_scratch_taken_before_its_output_leaves_the_output_its_plan_offset():
    from roam_cli.runtime.allocator import PlannedTensor, match

    # ORT's Where (a dropout replayed from its mask) takes two scratch buffers of its output's size
    # first, each freed within the node, then its output
    out = PlannedTensor("y", "where", 512, 0, 3, 9)
    assert match([500, 512, 512], [out], 256, ["where"] * 3, [True, True, False]) == [-1, -1, 0]
    assert match([512, 512], [out], 256, ["where"] * 2, [False, True]) == [0, -1]
