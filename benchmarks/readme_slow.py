#!/usr/bin/env python3
"""The README's slow commands on its sample (issue 41): wall and CPU seconds, and their answers.

    python benchmarks/readme_slow.py [--before DIR] [--repeat N] [--json benchmarks/results/readme_slow.json]

Makes the sample's full step (`make-training-graph sample_models/gpt2_tiny/training_model.onnx
--in-graph-optimizer`) in a temporary folder and times, one at a time, with their defaults:
`tradeoff STEP -o front.json --plot pictures/`, `tradeoff STEP -o front.json --offload host`,
`optimize STEP -o plan.json --recompute budget --budget 2.4GiB` (the README's line: the sample
fits it without recomputing) and `--budget 2.4MiB` (between the sample's recompute floor and its
plan without recomputation: a budget the recomputation has to meet). CPU seconds are the
command's and its child processes' (user + system, from getrusage). `--before DIR`: a checkout
of another revision (with its C extensions built in place) timed the same way, command by
command beside this one, on the same step. Each answer is printed too: the front's (memory,
extra FLOPs) pairs, and the budget plan's bytes and extra FLOPs."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_models" / "gpt2_tiny" / "training_model.onnx"
LIMIT_SECONDS = 10  # issue 41: the README's commands on its sample

COMMANDS = [  # (arguments, what it writes that holds the answer)
    (["tradeoff", "step.onnx", "-o", "front.json", "--plot", "pictures"], "front.json"),
    (["tradeoff", "step.onnx", "-o", "front_offload.json", "--offload", "host"], "front_offload.json"),
    (["optimize", "step.onnx", "-o", "budget_readme.json", "--recompute", "budget", "--budget", "2.4GiB"],
     "budget_readme.json"),
    (["optimize", "step.onnx", "-o", "budget.json", "--recompute", "budget", "--budget", "2.4MiB"], "budget.json"),
]


def timed(tree: Path, args: list[str], cwd: Path) -> tuple[float, float, int]:
    """(wall s, CPU s of the command and its children, exit code) of `python -m roam_cli` from `tree`"""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    code = subprocess.run([sys.executable, "-m", "roam_cli", "-q", *args], cwd=cwd, capture_output=True, check=False,
                          env=os.environ | {"PYTHONPATH": str(tree)}).returncode
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), code


def answer(path: Path) -> object:
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if "offload" in data:
        return [[p["device_bytes"], round(p["seconds"], 6)] for p in data["points"]]
    if "points" in data:
        return [[p["total_bytes"], p["extra_flops"]] for p in data["points"]]
    return {"needed_bytes": data["persistent_bytes"] + data["arena_bytes"], "peak_live_bytes": data["peak_live_bytes"],
            "extra_flops": data.get("recompute", {}).get("extra_flops")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="another checkout to time beside this one")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each command per tree (the least wall and CPU kept)")
    ap.add_argument("--json", dest="json_out", type=Path)
    args = ap.parse_args(argv)
    trees = ([("before", args.before.resolve())] if args.before else []) + [("after", ROOT)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run([sys.executable, "-m", "roam_cli", "-q", "make-training-graph", str(SAMPLE), "-o", "step.onnx",
                        "--in-graph-optimizer"], cwd=work, check=True, env=os.environ | {"PYTHONPATH": str(ROOT)})
        for cmd, out in COMMANDS:
            row = {"command": "roam " + " ".join(cmd).replace("pictures", "pictures/")}
            for label, tree in trees:
                runs = []
                for _ in range(args.repeat):
                    folder = work / label
                    folder.mkdir(exist_ok=True)
                    (folder / "step.onnx").write_bytes((work / "step.onnx").read_bytes())
                    runs.append(timed(tree, cmd, folder))
                row[label] = {"wall_s": round(min(r[0] for r in runs), 1), "cpu_s": round(min(r[1] for r in runs), 1),
                              "exit": runs[-1][2], "answer": answer(work / label / out)}
            rows.append(row)
            cells = " | ".join(f"{row[label]['wall_s']} | {row[label]['cpu_s']}" for label, _ in trees)
            print(f"| `{row['command']}` | {cells} |", flush=True)
    print()
    for row in rows:
        for label, _ in trees:
            print(f"{label}: {row['command']} -> exit {row[label]['exit']}: {json.dumps(row[label]['answer'])}")
    slow = [r["command"] for r in rows if r["after"]["wall_s"] > LIMIT_SECONDS]
    print(f"\n{len(rows) - len(slow)} of {len(rows)} within {LIMIT_SECONDS} s wall" + (f"; over: {', '.join(slow)}" if slow else ""))
    if args.json_out:
        meta = {"date": datetime.date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                f"Python {platform.python_version()}", "command": "python benchmarks/readme_slow.py " + " ".join(
                    sys.argv[1:] if argv is None else argv)}
        args.json_out.write_text(json.dumps(meta | {"rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
