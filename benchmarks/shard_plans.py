#!/usr/bin/env python3
"""A step's rank plans against its single-device plan: one run, one table (docs/sharding.md).

    python benchmarks/shard_plans.py [--step STEP.onnx] [--ranks 2,4,8] [--device nvlink4-gpu]

Without --step, the README's sample step (make-training-graph --in-graph-optimizer of
sample_models/gpt2_tiny). The full step and `roam shard` of it at each N are planned with
`roam optimize --recompute off` and `free`, each plan checked by `roam verify`. Per plan: the
bytes one rank holds (persistent, arena, their sum), the all-gathers (those gathering again in
the backward), the bytes each rank sends per step, and the communication's estimated time on the
profile with its exposed part. Each command runs as its own process; its wall time is printed."""

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
SAMPLE = ROOT / "sample_models" / "gpt2_tiny" / "training_model.onnx"
KIB = 1024


def roam(*args) -> float:
    t = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "roam_cli", "-q", *map(str, args)], capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"roam {' '.join(map(str, args))}: {(run.stderr or run.stdout).strip()}")
    return time.perf_counter() - t


def row(step: Path, folder: Path, ranks: int | None, mode: str, device: str) -> list[str]:
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
    cells = [("1 device" if ranks is None else f"{ranks} ranks"), mode,
             f"{plan['persistent_bytes'] / KIB:,.1f}", f"{plan['arena_bytes'] / KIB:,.1f}",
             f"{(plan['persistent_bytes'] + plan['arena_bytes']) / KIB:,.1f}"]
    c = plan.get("sharding", {}).get("communication")
    if c is None:
        cells += ["–"] * 4
    else:
        ag = c["all_gather"]
        cells += [f"{ag['count']} ({ag['regathered']} again)", f"{c['sent_bytes'] / KIB:,.1f}",
                  f"{c['seconds'] * 1e6:,.1f}", f"{c['exposed_seconds'] * 1e6:,.1f}"]
    return cells + [f"{seconds:.1f}"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--step", type=Path, help="a full training step (default: the README's sample step)")
    p.add_argument("--ranks", default="2,4,8", help="comma-separated N")
    p.add_argument("--device", default="nvlink4-gpu", help="device profile of the communication estimate")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        step = args.step
        if step is None:
            step = folder / "step.onnx"
            roam("make-training-graph", SAMPLE, "-o", step, "--in-graph-optimizer")
        rows = [row(step, folder, None, mode, args.device) for mode in ("off", "free")]
        rows += [row(step, folder, int(n), mode, args.device) for n in args.ranks.split(",") for mode in ("off", "free")]
    header = ["plan", "recompute", "persistent KiB", "arena KiB", "per rank KiB", "all-gathers", "sent KiB",
              f"comm µs ({args.device})", "exposed µs", "optimize s"]
    print(f"{step.name if args.step else 'the sample step (gpt2_tiny, batch 2 x 32 per rank)'}; "
          f"{platform.machine()}, Python {platform.python_version()}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" if i < 2 else "---:" for i in range(len(header))) + "|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
