"""Write `remat/gpt2_tiny_step.graph.json`: the bundled sample's training graph as the node-link
DAG `roam remat` reads (Checkmate's and Moccasin's form): one node per ONNX node, `cost_ram` the
bytes of its outputs, `cost_cpu` its FLOPs (at least 1: a node that moves data still takes a
step), an edge per value read. Needs only roam: `python sample_models/make_remat_graph.py`."""

import json
from pathlib import Path

from roam_cli.frontend.onnx_import import import_model
from roam_cli.recompute.flops import node_flops

HERE = Path(__file__).resolve().parent


def main() -> None:
    graph = import_model(HERE / "gpt2_tiny" / "training_model.onnx").graph
    producer = {out: n.name for n in graph.nodes for out in n.outputs}
    nodes = [{"id": n.name, "cost_ram": sum(graph.values[o].nbytes for o in n.outputs if o),
              "cost_cpu": max(1, node_flops(graph, n))} for n in graph.nodes]
    links = sorted({(producer[x], n.name) for n in graph.nodes for x in n.inputs if x in producer})
    out = HERE / "remat" / "gpt2_tiny_step.graph.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"directed": True, "nodes": nodes,
                               "links": [{"source": u, "target": v} for u, v in links]}, indent=0) + "\n")
    print(f"wrote {out}: {len(nodes)} nodes, {len(links)} edges")


if __name__ == "__main__":
    main()
