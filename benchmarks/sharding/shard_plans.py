"""A step's rank plans against its single-device plan: what one rank holds, sends and waits for.

    python -m benchmarks run sharding/shard_plans [--step STEP.onnx] [--ranks 2,4,8] [--device nvlink4-gpu]

Without --step, the README's sample step (`make-training-graph --in-graph-optimizer` of
sample_models/gpt2_tiny, 2 × 32 tokens per rank). The full step and `roam shard` of it at each N are
planned with `roam optimize --recompute off` and `free`, each plan checked by `roam verify`. Per
plan: the bytes one rank holds (persistent, arena), the all-gathers (and how many gather again in the
backward), the bytes each rank sends per step, and the communication's estimated time on the
profile with its exposed part; the seconds of `roam optimize` (its own process). About 2 min on the
2-core machine; roam's install only."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness

TAKES = "about a minute (the sample step, N = 2, 4, 8); roam's install only"
SAMPLE = harness.ROOT / "sample_models" / "gpt2_tiny" / "training_model.onnx"


def roam(*args) -> float:
    t = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "roam_cli", "-q", *map(str, args)], capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"roam {' '.join(map(str, args))}: {(run.stderr or run.stdout).strip()}")
    return time.perf_counter() - t


def row(step: Path, folder: Path, ranks: int | None, mode: str, device: str) -> dict:
    """The figures of one plan: the full step (ranks None) or its rank step at `ranks`."""
    graph = step
    if ranks is not None:
        graph = folder / f"rank{ranks}.onnx"
        if not graph.exists():
            roam("shard", step, "--ranks", ranks, "-o", graph)
    out = folder / f"{graph.stem}-{mode}.json"
    extra = ["--device", device] if ranks is not None else []
    seconds = roam("optimize", graph, "-o", out, "--recompute", mode, *extra)
    plan = json.loads(out.read_text())
    roam("verify", folder / plan["model"]["path"], out)
    r = {"ranks": ranks, "recompute": mode, "persistent_bytes": plan["persistent_bytes"],
         "arena_bytes": plan["arena_bytes"], "optimize_seconds": round(seconds, 1)}
    c = plan.get("sharding", {}).get("communication")
    if c is not None:
        r |= {"all_gathers": c["all_gather"]["count"], "regathered": c["all_gather"]["regathered"],
              "sent_bytes": c["sent_bytes"], "seconds": c["seconds"], "exposed_seconds": c["exposed_seconds"]}
    return r


def main(argv: list[str]) -> dict:
    p = harness.options(__name__, __doc__)
    p.add_argument("--step", type=Path, help="a full training step (default: the README's sample step)")
    p.add_argument("--ranks", default="2,4,8", help="comma-separated N")
    p.add_argument("--device", default="nvlink4-gpu", help="device profile of the communication estimate")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        step = args.step
        if step is None:
            step = folder / "step.onnx"
            roam("make-training-graph", SAMPLE, "-o", step, "--in-graph-optimizer")
        rows = [row(step, folder, None, mode, args.device) for mode in ("off", "free")]
        rows += [row(step, folder, int(n), mode, args.device) for n in args.ranks.split(",") for mode in ("off", "free")]
    return {"step": str(args.step) if args.step else "the sample step (gpt2_tiny, batch 2 x 32 per rank)",
            "device": args.device, "rows": rows}


def table(results: dict) -> str:
    def kib(n):
        return "–" if n is None else f"{n / 1024:,.1f}"

    rows = []
    for r in results["rows"]:
        cells = ["1 device" if r["ranks"] is None else f"{r['ranks']} ranks", r["recompute"],
                 kib(r["persistent_bytes"]), kib(r["arena_bytes"]), kib(r["persistent_bytes"] + r["arena_bytes"])]
        if "sent_bytes" in r:
            cells += [f"{r['all_gathers']} ({r['regathered']} again)", kib(r["sent_bytes"]),
                      f"{r['seconds'] * 1e6:,.1f}", f"{r['exposed_seconds'] * 1e6:,.1f}"]
        else:
            cells += ["–"] * 4
        rows.append(cells + ["–" if r["optimize_seconds"] is None else f"{r['optimize_seconds']:.1f}"])
    return harness.markdown_table(
        ["plan", "recompute", "persistent KiB", "arena KiB", "per rank KiB", "all-gathers", "sent KiB",
         f"comm µs ({results['device']})", "exposed µs", "optimize s"], rows, "ll" + "r" * 8)


if __name__ == "__main__":
    sys.exit("run it as: python -m benchmarks run sharding/shard_plans [options]")
