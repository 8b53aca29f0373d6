"""50 AdamW steps of roam's mixed-precision step against PyTorch AMP's: the loss curves, and fp16's
skipped steps with an overflow injected.

For each model (exporters/exporters_corpus's tiny configurations, dropout 0) and precision:
- PyTorch: the module in train mode, its forward under `torch.autocast("cpu", P)`, `F.cross_entropy`
  (mean) on the float32 logits, `torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
  weight_decay=0.01)` on the float32 parameters; fp16 with `torch.amp.GradScaler("cpu")` at its
  defaults (scale 65536, x2 after 2000 clean steps, x0.5 on an overflow);
- roam: the export (`torch.onnx.export(dynamo=True, optimize=False)`) made into the step by
  `make-training-graph --in-graph-optimizer --precision P --optimizer-setting convention=pytorch
  --optimizer-setting eps=1e-8 --optimizer-setting weight_decay=0.01`, emulated (`roam emulate`),
  planned (`roam optimize`) and run by `PlannedSession` (the plan's arena) from the export's weights;
- the same 50 batches (random tokens or images, seed = the step); before step 20, fp16's scale is
  set to 2^40 in both (`GradScaler.update(new_scale=2.0**40)`; roam's `grad_scaler.scale` state): an
  injected overflow, which each must skip until the scale has backed off far enough.
The figures: the largest |loss_roam - loss_torch| / loss_torch over the 50 steps, the first and last
losses, and the steps each skipped (fp16: the scale fell; the parameters are checked unchanged;
a skipped step that changed a parameter is listed negative).

    python -m benchmarks run precision/amp_curves                      # 6 models x bf16, fp16: about 10 min
    python -m benchmarks run precision/amp_curves.smoke --only gpt2 --kinds fp16

Needs the bench extra (torch, transformers 4.57, onnxscript) and `roam` installed in the same
environment."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

try:
    import torch
except ImportError:  # the records' tables need no torch; measuring does
    torch = None

from benchmarks import harness
from benchmarks.exporters.autograd_check import cross_entropy
from benchmarks.exporters.exporters import Wrapped
from benchmarks.exporters.exporters_corpus import configs, export, model_and_batch
from roam_cli.frontend.optimizer_graph import LOSS_SCALE
from roam_cli.runtime import train as roam_train

TAKES = "about 10 min; needs the bench extra (torch, transformers 4.57, onnxscript)"

ROAM = Path(sys.executable).parent / "roam"
STEPS, INJECT, LR = 50, 20, 1e-3
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}  # torch dtypes, by name
MODELS = ("gpt2", "llama-gqa", "bert", "vit", "resnet", "convnext")


def batches(name: str, feeds: dict, labels: np.ndarray) -> list[tuple[dict, np.ndarray]]:
    """STEPS batches shaped as the corpus' one, drawn with the step's seed."""
    config = configs()[name][0]
    out = []
    for k in range(STEPS):
        rng = np.random.default_rng(100 + k)
        fresh = {n: (rng.integers(0, config.vocab_size, v.shape) if n == "input_ids" else
                     rng.standard_normal(v.shape).astype(np.float32) if v.dtype == np.float32 else v)
                 for n, v in feeds.items()}
        out.append((fresh, rng.integers(0, labels.max() + 1 if labels.size else 1, labels.shape)))
    return out


def torch_curve(model, data, kind: str) -> tuple[list[float], list[int]]:
    wrapped = Wrapped(model.train(), list(data[0][0])[1:])
    opt = torch.optim.AdamW(wrapped.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, foreach=False)
    scaler = torch.amp.GradScaler("cpu", enabled=kind == "fp16")
    losses, skipped = [], []
    for k, (feeds, labels) in enumerate(data, start=1):
        if k == INJECT and kind == "fp16":
            scaler.update(new_scale=2.0**40)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", getattr(torch, DTYPES[kind])):
            logits = wrapped(*map(torch.from_numpy, feeds.values()))
        loss = cross_entropy(logits.float(), torch.from_numpy(labels))
        scaler.scale(loss).backward()
        before = scaler.get_scale() if kind == "fp16" else 0.0
        scaler.step(opt)
        scaler.update()
        losses.append(float(loss))
        if kind == "fp16" and scaler.get_scale() < before:
            skipped.append(k)
    return losses, skipped


def roam_curve(folder: Path, data, kind: str) -> tuple[list[float], list[int], dict]:
    def run(*args):
        subprocess.run([str(ROAM), *map(str, args)], cwd=folder, check=True, capture_output=True, text=True)

    run("make-training-graph", "model.onnx", "-o", "step.onnx", "--loss", "cross-entropy", "--in-graph-optimizer",
        "--precision", kind, "--optimizer-setting", "convention=pytorch", "--optimizer-setting", "eps=1e-8",
        "--optimizer-setting", "weight_decay=0.01")
    run("emulate", "step.onnx", "-o", "step.cpu.onnx")
    run("optimize", "step.cpu.onnx", "-o", "plan.json")
    plan = json.loads((folder / "plan.json").read_text())
    session = roam_train.PlannedSession(folder / "step.cpu.onnx", plan)
    try:
        given = session.source.starting_values(set(session.input_names))
        kinds = {t["name"]: t["kind"] for t in plan["tensors"]}
        state, _ = roam_train.starting_values(session, given, 0, LR, kinds)
        session.set_state(state)
        fixed = {n: state[n] for n in session.input_names if n not in session.state_names}  # learning_rate
        losses, skipped, at_offset = [], [], []
        for k, (feeds, labels) in enumerate(data, start=1):
            if k == INJECT and kind == "fp16":
                injected = session.state_arrays()
                injected[LOSS_SCALE] = np.full_like(injected[LOSS_SCALE], 2.0**40)
                session.set_state(injected)
            before = session.state_arrays()
            r = session.step(fixed | feeds | {"labels": labels})
            after = session.state_arrays()
            losses.append(float(r.outputs["loss"]))
            at_offset.append((r.memory or {}).get("served_at_plan_offset"))
            if kind == "fp16" and after[LOSS_SCALE] < before[LOSS_SCALE]:
                unchanged = all(np.array_equal(before[n], after[n]) for n in after if kinds.get(n) == "parameter")
                skipped.append(k if unchanged else -k)  # -k: a skipped step that changed a parameter
        return losses, skipped, {"arena": plan["arena_bytes"], "at_offset_min": min(x for x in at_offset[1:] if x)}
    finally:
        session.close()


def curve(name: str, kind: str, folder: Path) -> dict:
    model, feeds, labels = model_and_batch(name)
    with contextlib.redirect_stdout(sys.stderr):  # the exporter's progress, not the table
        export(model, feeds, "dynamo-optimize-false", folder / "model.onnx")
    data = batches(name, feeds, labels)
    theirs, their_skips = torch_curve(model, data, kind)
    ours, our_skips, figures = roam_curve(folder, data, kind)
    diff = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
    return {"model": name, "kind": kind, "torch": theirs, "roam": ours, "max_rel": diff,
            "torch_skipped": their_skips, "roam_skipped": our_skips} | figures


def main(argv: list[str]) -> list[dict]:
    harness.needs_torch(torch, __name__)
    p = harness.options(__name__, __doc__)
    p.add_argument("--only", default=",".join(MODELS))
    p.add_argument("--kinds", default="bf16,fp16")
    a = p.parse_args(argv)
    harness.quiet_torch(torch)
    rows = []
    for name in a.only.split(","):
        for kind in a.kinds.split(","):
            with tempfile.TemporaryDirectory() as scratch:
                rows.append(curve(name, kind, Path(scratch)))
            r = rows[-1]
            print(f"{name} / {kind}: max rel {r['max_rel']:.2e}, skipped torch {r['torch_skipped']} roam "
                  f"{r['roam_skipped']}", file=sys.stderr, flush=True)
    return rows


def spans(steps: list[int]) -> str:
    """[1, 5, 20, 21, 22] -> "1, 5, 20–22"."""
    out: list[list[int]] = []
    for k in steps:
        if out and k == out[-1][1] + 1 and k > 0:
            out[-1][1] = k
        else:
            out.append([k, k])
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in out) or "—"


def table(rows: list[dict]) -> str:
    out = []
    for r in rows:
        skipped = spans(r["torch_skipped"]) if r["torch_skipped"] == r["roam_skipped"] else \
            f"torch {spans(r['torch_skipped'])}; roam **{spans(r['roam_skipped'])}**"
        out.append([r["model"], r["kind"], f"{r['torch'][0]:.4f} / {r['roam'][0]:.4f}",
                    f"{r['torch'][-1]:.4f} / {r['roam'][-1]:.4f}", f"{r['max_rel']:.1e}", skipped,
                    f"{r['arena']:,}"])
    same = sum(r["torch_skipped"] == r["roam_skipped"] for r in rows)
    return harness.markdown_table(
        ["model", "precision", "loss step 1 (torch / roam)", f"loss step {len(rows[0]['torch']) if rows else STEPS} "
         "(torch / roam)", "max rel. difference", "steps skipped (torch = roam)", "roam arena B"],
        out, "llllrlr") + (f"\nSkipped steps the same as GradScaler's in {same} of {len(rows)} runs; the largest loss "
                           f"difference {max(r['max_rel'] for r in rows):.1e}.\n" if rows else "")
