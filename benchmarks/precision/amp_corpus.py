"""Mixed precision against PyTorch AMP on the exporter corpus: gradients, the steps made, planned,
verified and trained, and exports already in low precision.

The corpus is exporters/exporters_corpus's: Hugging Face architectures in tiny configurations
(2 layers or stages, hidden 32-64, vocabulary 128; batch 2, 8 tokens or 32x32 images) with random
weights and every dropout probability 0, put in eval mode as users export them. A cell is a model
and a kind:

- `bf16`, `fp16` (the AMP step of a float32 export, `torch.onnx.export(dynamo=True, optimize=False)`):
  1. gradients. roam: `make-training-graph --loss cross-entropy --precision P`'s training graph,
     emulated (`roam emulate`: each 16-bit op in float32, its result rounded as a GPU's kernel
     rounds it), run on PyTorch's weights and one batch. PyTorch: the module in train mode, its
     forward under `torch.autocast("cpu", P)`, `F.cross_entropy` (mean) on the logits in float32,
     the parameters float32. fp16 scales the loss in both by the largest power of two from 1024
     down whose autocast gradients are all finite (a static GradScaler that does not overflow: the
     tiny models' gradients would otherwise fall into fp16's subnormals) and divides by it. Per
     parameter tensor, three norm-relative errors: roam against autocast (`err`), autocast
     against the float64 gradient of the same module (`amp64`: PyTorch's own low-precision error)
     and roam against float64 (`roam64`). The tolerance is 4 x amp64: two independent roundings
     of the same size differ by about sqrt(2) of one, and torch's CPU autocast runs softmax,
     layer_norm and pow in the low type where roam's policy (torch's CUDA lists) runs them in
     float32. A tensor whose float64 gradient is below 1e-6 of the largest is float noise in every
     run (an attention key's bias) and is listed apart.
  2. the step: `make-training-graph --in-graph-optimizer --precision P`, then on the CPU provider
     bf16 `roam emulate`d and fp16 as the provider runs it (`roam optimize --ort-optimized`: the
     casts it inserts planned), `roam verify`, `roam train --steps 3 --compare --save-weights` (the
     export's weights in, PyTorch-named float32 weights out): whether each passes, the requests at
     their plan offset, the compare's differences.
- `half`, `to-bf16`, `autocast-bf16`, `autocast-fp16` (exports already in low precision:
  `model.half()`, `model.to(torch.bfloat16)`, or the float32 module exported under
  `torch.autocast("cpu", P)` with dynamo's default optimisation, which folds the weights' casts):
  step 2 without --precision (the step follows the export), the warnings roam printed, and
  whether the weights written back are float32 under PyTorch's names.
- `torchscript-bf16`, `torchscript-fp16` (another exporter: `torch.onnx.export(dynamo=False,
  opset_version=17)`, its default constant folding): step 2 with --precision.

Each cell runs in a process of its own (`benchmarks/cells.py`), killed after `--timeout` seconds;
`--jobs` at a time.

    python -m benchmarks run precision/amp_corpus                      # 162 cells, about 45 min
    python -m benchmarks run precision/amp_corpus.torchscript --kinds torchscript-bf16,torchscript-fp16
    python -m benchmarks run precision/amp_corpus.smoke --only gpt2 --kinds bf16,half

Needs the bench extra (torch, transformers 4.57, onnxscript), safetensors, and `roam` installed in
the same environment."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx

try:
    import torch
except ImportError:  # the records' tables need no torch; measuring does
    torch = None
from onnx import numpy_helper

from benchmarks import cells, harness
from benchmarks.exporters.autograd_check import cross_entropy, roam_gradients, torch_gradients
from benchmarks.exporters.exporters import Wrapped
from benchmarks.exporters.exporters_corpus import configs, export, model_and_batch
from roam_cli.backward import step as roam_step
from roam_cli.core.errors import first_line
from roam_cli.frontend import training_graph
from roam_cli.frontend.optimizer_graph import LOSS_SCALE
from roam_cli.precision.emulate import emulate

TAKES = ("about 45 min (162 cells, 2 at a time); needs the bench extra (torch, transformers 4.57, onnxscript), "
         "safetensors")
ROAM = Path(sys.executable).parent / "roam"
AMP_KINDS = ("bf16", "fp16")
EXPORT_KINDS = ("half", "to-bf16", "autocast-bf16", "autocast-fp16")
# the float32 export TorchScript writes (its default constant folding), made into the AMP step: another
# exporter's graph for the same steps
TORCHSCRIPT_KINDS = ("torchscript-bf16", "torchscript-fp16")
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}  # torch dtypes, by name
FP16_SCALES = [2.0**k for k in range(10, -1, -1)]
TOLERANCE_FACTOR = 4
NOISE = 1e-6


def roam(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROAM), *map(str, args)], cwd=cwd, capture_output=True, text=True)


def scaled_backward(model, chosen, loss, optimizer, low=None, loss_scale=None):
    """roam's backward with the loss scale as an input even without the in-graph optimizer (the
    CLI refuses that: no update would skip), so that the training graph's gradients are those of
    the scaled loss, as GradScaler's backward computes them."""
    return roam_step.build(model, chosen, loss, optimizer, low, LOSS_SCALE)


