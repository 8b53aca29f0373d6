"""What serving one request per tensor costs ONNX Runtime itself, without roam: a plain session's step
time against the same session with every tensor its own request to the system allocator.

    python -m benchmarks run runtime/allocator_overhead STEP.onnx|FOLDER ... [--make standard|fused] [--steps 300]

The plain session has ORT's arena and memory pattern (the default); the other has memory pattern,
memory reuse and the CPU arena off: the options roam's allocator needs. Both run the plan's kind of
session (nodes in file order, PRIORITY_BASED, basic optimisations, no spinning thread pool) on
synthetic inputs with the learning rate 0, so every step computes the same thing, stepped in turn
in one process; medians of --steps steps each. The ratio is the floor under runtime/allocator's
"time ratio" for roam's allocator: roam answers each request itself, but ORT's own work per request
stays. The graphs as runtime/allocator takes them (--make: from forward.onnx). Seconds on the tiny
graphs."""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness

TAKES = "under a minute on the tiny steps; --make fused needs onnxruntime-training and torch"


def session(model: bytes, per_tensor: bool):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if per_tensor:
        so.enable_mem_pattern = so.enable_mem_reuse = so.enable_cpu_mem_arena = False
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def main(argv: list[str]) -> dict:
    from benchmarks.runtime.allocator import steps_of
    from roam_cli.frontend.synthetic import synthetic_feeds

    ap = harness.options(__name__, __doc__)
    ap.add_argument("paths", nargs="+", type=Path, help="full steps, or folders of them")
    ap.add_argument("--make", choices=("standard", "fused"), help="the paths hold forward.onnx: make each a full step")
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in steps_of(args.paths, args.make, Path(tmp)):
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
            rows.append({"graph": f"{path.parent.name}/{path.name}", "plain_ms": a * 1e3, "per_tensor_ms": b * 1e3,
                         "ratio": b / a})
    return {"steps": args.steps, "rows": rows}


def table(results: dict) -> str:
    def ms(x):
        return "–" if x is None else f"{x:.3f}"

    return harness.markdown_table(
        ["graph", "ORT default ms", "ORT one request per tensor ms", "ratio"],
        [[r["graph"], ms(r["plain_ms"]), ms(r["per_tensor_ms"]), f"{r['ratio']:.3f}"] for r in results["rows"]])


if __name__ == "__main__":
    sys.exit("run it as: python -m benchmarks run runtime/allocator_overhead [options]")
