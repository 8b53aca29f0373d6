"""Memory tiers (issue 32): the accounting of a rewritten graph worked by hand, the rewritten model
run by ONNX Runtime, `roam verify` on tiered plans and on hand-edited ones, and optimize
--offload's refusals."""

import copy
import json
import xml.etree.ElementTree as ET
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import SAMPLE, roam
from onnx_builder import model, node, save

from roam_cli.core import memory
from roam_cli.core.units import format_bytes
from roam_cli.frontend.onnx_import import import_model
from roam_cli.offload.policies import working_set
from roam_cli.offload.rewrite import Placement, reapply, rewrite
from roam_cli.outputs import plot
from roam_cli.outputs.export import memory_snapshot, perfetto_trace
from roam_cli.verify import Violation, verify

W = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    """x, w [1, 64] (256 bytes each, the alignment; w a graph input, as a full step's weights are) -> h = x * w -> a = Relu(h) -> loss = sum(a):
    the forward; d = max(h, w), y = d + a: the backward (h and a read after the forward). (Max, not
    Mul: roam would write d over what the backward reads last, and leave a storage fewer to count.)"""
    m = model([node("Mul", ["x", "w"], ["h"]), node("Relu", ["h"], ["a"]),
               node("ReduceSum", ["a"], ["loss"], keepdims=0),
               node("Max", ["h", "w"], ["d"]), node("Add", ["d", "a"], ["y"])],
              [("x", [1, 64]), ("w", [1, 64])], [("loss", []), ("y", [1, 64])])
    imported = import_model(save(m, tmp_path_factory.mktemp("hand") / "hand.onnx"), {}, False)
    mm = memory.build(imported.graph)
    assert mm.node_class == ["forward"] * 3 + ["backward"] * 2
    return imported, mm


def tiers_of(mm: memory.MemoryModel) -> dict[str, str]:
    return {s.root: s.tier for s in mm.storages}


def svg_texts(path) -> str:
    return " ".join(t.text or "" for t in ET.parse(path).iter("{http://www.w3.org/2000/svg}text"))


