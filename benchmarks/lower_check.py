#!/usr/bin/env python3
"""Does a lowered graph compute what the fused one does, and does today's onnxruntime run it?

    python benchmarks/lower_check.py                                   # the bundled sample
    python benchmarks/lower_check.py /work/suite_cache --ort131 /work/venvs/ort131/bin/python
    python benchmarks/lower_check.py /work/suite_cache/gpt2_xl --structural   # too large to run here

A folder stands for every training_model.onnx, full_step.onnx and optimizer_model.onnx under it.
Weights the graph keeps outside (the suite's are never written) are replaced by random ones
(std 0.02), Dropout ratios are set to 0, and every input gets random values (integers in
[0, 100): token ids, labels; lazy_reset_grad false). The fused graph runs in this environment's
onnxruntime-training, the lowered one (`roam_cli.lower`) in the same runtime; the row's
difference is the largest over all outputs of |lowered - fused| relative to that output's
largest value. With --ort131, the lowered graph also runs under that interpreter's onnxruntime
(a separate environment: the two runtimes ship the same module). Optimizer graphs (sequence
inputs) are only run, not compared: feeding them needs sequences of the parameters. Every row
counts the nodes left outside standard ONNX and runs `onnx.checker.check_model(full_check=True)`
on the lowered graph saved to a file (the path form, which models over 2 GB need; a sparse
stand-in takes the place of each external-data file). --structural stops there: for graphs
whose inputs and outputs do not fit in memory (run the numerics on `benchmarks/suite.py
--layers N`, the same architecture with fewer blocks). --json writes the rows."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from roam_cli.frontend.training_graph import external_data_stand_ins  # noqa: E402
from roam_cli.lower import lower_model, nonstandard_nodes  # noqa: E402

SAMPLE = ROOT / "sample_models" / "gpt2_tiny" / "training_model.onnx"
GRAPHS = ("training_model.onnx", "full_step.onnx", "optimizer_model.onnx")
# Run in the other environment: load, feed, run, print the first output.
RUN = """
import sys, numpy as np, onnxruntime as ort
s = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
feeds = dict(np.load(sys.argv[2]))
for i in s.get_inputs():
    if i.type.startswith("seq"):
        feeds[i.name] = [np.full((4, 3), 0.5, np.float32) for _ in range(3)]
print(ort.__version__, np.ravel(s.run(None, feeds)[0])[0])
"""


def with_weights(path: Path) -> onnx.ModelProto:
    """The model with random weights where its own are external, and every Dropout ratio 0."""
    m = onnx.load(str(path), load_external_data=False)
    rng = np.random.default_rng(0)
    ratios = {n.input[1] for n in m.graph.node if n.op_type == "Dropout" and len(n.input) > 1}
    for t in m.graph.initializer:
        if t.external_data:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
            t.CopyFrom(numpy_helper.from_array((rng.standard_normal(list(t.dims)) * 0.02).astype(dtype), t.name))
        if t.name in ratios:
            t.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(t)), t.name))
    return m


def session(model: onnx.ModelProto):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def feeds_for(sess) -> dict:
    rng = np.random.default_rng(1)
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        # np.asarray: a scalar input (shape []) must be fed as a 0-d array, which onnxruntime 1.19 requires
        if i.type == "tensor(int64)":
            feeds[i.name] = np.asarray(rng.integers(0, 100, shape), dtype=np.int64)
        elif i.type == "tensor(bool)":
            feeds[i.name] = np.zeros(shape, bool)
        elif i.type == "tensor(float)":
            feeds[i.name] = np.asarray(rng.standard_normal(shape) * 0.1, dtype=np.float32)
    return feeds


def checked_on_disk(lowered: onnx.ModelProto) -> None:
    """onnx.checker.check_model(path, full_check=True) on the lowered model written to a scratch folder."""
    with external_data_stand_ins(lowered) as scratch:
        onnx.save(lowered, str(scratch / "lowered.onnx"))
        onnx.checker.check_model(str(scratch / "lowered.onnx"), full_check=True)


def check(path: Path, ort131: str | None, folder: Path, structural: bool) -> dict:
    fused = onnx.load(str(path), load_external_data=False) if structural else with_weights(path)
    lowered = lower_model(fused)
    row = dict(graph=f"{path.parent.name}/{path.name}", nodes=[len(fused.graph.node), len(lowered.graph.node)],
               nonstandard_after=len(nonstandard_nodes(lowered)))
    checked_on_disk(lowered)
    row["check_model"] = "passed"
    if structural:
        return row
    if not path.name.startswith("optimizer"):
        for n in fused.graph.node:  # the fused accumulators' results, under the lowered names
            if n.op_type == "InPlaceAccumulatorV2" and len(n.output) == 1:
                n.output.append(f"{n.input[0]}.out")
        fused.graph.output.extend(o for o in lowered.graph.output if o.name not in {x.name for x in fused.graph.output})
        ours = session(lowered)
        feeds = feeds_for(ours)
        names = [o.name for o in ours.get_outputs()]
        theirs = session(fused)  # its accumulators write into their inputs: each run gets its own copy
        want = dict(zip([o.name for o in theirs.get_outputs()], theirs.run(None, {k: v.copy() for k, v in feeds.items()})))
        got = dict(zip(names, ours.run(None, {k: v.copy() for k, v in feeds.items()})))
        diff = {k: float(np.abs(got[k].astype(np.float64) - want[k]).max() / max(np.abs(want[k]).max(), 1e-30))
                for k in names if want[k].dtype != np.bool_}
        worst = max(diff, key=diff.get)
        row.update(loss=float(np.ravel(want[names[0]])[0]), max_relative_difference=diff[worst], worst_output=worst)
    if ort131:
        model_path, feeds_path = folder / "lowered.onnx", folder / "feeds.npz"
        onnx.save(lowered, str(model_path))
        np.savez(feeds_path, **feeds_for(session(lowered)))
        run = subprocess.run([ort131, "-c", RUN, str(model_path), str(feeds_path)], capture_output=True, text=True)
        version, first = run.stdout.split() if run.returncode == 0 else ("", "")
        row["ort131"] = (f"onnxruntime {version} runs it (first output {first})" if run.returncode == 0
                         else f"FAILED under {ort131}: {(run.stderr.strip().splitlines() or ['?'])[-1]}")
    return row


def line(row: dict) -> str:
    text = (f"{row['graph']}: {row['nodes'][0]} -> {row['nodes'][1]} nodes; {row['nonstandard_after']} nonstandard "
            f"left; check_model {row['check_model']}")
    if "loss" in row:
        text += f"; loss {row['loss']:.6f}; max relative difference {row['max_relative_difference']:.2e}"
    return text + (f"; {row['ort131']}" if "ort131" in row else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", type=Path, default=[SAMPLE])
    ap.add_argument("--only", help="Suite models (folder names), comma-separated.")
    ap.add_argument("--ort131", help="A Python whose onnxruntime is today's (it runs the lowered graphs too).")
    ap.add_argument("--structural", action="store_true", help="Lower and check only: no run.")
    ap.add_argument("--json", type=Path, help="Write the rows here.")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None
    graphs = [q for p in args.paths for q in (sorted(x for n in GRAPHS for x in p.rglob(n)) if p.is_dir() else [p])]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for g in graphs:
            if not only or g.parent.name in only:
                rows.append(check(g, args.ort131, Path(tmp), args.structural))
                print(line(rows[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
