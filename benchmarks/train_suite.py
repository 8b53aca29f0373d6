#!/usr/bin/env python3
"""Every suite model, from its inference export to 20 training steps, with roam's install only.

    python benchmarks/train_suite.py /work/suite_cache [--only gpt2_small,bert_base] [--steps 20]

Run it in an environment made by the README's install (today's onnxruntime, no torch, no
onnxruntime-training). For the bundled sample's full step and for each `<suite>/<model>/forward.onnx`
(`benchmarks/suite.py`): `roam make-training-graph FORWARD -o step.onnx --in-graph-optimizer`
(roam's backward; the suite's loss: the model's own, or cross-entropy for image classifiers), `roam optimize`, `roam verify`, `roam train --steps N --json`.
Prints one markdown row per model: the seconds of each command, the plan's arena, what ORT held,
the requests served at their plan offsets, and the first and last loss; or the command that failed
and its last line."""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from backward import suite_loss  # noqa: E402  (the loss the suite trains each model with)

SAMPLE = ROOT / "sample_models" / "gpt2_tiny" / "training_model.onnx"
MIB = 2**20


def roam(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    t = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "roam_cli", "-q", *map(str, args)], capture_output=True, text=True)
    return run, time.perf_counter() - t


def row(name: str, source: Path, loss: str | None, folder: Path, steps: int) -> str:
    step, plan = folder / f"{name}.step.onnx", folder / f"{name}.plan.json"
    made = ["make-training-graph", source, "-o", step, "--in-graph-optimizer"] + (["--loss", loss] if loss else [])
    seconds = []
    for args in (made, ["optimize", step, "-o", plan], ["verify", step, plan],
                 ["train", step, "--plan", plan, "--steps", steps, "--json"]):
        run, s = roam(*args)
        seconds.append(s)
        if run.returncode:
            last = (run.stderr or run.stdout).strip().splitlines()[-1:] or [f"exit {run.returncode}"]
            return f"| {name} | `roam {args[0]}` failed (exit {run.returncode}): {last[0]} |"
    report = json.loads(run.stdout)
    losses = [s["outputs"]["loss"] for s in report["per_step"]]
    memory = report["per_step"][-1]["memory"]
    return (f"| {name} | {' / '.join(f'{s:.0f}' for s in seconds)} | {report['plan']['arena_bytes'] / MIB:,.2f} | "
            f"{memory['bytes_held'] / MIB:,.2f} | {memory['served_at_plan_offset']} of {memory['planned_requests']} | "
            f"{memory['unplanned']} | {losses[0]:.4f} → {losses[-1]:.4f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite", type=Path, help="benchmarks/suite.py's output folder")
    ap.add_argument("--only", help="comma-separated models (default: every one with a forward.onnx)")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    import onnxruntime

    print(f"Python {platform.python_version()}, onnxruntime {onnxruntime.__version__}, {platform.machine()}")
    print("| model | seconds: make-training-graph / optimize / verify / train | plan arena MiB | ORT held MiB, "
          "last step | served at plan offset | unplanned | loss, step 1 → last |\n|---|---|---:|---:|---:|---:|---|")
    folders = sorted(p.parent for p in args.suite.glob("*/forward.onnx"))
    folders = [f for f in folders if not args.only or f.name in args.only.split(",")]
    with tempfile.TemporaryDirectory() as scratch:
        print(row("sample (GPT-2 tiny)", SAMPLE, None, Path(scratch), args.steps), flush=True)
        for folder in folders:
            print(row(folder.name, folder / "forward.onnx", suite_loss(folder / "forward.onnx"), Path(scratch), args.steps),
                  flush=True)


if __name__ == "__main__":
    main()
