"""Exports: the Perfetto trace and the PyTorch memory snapshot, checked event by event on a
plan small enough to write down, and for structure on the sample's plan."""

import base64
import json
import pickle
import pickletools

import pytest
from conftest import roam
from small_models import W_BYTES, chain_model

from roam_cli.outputs.export import ARENA_BASE, PICKLE_PROTOCOL, memory_snapshot

# The opcodes memory_viz's JavaScript unpickler (torch/utils/viz/MemoryViz.js) understands.
MEMORY_VIZ_OPCODES = {
    "PROTO", "FRAME", "STOP", "MARK", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "APPEND", "APPENDS", "LIST",
    "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "DICT", "SETITEM", "SETITEMS", "MEMOIZE", "BINPUT", "LONG_BINPUT",
    "BINGET", "LONG_BINGET", "BININT", "BININT1", "BININT2", "LONG1", "NONE", "NEWTRUE", "NEWFALSE", "BINFLOAT",
    "SHORT_BINUNICODE", "BINUNICODE",
}


@pytest.fixture(scope="module")
def chain_plan(tmp_path_factory):
    """The chain model at batch 1, placed first-fit: a (256 B) at steps 0..1, offset 0; b at
    1..2, offset 256; y at step 2 (a graph output), offset 0 again."""
    d = tmp_path_factory.mktemp("chain")
    r = roam("optimize", chain_model(d / "chain.onnx"), "-o", d / "plan.json", "--dim", "batch=1",
             "--layout", "first-fit")
    assert r.code == 0, r.err
    plan = json.loads((d / "plan.json").read_text())
    placed = {t["name"]: (t["offset"], t["first_step"], t["last_step"])
              for t in plan["tensors"] if t["offset"] is not None}
    assert placed == {"a": (0, 0, 1), "b": (256, 1, 2), "y": (0, 2, 2)}
    return d / "plan.json", plan


