#!/usr/bin/env python3
"""Cross-check `--order ort` against ONNX Runtime itself: run each model once in a profiled
session (graph optimizations off, so ORT runs the graph as written; default execution order)
and compare the node order of its kernel events with roam's reproduction of ORT's algorithm.

    python benchmarks/ort_order_check.py                     # the sample model + a Shape-op graph
    python benchmarks/ort_order_check.py model.onnx ...      # models ORT can run (weights present)

Prints one row per model: nodes, how many positions agree, and whether the orders are equal."""

import argparse
import json
import sys
import tempfile
from pathlib import Path

import onnxruntime as ort

from roam_cli.core import memory
from roam_cli.frontend.onnx_import import import_model
from roam_cli.frontend.synthetic import synthetic_feeds
from roam_cli.order.ort import ort_default

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from onnx_builder import model, node, save  # noqa: E402

SAMPLE = ROOT / "sample_models" / "gpt2_tiny" / "training_model.onnx"


def shape_graph(folder: Path) -> Path:
    """Shape reads a tensor whose producer the depth-first search visits early: training builds
    of ORT move it up to right after that producer."""
    m = model([node("Relu", ["x"], ["a"]), node("Shape", ["a"], ["s"]), node("Relu", ["x"], ["b"]),
               node("Add", ["a", "b"], ["c"]), node("Sigmoid", ["c"], ["d"]), node("Reshape", ["d", "s"], ["r"])],
              [("x", [4, 4])], [("r", [4, 4])])
    return Path(save(m, folder / "shape_graph.onnx"))


def profiled_order(path: Path, folder: Path) -> list[str]:
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(folder / path.stem)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    session.run(None, synthetic_feeds(session))
    events = json.loads(Path(session.end_profiling()).read_text())
    return [e["name"].removesuffix("_kernel_time") for e in events
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", type=Path)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        models = args.models or [SAMPLE, shape_graph(folder)]
        print(f"onnxruntime {ort.__version__}\n\n| model | nodes | same position | identical |\n|---|---|---|---|")
        for path in models:
            graph = import_model(path).graph
            mm = memory.build(graph)
            ours = [graph.nodes[i].name for i in ort_default(list(mm.run_preds), [n.op_type for n in graph.nodes])]
            theirs = profiled_order(path, folder)
            same = sum(a == b for a, b in zip(ours, theirs))
            print(f"| {path.name} | {len(ours)} | {same}/{len(theirs)} | {'yes' if ours == theirs else 'no'} |")


if __name__ == "__main__":
    main()
