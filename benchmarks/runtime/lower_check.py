"""Does a lowered graph compute what the fused one does, is it standard ONNX, and does another
onnxruntime run it?

    python -m benchmarks run runtime/lower_check                                     # the bundled sample
    python -m benchmarks run runtime/lower_check benchmarks/.cache/suite --other-python PY
    python -m benchmarks run runtime/lower_check.structural benchmarks/.cache/suite --structural

A folder stands for every training_model.onnx, full_step.onnx and optimizer_model.onnx under it.
Weights the graph keeps outside (the suite's are never written) are replaced by random ones (std
0.02), Dropout ratios are set to 0, and every input gets random values (integers in [0, 100): token
ids, labels; lazy_reset_grad false). The fused graph runs in this environment's onnxruntime-training,
the lowered one (`roam_cli.lower`) in the same runtime; a row's difference is the largest over all
outputs of |lowered − fused| relative to that output's largest value. With --other-python, the lowered
graph also runs under that interpreter's onnxruntime (an environment of its own, e.g. today's
onnxruntime beside onnxruntime-training: the two ship the same module). Optimizer graphs (sequence
inputs) are only run, not compared. Every row counts the nodes left outside standard ONNX and runs
`onnx.checker.check_model(full_check=True)` on the lowered graph saved to a file (the path form, which
models over 2 GB need; a sparse stand-in takes each external-data file's place). --structural stops
there: for graphs whose inputs and outputs do not fit in memory (run the numerics on the same
architecture with fewer blocks: `python -m benchmarks.suite --layers 2`).

Needs onnxruntime-training (the fused graphs' ops); minutes per suite graph, the large ones need more
memory than a 2-core development machine gives a process."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from benchmarks import harness
from roam_cli.frontend.training_graph import external_data_stand_ins
from roam_cli.lower import lower_model, nonstandard_nodes

TAKES = "seconds (the sample); minutes a suite graph; needs onnxruntime-training (--other-python: another venv)"
SAMPLE = harness.ROOT / "sample_models" / "gpt2_tiny" / "training_model.onnx"
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


def check(path: Path, other_python: str | None, folder: Path, structural: bool) -> dict:
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
    if other_python:
        model_path, feeds_path = folder / "lowered.onnx", folder / "feeds.npz"
        onnx.save(lowered, str(model_path))
        np.savez(feeds_path, **feeds_for(session(lowered)))
        run = subprocess.run([other_python, "-c", RUN, str(model_path), str(feeds_path)], capture_output=True, text=True)
        version, first = run.stdout.split() if run.returncode == 0 else ("", "")
        row["other_runtime"] = (f"onnxruntime {version} runs it (first output {first})" if run.returncode == 0
                                else f"FAILED: {(run.stderr.strip().splitlines() or ['?'])[-1]}")
    return row


def main(argv: list[str]) -> list[dict]:
    ap = harness.options(__name__, __doc__)
    ap.add_argument("paths", nargs="*", type=Path, default=[SAMPLE])
    ap.add_argument("--only", help="models (folder names), comma-separated")
    ap.add_argument("--other-python", metavar="PY",
                    help="a Python whose onnxruntime is another build (e.g. today's): it runs the lowered graphs too")
    ap.add_argument("--structural", action="store_true", help="lower and check only: no run")
    args = ap.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    graphs = [q for p in args.paths for q in (sorted(x for n in GRAPHS for x in p.rglob(n)) if p.is_dir() else [p])]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for g in graphs:
            if not only or g.parent.name in only:
                rows.append(check(g, args.other_python, Path(tmp), args.structural))
                print(f"{rows[-1]['graph']}: done", file=sys.stderr, flush=True)
    return rows


def table(results: list[dict]) -> str:
    def cell(r, key, fmt="{}"):
        return "–" if r.get(key) is None else fmt.format(r[key])

    rows = []
    for r in results:
        difference = (f"{r['max_relative_difference']:.2e}" if r.get("max_relative_difference") is not None
                      else "not compared" if r["graph"].endswith("optimizer_model.onnx") else "–")
        rows.append([r["graph"], f"{r['nodes'][0]:,}", f"{r['nodes'][1]:,}", cell(r, "nonstandard_after"),
                     cell(r, "check_model"), cell(r, "loss", "{:.6f}"), difference, cell(r, "other_runtime")])
    return harness.markdown_table(
        ["graph", "fused nodes", "lowered nodes", "non-standard left", "check_model (full_check, path)", "loss",
         "max relative difference, lowered vs fused", "another onnxruntime"], rows, "lrrrlrrl")


if __name__ == "__main__":
    sys.exit("run it as: python -m benchmarks run runtime/lower_check [options]")
