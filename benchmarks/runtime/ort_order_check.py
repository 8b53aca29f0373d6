"""roam's reproduction of ONNX Runtime's default execution order (`--order ort`) against ONNX Runtime
itself, node for node.

    python -m benchmarks run runtime/ort_order_check [MODEL.onnx ...]

Each model runs once in a profiled session (graph optimisations off, so ORT runs the graph as
written; the default execution order), and the node order of its kernel events is compared with
`roam_cli.order.ort.ort_default`. Without models: the sample's artifacts graph and a graph built so
that a Shape node's place matters (training builds of ORT move each Shape/Size to right after its
input's producer); the sample's graph has ORT's fused training ops, so the default needs
onnxruntime-training. Models given must run in the installed ORT (weights present). Per model: nodes,
how many positions agree, whether the orders are identical. Seconds."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from benchmarks import harness

TAKES = "seconds; the default models need onnxruntime-training (models given: any onnxruntime)"
SAMPLE = harness.ROOT / "sample_models" / "gpt2_tiny" / "training_model.onnx"


def shape_graph(folder: Path) -> Path:
    """Shape reads a tensor whose producer the depth-first search visits early: training builds
    of ORT move it up to right after that producer."""
    from tests.onnx_builder import model, node, save

    m = model([node("Relu", ["x"], ["a"]), node("Shape", ["a"], ["s"]), node("Relu", ["x"], ["b"]),
               node("Add", ["a", "b"], ["c"]), node("Sigmoid", ["c"], ["d"]), node("Reshape", ["d", "s"], ["r"])],
              [("x", [4, 4])], [("r", [4, 4])])
    return Path(save(m, folder / "shape_graph.onnx"))


def profiled_order(path: Path, folder: Path) -> list[str]:
    import onnxruntime as ort

    from roam_cli.frontend.synthetic import synthetic_feeds

    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(folder / path.stem)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    session.run(None, synthetic_feeds(session))
    events = json.loads(Path(session.end_profiling()).read_text())
    return [e["name"].removesuffix("_kernel_time") for e in events
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]


def main(argv: list[str]) -> list[dict]:
    from roam_cli.core import memory
    from roam_cli.frontend.onnx_import import import_model
    from roam_cli.order.ort import ort_default

    p = harness.options(__name__, __doc__)
    p.add_argument("models", nargs="*", type=Path)
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for path in args.models or [SAMPLE, shape_graph(folder)]:
            graph = import_model(path).graph
            mm = memory.build(graph)
            ours = [graph.nodes[i].name for i in ort_default(list(mm.run_preds), [n.op_type for n in graph.nodes])]
            theirs = profiled_order(path, folder)
            rows.append({"model": path.name, "nodes": len(ours), "profiled": len(theirs),
                         "same_position": sum(a == b for a, b in zip(ours, theirs)), "identical": ours == theirs})
    return rows


def table(results: list[dict]) -> str:
    return harness.markdown_table(
        ["model", "nodes", "same position", "identical"],
        [[r["model"], r["nodes"], f"{r['same_position']}/{r['profiled']}", "yes" if r["identical"] else "no"]
         for r in results], "lrrl")


if __name__ == "__main__":
    sys.exit("run it as: python -m benchmarks run runtime/ort_order_check [options]")