def export_values(path: Path) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t, base_dir=str(path.parent)) for t in onnx.load(str(path)).graph.initializer}


def amp_gradients(model, feeds: dict, labels: np.ndarray, kind: str) -> tuple[dict[str, np.ndarray], float]:
    """PyTorch AMP's gradients (the forward under autocast, the loss in float32) and the loss scale:
    fp16's largest in FP16_SCALES whose gradients are all finite."""
    wrapped = Wrapped(model.train(), list(feeds)[1:])
    for scale in FP16_SCALES if kind == "fp16" else [1.0]:
        wrapped.zero_grad()
        with torch.autocast("cpu", getattr(torch, DTYPES[kind])):
            logits = wrapped(*map(torch.from_numpy, feeds.values()))
        (cross_entropy(logits.float(), torch.from_numpy(labels)) * scale).backward()
        grads = {n: (p.grad / scale).numpy().copy() for n, p in wrapped.m.named_parameters() if p.grad is not None}
        if all(np.isfinite(g).all() for g in grads.values()):
            break
    return grads, scale


def gradients(name: str, kind: str, folder: Path) -> dict:
    """Part 1 of an AMP cell: roam's gradients against autocast's and float64's."""
    model, feeds, labels = model_and_batch(name)
    weights = {n: t.detach().numpy().copy() for n, t in model.named_parameters(remove_duplicate=False)}
    made = training_graph.make(folder / "model.onnx", folder / "train.onnx", loss="cross-entropy",
                               backward=scaled_backward, precision=kind, optimizer_path=folder / "unused.onnx",
                               scaler_settings={"enabled": "false"} if kind == "fp16" else None)
    train = onnx.load(str(folder / "train.onnx"))
    emulate(train)
    constants = export_values(folder / "model.onnx")
    batch = dict(zip([i.name for i in onnx.load(str(folder / "model.onnx")).graph.input
                      if i.name not in constants], feeds.values()))
    amp, scale = amp_gradients(copy.deepcopy(model), feeds, labels, kind)
    values = {**constants, **weights, **batch, "labels": labels, LOSS_SCALE: np.array(scale, np.float32)}
    ours = {p: g / scale for p, g in roam_gradients(train, values).items()}
    wrapped64 = Wrapped(copy.deepcopy(model).train(), list(feeds)[1:]).double()
    exact = {n.removeprefix("m."): g for n, g in torch_gradients(wrapped64, feeds, labels, torch.float64).items()}
    largest = max(float(np.linalg.norm(g)) for g in exact.values())
    rows, noise = {}, {}
    for p, g in amp.items():
        if p not in ours or p not in exact:
            continue
        norm64 = float(np.linalg.norm(exact[p]))
        e = {"err": rel(ours[p], g), "amp64": rel(g, exact[p]), "roam64": rel(ours[p], exact[p])}
        (noise if norm64 < NOISE * largest else rows)[p] = e
    over = [p for p, e in rows.items() if not e["err"] <= TOLERANCE_FACTOR * e["amp64"]]
    return {"trained": len(made.survey.trainable), "pytorch": len(amp), "compared": len(rows), "errors": rows,
            "noise": noise, "over": over, "loss_scale": scale}


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / max(np.linalg.norm(b), 1e-30))


