#!/usr/bin/env python3
"""Memory tiers on the suite's steps: roam's device-memory / estimated-time front against the
fixed policies users know, and the budgets the issue names.

    python benchmarks/offload.py [--suite /work/suite_cache] [--scale /work/scale_cache]
        [--only gpt2_small,resnet50] [--device pcie-gen4-gpu] [--points 4] [--json benchmarks/results/offload.json]

For every full step under --suite (benchmarks/suite.py's exports: <model>/full_step.onnx) and the
70B-class step under --scale (benchmarks/scale.py's `base` variant), runs `roam tradeoff STEP
--offload host --device P --json` and prints, per fixed policy (keep, save_on_cpu, ZeRO-Offload,
every persistent byte on the host, recompute only), its device bytes and estimated step time and
the front's point that beats it (less device memory at no more estimated time), or "none". Then
the issue's two budgets: GPT-2 small's step at 1 GiB on the device, and the 70B-class step on an
80 GB device (the PCIe Gen5 profile) with every persistent byte on the host, each through `roam
optimize --offload host --budget B`, with the plan's device bytes, host bytes and estimated time.
Times are estimates from the profile's figures (roam_cli/cost)."""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GiB = 2**30
SEVENTY_B = "70b-eager-mha-loss-model-1x512"


def roam(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "roam_cli", *args], capture_output=True, text=True)


def front(step: Path, device: str, points: int, out: Path) -> dict:
    start = time.perf_counter()
    done = roam("-q", "tradeoff", str(step), "-o", str(out), "--offload", "host", "--device", device,
                "--points", str(points))
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(out.read_text()) | {"wall_seconds": time.perf_counter() - start}


def fit(step: Path, budget: int, device: str, out: Path) -> dict:
    start = time.perf_counter()
    done = roam("-q", "optimize", str(step), "-o", str(out), "--offload", "host", "--budget", str(budget),
                "--device", device, "--gap", "0.01")
    row = {"budget_bytes": budget, "exit": done.returncode, "wall_seconds": time.perf_counter() - start}
    if done.returncode != 0:
        return row | {"error": done.stderr.strip()}
    plan = json.loads(out.read_text())
    o = plan["offload"]
    keep = next(c for c in o["candidates"] if c["policy"] == "keep")
    return row | {"policy": o["policy"], "device_bytes": plan["persistent_bytes"] + plan["arena_bytes"],
                  "device_persistent_bytes": plan["persistent_bytes"],
                  "host_bytes": plan["tiers"]["persistent_bytes"] + plan["tiers"]["arena_bytes"],
                  "seconds": o["estimate"]["seconds"], "keep_seconds": keep["estimate"]["seconds"],
                  "keep_device_bytes": keep["device_bytes"], "transfers": len(o["transfers"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", type=Path, default=Path("/work/suite_cache"))
    ap.add_argument("--scale", type=Path, default=Path("/work/scale_cache"))
    ap.add_argument("--only", default=None, help="comma-separated model names (the suite's and '70b')")
    ap.add_argument("--device", default="pcie-gen4-gpu")
    ap.add_argument("--points", type=int, default=4)
    ap.add_argument("--skip-fronts", action="store_true", help="only the two budgets")
    ap.add_argument("--plans", type=Path, default=None, help="keep the budgets' plans (and annotated models) here")
    ap.add_argument("--json", type=Path, default=None, help="written after each step, so a stopped run keeps what it measured")
    a = ap.parse_args()
    only = set(a.only.split(",")) if a.only else None
    steps = {p.parent.name: p for p in sorted(a.suite.glob("*/full_step.onnx"))}
    steps["70b"] = a.scale / SEVENTY_B / "full_step.onnx"
    steps = {k: v for k, v in steps.items() if (only is None or k in only) and v.is_file()}
    results = {"machine": f"{platform.node()} {platform.machine()}, Python {platform.python_version()}",
               "date": datetime.date.today().isoformat(), "device": a.device, "fronts": {}, "budgets": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if not a.skip_fronts:
            print(f"{'model':<12} {'policy':<15} {'device GiB':>10} {'est. ms':>9}   beaten by (GiB at ms)")
            for name, step in steps.items():
                f = results["fronts"][name] = front(step, a.device, a.points, tmp / f"{name}.json")
                if "error" in f:
                    print(f"{name:<12} error: {f['error']}")
                    continue
                for p in f["policies"]:
                    by = p["dominated_by"]
                    beaten = "none" if by is None else f"{by['device_bytes'] / GiB:.3f} at {1e3 * by['seconds']:.2f}"
                    print(f"{name:<12} {p['policy']:<15} {p['device_bytes'] / GiB:>10.3f} {1e3 * p['seconds']:>9.2f}   {beaten}")
                least = min(f["points"], key=lambda p: p["device_bytes"])
                print(f"{name:<12} {'least on front':<15} {least['device_bytes'] / GiB:>10.3f} "
                      f"{1e3 * least['seconds']:>9.2f}   ({f['plans_weighed']} plans, {f['wall_seconds']:.0f} s)")
                save(results, a.json)
        for name, budget, device in (("gpt2_small", GiB, a.device), ("70b", 80 * 10**9, "pcie-gen5-gpu")):
            if name not in steps:
                continue
            kept = a.plans if a.plans is not None else tmp
            kept.mkdir(parents=True, exist_ok=True)
            r = results["budgets"][name] = fit(steps[name], budget, device, kept / f"{name}_fit.json") | {"device": device}
            save(results, a.json)
            if r["exit"] != 0:
                print(f"{name} at {budget / GiB:.2f} GiB ({device}): exit {r['exit']}: {r.get('error')}")
                continue
            print(f"{name} at {budget / GiB:.2f} GiB ({device}): {r['policy']}, device {r['device_bytes'] / GiB:.3f} GiB "
                  f"(persistent {r['device_persistent_bytes'] / GiB:.3f}), host {r['host_bytes'] / GiB:.1f} GiB, "
                  f"est. {1e3 * r['seconds']:.1f} ms vs keeping everything {r['keep_device_bytes'] / GiB:.1f} GiB at "
                  f"{1e3 * r['keep_seconds']:.1f} ms; {r['wall_seconds']:.0f} s to plan")
    save(results, a.json)


def save(results: dict, path: Path | None) -> None:
    if path is not None:
        path.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
