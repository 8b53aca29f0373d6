#!/usr/bin/env python3
"""What serving one request per tensor costs ONNX Runtime itself, without roam: the step time of a
plain session (ORT's arena and memory pattern, the default) against the same session with every
tensor its own request to the system allocator (memory pattern, memory reuse and the CPU arena
off: the options roam's allocator needs), stepped in turn in one process.

    python benchmarks/allocator_overhead.py STEP.onnx [STEP.onnx ...] [--steps 300]

Both run the plan's kind of session (nodes in file order, PRIORITY_BASED, basic optimisations, no
spinning thread pool) on synthetic inputs with the learning rate 0, so every step computes the
same thing. The ratio is the floor under `benchmarks/allocator.py`'s "time ratio" for roam's
allocator: roam answers each request itself, but ORT's own work per request stays."""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import onnxruntime as ort

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from roam_cli.frontend.synthetic import synthetic_feeds  # noqa: E402


def session(model: bytes, per_tensor: bool) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if per_tensor:
        so.enable_mem_pattern = so.enable_mem_reuse = so.enable_cpu_mem_arena = False
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    print(f"{platform.machine()}, Python {platform.python_version()}, onnxruntime {ort.__version__}; "
          f"median of {args.steps} steps each, in turn")
    print("| graph | ORT default ms | ORT one request per tensor ms | ratio |\n|---|---:|---:|---:|")
    for path in args.models:
        model = path.read_bytes()
        plain, per_tensor = session(model, False), session(model, True)
        feeds = synthetic_feeds(plain)
        if "learning_rate" in feeds:
            feeds["learning_rate"][:] = 0
        times: dict[str, list[float]] = {"plain": [], "per tensor": []}
        for s in (plain, per_tensor):
            s.run(None, feeds)
        for _ in range(args.steps):
            for key, s in (("plain", plain), ("per tensor", per_tensor)):
                t = time.perf_counter()
                s.run(None, feeds)
                times[key].append(time.perf_counter() - t)
        a, b = statistics.median(times["plain"]), statistics.median(times["per tensor"])
        print(f"| {path.parent.name}/{path.name} | {a * 1e3:.3f} | {b * 1e3:.3f} | {b / a:.3f} |", flush=True)


if __name__ == "__main__":
    main()