def step_pipeline(folder: Path, precision: str | None, model_name: str) -> dict:
    """Part 2: the full step made (following the export without `precision`), planned, verified and
    trained 3 steps against a plain run on the CPU provider, as the issue asks: bf16 emulated (the
    provider has no bf16 arithmetic), fp16 as the provider runs it (the casts it inserts: planned
    with --ort-optimized); the weights written back."""
    r: dict = {}
    made = roam("make-training-graph", "model.onnx", "-o", "step.onnx", "--loss", "cross-entropy",
                "--in-graph-optimizer", "--json", *(["--precision", precision] if precision else []), cwd=folder)
    r["make"] = made.returncode
    if made.returncode:
        return r | {"error": made.stderr.strip().splitlines()[-1][:300]}
    listed = json.loads(made.stdout)
    r["warnings"] = listed["warnings"]
    r["precision"] = listed.get("precision", {}).get("precision", "fp32")
    native = r["precision"] == "fp16"
    runs = "plan.annotated.onnx" if native else "step.cpu.onnx"
    stages = [("emulate", ("emulate", "step.onnx", "-o", "step.cpu.onnx"))] if not native else []
    stages += [("optimize", ("optimize", "step.onnx" if native else runs, "-o", "plan.json",
                             *(["--ort-optimized"] if native else []))),
               ("verify", ("verify", runs, "plan.json")),
               ("train", ("train", runs, "--plan", "plan.json", "--steps", "3", "--compare", "--json",
                          "--save-weights", "trained.safetensors"))]
    r["runs"] = "CPU provider's own fp16" if native else "emulated"
    for stage, args in stages:
        run = roam(*args, cwd=folder)
        r[stage] = run.returncode
        if run.returncode:
            return r | {"error": f"{stage}: {run.stderr.strip().splitlines()[-1][:300]}"}
    trained = json.loads(run.stdout)
    plan = json.loads((folder / "plan.json").read_text())
    memory = trained["per_step"][-1]["memory"] or {}
    r |= {"arena": plan["arena_bytes"], "persistent": plan["persistent_bytes"],
          "at_offset": memory.get("served_at_plan_offset"), "planned": memory.get("planned_requests"),
          "compare": {k: trained["compare"][k] for k in ("outputs_max_rel", "state_max_rel")},
          "losses": [s["outputs"]["loss"] for s in trained["per_step"]],
          "weights": written_weights(folder / "trained.safetensors", model_name)}
    return r


def written_weights(path: Path, model_name: str) -> dict:
    """What --save-weights wrote: how many tensors, of which types, how many named as the PyTorch
    model names a parameter or buffer (a tied one under any of its names; BatchNorm's running
    statistics), each with its shape."""
    from safetensors.numpy import load_file

    model, _, _ = model_and_batch(model_name)
    shapes = {n: tuple(p.shape) for n, p in [*model.named_parameters(remove_duplicate=False),
                                              *model.named_buffers(remove_duplicate=False)]}
    tensors = load_file(str(path))
    return {"tensors": len(tensors), "dtypes": sorted({str(v.dtype) for v in tensors.values()}),
            "pytorch_named": sum(shapes.get(n) == v.shape for n, v in tensors.items())}


