"""ONNX Runtime's own session allocating from roam's arena, and `roam train` on it."""

import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from conftest import SAMPLE, needs_ort_training, roam
from onnx_builder import model, node, save

from roam_cli.core import plan as plan_io
from roam_cli.core.errors import RoamError
from roam_cli.frontend.providers import RUNTIME, TRAINING_OPS
from roam_cli.runtime.allocator import ALIGNMENT, ArenaAllocator
from roam_cli.runtime.train import train

N = 1000  # floats per tensor: 4,000 bytes, one 256-byte-aligned slot of 4,096 each


def chain(path):
    """a = x + x, b = a * a, c = b + x: three tensors of N floats, c the output."""
    m = model([node("Add", ["x", "x"], ["a"]), node("Mul", ["a", "a"], ["b"]), node("Add", ["b", "x"], ["c"])],
              [("x", [N])], [("c", [N])])
    return save(m, path / "chain.onnx")


def planned_session(arena, path):
    options = ort.SessionOptions()
    options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, arena.session_options(options), providers=arena.providers())


def run(session, x, keep=False):
    """One step with I/O binding. With `keep` the binding, which holds ORT's output, is returned
    too: the output outlives the step."""
    binding = session.io_binding()
    xv = ort.OrtValue.ortvalue_from_numpy(x)
    binding.bind_ortvalue_input("x", xv)
    binding.bind_output("c", "cpu")
    session.run_with_iobinding(binding)
    value = binding.get_outputs()[0].numpy().copy()
    if keep:
        return value, binding
    binding.clear_binding_outputs()
    return value


def in_fresh_process(function, *args):
    """ONNX Runtime gives every session of a process the CPU allocator of its first session, and
    other tests make sessions with ORT's arena: the allocator's tests each get a process."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args).result()


def test_the_chain_is_recorded_laid_out_and_served_from_two_slots(tmp_path):
    in_fresh_process(chain_served_from_two_slots, tmp_path)


def test_a_buffer_held_past_its_step_is_never_handed_out_again(tmp_path):
    """The arena may be wrong about nothing: a request whose place is taken falls back, counted."""
    in_fresh_process(held_buffer_falls_back, tmp_path)


def chain_served_from_two_slots(tmp_path):
    arena = ArenaAllocator("cpu", strategy="first-fit")
    s = planned_session(arena, chain(tmp_path))
    x = np.linspace(-1, 1, N, dtype=np.float32)
    expected = (x + x) * (x + x) + x
    with arena.step() as first:
        np.testing.assert_array_equal(run(s, x), expected)
    # a, b and c, one request each (ORT's reuse is off); a dies when b exists, b when c does:
    # at most two live at once, so two slots
    sizes = arena.recording.sizes
    assert len(sizes) == 3 and len(set(sizes)) == 1 and N * 4 <= sizes[0] <= ALIGNMENT * 16
    assert first.recorded and first.stats["recorded"] == 3
    slot = -(-sizes[0] // ALIGNMENT) * ALIGNMENT
    assert arena.layout["arena_bytes"] == arena.layout["peak_live_bytes"] == 2 * slot
    for _ in range(3):
        with arena.step() as later:
            np.testing.assert_array_equal(run(s, x), expected)
        assert later.stats["served"] == 3 and later.stats["unplanned"] == 0 and later.stats["conflicts"] == 0
        assert later.stats["arena_high_water"] <= 2 * slot


def held_buffer_falls_back(tmp_path):
    arena = ArenaAllocator("cpu", strategy="first-fit")
    s = planned_session(arena, chain(tmp_path))
    x = np.linspace(-1, 1, N, dtype=np.float32)
    with arena.step():
        run(s, x)
    with arena.step() as holding:
        held, binding = run(s, x, keep=True)  # ORT's output c stays in its slot
    assert holding.stats["held_after_step"] == 1
    with arena.step() as step:
        np.testing.assert_array_equal(run(s, 2 * x), (4 * x) * (4 * x) + 2 * x)
    np.testing.assert_array_equal(binding.get_outputs()[0].numpy(), held)  # not overwritten by the next step
    assert step.stats["served"] + step.stats["unplanned"] == 3
    assert step.stats["unplanned"] >= 1 and step.stats["unplanned_bytes"] >= N * 4
    binding.clear_binding_outputs()


@pytest.fixture(scope="module", params=["standard", pytest.param("fused", marks=needs_ort_training)])
def sample_step(tmp_path_factory, request):
    """The sample's full step as make-training-graph writes it (standard ONNX) and with --fused."""
    d = tmp_path_factory.mktemp("step")
    fused = ["--fused"] if request.param == "fused" else []
    r = roam("make-training-graph", SAMPLE, "-o", d / "step.onnx", "--in-graph-optimizer", *fused)
    assert r.code == 0, r.err
    r = roam("optimize", d / "step.onnx", "-o", d / "plan.json", "--annotated-model", d / "planned.onnx")
    assert r.code == 0, r.err
    return d


