"""Offload on the suite's steps: roam's device-memory / estimated-time front against fixed policies, and two budgets.

    python -m benchmarks run tiers/offload --points 3 [--suite DIR] [--scale DIR] [--only gpt2_small,resnet50]
    python -m benchmarks run tiers/offload.budgets --skip-fronts --only gpt2_small,70b --plans DIR

Needs the suite's full steps (`python -m benchmarks.suite`, the bench extra) and, for the 70B-class
step, scale/scale's `base` export under --scale; roam alone runs here. The fronts take 2 to 15 min
per suite step and 45 min for the 70B-class step on the 2-core machine (about 2 h in all, with the
budgets: the 70B-class step's takes 13 min more).

For every full step under --suite (<model>/full_step.onnx) and the 70B-class step under --scale,
runs `roam tradeoff STEP --offload host --device P` and records, per fixed policy (keep,
save_on_cpu, ZeRO-Offload, every persistent byte on the host, recompute only), its device bytes and
estimated step time and the front's point that beats it (less device memory at no more estimated
time), or none. Then two budgets: GPT-2 small's step at 1 GiB on the device, and the
70B-class step on an 80 GB device (the PCIe Gen5 profile) with every persistent byte on the host,
each through `roam optimize --offload host --budget B --gap 0.01`, with the plan's device bytes,
host bytes and estimated time. Times are estimates from the profile's figures (roam_cli/cost)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness

TAKES = "about 2 h (9 suite steps and the 70B-class step); needs the suite and scale/scale's 70B-class export"
GiB = 2**30
SEVENTY_B = "70b-eager-mha-loss-model-1x512"
POLICIES = {"keep": "keep everything", "save_on_cpu": "save_on_cpu", "zero_offload": "ZeRO-Offload",
            "all_on_host": "all persistent on the host", "recompute_only": "recompute only"}


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


def main(argv: list[str]) -> dict:
    ap = harness.options(__name__, __doc__)
    ap.add_argument("--suite", type=Path, default=harness.CACHE / "suite", help="the suite's steps (default %(default)s)")
    ap.add_argument("--scale", type=Path, default=harness.CACHE / "scale",
                    help=f"scale/scale's exports, <scale>/{SEVENTY_B}/full_step.onnx (default %(default)s)")
    ap.add_argument("--only", default=None, help="comma-separated model names (the suite's and '70b')")
    ap.add_argument("--device", default="pcie-gen4-gpu")
    ap.add_argument("--points", type=int, default=4)
    ap.add_argument("--skip-fronts", action="store_true", help="only the two budgets")
    ap.add_argument("--plans", type=Path, default=None, help="keep the budgets' plans (and annotated models) here")
    a = ap.parse_args(argv)
    only = set(a.only.split(",")) if a.only else None
    steps = {p.parent.name: p for p in sorted(a.suite.glob("*/full_step.onnx"))}
    steps["70b"] = a.scale / SEVENTY_B / "full_step.onnx"
    steps = {k: v for k, v in steps.items() if (only is None or k in only) and v.is_file()}
    if not steps:
        harness.needs(a.suite, "python -m benchmarks.suite (the bench extra), or --suite DIR")
        sys.exit(f"no full_step.onnx under {a.suite} or {a.scale / SEVENTY_B} for --only {a.only}")
    results = {"device": a.device, "fronts": {}, "budgets": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if not a.skip_fronts:
            for name, step in steps.items():
                f = results["fronts"][name] = front(step, a.device, a.points, tmp / f"{name}.json")
                print(f"{name}: {f.get('error') or str(f['plans_weighed']) + ' plans'}", file=sys.stderr, flush=True)
        for name, budget, device in (("gpt2_small", GiB, a.device), ("70b", 80 * 10**9, "pcie-gen5-gpu")):
            if name not in steps:
                continue
            kept = a.plans if a.plans is not None else tmp
            kept.mkdir(parents=True, exist_ok=True)
            r = results["budgets"][name] = fit(steps[name], budget, device, kept / f"{name}_fit.json") | {"device": device}
            print(f"{name} at {budget / GiB:.2f} GiB: exit {r['exit']}", file=sys.stderr, flush=True)
    return results


def table(results: dict) -> str:
    """The fronts, one row per step: each fixed policy's device GiB and estimated ms, and how much less
    device memory roam's front needs at no more estimated time; then the budgets."""
    text = []
    if results["fronts"]:
        body = []
        for name, f in results["fronts"].items():
            if "error" in f:
                body.append([name, "error: " + f["error"][:80]] + [""] * len(POLICIES))
                continue
            by_policy = {p["policy"]: p for p in f["policies"]}
            cells = []
            for policy in POLICIES:
                p = by_policy.get(policy)
                if p is None:
                    cells.append("–")
                    continue
                by = p["dominated_by"]
                less = None if by is None else 100 * (1 - by["device_bytes"] / p["device_bytes"])
                cells.append(f"{p['device_bytes'] / GiB:.3f} @ {1e3 * p['seconds']:.1f} → " + (
                    "none" if less is None else f"−{less:.{1 if less < 10 else 0}f} %"))
            least = min(f["points"], key=lambda p: p["device_bytes"])
            body.append([name, *cells, f"{least['device_bytes'] / GiB:.3f} @ {1e3 * least['seconds']:.1f}",
                         f"{f['plans_weighed']} / {f['wall_seconds']:.0f}"])
        text.append(harness.markdown_table(["step", *POLICIES.values(), "least on roam's front", "plans / s"], body,
                                           "l" + "r" * (len(POLICIES) + 2)))
        text.append(f"Device GiB @ estimated ms ({results['device']}) of each fixed policy, each planned in full by roam; "
                    "→ −N %: the point of roam's front that needs N % less device memory at no more estimated time "
                    "(none: the front passes through the policy, not below it).\n")
    if results["budgets"]:
        body = []
        for name, r in results["budgets"].items():
            if r["exit"] != 0:
                body.append([name, size(r["budget_bytes"]), r["device"], f"exit {r['exit']}: {r.get('error', '')[:80]}",
                             "", "", "", "", "", f"{r['wall_seconds']:.0f}"])
                continue
            body.append([name, size(r["budget_bytes"]), r["device"], r["policy"], f"{r['device_bytes'] / GiB:.3f}",
                         f"{r['device_persistent_bytes'] / GiB:.3f}", f"{r['host_bytes'] / GiB:.1f}", r["transfers"],
                         f"{1e3 * r['seconds']:.1f} ({1e3 * r['keep_seconds']:.1f} keeping {r['keep_device_bytes'] / GiB:.1f} GiB)",
                         f"{r['wall_seconds']:.0f}"])
        text.append(harness.markdown_table(["step", "budget", "device profile", "plan", "device GiB",
                                            "of which persistent", "host GiB", "transfers", "estimated ms",
                                            "plan s"], body, "lrllrrrrrr"))
    return "\n".join(text)


def size(n: int) -> str:
    return f"{n / 10**9:g} GB" if n % 10**9 == 0 else f"{n / GiB:g} GiB"