def export_of(name: str, kind: str, folder: Path) -> None:
    """<folder>/model.onnx: the float32 export (an AMP kind) or the one already in low precision."""
    model, feeds, _ = model_and_batch(name)
    if kind in AMP_KINDS:
        export(model, feeds, "dynamo-optimize-false", folder / "model.onnx")
    elif kind in TORCHSCRIPT_KINDS:
        export(model, feeds, "torchscript", folder / "model.onnx")
    elif kind in ("half", "to-bf16"):
        dtype = torch.float16 if kind == "half" else torch.bfloat16
        model = model.to(dtype)
        feeds = {k: v.astype(np.float16) if v.dtype == np.float32 and kind == "half" else v for k, v in feeds.items()}
        first, *rest = feeds
        args = (torch.from_numpy(feeds[first]).to(dtype) if feeds[first].dtype != np.int64
                else torch.from_numpy(feeds[first]),)
        kwargs = {k: torch.from_numpy(feeds[k]) for k in rest}
        torch.onnx.export(model, args, str(folder / "model.onnx"), kwargs=kwargs, dynamo=True, optimize=False)
    else:
        with torch.autocast("cpu", getattr(torch, DTYPES[kind.removeprefix("autocast-")])):
            export(model, feeds, "dynamo", folder / "model.onnx")
    forward = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    constants = {t.name for t in forward.graph.initializer}
    extra = [i.name for i in forward.graph.input if i.name not in constants][len(feeds):]
    if extra:  # a value the trace made an input (Falcon's TorchScript: logits_to_keep): no batch fills it
        raise ValueError(f"the export takes inputs the model does not: {', '.join(extra)}")


def cell(name: str, kind: str, folder: Path) -> dict:
    r = {"model": name, "kind": kind}
    try:
        export_of(name, kind, folder)
    except Exception as e:  # noqa: BLE001  (the exporter's failure: not counted against roam)
        return r | {"export_error": f"{type(e).__name__}: {first_line(e)}"}
    try:
        if kind in AMP_KINDS:
            r |= gradients(name, kind, folder)
    except Exception as e:  # noqa: BLE001  (roam's failure is the cell's result)
        return r | {"error": f"{type(e).__name__}: {first_line(e)}"}
    precision = kind if kind in AMP_KINDS else kind.removeprefix("torchscript-") if kind in TORCHSCRIPT_KINDS else None
    return r | {"step": step_pipeline(folder, precision, name)}


def one_cell(spec: str, out: Path) -> dict:
    """The cell process: `--cell MODEL:KIND --out FOLDER`."""
    harness.quiet_torch(torch)
    name, kind = spec.split(":")
    return cell(name, kind, out)


def main(argv: list[str]) -> list[dict]:
    harness.needs_torch(torch, __name__)
    p = harness.options(__name__, __doc__)
    p.add_argument("--only", help="comma-separated models (default: all)")
    p.add_argument("--kinds", default=",".join(AMP_KINDS + EXPORT_KINDS),
                   help="comma-separated, of " + ", ".join(AMP_KINDS + EXPORT_KINDS + TORCHSCRIPT_KINDS))
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("--out", type=Path, help="keep the cells' files here (default: a temporary folder)")
    a = p.parse_args(argv)
    models = a.only.split(",") if a.only else list(configs())
    kinds = a.kinds.split(",")
    with tempfile.TemporaryDirectory() as scratch, ThreadPoolExecutor(a.jobs) as pool:
        out = (a.out or Path(scratch)).resolve()
        futures = [pool.submit(cells.run_cell, __name__, f"{m}:{k}", out / f"{m}-{k}", a.timeout,
                               {"model": m, "kind": k}) for m in models for k in kinds]
        rows = []
        for f in futures:
            rows.append(f.result())
            r = rows[-1]
            print(f"{r['model']} / {r['kind']}: {step_cell(r)[:100]}", file=sys.stderr, flush=True)
    return rows