def test_the_sample_trains_in_the_plans_arena_as_plain_ort_does(sample_step):
    d = sample_step
    r = roam("train", d / "step.onnx", "--plan", d / "plan.json", "--steps", "4", "--compare", "--json")
    assert r.code == 0, r.err
    result = r.json()
    plan = json.loads((d / "plan.json").read_text())
    first, *later = result["per_step"]
    layout = result["arena"]
    assert first["memory"]["recorded"] == layout["requests"] > 0 and result["plan"]["arena_bytes"] == plan["arena_bytes"]
    # every request of step 1 is a tensor the plan places (ORT's profiler tells whose) or workspace
    assert layout["planned_requests"] + layout["workspace_requests"] == layout["requests"]
    assert layout["planned_requests"] >= 0.95 * layout["requests"]
    for step in later:
        m = step["memory"]
        assert m["unplanned"] == 0 and m["conflicts"] == 0 and m["served"] == layout["requests"]
        # each planned tensor ORT keeps as the plan says is served at its plan offset; the few it keeps
        # longer (kernels working in place) are moved, never overlapping a live one
        assert m["served_at_plan_offset"] == m["planned_requests"] - layout["planned_moved"]
        assert m["planned_requests"] == layout["planned_requests"]
        assert m["bytes_held"] == m["bytes"] == layout["arena_bytes"] >= plan["arena_bytes"]
    losses = [s["outputs"]["loss"] for s in result["per_step"]]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]  # it learns
    assert result["compare"]["outputs_max_rel"] <= 1e-5 and result["compare"]["state_max_rel"] <= 1e-5
    # m * beta1 and v * beta2 of each parameter's AdamW are written over its moments, whose new
    # values the step writes there anyway: served in the moments' own buffers, two per parameter
    parameters = sum(t["kind"] == "parameter" for t in plan["tensors"])
    assert layout["in_state_buffers"] == 2 * parameters > 0


def test_inputs_give_the_starting_state_and_one_batch_per_step(sample_step, tmp_path):
    d = sample_step
    sess = ort.InferenceSession(str(d / "step.onnx"), providers=["CPUExecutionProvider"])
    ids = next(i for i in sess.get_inputs() if i.name == "input_ids")
    batches = np.stack([np.full(ids.shape, k, dtype=np.int64) for k in (1, 2)])
    np.savez(tmp_path / "b.npz", input_ids=batches, learning_rate=np.zeros([1], np.float32))
    np.savez(tmp_path / "one.npz", input_ids=batches[0], learning_rate=np.zeros([1], np.float32))
    runs = {}
    for name in ("b", "one"):
        r = roam("train", d / "step.onnx", "--plan", d / "plan.json", "--steps", "3",
                 "--inputs", tmp_path / f"{name}.npz", "--json")
        assert r.code == 0, r.err
        runs[name] = r.json()
    assert not {"input_ids", "learning_rate"} & set(runs["b"]["synthesised_inputs"])
    cycled, same = ([s["outputs"]["loss"] for s in runs[k]["per_step"]] for k in ("b", "one"))
    # learning rate 0 leaves the weights; Dropout draws the same masks in both runs: steps 1 and 3
    # see batch 1 in both, step 2 batch 2 in one of them
    assert cycled[0] == same[0] and cycled[2] == same[2] and cycled[1] != same[1]
    assert runs["b"]["non_finite_inputs"] == []
    np.savez(tmp_path / "nan.npz", input_ids=batches[0], learning_rate=np.array([np.nan], np.float32))
    r = roam("train", d / "step.onnx", "--plan", d / "plan.json", "--steps", "1", "--inputs", tmp_path / "nan.npz")
    assert r.code == 0 and "warning: --inputs holds NaN or infinity in 'learning_rate'" in r.out, r.out + r.err


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "--steps must be at least 1"),
    (["--inputs", "{tmp}/bad.npz"], "'input_ids' is int32[3]"),
    (["--allocator", "mine"], "Invalid value for '--allocator'"),
])
def test_bad_input_is_one_line_and_exit_2(sample_step, tmp_path, args, message):
    np.savez(tmp_path / "bad.npz", input_ids=np.zeros(3, np.int32))
    d = sample_step
    r = roam("train", d / "step.onnx", "--plan", d / "plan.json", *[a.format(tmp=tmp_path) for a in args])
    assert r.code == 2 and message in r.err, r.err
    assert "Traceback" not in r.err


