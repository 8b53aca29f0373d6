"""The same training step on two ONNX Runtimes, each in an environment of its own (they ship the
same `onnxruntime` module): ORT's fused full step on onnxruntime-training, and its standard-ONNX
form (`roam lower`) on today's onnxruntime. Both are planned by roam and trained with `roam train`
(the plan's order and arena) from the same inputs; every step's loss is compared.

    python benchmarks/runtimes.py FUSED.onnx STANDARD.onnx --fused-python PY --standard-python PY [--steps 20]

Each interpreter needs roam's dependencies; roam itself comes from this checkout (PYTHONPATH).
Prints one row per step and exits 1 when a loss differs by more than --tolerance (relative)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from roam_cli.frontend.synthetic import synthesize  # noqa: E402

GENERATED = {"optimizer_state"}  # plan kinds roam train starts at zero itself
LEARNING_RATE = "learning_rate"


def roam(python: str, *args) -> str:
    proc = subprocess.run([python, "-m", "roam_cli", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        sys.exit(f"{python} roam {args[0]}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def runtime(python: str) -> str:
    proc = subprocess.run([python, "-c", "from roam_cli.frontend.providers import RUNTIME; print(RUNTIME)"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    return proc.stdout.strip()


def inputs(model: Path, plan: dict, seed: int) -> dict[str, np.ndarray]:
    """Every input roam train would synthesise, drawn once here so that both runs read the same."""
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fused", type=Path)
    ap.add_argument("standard", type=Path)
    ap.add_argument("--fused-python", required=True, help="an interpreter with onnxruntime-training")
    ap.add_argument("--standard-python", required=True, help="an interpreter with today's onnxruntime")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tolerance", type=float, default=1e-4)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="roam-runtimes-") as scratch:
        folder = Path(scratch)
        plans = {"fused": plan(a.fused_python, a.fused, folder, "fused"),
                 "standard": plan(a.standard_python, a.standard, folder, "standard")}
        feeds = folder / "inputs.npz"
        np.savez(feeds, **inputs(a.fused, json.loads(plans["fused"].read_text()), a.seed))
        runs = {"fused": train(a.fused_python, a.fused, plans["fused"], feeds, a.steps),
                "standard": train(a.standard_python, a.standard, plans["standard"], feeds, a.steps)}
    names = {"fused": runtime(a.fused_python), "standard": runtime(a.standard_python)}
    # the losses: the one-element outputs that are not new state (`<state>.out`)
    losses = {form: [[v for n, v in s["outputs"].items() if not n.endswith(".out")] for s in r["per_step"]]
              for form, r in runs.items()}
    print(f"fused step {a.fused} on {names['fused']}; standard step {a.standard} on {names['standard']}")
    print(f"plans: fused arena {runs['fused']['plan']['arena_bytes']:,} B, "
          f"standard arena {runs['standard']['plan']['arena_bytes']:,} B")
    print(f"| step | loss, fused ({names['fused']}) | loss, standard ({names['standard']}) | relative difference |")
    print("|---:|---:|---:|---:|")
    worst = 0.0
    for k, (fs, ss) in enumerate(zip(losses["fused"], losses["standard"]), 1):
        for f, s in zip(fs, ss):
            rel = abs(f - s) / max(abs(f), 1e-30)
            worst = max(worst, rel)
            print(f"| {k} | {f:.9g} | {s:.9g} | {rel:.2e} |")
    print(f"largest relative difference {worst:.2e} (tolerance {a.tolerance:g})")
    sys.exit(0 if worst <= a.tolerance else 1)


if __name__ == "__main__":
    main()
