#!/usr/bin/env python3
"""Order before/after: each suite full step planned by an earlier roam and by this one.

    git worktree add /tmp/before d66da7c && (cd /tmp/before && python setup.py build_ext --inplace)
    python benchmarks/order_before_after.py /work/suite_cache /tmp/before [--modes off,free] [--only resnet50]

For each `<suite>/<model>/full_step.onnx` (benchmarks/suite.py makes them) and each `--recompute`
mode, three `roam optimize STEP -o PLAN --jobs 2 --recompute MODE` commands, one after another:
`before`, the roam of the BEFORE tree (`PYTHONPATH=BEFORE`) with its defaults; `after`, this
roam with its defaults; `after --gap 0`, this roam with the before's stop rule (search until the
order is proven optimal or the time is out). Each runs under `/usr/bin/time -v` (wall time, CPU
time of the command and its workers, peak RSS; on a shared machine the CPU time is the figure
that compares runs); every plan is checked with this roam's `roam verify`. The table prints peak
live bytes, arena bytes, the order's lower bound and whether the order is proven optimal.
`--json` (default benchmarks/results/order_before_after.json) keeps the rows of the models not
run this time, so the suite can be run a model at a time."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ["resnet50", "gpt2_small", "vit_base", "bert_base", "t5_small", "gpt2_medium", "bert_large", "gpt2_large",
          "gpt2_xl"]  # benchmarks/suite.py's models, smallest first
GIB = 2**30


def plan(step: Path, out: Path, mode: str, tree: Path, extra: list[str]) -> dict:
    """One timed `roam optimize` of the roam in `tree`, and this roam's verdict on its plan."""
    env = os.environ | {"PYTHONPATH": str(tree)}
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "roam_cli", "-q", "optimize", str(step), "-o", str(out),
           "--jobs", "2", "--recompute", mode, *extra]
    t = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env, cwd=tree)
    wall = time.perf_counter() - t
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", run.stderr)
    cpu = sum(float(x) for x in re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", run.stderr))
    row = {"seconds": round(wall, 1), "cpu_seconds": round(cpu, 1), "rss_gib": round(int(rss.group(1)) / 2**20, 2)}
    if run.returncode != 0:
        lines = [line for line in run.stderr.splitlines() if not line.startswith("\t")]
        return row | {"failed": lines[-1] if lines else f"exit {run.returncode}"}
    p = json.loads(out.read_text())
    order = p["stats"]["order"]
    verified = subprocess.run([sys.executable, "-m", "roam_cli", "-q", "verify", str(step), str(out)],
                              capture_output=True, text=True, check=False, cwd=ROOT).returncode == 0
    return row | {"peak_live_bytes": p["peak_live_bytes"], "arena_bytes": p["arena_bytes"],
                  "bound_bytes": order.get("lower_bound_bytes"), "proven": order.get("proven_optimal"),
                  "verified": verified}


def row_md(r: dict) -> str:
    head = f"| {r['model']} | {r['mode']} | {r['version']} | {r['seconds']:.1f} | {r['cpu_seconds']:.1f} | {r['rss_gib']:.2f} | "
    if "failed" in r:
        return head + f"failed: {r['failed']} | | | | |"
    bound = "–" if r["bound_bytes"] is None else f"{r['bound_bytes'] / GIB:.4f}"
    return head + (f"{r['peak_live_bytes'] / GIB:.4f} | {r['arena_bytes'] / GIB:.4f} | {bound} | "
                   f"{'yes' if r['proven'] else 'no'} | {'yes' if r['verified'] else 'NO'} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suite", type=Path, help="benchmarks/suite.py's output folder")
    ap.add_argument("before", type=Path, help="a worktree of the earlier roam, its C extensions built in place")
    ap.add_argument("--modes", default="off,free")
    ap.add_argument("--only", default=",".join(MODELS), help="comma-separated models (default: all)")
    ap.add_argument("--json", dest="json_out", type=Path, default=ROOT / "benchmarks/results/order_before_after.json")
    args = ap.parse_args(argv)
    models = args.only.split(",")
    versions = [("before", args.before.resolve(), []), ("after", ROOT, []), ("after --gap 0", ROOT, ["--gap", "0"])]
    kept = json.loads(args.json_out.read_text())["rows"] if args.json_out.exists() else []
    rows = [r for r in kept if r["model"] not in models]
    meta = {"date": datetime.date.today().isoformat(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
            **{name: subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True).stdout.strip() for name, tree, _ in versions[:2]}}
    print("| model | recompute | roam | wall s | CPU s | peak RSS GiB | peak live GiB | arena GiB | bound GiB | proven | verifies |\n"
          "|---|---|---|---:|---:|---:|---:|---:|---:|---|---|", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for model in models:
            step = args.suite / model / "full_step.onnx"
            if not step.exists():
                raise SystemExit(f"{step} is missing: make it with benchmarks/suite.py --only {model}")
            for mode in args.modes.split(","):
                for version, tree, extra in versions:
                    r = {"model": model, "mode": mode, "version": version}
                    r |= plan(step, Path(tmp) / "plan.json", mode, tree, extra)
                    rows.append(r)
                    print(row_md(r), flush=True)
                    rows.sort(key=lambda r: MODELS.index(r["model"]))  # stable: a model's rows in run order
                    args.json_out.write_text(json.dumps(meta | {"rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