# --- the table ------------------------------------------------------------------------------------

def worst(r: dict) -> str:
    """The cell's worst tensor (err over its tolerance): err (tolerance; roam vs float64 / autocast vs float64)."""
    if "errors" not in r:
        return step_cell(r) if "step" not in r else "—"
    if not r["errors"]:
        return "—"
    p = max(r["errors"], key=lambda q: r["errors"][q]["err"] / max(r["errors"][q]["amp64"], 1e-30))
    e = r["errors"][p]
    over = f" **{len(r['over'])} over**" if r["over"] else ""
    return f"{e['err']:.1e} ({TOLERANCE_FACTOR * e['amp64']:.0e}; {e['roam64']:.0e} vs {e['amp64']:.0e}){over}"


def step_cell(r: dict) -> str:
    """✓: made, verified, trained 3 steps bit-equal to a plain ONNX Runtime run, and the weights written
    back float32 under PyTorch's names; (a/b): the requests served at their plan offset when not all."""
    if "crash" in r:
        return f"crash: {r['crash'][:100]}"
    if "export_error" in r:
        return "export fails"
    if "error" in r:
        return f"fails: {r['error'][:100]}"
    s = r["step"]
    if "error" in s:
        return "refused" if "roam: error: " in s["error"] else f"fails: {s['error'][:100]}"
    c, w = s["compare"], s["weights"]
    marks = []
    if c["outputs_max_rel"] != 0 or c["state_max_rel"] != 0:
        marks.append(f"differs {max(c.values()):.1e}")
    if w["dtypes"] != ["float32"] or w["pytorch_named"] != w["tensors"]:
        marks.append(f"weights {','.join(w['dtypes'])}, {w['pytorch_named']}/{w['tensors']} PyTorch's")
    if s["at_offset"] != s["planned"]:
        marks.append(f"{s['at_offset']}/{s['planned']}")
    return "✓" + (f" ({'; '.join(marks)})" if marks else "")


def table(rows: list[dict]) -> str:
    """A row per model: the gradients of each AMP kind, then each kind's step; the counts under it."""
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    graded_kinds = [k for k in kinds if k in AMP_KINDS]
    by: dict[str, dict[str, dict]] = {}
    for r in rows:
        by.setdefault(r["model"], {})[r["kind"]] = r
    text = harness.markdown_table(
        ["model", *(f"{k} gradients: worst err (tolerance; roam vs fp64 / autocast vs fp64)" for k in graded_kinds),
         *kinds],
        [[m, *(worst(c[k]) if k in c else "–" for k in graded_kinds),
          *(step_cell(c[k]) if k in c else "–" for k in kinds)]
         for m, c in by.items()], "l" * (1 + len(graded_kinds) + len(kinds)))
    graded = [r for r in rows if r["kind"] in AMP_KINDS and "errors" in r]
    exported = [r for r in rows if "export_error" not in r]
    trained = [r for r in exported if step_cell(r).startswith("✓")]
    refused = [r for r in exported if step_cell(r) == "refused"]
    lines = []
    if graded:
        lines.append(f"Gradients within tolerance on every compared tensor: {sum(not r['over'] for r in graded)} of "
                     f"{len(graded)} cells ({len({r['model'] for r in graded if not r['over']})} architectures).")
    lines.append(f"Steps made, planned, verified and trained bit-equal to a plain run, weights back float32 under "
                 f"PyTorch's names: {len(trained)} of {len(exported)} exports made; refused in one line: {len(refused)}; "
                 f"failed otherwise: {len(exported) - len(trained) - len(refused)}; the exporter failed on "
                 f"{len(rows) - len(exported)} (not counted).")
    return text + "\n" + "\n".join(lines) + "\n"


if __name__ == "__main__":  # a cell, run by benchmarks.cells.run_cell
    cells.serve(one_cell)
