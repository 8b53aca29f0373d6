#!/usr/bin/env python3
"""Mixed precision against PyTorch AMP on the exporter corpus: gradients, the steps made, planned,
verified and trained, and exports already in low precision.

    PYTHONPATH=. /work/venvs/torch/bin/python benchmarks/amp_corpus.py --json benchmarks/results/amp_corpus.json
    PYTHONPATH=. /work/venvs/torch/bin/python benchmarks/amp_corpus.py --only gpt2,vit --kinds bf16 --out DIR

The corpus is benchmarks/exporters_corpus.py's: Hugging Face architectures in tiny configurations
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

Each cell runs in a process of its own (`benchmarks/cells.py`), killed after `--timeout` seconds."""

from __future__ import annotations

import argparse
import copy
import json
import logging
import subprocess
import sys
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from autograd_check import cross_entropy, roam_gradients, torch_gradients  # noqa: E402
from cells import run_cell  # noqa: E402
from exporters import Wrapped  # noqa: E402
from exporters_corpus import configs, export, model_and_batch  # noqa: E402

from roam_cli.backward import step as roam_step  # noqa: E402
from roam_cli.core.errors import first_line  # noqa: E402
from roam_cli.frontend import training_graph  # noqa: E402
from roam_cli.frontend.optimizer_graph import LOSS_SCALE  # noqa: E402
from roam_cli.precision.emulate import emulate  # noqa: E402

ROAM = Path(sys.executable).parent / "roam"
AMP_KINDS = ("bf16", "fp16")
EXPORT_KINDS = ("half", "to-bf16", "autocast-bf16", "autocast-fp16")
# the float32 export TorchScript writes (its default constant folding), made into the AMP step: another
# exporter's graph for the same steps
TORCHSCRIPT_KINDS = ("torchscript-bf16", "torchscript-fp16")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
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
        with torch.autocast("cpu", DTYPES[kind]):
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
        with torch.autocast("cpu", DTYPES[kind.removeprefix("autocast-")]):
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


# --- the table ------------------------------------------------------------------------------------

def worst(r: dict) -> str:
    if not r.get("errors"):
        return "—"
    p = max(r["errors"], key=lambda q: r["errors"][q]["err"] / max(r["errors"][q]["amp64"], 1e-30))
    e = r["errors"][p]
    over = f" **{len(r['over'])} over**" if r["over"] else ""
    return f"{e['err']:.1e} (tol {TOLERANCE_FACTOR * e['amp64']:.1e}; roam64 {e['roam64']:.1e}){over}"


def step_cell(r: dict) -> str:
    s = r.get("step")
    if s is None:
        return "—"
    if "error" in s:
        refused = s["error"].partition("roam: error: ")[2]
        return f"refused in one line: {refused[:150]}" if refused else f"fails: {s['error'][:150]}"
    c = s["compare"]
    equal = "bit-equal" if c["outputs_max_rel"] == 0 and c["state_max_rel"] == 0 else \
        f"differs {max(c.values()):.1e}"
    return (f"{s['precision']} ({s['runs']}), {s['at_offset']}/{s['planned']} at offset, {equal}, "
            f"loss {s['losses'][0]:.4f} → {s['losses'][-1]:.4f}, weights {','.join(s['weights']['dtypes'])} "
            f"({s['weights']['pytorch_named']}/{s['weights']['tensors']} PyTorch's)")


def print_table(rows: list[dict]) -> None:
    """The markdown table of the cells, and the counts."""
    print("| model | kind | gradients vs autocast: worst err (tolerance; roam vs float64) | step: made, emulated, "
          "planned, verified, trained 3 steps | warnings |")
    print("|---|---|---|---|---|")
    for r in rows:
        warned = "; ".join(w[:100] for w in r.get("step", {}).get("warnings", []))
        failure = r.get("error") or r.get("crash")
        step = (f"export fails: {r['export_error'][:100]}" if "export_error" in r
                else f"**{failure[:150]}**" if failure else step_cell(r))
        print(f"| {r['model']} | {r['kind']} | {worst(r)} | {step} | {warned or '—'} |")
    graded = [r for r in rows if r["kind"] in AMP_KINDS and "errors" in r]
    made = [r for r in rows if "export_error" not in r]
    equal = [r for r in rows if "error" not in r.get("step", {"error": 1})
             and r["step"]["compare"]["outputs_max_rel"] == 0 == r["step"]["compare"]["state_max_rel"]]
    print(f"\ngradients within tolerance on every compared tensor: "
          f"{sum(not r['over'] for r in graded)}/{len(graded)} cells "
          f"({len({r['model'] for r in graded if not r['over']})} architectures)")
    refused = [r for r in made if "error" in r.get("step", {}) and "roam: error:" in r["step"]["error"]]
    print(f"steps made, planned, verified and trained bit-equal to a plain run: {len(equal)}/{len(made)} exports "
          f"made ({len(rows) - len(made)} the exporter failed on); refused in one line: {len(refused)}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--only", help="comma-separated models (default: all)")
    p.add_argument("--kinds", default=",".join(AMP_KINDS + EXPORT_KINDS + TORCHSCRIPT_KINDS))
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("--json", type=Path)
    p.add_argument("--out", type=Path, help="keep the cells' files here (default: a temporary folder)")
    p.add_argument("--table", type=Path, help="print the table of a run's --json, running nothing")
    p.add_argument("--cell", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.table:
        print_table(json.loads(a.table.read_text()))
        return 0
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    if a.cell:
        torch.set_num_threads(1)
        name, kind = a.cell.split(":")
        (a.out / "result.json").write_text(json.dumps(cell(name, kind, a.out), indent=1))
        return 0
    models = a.only.split(",") if a.only else list(configs())
    kinds = a.kinds.split(",")
    with tempfile.TemporaryDirectory() as scratch, ThreadPoolExecutor(a.jobs) as pool:
        out = (a.out or Path(scratch)).resolve()
        futures = [pool.submit(run_cell, __file__, f"{m}:{k}", out / f"{m}-{k}", a.timeout, {"model": m, "kind": k})
                   for m in models for k in kinds]
        rows = []
        for f in futures:
            rows.append(f.result())
            r = rows[-1]
            failure = r.get("export_error") or r.get("error") or r.get("crash")
            print(f"{r['model']} / {r['kind']}: {failure or step_cell(r)[:100]}",
                  file=sys.stderr, flush=True)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
