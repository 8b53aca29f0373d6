#!/usr/bin/env python3
"""50 AdamW steps of roam's mixed-precision step against PyTorch AMP's: the loss curves, and fp16's
skipped steps with an overflow injected.

    PYTHONPATH=. /work/venvs/torch/bin/python benchmarks/amp_curves.py --json benchmarks/results/amp_curves.json
    PYTHONPATH=. /work/venvs/torch/bin/python benchmarks/amp_curves.py --only gpt2 --kinds fp16

For each model (benchmarks/exporters_corpus.py's tiny configurations, dropout 0) and precision:
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
losses, and the steps each skipped (fp16: the scale fell; the parameters are checked unchanged)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from autograd_check import cross_entropy  # noqa: E402
from exporters import Wrapped  # noqa: E402
from exporters_corpus import configs, export, model_and_batch  # noqa: E402

from roam_cli.frontend.optimizer_graph import LOSS_SCALE  # noqa: E402
from roam_cli.runtime import train as roam_train  # noqa: E402

ROAM = Path(sys.executable).parent / "roam"
STEPS, INJECT, LR = 50, 20, 1e-3
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
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
        with torch.autocast("cpu", DTYPES[kind]):
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--only", default=",".join(MODELS))
    p.add_argument("--kinds", default="bf16,fp16")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    rows = []
    for name in a.only.split(","):
        for kind in a.kinds.split(","):
            with tempfile.TemporaryDirectory() as scratch:
                rows.append(curve(name, kind, Path(scratch)))
            r = rows[-1]
            print(f"{name} / {kind}: max rel {r['max_rel']:.2e}, skipped torch {r['torch_skipped']} roam "
                  f"{r['roam_skipped']}", file=sys.stderr, flush=True)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    print(f"| model | precision | loss step 1 (torch / roam) | loss step {STEPS} (torch / roam) | max rel. difference "
          "| skipped steps, torch | skipped steps, roam | roam arena |")
    print("|---|---|---|---|---:|---|---|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['kind']} | {r['torch'][0]:.4f} / {r['roam'][0]:.4f} | {r['torch'][-1]:.4f} / "
              f"{r['roam'][-1]:.4f} | {r['max_rel']:.2e} | {r['torch_skipped'] or '—'} | {r['roam_skipped'] or '—'} "
              f"| {r['arena']:,} B |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
