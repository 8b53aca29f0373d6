"""Every request at its plan offset? The exporter corpus's full steps trained on their plans.

    python -m benchmarks run runtime/corpus_offsets [--cache DIR] [--precisions fp32,bf16] [--steps 3]

The census's corpus steps (`python -m benchmarks.scale.census --build corpus`: 26 architectures,
exported by torch's dynamo exporter with `optimize=False` and with its default, each made a full
AdamW step by `make-training-graph --in-graph-optimizer`), float32 and bf16 AMP (bf16 emulated in
float32 on the CPU, `roam emulate`, which has no bfloat16 kernels), each planned (`roam optimize`,
its defaults) and trained `--steps` steps with `--compare` (the same steps on plain ONNX Runtime).
Per step after the first: the requests at their plan offsets against the plan's requests, the
requests the plan does not serve (it stops the run without `--allow-unplanned`), and whether the
planned run is bit-equal to the plain one."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import harness

TAKES = "about 10 min (98 steps); needs the census's corpus steps (--build corpus, torch)"


def roam(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "roam_cli", "-q", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, check=False)


def one(step: Path, precision: str, steps: int) -> dict:
    row = {"step": f"{step.parent.name} {precision}"}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = step
        if precision == "bf16":
            r = roam("emulate", step, "-o", work / "emulated.onnx", cwd=work)
            if r.returncode:
                return row | {"failed": "emulate: " + r.stderr.strip()[-200:]}
            model = work / "emulated.onnx"
        r = roam("optimize", model, "-o", work / "plan.json", cwd=work)
        if r.returncode:
            return row | {"failed": "optimize: " + r.stderr.strip()[-200:]}
        r = roam("train", model, "--plan", work / "plan.json", "--steps", steps, "--compare", "--allow-unplanned",
                 "--json", cwd=work)
        if not r.stdout.strip():
            return row | {"failed": "train: " + r.stderr.strip()[-200:]}
        result = json.loads(r.stdout)
    later = [s["memory"] for s in result["per_step"][1:]]
    c = result["compare"]
    return row | {"planned": later[0]["planned_requests"], "at_plan": min(m["served_at_plan_offset"] for m in later),
                  "unplanned": max(m["unplanned"] for m in later), "bit_equal": c["bit_equal"],
                  "differs": max(c["outputs_max_rel"], c["state_max_rel"])}


def main(argv: list[str]) -> dict:
    ap = harness.options(__name__, __doc__)
    ap.add_argument("--cache", type=Path, default=harness.CACHE / "census")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args(argv)
    corpus = harness.needs(a.cache / "corpus", "python -m benchmarks.scale.census --build corpus")
    rows = []
    for precision in a.precisions.split(","):
        for step in sorted(corpus.glob(f"*/step.{precision}.onnx")):
            rows.append(one(step, precision, a.steps))
            print(rows[-1], file=sys.stderr, flush=True)
    return {"rows": rows, "steps": a.steps}


def table(results: dict) -> str:
    rows = results["rows"]
    ran = [r for r in rows if "failed" not in r]
    short = [r for r in ran if r["at_plan"] < r["planned"] or r["unplanned"] or not r["bit_equal"]]
    body = harness.markdown_table(
        ["step", "requests at their plan offset (least over steps 2+)", "unplanned", "against plain ORT"],
        [[r["step"], f"{r['at_plan']} of {r['planned']}", r["unplanned"],
          "bit-equal" if r["bit_equal"] else f"differs {r['differs']:.2g}"] for r in short]
        + [[r["step"], "failed", "", r["failed"]] for r in rows if "failed" in r], "lrrl")
    full = sum(r["at_plan"] == r["planned"] for r in ran)
    return (f"{len(ran)} steps trained ({results['steps']} steps each, `--compare`): {full} with every request "
            f"at its plan offset, {sum(r['unplanned'] == 0 for r in ran)} with no request outside the plan, "
            f"{sum(r['bit_equal'] for r in ran)} bit-equal to plain ONNX Runtime; "
            f"{len(rows) - len(ran)} not trained. The rest:\n\n" + body)
