"""roam's plans on CUDAExecutionProvider beside the CPU: `roam execute` of each model, then `roam train`
of the sample's full step allocating from roam's arena.

    python -m benchmarks run runtime/cuda_check [MODEL.onnx ...] [--providers cuda,cpu] [--order roam]
    python -m benchmarks run runtime/cuda_check.cpu --providers cpu     # the same tables without a GPU

For the bundled sample's artifacts graph and each training graph given: `roam optimize --order
ORDER`, then `roam execute --provider P --json` per provider (the plan's order as ORT ran it, the
arena replay against a plain run, ORT's own arena in the original and the plan's order). Then the
sample's full step (`make-training-graph --in-graph-optimizer`): `roam train --provider P --steps 8
--compare --json`, ORT's session allocating from roam's arena (CUDA: through the provider's
gpu_external_alloc), checked against a plain ORT session.

Needs ONNX Runtime's GPU build in place of the CPU one (`pip uninstall -y onnxruntime && pip install
onnxruntime-gpu`; for fused graphs onnxruntime-training, its own environment) and a GPU; stops when
CUDA is asked for and not available. A minute for the sample."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import harness

TAKES = "a minute (the sample); needs a GPU and onnxruntime-gpu (--providers cpu: roam's install)"
SAMPLE = harness.ROOT / "sample_models" / "gpt2_tiny" / "training_model.onnx"


def roam(*args) -> tuple[int, str, str]:
    run = subprocess.run([sys.executable, "-m", "roam_cli", *map(str, args)], capture_output=True, text=True)
    return run.returncode, run.stdout, (run.stderr.strip().splitlines() or [""])[-1]


def main(argv: list[str]) -> dict:
    import onnxruntime as ort

    ap = harness.options(__name__, __doc__)
    ap.add_argument("models", nargs="*", type=Path, help="training graphs beside the sample's")
    ap.add_argument("--providers", default="cuda,cpu", help="comma-separated: cuda, cpu")
    ap.add_argument("--order", default="roam", help="optimize --order of the plans")
    args = ap.parse_args(argv)
    providers = args.providers.split(",")
    if "cuda" in providers and "CUDAExecutionProvider" not in ort.get_available_providers():
        sys.exit("CUDA is not available: install onnxruntime-gpu in place of onnxruntime on a CUDA machine")
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False).stdout.strip() if "cuda" in providers else None
    executed, trained = [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for k, model in enumerate([SAMPLE, *args.models]):
            plan = work / f"plan{k}.json"
            code, _, line = roam("-q", "optimize", model, "-o", plan, "--order", args.order)
            if code:
                executed.append({"model": str(model), "failed": f"optimize: {line}"})
                continue
            for provider in providers:
                code, out, line = roam("execute", model, "--plan", plan, "--provider", provider, "--json")
                executed.append(json.loads(out) | {"exit": code} if out.strip() else
                                {"model": str(model), "provider": provider, "failed": f"execute exit {code}: {line}"})
        step, plan = work / "step.onnx", work / "step_plan.json"
        roam("-q", "make-training-graph", SAMPLE, "-o", step, "--in-graph-optimizer")
        roam("-q", "optimize", step, "-o", plan)
        for provider in providers:
            code, out, line = roam("train", step, "--plan", plan, "--provider", provider, "--steps", 8, "--compare",
                                   "--json")
            if not out.strip():
                trained.append({"provider": provider, "failed": f"train exit {code}: {line}"})
                continue
            r = json.loads(out)
            c = r["compare"]
            trained.append({"provider": provider, "exit": code, "arena_bytes": r["arena"]["arena_bytes"],
                            "plan_arena_bytes": r["plan"]["arena_bytes"], "requests": r["arena"]["requests"],
                            "unplanned": sum(s["memory"].get("unplanned", 0) for s in r["per_step"][1:]),
                            "loss_max_rel": c["outputs_max_rel"], "state_max_rel": c["state_max_rel"]})
    return {"gpu": gpu, "order": args.order, "execute": executed, "train": trained}


def table(results: dict) -> str:
    rows = []
    for r in results["execute"]:
        if "failed" in r:
            rows.append([Path(r["model"]).name, r.get("provider", "–"), f"failed: {r['failed']}"] + [""] * 8)
            continue
        a, rp = r["ort_arena_bytes"], r["replay"]
        rows.append([Path(r["model"]).name, r["provider"], r["plan"]["order_strategy"], f"{r['order']['agreement']:.4%}",
                     "n/a" if rp["max_rel"] is None else f"{rp['max_rel']:.1e}",
                     f"{rp['bitwise_equal']}/{rp['tensors']}",
                     f"{a['original_order']['next_power_of_two'] or 0:,}", f"{a['original_order']['same_as_requested'] or 0:,}",
                     f"{a['plan_order']['same_as_requested'] or 0:,}", f"{r['plan']['arena_bytes']:,}",
                     "; ".join(r["failures"]) or "OK"])
    text = harness.markdown_table(
        ["model", "provider", "order", "agreement", "replay max rel", "bitwise equal", "ORT pow2, original order B",
         "ORT exact, original order B", "ORT exact, plan order B", "roam arena B", "result"], rows, "lllrrrrrrrl")
    rows = [[r["provider"], f"failed: {r['failed']}"] + [""] * 5 if "failed" in r else
            [r["provider"], f"{r['arena_bytes']:,}", f"{r['plan_arena_bytes']:,}", r["requests"], r["unplanned"],
             f"{r['loss_max_rel']:.1e}", f"{r['state_max_rel']:.1e}"] for r in results["train"]]
    return text + "\n" + harness.markdown_table(
        ["roam train, sample full step: provider", "arena B", "plan arena B", "requests", "unplanned after step 1",
         "loss max rel", "state max rel"], rows)


if __name__ == "__main__":
    sys.exit("run it as: python -m benchmarks run runtime/cuda_check [options]")