def run(m: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(["loss", "y"], {"x": x, "w": W})


def test_offloaded_activation_and_a_weight_kept_on_the_host(hand):
    imported, mm = hand
    new, records = rewrite(imported, mm, Placement("host", offloaded=frozenset({"h"}), homes=frozenset({"w"})))
    # w is fetched once and its copy read by both phases; h goes out after the forward and back
    assert [n.name for n in new.graph.nodes] == ["w/to_device", "h_node", "a_node", "loss_node",
                                                 "h/to_host", "h/to_device", "d_node", "y_node"]
    assert [(r["node"], r["value"], r["direction"], r["bytes"]) for r in records] == [
        ("w/to_device", "w", "to_device", 256), ("h/to_host", "h", "to_host", 256),
        ("h/to_device", "h", "to_device", 256)]
    assert {n.name: n.inputs for n in new.graph.nodes}["d_node"] == ("h/to_device", "w/to_device")
    meta = json.loads(new.graph.metadata[memory.TIERS_KEY])
    assert meta == {"tier": "host", "transfers": {r["node"]: r["direction"] for r in records}, "host_nodes": [],
                    "homes": ["w"]}

    nm = memory.build(new.graph)
    assert tiers_of(nm) == {"w/to_device": "device", "h": "device", "a": "device", "loss": "device",
                            "h/to_host": "host", "h/to_device": "device", "d": "device", "y": "device"}
    assert nm.persistent_bytes == 256 and nm.slow_persistent_bytes == 256  # x on the device, w on the host
    spans = memory.lifetimes(nm, list(range(8)))
    # file order: w/to_device 0..6, h 1..4 (freed once copied out), a 2..7, loss 3..7, h/to_device 5..6,
    # d 6..7, y 7: at step 6 w's copy, a, loss, h's copy back and d are live on the device
    assert memory.peak_live(nm, spans) == (5 * 256, 6)
    assert memory.peak_live(nm, spans, "host") == (256, 4)  # h/to_host, 4..5

    onnx.checker.check_model(new.model, full_check=True)
    x = np.linspace(-2, 2, 64, dtype=np.float32).reshape(1, 64)
    for got, want in zip(run(new.model, x), run(imported.model, x)):
        np.testing.assert_array_equal(got, want)


def test_a_node_run_by_the_host(hand):
    imported, mm = hand
    new, records = rewrite(imported, mm, Placement("host", host_nodes=frozenset({4})))  # y = d + a
    assert [(r["node"], r["direction"]) for r in records] == [("d/to_host", "to_host"), ("a/to_host", "to_host")]
    assert {n.name: n.inputs for n in new.graph.nodes}["y_node"] == ("d/to_host", "a/to_host")
    nm = memory.build(new.graph)
    assert tiers_of(nm) == {"h": "device", "a": "device", "loss": "device", "d": "device",
                            "d/to_host": "host", "a/to_host": "host", "y": "host"}
    assert nm.persistent_bytes == 512 and nm.slow_persistent_bytes == 0  # x and w stay on the device
    spans = memory.lifetimes(nm, list(range(7)))
    # h 0..3, a 1..5, loss 2..6, d 3..4: four at step 3; the host: d/to_host 4..6, a/to_host 5..6, y 6
    assert memory.peak_live(nm, spans) == (4 * 256, 3)
    assert memory.peak_live(nm, spans, "host") == (3 * 256, 6)
    onnx.checker.check_model(new.model, full_check=True)
    x = np.linspace(-2, 2, 64, dtype=np.float32).reshape(1, 64)
    for got, want in zip(run(new.model, x), run(imported.model, x)):
        np.testing.assert_array_equal(got, want)


@pytest.fixture(scope="module")
def step(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiers")
    r = roam("make-training-graph", SAMPLE, "-o", d / "step.onnx", "--in-graph-optimizer")
    assert r.code == 0, r.err
    return d


@pytest.fixture(scope="module")
def tiered(step):
    """The sample's step planned with the host tier at a budget ZeRO-Offload meets: the update on the host."""
    r = roam("optimize", step / "step.onnx", "-o", step / "plan.json", "--offload", "host", "--budget", "2MiB")
    assert r.code == 0, r.err
    plan = json.loads((step / "plan.json").read_text())
    assert plan["tiers"]["slow"] == "host" and plan["tiers"]["host_nodes"] and plan["offload"]["transfers"]
    return step / "plan.annotated.onnx", step / "plan.json", plan


def test_a_tiered_plan_verifies_with_both_arenas(tiered):
    annotated, plan_path, plan = tiered
    r = roam("verify", annotated, plan_path, "--json")
    assert r.code == 0, r.err
    out = r.json()
    assert out["arena_bytes"] == plan["arena_bytes"] and out["peak_live_bytes"] == plan["peak_live_bytes"]
    slow = plan["tiers"]
    placed = sum(1 for t in plan["tensors"] if t.get("tier") == "host" and t["offset"] is not None)
    assert out["tiers"] == {"tier": "host", "arena_bytes": slow["arena_bytes"], "placed": placed,
                            "peak_live_bytes": slow["peak_live_bytes"], "transfers": len(plan["offload"]["transfers"])}
    r = roam("verify", annotated, plan_path)
    assert "device arena" in r.out and "host: " in r.out


@pytest.mark.slow  # 9 s: a tight budget's tier search; the tiered plan's checks are the default run's
def test_a_plan_with_persistent_bytes_on_the_host_verifies(step):
    """A tight budget moves persistent tensors to the host: the device's views of their copies
    (input_ids's Reshape) live on the device, and no transfer copies a device tensor."""
    r = roam("optimize", step / "step.onnx", "-o", step / "tight.json", "--offload", "host", "--budget", "1.3MiB")
    assert r.code == 0, r.err
    plan = json.loads((step / "tight.json").read_text())
    assert any(t.get("tier") == "host" and t["offset"] is None for t in plan["tensors"])
    r = roam("verify", step / "tight.annotated.onnx", step / "tight.json")
    assert r.code == 0, r.err
    # the other member of the pair, the source model: the plan's transfers (and copies) made again
    r = roam("verify", step / "step.onnx", step / "tight.json")
    assert r.code == 0, r.err
    assert any(t.get("tier") == "host" and "alias_of" in t for t in plan["tensors"])  # param.out, in place on the host


def refusal(annotated, plan: dict, edit_graph=lambda g: g) -> str:
    imported = import_model(annotated, {}, False)
    with pytest.raises(Violation) as caught:
        verify(edit_graph(imported.graph), imported.sha256, plan)
    return str(caught.value)


def test_verify_refuses_hand_edited_tiered_plans(tiered):
    annotated, _, plan = tiered
    imported = import_model(annotated, {}, False)
    verify(imported.graph, imported.sha256, plan)  # as written, it holds
    host = [t for t in plan["tensors"] if t.get("tier") == "host" and t["offset"] is not None and t["bytes"]]
    a, b = next((a, b) for a in host for b in host if a is not b and a["offset"] != b["offset"]
                and a["first_step"] <= b["first_step"] <= a["last_step"])

    overlapping = copy.deepcopy(plan)
    next(t for t in overlapping["tensors"] if t["name"] == b["name"])["offset"] = a["offset"]
    assert "overlaps" in refusal(annotated, overlapping)

    beyond = copy.deepcopy(plan)
    next(t for t in beyond["tensors"] if t["name"] == a["name"])["offset"] = plan["tiers"]["arena_bytes"]
    assert f"past the host arena ({plan['tiers']['arena_bytes']} bytes)" in refusal(annotated, beyond)

    stated = copy.deepcopy(plan)
    stated["tiers"]["persistent_bytes"] += 256
    assert "persistent bytes in the host tier" in refusal(annotated, stated)

    # the model's record loses a transfer to the device: its node is then a device node reading
    # the host's tensor
    back = next(t for t in plan["offload"]["transfers"] if t["direction"] == "to_device")
    source = next(n for n in imported.graph.nodes if n.name == back["node"]).inputs[0]

    def dropped(graph):
        meta = json.loads(graph.metadata[memory.TIERS_KEY])
        del meta["transfers"][back["node"]]
        return replace(graph, metadata={**graph.metadata, memory.TIERS_KEY: json.dumps(meta)})

    assert refusal(annotated, plan, dropped) == (f"node {back['node']!r} reads the device tier, but {source!r} "
                                                 "lives in the host tier (no transfer brings it there)")

    moved = copy.deepcopy(plan)
    next(t for t in moved["offload"]["transfers"] if t["node"] == back["node"])["needed_at"] += 1
    assert f"transfer {back['node']!r} with needed_at" in refusal(annotated, moved)

    untiered = copy.deepcopy(plan)
    del untiered["tiers"]
    assert "the plan has no slow tier" in refusal(annotated, untiered)


def test_optimize_offload_refusals(step):
    model = step / "step.onnx"
    imported = import_model(model, {}, False)
    floor, name = working_set(imported.graph, memory.build(imported.graph))
    r = roam("optimize", model, "-o", step / "r.json", "--offload", "host", "--budget", "1KiB")
    assert r.code == 1 and f"node {name!r}'s working set: {floor} bytes" in r.err
    assert len(r.err.strip().splitlines()) == 1
    for args, says in ((["--offload", "host", "--device", "nosuch"], "device profile 'nosuch'"),
                       (["--offload", "host", "--objective", "energy"], "has no energy figures"),
                       (["--device", "pcie-gen4-gpu"], "give --offload host|storage too")):
        r = roam("optimize", model, "-o", step / "r.json", *args)
        assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and says in r.err, (args, r.err)
    assert not (step / "r.json").exists()


def test_pictures_and_exports_show_both_tiers(tiered, tmp_path):
    annotated, plan_path, plan = tiered
    slow = plan["tiers"]
    assert max(plot.tier_curve(plan)) == plan["peak_live_bytes"]  # the device's curve counts the device alone
    assert max(plot.tier_curve(plan, "host")) == slow["peak_live_bytes"]
    pytest.importorskip("matplotlib")
    r = roam("plot", plan_path, "-o", tmp_path, "--model", annotated, "--format", "svg")
    assert r.code == 0, r.err
    moved = {d: [t for t in plan["offload"]["transfers"] if t["direction"] == d] for d in ("to_host", "to_device")}
    live = svg_texts(tmp_path / "live_memory.svg")
    for label in ("device: persistent + live transient", "host: persistent + live transient",
                  f"host persistent: {format_bytes(slow['persistent_bytes'])}",
                  f"transfers to device: {len(moved['to_device'])}", f"transfers to host: {len(moved['to_host'])}"):
        assert label in live, label
    layout = svg_texts(tmp_path / "layout.svg")
    assert f"host arena: {format_bytes(slow['arena_bytes'])}" in layout

    events = perfetto_trace(plan)["traceEvents"]
    host_live = [e["args"]["bytes"] for e in events if e["ph"] == "C" and e["name"] == "host arena live bytes"]
    assert max(host_live) == slow["peak_live_bytes"]
    assert sum(e["ph"] == "b" for e in events) == len(plan["offload"]["transfers"])
    snapshot = memory_snapshot(plan)
    assert len(snapshot["device_traces"]) == 2
    assert sorted(s["total_size"] for s in snapshot["segments"] if s["device"] == 1) == sorted(
        [slow["arena_bytes"], slow["persistent_bytes"]])


def test_folded_values_and_shape_readers_need_no_transfer(tmp_path):
    # h = Mul(x, c) run by the host, c an initializer; n = Shape(h) and loss = ReduceSum(h) on the
    # device. ONNX Runtime holds c itself (no copy of it to the host) and Shape reads h's shape
    # only: the transfers are x to the host, for Mul, and h back, for ReduceSum.
    m = model([node("Mul", ["x", "c"], ["h"]), node("Shape", ["h"], ["n"]),
               node("ReduceSum", ["h"], ["loss"], keepdims=0)],
              [("x", [1, 64])], [("loss", []), ("n", [2], onnx.TensorProto.INT64)], initializers={"c": W})
    imported = import_model(save(m, tmp_path / "folded.onnx"), {}, False)
    mm = memory.build(imported.graph)
    new, records = rewrite(imported, mm, Placement("host", host_nodes=frozenset({0})))
    assert [(r["node"], r["direction"]) for r in records] == [("x/to_host", "to_host"), ("h/to_device", "to_device")]
    nodes = {n.name: n.inputs for n in new.graph.nodes}
    assert nodes[new.graph.nodes[new.graph.producer["h"]].name] == ("x/to_host", "c")
    assert nodes[new.graph.nodes[new.graph.producer["n"]].name] == ("h",)


def test_the_source_model_is_rewritten_again_from_the_plan(hand):
    # what `roam verify SOURCE plan.json` reads: the plan's transfer records (what each reads, who
    # reads it) and tiers give back the rewritten graph, node for node, the offloaded h's fetch
    # reading its copy on the host
    imported, mm = hand
    new, records = rewrite(imported, mm, Placement("host", offloaded=frozenset({"h"}), homes=frozenset({"w"})))
    g = new.graph
    plan = {"offload": {"transfers": [r | {"readers": sorted(g.nodes[u].name for u in g.consumers[r["node"]])}
                                      for r in records]},
            "tiers": {"slow": "host", "host_nodes": []},
            "tensors": [{"name": "w", "tier": "host", "offset": None}]}
    again = reapply(imported, plan)
    assert [(n.name, n.inputs) for n in again.graph.nodes] == [(n.name, n.inputs) for n in g.nodes]
    assert {n.name: n.inputs for n in again.graph.nodes}["h/to_device"] == ("h/to_host", "roam/same_shape")
    assert json.loads(again.graph.metadata[memory.TIERS_KEY]) == json.loads(g.metadata[memory.TIERS_KEY])


@pytest.mark.slow  # 12 s: a roomy budget's tier search
def test_an_offload_the_budget_does_not_force_says_why_it_was_chosen(step, tiered):
    """At 1 GiB the sample's step fits whole, yet the host's placement is estimated faster: optimize
    says that keeping everything fits too and that the objective chose; at 2 MiB (`tiered`) keeping
    everything does not fit, and it says nothing of the kind."""
    r = roam("optimize", step / "step.onnx", "-o", step / "roomy.json", "--offload", "host", "--budget", "1GiB")
    assert r.code == 0, r.err
    plan = json.loads((step / "roomy.json").read_text())
    keep = next(c for c in plan["offload"]["candidates"] if c["policy"] == "keep")
    assert keep["fits"] and plan["offload"]["policy"] != "keep"
    assert "keeping everything on the device fits the budget too" in r.out and "not one the budget forces" in r.out
    _, _, tight = tiered
    assert not next(c for c in tight["offload"]["candidates"] if c["policy"] == "keep")["fits"]
    r = roam("report", step / "plan.json")
    assert r.code == 0 and "fits the budget too" not in r.out, r.out
