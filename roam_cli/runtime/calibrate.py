"""Each node's workspace: what ONNX Runtime's kernels take besides the tensors, from one step.

A calibration step of the graph on ORT's CPU provider, in a fresh process (ORT 1.19 gives every
session of a process the CPU allocator of its first), its requests recorded by roam's allocator
and attributed to nodes by ORT's profiler. A node's requests that are not its outputs (bytes
rounded up to the alignment) are its workspace: kernel scratch such as the im2col buffer of a
convolution's gradient. `roam optimize --workspace calibrate` places each as a buffer live at
its node's step only (plan field `workspace`), so that the plan's arena is the arena ORT uses."""

from __future__ import annotations

import multiprocessing
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from roam_cli.core.errors import RoamError, first_line


def node_workspace(model_path: Path, dims: dict[str, int], alignment: int, seed: int = 0) -> dict[str, list[int]]:
    """Node name -> the bytes of each workspace request it made (rounded up to `alignment`), in
    request order. Nodes without workspace are left out."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        found, error = pool.submit(calibration_step, str(model_path), dims, alignment, seed).result()
    if error:
        raise RoamError(f"--workspace calibrate: {error}")
    return found


def calibration_step(model_path: str, dims: dict[str, int], alignment: int, seed: int) -> tuple[dict, str | None]:
    """In the child: one step, recorded. Returns (workspace by node, None) or ({}, why not)."""
    import onnxruntime as ort

    from roam_cli.frontend.onnx_import import import_model
    from roam_cli.frontend.ort_optimize import planned_optimizations
    from roam_cli.frontend.providers import check_runs, locate_weights
    from roam_cli.frontend.synthetic import synthesize
    from roam_cli.runtime import _planalloc
    from roam_cli.runtime.allocator import ArenaAllocator, node_at
    from roam_cli.runtime.execute import input_specs, kernel_spans, seed_random_ops

    imported = import_model(Path(model_path), dims)
    model = imported.model
    check_runs(model, model_path)
    seed_random_ops(model, seed)
    arena = ArenaAllocator("cpu")
    try:
        with tempfile.TemporaryDirectory(prefix="roam-calibrate-") as folder:
            options = ort.SessionOptions()
            options.log_severity_level = 3
            for key, value in locate_weights(model, imported.path.resolve().parent).items():
                options.add_session_config_entry(key, value)
            options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
            options.graph_optimization_level, disabled = planned_optimizations(model)
            options.enable_profiling = True
            options.profile_file_prefix = str(Path(folder) / "calibration")
            try:
                session = ort.InferenceSession(model.SerializeToString(), arena.session_options(options),
                                               providers=arena.providers(), disabled_optimizers=disabled)
                specs = [(name, np.dtype(dtype), shape) for name, dtype, shape in input_specs(imported.graph)]
                feeds = {name: np.ascontiguousarray(v) for name, v in synthesize(specs, seed).items()}  # scalars too
                _planalloc.begin_record(arena.handle)
                try:
                    session.run(None, feeds)
                finally:
                    sizes, _, _, times, _ = _planalloc.end_record(arena.handle)
                spans = kernel_spans(Path(session.end_profiling()), session.get_profiling_start_time_ns())
            except Exception as e:  # ORT's own errors carry no common type
                return {}, f"ONNX Runtime could not run a step: {first_line(e)}"
    finally:
        arena.close()
    outputs = {n.name: [imported.graph.values[o].nbytes for o in n.outputs if o in imported.graph.values]
               for n in imported.graph.nodes}
    found: dict[str, list[int]] = {}
    for size, node in zip(sizes, node_at(times, spans)):
        rounded = -(-size // alignment) * alignment
        named = [-(-b // alignment) * alignment for b in outputs.get(node, [])]
        if node is None:
            continue  # between kernels: ORT's own, not a node's
        if rounded in named:
            outputs[node].pop(named.index(rounded))
        else:
            found.setdefault(node, []).append(rounded)
    return found, None
