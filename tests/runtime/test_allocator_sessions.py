"""roam's allocator as a library: a state per session, safe under Python's garbage collector,
and ORT's own allocation entries given back when the last session closes."""

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from test_train import N, chain, in_fresh_process, planned_session, run

from roam_cli.core.errors import RoamError
from roam_cli.runtime import _planalloc
from roam_cli.runtime.allocator import ArenaAllocator

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("threshold", [1, 2])
def test_a_collection_during_end_of_step_does_not_hang(tmp_path, threshold):
    """The collector frees an ORT output (a cycle holds it) while end_step builds its figures: the
    free comes back into the allocator, which must not be holding its lock then. With
    gc.collect() first and the threshold at 1 or 2, the collection falls inside end_step (the
    argument tuple is the one allocation before it); it hung before the lock was dropped there."""
    script = textwrap.dedent(f"""
        import gc, sys
        from pathlib import Path
        import numpy as np
        sys.path[:0] = [{str(ROOT / "tests")!r}, {str(ROOT / "tests" / "runtime")!r}]
        from test_train import N, chain, planned_session
        from roam_cli.runtime import _planalloc
        from roam_cli.runtime.allocator import ArenaAllocator
        arena = ArenaAllocator("cpu", strategy="first-fit")
        s = planned_session(arena, chain(Path({str(tmp_path)!r})))
        x = np.ones(N, np.float32)
        for k in range(4):
            (_planalloc.begin_record if k == 0 else _planalloc.begin_step)(arena.handle)
            b = s.io_binding(); b.bind_cpu_input("x", x); b.bind_output("c", "cpu"); s.run_with_iobinding(b)
            out = b.get_outputs()[0]
            del b
            gc.disable(); gc.collect()
            cycle = [out]; cycle.append(cycle); del out, cycle
            gc.set_threshold({threshold}); gc.enable()
            if k == 0:
                sizes, allocs, frees, times, events = _planalloc.end_record(arena.handle)
                gc.set_threshold(700)
                arena._load(__import__("roam_cli.runtime.allocator", fromlist=["Recording"]).Recording(
                    sizes, [(a, f if f >= 0 else events) for a, f in zip(allocs, frees)], times))
            else:
                stats = _planalloc.end_step(arena.handle)
                gc.set_threshold(700)
                assert stats["served"] == 3, stats
        print("done")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and r.stdout.strip() == "done", r.stderr


def test_two_sessions_one_after_the_other_and_interleaved(tmp_path):
    in_fresh_process(two_sessions, tmp_path)


def two_sessions(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    x = np.linspace(-1, 1, N, dtype=np.float32)
    expected = (x + x) * (x + x) + x
    for interleaved in (False, True):
        arenas = [ArenaAllocator("cpu", strategy="first-fit") for _ in range(2)]
        sessions = [planned_session(a, chain(tmp_path / name)) for a, name in zip(arenas, "ab")]
        order = [0, 1] * 4 if interleaved else [0] * 4 + [1] * 4
        stats = {0: [], 1: []}
        for i in order:
            with arenas[i].step() as step:
                np.testing.assert_array_equal(run(sessions[i], x * (i + 1)), expected * (i + 1) if i == 0 else
                                              (2 * x + 2 * x) * (2 * x + 2 * x) + 2 * x)
            stats[i].append(step.stats)
        for i in (0, 1):
            assert stats[i][0]["recorded"] == 3
            assert all(s["served"] == 3 and s["unplanned"] == 0 for s in stats[i][1:]), stats[i]
        arenas[0].close()
        # the other session still serves from its arena after the first one closed
        with arenas[1].step() as step:
            run(sessions[1], x)
        assert step.stats["served"] == 3
        assert arenas[1].close() == 0 and arenas[1].close() == 0  # twice does nothing


def test_after_close_the_library_allocates_as_before(tmp_path):
    in_fresh_process(closed_then_plain, tmp_path)


def closed_then_plain(tmp_path):
    import onnxruntime as ort

    arena = ArenaAllocator("cpu", strategy="first-fit")
    assert _planalloc.patched() >= 2  # posix_memalign and free, or aligned new and delete
    s = planned_session(arena, chain(tmp_path))
    x = np.ones(N, np.float32)
    for _ in range(2):
        with arena.step():
            run(s, x)
    arena.close()
    assert _planalloc.patched() == 0  # the last session gave the entries back
    options = ort.SessionOptions()
    options.enable_cpu_mem_arena = False
    plain = ort.InferenceSession(str(tmp_path / "chain.onnx"), options, providers=["CPUExecutionProvider"])
    for _ in range(3):
        np.testing.assert_array_equal(plain.run(None, {"x": x})[0], (x + x) * (x + x) + x)
    with pytest.raises(RoamError, match="closed"):
        with arena.step():
            pass


def test_close_after_a_failed_step_stops_serving_and_frees_with_the_last_buffer(tmp_path):
    in_fresh_process(failed_step_then_close, tmp_path)


def failed_step_then_close(tmp_path):
    arena = ArenaAllocator("cpu", strategy="first-fit")
    s = planned_session(arena, chain(tmp_path))
    x = np.ones(N, np.float32)
    with arena.step():
        run(s, x)
    with pytest.raises(ValueError):
        with arena.step():
            held, binding = run(s, x, keep=True)  # ORT's output stays in the arena
            raise ValueError("the step failed")
    assert arena.close() == 1  # one buffer still in the arena: it is freed with that buffer
    assert _planalloc.patched() >= 2  # still patched: the buffer's free must come back here
    np.testing.assert_array_equal(binding.get_outputs()[0].numpy(), held)
    binding.clear_binding_outputs()
    assert _planalloc.patched() == 0