def test_a_session_made_first_with_ort_arena_is_named_not_silently_used(sample_step):
    message = in_fresh_process(train_after_an_arena_session, sample_step)
    if tuple(map(int, ort.__version__.split(".")[:2])) < (1, 20):  # 1.19 gives every session the first's allocator
        assert "another ONNX Runtime session with a CPU arena was created in this process first" in message
    else:  # 1.32 (measured) does not: the plan's arena serves the step
        assert message == "trained"


def train_after_an_arena_session(folder: Path) -> str:
    ort.InferenceSession(str(folder / "step.onnx"), providers=["CPUExecutionProvider"])  # arena on: ORT's default
    try:
        train(folder / "step.onnx", plan_io.read(folder / "plan.json"), 2)
    except RoamError as e:
        return str(e)
    return "trained"


def test_an_artifacts_training_graph_is_refused_with_what_to_make(tmp_path):
    r = roam("optimize", SAMPLE, "-o", tmp_path / "plan.json")
    assert r.code == 0, r.err
    r = roam("train", SAMPLE, "--plan", tmp_path / "plan.json", "--steps", "1")
    assert r.code == 2 and "artifacts training graph" in r.err and "--in-graph-optimizer" in r.err, r.err


def test_a_plan_for_another_model_is_refused(sample_step):
    r = roam("train", SAMPLE, "--plan", sample_step / "plan.json", "--steps", "1")
    assert r.code == 2 and "another model" in r.err and len(r.err.strip().splitlines()) == 1


@pytest.mark.skipif(TRAINING_OPS, reason=f"{RUNTIME} runs ORT's fused training ops")
def test_a_fused_step_where_the_runtime_lacks_its_ops_is_one_line_naming_op_and_fix(tmp_path):
    r = roam("make-training-graph", SAMPLE, "-o", tmp_path / "step.onnx", "--in-graph-optimizer", "--fused")
    assert r.code == 0, r.err  # a full step from an artifacts graph needs no onnxruntime-training
    assert roam("optimize", tmp_path / "step.onnx", "-o", tmp_path / "plan.json").code == 0
    r = roam("train", tmp_path / "step.onnx", "--plan", tmp_path / "plan.json", "--steps", "1")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    assert "com.microsoft:" in r.err and "roam lower" in r.err and "onnxruntime-training" in r.err


def another_valid_order(model_path, plan):
    """The plan's order with the first two neighbours that do not depend on each other swapped,
    the second making an arena tensor: it now starts a step before the plan places it."""
    import onnx

    nodes = {n.name: n for n in onnx.load(str(model_path), load_external_data=False).graph.node}
    placed = {t["name"] for t in plan["tensors"] if t["offset"] is not None}
    order = plan["order"]
    for i in range(len(order) - 1):
        first, second = nodes[order[i]], nodes[order[i + 1]]
        if not set(first.output) & set(second.input) and set(second.output) & placed:
            return order[:i] + [order[i + 1], order[i]] + order[i + 2:]
    raise AssertionError("no two independent neighbours")


