"""The same training step on two ONNX Runtimes, each in an environment of its own: ORT's fused full
step on onnxruntime-training, and its standard-ONNX form (`roam lower`) on today's onnxruntime.

    python -m benchmarks run runtime/runtimes FUSED.onnx STANDARD.onnx --fused-python PY --standard-python PY [--steps 20]

The two runtimes ship the same `onnxruntime` module, so each runs under an interpreter the user
names: --fused-python has onnxruntime-training, --standard-python today's onnxruntime; each needs
roam's dependencies (roam itself comes from this checkout, on PYTHONPATH). Both steps are planned by
roam (`optimize --reproducible --jobs 1`) and trained with `roam train` (the plan's order and arena)
from the same inputs, drawn once here; every step's loss is compared. `within_tolerance` says whether
every loss is within --tolerance (relative). Seconds for the sample's step, minutes for a suite model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import harness

TAKES = "seconds (the sample) to minutes; needs two interpreters the user names (onnxruntime-training, today's)"
GENERATED = {"optimizer_state"}  # plan kinds roam train starts at zero itself
LEARNING_RATE = "learning_rate"


def roam(python: str, *args) -> str:
    proc = subprocess.run([python, "-m", "roam_cli", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(harness.ROOT)})
    if proc.returncode != 0:
        sys.exit(f"{python} roam {args[0]}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def runtime(python: str) -> str:
    proc = subprocess.run([python, "-c", "from roam_cli.frontend.providers import RUNTIME; print(RUNTIME)"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(harness.ROOT)},
                          check=True)
    return proc.stdout.strip()


def inputs(model: Path, plan: dict, seed: int) -> dict:
    """Every input roam train would synthesise, drawn once here so that both runs read the same."""
    import onnx

    from roam_cli.frontend.synthetic import synthesize

    kinds = {t["name"]: t["kind"] for t in plan["tensors"]}
    specs = []
    for i in onnx.load(str(model), load_external_data=False).graph.input:
        if kinds.get(i.name) in GENERATED or i.name == LEARNING_RATE:
            continue
        t = i.type.tensor_type
        specs.append((i.name, onnx.helper.tensor_dtype_to_np_dtype(t.elem_type), [d.dim_value for d in t.shape.dim]))
    return synthesize(specs, seed)


def plan(python: str, model: Path, folder: Path, form: str) -> Path:
    path = folder / f"{form}.plan.json"
    roam(python, "-q", "optimize", model, "-o", path, "--reproducible", "--jobs", "1")
    return path


def train(python: str, model: Path, plan_path: Path, feeds: Path, steps: int) -> dict:
    return json.loads(roam(python, "train", model, "--plan", plan_path, "--steps", steps, "--inputs", feeds, "--json"))


def main(argv: list[str]) -> dict:
    import numpy as np

    ap = harness.options(__name__, __doc__)
    ap.add_argument("fused", type=Path)
    ap.add_argument("standard", type=Path)
    ap.add_argument("--fused-python", required=True, help="an interpreter with onnxruntime-training")
    ap.add_argument("--standard-python", required=True, help="an interpreter with today's onnxruntime")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tolerance", type=float, default=1e-4)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="roam-runtimes-") as scratch:
        folder = Path(scratch)
        plans = {"fused": plan(a.fused_python, a.fused, folder, "fused"),
                 "standard": plan(a.standard_python, a.standard, folder, "standard")}
        feeds = folder / "inputs.npz"
        np.savez(feeds, **inputs(a.fused, json.loads(plans["fused"].read_text()), a.seed))
        runs = {"fused": train(a.fused_python, a.fused, plans["fused"], feeds, a.steps),
                "standard": train(a.standard_python, a.standard, plans["standard"], feeds, a.steps)}
    forms = {"fused": {"model": a.fused.name, "runtime": runtime(a.fused_python),
                       "arena_bytes": runs["fused"]["plan"]["arena_bytes"]},
             "standard": {"model": a.standard.name, "runtime": runtime(a.standard_python),
                          "arena_bytes": runs["standard"]["plan"]["arena_bytes"]}}
    # the losses: the one-element outputs that are not new state (`<state>.out`)
    losses = {form: [[v for n, v in s["outputs"].items() if not n.endswith(".out")] for s in r["per_step"]]
              for form, r in runs.items()}
    steps = [{"step": k, "fused": f, "standard": s, "relative_difference": abs(f - s) / max(abs(f), 1e-30)}
             for k, (fs, ss) in enumerate(zip(losses["fused"], losses["standard"]), 1) for f, s in zip(fs, ss)]
    worst = max((s["relative_difference"] for s in steps), default=0.0)
    return {**forms, "steps": steps, "largest_relative_difference": worst, "tolerance": a.tolerance,
            "within_tolerance": worst <= a.tolerance}


def table(results: dict) -> str:
    f, s = results["fused"], results["standard"]
    text = (f"Fused step {f['model']} on {f['runtime']} (plan arena {f['arena_bytes']:,} B); standard step "
            f"{s['model']} on {s['runtime']} (plan arena {s['arena_bytes']:,} B).\n\n")
    text += harness.markdown_table(
        ["step", f"loss, fused ({f['runtime']})", f"loss, standard ({s['runtime']})", "relative difference"],
        [[r["step"], f"{r['fused']:.9g}", f"{r['standard']:.9g}", f"{r['relative_difference']:.2e}"]
         for r in results["steps"]], "rrrr")
    return text + (f"\nLargest relative difference {results['largest_relative_difference']:.2e} "
                   f"(tolerance {results['tolerance']:g}: {'within' if results['within_tolerance'] else 'NOT within'}).\n")


if __name__ == "__main__":
    sys.exit("run it as: python -m benchmarks run runtime/runtimes [options]")
