"""The README's commands on its bundled sample, each timed with its defaults: every one within 10 s?

    python -m benchmarks run scale/readme_sample

Runs, in a temporary folder, the commands README.md shows, on `sample_models/gpt2_tiny`: the
training graph as shipped (ONNX Runtime's artifacts, fused ops) and the full step
`make-training-graph --in-graph-optimizer` makes of it (standard ONNX), with `STEP.onnx` and
`MODEL.onnx` in the README read as those (`max-batch` is left out: the sample has no symbolic
dimension to search). Commands that need onnxruntime-training (`execute` on
the fused graph, `--ort-optimized`) are skipped where it is not installed. Prints one row per
command: wall seconds, exit code, and for a plan what its report says of the order. Needs only
roam (onnxruntime-training for the two fused commands); about 2 minutes."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness

TAKES = "about 2 min; needs only roam (onnxruntime-training for two commands)"
ROOT = harness.ROOT
SAMPLE = ROOT / "sample_models" / "gpt2_tiny" / "training_model.onnx"
LIMIT_SECONDS = 10  # issue 33: every command of the README on its sample


def commands(fused: bool) -> list[tuple[list[str], str | None]]:
    """(arguments, the plan it writes or None), in the README's order."""
    s = str(SAMPLE)
    out = [(["optimize", s, "-o", "plan.json"], "plan.json"),
           (["verify", s, "plan.json"], None),
           (["report", "plan.json"], None),
           (["plot", "plan.json", "-o", "pictures"], None),
           (["export", "plan.json", "--perfetto", "trace.json", "--memory-snapshot", "snapshot.pickle"], None),
           (["make-training-graph", s, "-o", "step.onnx", "--in-graph-optimizer"], None),
           (["optimize", "step.onnx", "-o", "step_plan.json"], "step_plan.json"),
           (["train", "step.onnx", "--plan", "step_plan.json", "--steps", "20", "--compare"], None),
           (["execute", "step.onnx", "--plan", "step_plan.json"], None),
           (["optimize", "step.onnx", "-o", "free.json", "--recompute", "free"], "free.json"),
           (["optimize", "step.onnx", "-o", "free_gap.json", "--recompute", "free", "--gap", "0.01"], "free_gap.json"),
           (["optimize", "step.onnx", "-o", "budget.json", "--recompute", "budget", "--budget", "2.4MiB"],
            "budget.json"),
           (["tradeoff", "step.onnx", "-o", "front.json"], None),
           (["lower", s, "-o", "lowered.onnx"], None)]
    if fused:
        out += [(["execute", s, "--plan", "plan.json"], None),
                (["optimize", s, "-o", "ort_plan.json", "--ort-optimized"], "ort_plan.json")]
    return out


def order_line(plan: Path) -> str:
    stats = json.loads(plan.read_text())
    order = stats["stats"]["order"]
    if order.get("proven_optimal"):
        return "proven optimal"
    return f"within {100 * (stats['peak_live_bytes'] / order['lower_bound_bytes'] - 1):.2f} %"


def main(argv: list[str]) -> dict:
    harness.options(__name__, __doc__).parse_args(argv)
    from roam_cli.frontend.providers import TRAINING_OPS

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for cmd, plan in commands(bool(TRAINING_OPS)):
            t = time.perf_counter()
            code = subprocess.run([sys.executable, "-m", "roam_cli", "-q", *cmd], cwd=tmp, capture_output=True,
                                  check=False).returncode
            row = {"command": "roam " + " ".join(c.replace(str(ROOT) + "/", "") for c in cmd),
                   "seconds": round(time.perf_counter() - t, 1), "exit": code,
                   "order": order_line(Path(tmp, plan)) if plan and code == 0 else ""}
            rows.append(row)
            print(f"{row['command']}: {row['seconds']} s, exit {code}", file=sys.stderr, flush=True)
    return {"rows": rows}


def table(results: dict) -> str:
    rows = results["rows"]
    slow = [r["command"] for r in rows if r["seconds"] > LIMIT_SECONDS]
    return (harness.markdown_table(["command", "wall s", "exit", "order"],
                                   [[f"`{r['command']}`", r["seconds"], r["exit"], r["order"]] for r in rows], "lrrl")
            + f"\n{len(rows) - len(slow)} of {len(rows)} within {LIMIT_SECONDS} s"
            + (f"; over: {', '.join(f'`{c}`' for c in slow)}" if slow else "") + ".\n")