def test_perfetto_trace_has_one_slice_per_operator_and_the_arena_counters(chain_plan, tmp_path):
    plan_path, plan = chain_plan
    r = roam("export", plan_path, "--perfetto", tmp_path / "trace.json")
    assert r.code == 0, r.err
    trace = json.loads((tmp_path / "trace.json").read_text())
    events = trace["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert [(e["name"], e["ts"], e["dur"]) for e in slices] == [("a_node", 0, 1), ("b_node", 1, 1), ("y_node", 2, 1)]
    assert [e["args"]["allocates"] for e in slices] == [["a"], ["b"], ["y"]]
    assert [(e["args"]["allocates_bytes"], e["args"]["frees_bytes"]) for e in slices] == [
        (256, 0), (256, 256), (256, 512)]

    def counter(name):
        return [(e["ts"], e["args"]["bytes"]) for e in events if e["ph"] == "C" and e["name"] == name]

    assert counter("arena live bytes") == [(0, 256), (1, 512), (2, 512), (3, 0)]
    assert counter("arena highest used address") == [(0, 256), (1, 512), (2, 512), (3, 0)]
    assert {e["name"] for e in events if e["ph"] == "M"} == {"process_name", "thread_name"}
    assert trace["otherData"]["arena_bytes"] == 512


def test_memory_snapshot_events_addresses_and_segments(chain_plan):
    _, plan = chain_plan
    snap = pickle.loads(pickle.dumps(memory_snapshot(plan), protocol=PICKLE_PROTOCOL))
    assert set(snap) == {"segments", "device_traces"}
    (trace,) = snap["device_traces"]
    events = [(e["action"], e["addr"] - ARENA_BASE, e["size"], e["time_us"]) for e in trace]
    persistent_base = trace[0]["addr"] - ARENA_BASE
    assert events == [
        ("segment_alloc", persistent_base, 256 + W_BYTES, 0),
        ("alloc", persistent_base, 256, 0),  # x, then w: plan order
        ("alloc", persistent_base + 256, W_BYTES, 0),
        ("segment_alloc", 0, 512, 0),
        ("alloc", 0, 256, 0),  # a
        ("alloc", 256, 256, 1),  # b
        ("free_requested", 0, 256, 1), ("free_completed", 0, 256, 1),  # a after its last step
        ("alloc", 0, 256, 2),  # y reuses a's place
        ("free_requested", 0, 256, 2), ("free_completed", 0, 256, 2),
        ("free_requested", 256, 256, 2), ("free_completed", 256, 256, 2),
    ]
    assert persistent_base >= 512  # the two segments do not overlap
    assert trace[4]["frames"] == [{"filename": "a", "line": 0, "name": "activation, made by a_node"}]
    arena, persistent = snap["segments"]
    assert (arena["address"], arena["total_size"], arena["allocated_size"]) == (ARENA_BASE, 512, 0)
    assert [(b["size"], b["state"]) for b in arena["blocks"]] == [(512, "inactive")]
    assert [(b["size"], b["state"], b["requested_size"]) for b in persistent["blocks"]] == [
        (256, "active_allocated", 256), (W_BYTES, "active_allocated", W_BYTES)]


def replay(snap: dict) -> None:
    """What memory_viz does with a snapshot, as assertions: every alloc lies inside a segment
    and overlaps no live block, every free matches a live alloc of the same size, and the
    blocks left at the end are exactly the segments' active blocks (which tile their segment)."""
    segments, live = [], {}
    for e in snap["device_traces"][0]:
        addr, size = e["addr"], e["size"]
        if e["action"] == "segment_alloc":
            segments.append((addr, addr + size))
        elif e["action"] == "alloc":
            assert any(lo <= addr and addr + size <= hi for lo, hi in segments), e
            assert all(addr + size <= a or a + s <= addr for a, s in live.items()), e
            live[addr] = size
        elif e["action"] == "free_requested":
            assert live.get(addr) == size, e
        elif e["action"] == "free_completed":
            assert live.pop(addr) == size, e
    active = {}
    for seg in snap["segments"]:
        cursor = seg["address"]
        for b in seg["blocks"]:
            assert b["address"] == cursor
            cursor += b["size"]
            if b["state"] == "active_allocated":
                active[b["address"]] = b["size"]
        assert cursor == seg["address"] + seg["total_size"]
        assert (seg["address"], seg["address"] + seg["total_size"]) in segments
    assert active == live


def test_sample_snapshot_replays_and_uses_only_what_memory_viz_reads(sample_plan, tmp_path):
    _, plan_path, plan, _ = sample_plan
    r = roam("export", plan_path, "--memory-snapshot", tmp_path / "snap.pickle", "--perfetto", tmp_path / "t.json")
    assert r.code == 0, r.err
    data = (tmp_path / "snap.pickle").read_bytes()
    opcodes = {op.name for op, _, _ in pickletools.genops(data)}
    assert opcodes <= MEMORY_VIZ_OPCODES, opcodes - MEMORY_VIZ_OPCODES
    snap = pickle.loads(data)
    replay(snap)
    (trace,) = snap["device_traces"]
    arena_allocs = [e for e in trace if e["action"] == "alloc" and e["addr"] < ARENA_BASE + plan["arena_bytes"]]
    assert len(arena_allocs) == sum(1 for t in plan["tensors"] if t["offset"] is not None and t["bytes"])
    assert max(e["addr"] + e["size"] for e in arena_allocs) == ARENA_BASE + plan["arena_bytes"]
    assert all(e["addr"] < 2**53 for e in trace)  # JavaScript numbers stay exact
    trace_json = json.loads((tmp_path / "t.json").read_text())
    assert sum(e["ph"] == "X" for e in trace_json["traceEvents"]) == len(plan["order"])


def test_torch_memory_viz_reads_the_snapshot(sample_plan):
    memory_viz = pytest.importorskip("torch.cuda._memory_viz")
    _, _, plan, _ = sample_plan
    snap = memory_snapshot(plan)
    summary = memory_viz.segsum(snap)  # asserts that the segments' blocks account for every byte
    assert "segments: 2" in summary
    html = memory_viz.trace_plot(snap)
    encoded = json.loads(html.split("const local_files = ")[1].split("\n")[0])[0]["base64"]
    assert pickle.loads(base64.b64decode(encoded)) == snap


def test_export_refuses_bad_requests(chain_plan, tmp_path):
    plan_path, _ = chain_plan
    r = roam("export", plan_path)
    assert r.code == 2 and "nothing to export" in r.err
    r = roam("export", plan_path, "--perfetto", plan_path)
    assert r.code == 2 and "same file" in r.err
    r = roam("export", plan_path, "--perfetto", tmp_path / "x", "--memory-snapshot", tmp_path / "x")
    assert r.code == 2 and not (tmp_path / "x").exists()
