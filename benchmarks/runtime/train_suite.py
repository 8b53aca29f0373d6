"""Every suite model, from its inference export to 20 training steps, with roam's install only.

    python -m benchmarks run runtime/train_suite [--suite benchmarks/.cache/suite] [--only gpt2_small,bert_base] [--steps 20]

Run it in an environment made by the README's install (today's onnxruntime, no torch, no
onnxruntime-training). For the bundled sample and each `<suite>/<model>/forward.onnx` (the suite's
weightless inference exports, `python -m benchmarks.suite`): `roam make-training-graph FORWARD -o
step.onnx --in-graph-optimizer` (roam's backward; the suite's loss: the model's own, or cross-entropy
for the image classifiers), `roam optimize`, `roam verify`, `roam train --steps N --json` (synthetic
parameters and one synthetic batch, repeated: the loss falls as the step learns it). Per model: the
seconds of each command, the plan's arena, what ORT held in the last step, the requests served at
their plan offsets, and the first and last loss; or the command that failed and its last line.
About 20 min for the suite's smaller models on the 2-core machine."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness

TAKES = "about 20 min (the suite's smaller models); roam's install only; needs the suite (python -m benchmarks.suite)"
SAMPLE = harness.ROOT / "sample_models" / "gpt2_tiny" / "training_model.onnx"
COMMANDS = ("make-training-graph", "optimize", "verify", "train")


def roam(*args) -> tuple[subprocess.CompletedProcess, float]:
    t = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "roam_cli", "-q", *map(str, args)], capture_output=True, text=True)
    return run, time.perf_counter() - t


def row(name: str, source: Path, loss: str | None, folder: Path, steps: int) -> dict:
    step, plan = folder / f"{name}.step.onnx", folder / f"{name}.plan.json"
    made = ["make-training-graph", source, "-o", step, "--in-graph-optimizer"] + (["--loss", loss] if loss else [])
    seconds = {}
    for args in (made, ["optimize", step, "-o", plan], ["verify", step, plan],
                 ["train", step, "--plan", plan, "--steps", steps, "--json"]):
        run, seconds[args[0]] = roam(*args)
        if run.returncode:
            last = (run.stderr or run.stdout).strip().splitlines()[-1:] or [f"exit {run.returncode}"]
            return {"model": name, "failed": args[0], "exit": run.returncode, "line": last[0], "seconds": seconds}
    report = json.loads(run.stdout)
    memory = report["per_step"][-1]["memory"]
    return {"model": name, "seconds": seconds, "plan_arena_bytes": report["plan"]["arena_bytes"],
            "held_bytes": memory["bytes_held"], "served_at_plan_offset": memory["served_at_plan_offset"],
            "planned_requests": memory["planned_requests"], "unplanned": memory["unplanned"],
            "losses": [s["outputs"]["loss"] for s in report["per_step"]]}


def main(argv: list[str]) -> list[dict]:
    from benchmarks.exporters.backward import suite_loss

    ap = harness.options(__name__, __doc__)
    ap.add_argument("--suite", type=Path, default=harness.CACHE / "suite", help="the suite's folder")
    ap.add_argument("--only", help="comma-separated models (default: every one with a forward.onnx)")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args(argv)
    folders = sorted(p.parent for p in harness.needs(args.suite, "python -m benchmarks.suite makes it")
                     .glob("*/forward.onnx"))
    folders = [f for f in folders if not args.only or f.name in args.only.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        rows.append(row("sample (GPT-2 tiny)", SAMPLE, None, Path(scratch), args.steps))
        for folder in folders:
            print(f"{folder.name}...", file=sys.stderr, flush=True)
            rows.append(row(folder.name, folder / "forward.onnx", suite_loss(folder / "forward.onnx"), Path(scratch),
                            args.steps))
    return rows


def table(results: list[dict]) -> str:
    rows = []
    for r in results:
        seconds = " / ".join(f"{r['seconds'][c]:.0f}" if c in r["seconds"] else "–" for c in COMMANDS)
        if "failed" in r:
            rows.append([r["model"], seconds, f"`roam {r['failed']}` failed (exit {r['exit']}): {r['line']}"]
                        + [""] * 4)
            continue
        rows.append([r["model"], seconds, harness.mib(r["plan_arena_bytes"], 2), harness.mib(r["held_bytes"], 2),
                     f"{r['served_at_plan_offset']:,} of {r['planned_requests']:,}", r["unplanned"],
                     f"{r['losses'][0]:.4f} → {r['losses'][-1]:.4f}"])
    return harness.markdown_table(
        ["model", "seconds: make-training-graph / optimize / verify / train", "plan arena MiB",
         "ORT held MiB, last step", "served at plan offset", "unplanned", "loss, step 1 → last"], rows, "llrrrrl")


if __name__ == "__main__":
    sys.exit("run it as: python -m benchmarks run runtime/train_suite [options]")