@pytest.mark.parametrize("edit", ["reversed order", "another valid order", "offsets all zero"])
def test_an_edited_plan_is_refused_before_step_1(sample_step, tmp_path, edit):
    """The pair is verified before ORT runs anything: exit 1 and the broken rule in one line."""
    plan = json.loads((sample_step / "plan.json").read_text())
    if edit == "reversed order":
        plan["order"] = plan["order"][::-1]
    elif edit == "another valid order":  # the tensors' lifetimes no longer follow the order
        plan["order"] = another_valid_order(sample_step / "step.onnx", plan)
    else:
        for t in plan["tensors"]:
            t["offset"] = 0 if t["offset"] is not None else None
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    r = roam("train", sample_step / "step.onnx", "--plan", tmp_path / "plan.json", "--steps", "2")
    assert r.code == 1 and "step 1" not in r.out, (r.code, r.out, r.err)
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and "the plan does not hold" in lines[0], r.err
    assert ("overlaps" in lines[0]) if edit == "offsets all zero" else ("before it is produced" in lines[0]
                                                                       or "lives over steps" in lines[0])


def test_a_plan_for_another_batch_size_is_refused_before_running(tmp_path):
    """A plan made with batch 2, its `dims` edited to batch 4: the tensors it gives are too small."""
    m = model([node("Add", ["x", "x"], ["a"]), node("Mul", ["a", "a"], ["b"])], [("x", ["batch", 100])],
              [("b", ["batch", 100])])
    path = save(m, tmp_path / "sym.onnx")
    assert roam("optimize", path, "-o", tmp_path / "plan.json", "--dim", "batch=2").code == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    plan["dims"] = {"batch": 4}
    (tmp_path / "plan4.json").write_text(json.dumps(plan))
    r = roam("execute", path, "--plan", tmp_path / "plan4.json")
    assert r.code == 1 and "the plan does not hold" in r.err and "'x' needs 1600 bytes" in r.err, r.err


def test_a_request_that_leaves_the_plan_stops_the_run_unless_allowed(sample_step):
    assert in_fresh_process(leave_the_plan, sample_step) == "stopped, then served from the system"


def leave_the_plan(d: Path) -> str:
    from roam_cli.core.errors import CheckFailed
    from roam_cli.runtime.allocator import Recording
    from roam_cli.runtime.train import PlannedSession, batch_for, starting_values

    plan = plan_io.read(d / "plan.json")
    outcome = []
    for allow in (False, True):
        s = PlannedSession(d / "step.onnx", plan, allow_unplanned=allow, log_arena=False)
        start, _ = starting_values(s, {}, 0, 1e-3, {t["name"]: t["kind"] for t in plan["tensors"]})
        s.set_state(start)
        s.step(batch_for(1, start, {}, s))
        rec = s.arena.recording  # as if step 1 had asked for a byte more each time: no request fits its slot
        s.arena.recording = Recording([n + 1 for n in rec.sizes], rec.lifetimes, rec.times)
        s.arena._load(s.arena.recording)
        try:
            m = s.step(batch_for(2, start, {}, s)).memory
            assert allow and m["unplanned"] == m["requests"] == len(rec.sizes) and m["served_at_plan_offset"] == 0
            outcome.append("served from the system")
        except CheckFailed as e:
            assert not allow and str(e).startswith("step 2: ORT's request 1 (") and "--allow-unplanned" in str(e)
            outcome.append("stopped")
        finally:
            s.close()
    return ", then ".join(outcome)


def test_a_run_whose_arena_grew_past_the_plan_for_kernel_scratch_is_warned_of():
    import io

    from rich.console import Console

    from roam_cli.runtime.train import render_summary

    def said(arena: int, scratch: int) -> str:
        buffer = io.StringIO()
        memory = {"served_at_plan_offset": 10, "unplanned": 0}
        result = {"steps": 2, "provider": "cpu", "allocator": "roam",
                  "per_step": [{"seconds": 0.01, "memory": memory}, {"seconds": 0.01, "memory": memory}],
                  "arena": {"arena_bytes": arena, "requests": 12, "planned_requests": 10, "workspace_requests": scratch},
                  "plan": {"arena_bytes": 1024 * 1000}}
        render_summary(result, Console(file=buffer, width=300))
        return buffer.getvalue()

    # 1.22 MiB held for a plan of 1000 KiB: 2 scratch requests past it
    assert "warning: ONNX Runtime's kernels asked for 2 scratch buffers the plan does not have, and the arena grew " \
           "247.28 KiB past the plan's: `roam optimize --workspace calibrate` plans them" in said(1_277_215, 2)
    assert "warning" not in said(1024 * 1000, 2) and "warning" not in said(1_277_215, 0)
