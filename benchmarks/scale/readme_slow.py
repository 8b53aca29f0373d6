"""The README's slow commands on its sample: wall and CPU seconds, and their answers.

    python -m benchmarks run scale/readme_slow [--repeat N]

Makes the sample's full step (`make-training-graph sample_models/gpt2_tiny/training_model.onnx
--in-graph-optimizer`) in a temporary folder and times, one at a time, with their defaults:
`tradeoff STEP -o front.json --plot pictures/`, `tradeoff STEP -o front.json --offload host`,
`optimize STEP -o plan.json --recompute budget --budget 2.4GiB` (the README's line: the sample
fits it without recomputing) and `--budget 2.4MiB` (between the sample's recompute floor and its
plan without recomputation: a budget the recomputation has to meet). CPU seconds are the
command's and its child processes' (user + system, from getrusage); with --repeat N the least
of N runs is kept. Each answer is recorded too: the front's (memory, extra FLOPs) pairs, and the
budget plan's bytes and extra FLOPs. Needs only roam; about 1 minute per repeat."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness

TAKES = "about 1 min per --repeat; needs only roam"
ROOT = harness.ROOT
SAMPLE = ROOT / "sample_models" / "gpt2_tiny" / "training_model.onnx"
LIMIT_SECONDS = 10  # issue 41: the README's commands on its sample

COMMANDS = [  # (arguments, what it writes that holds the answer)
    (["tradeoff", "step.onnx", "-o", "front.json", "--plot", "pictures"], "front.json"),
    (["tradeoff", "step.onnx", "-o", "front_offload.json", "--offload", "host"], "front_offload.json"),
    (["optimize", "step.onnx", "-o", "budget_readme.json", "--recompute", "budget", "--budget", "2.4GiB"],
     "budget_readme.json"),
    (["optimize", "step.onnx", "-o", "budget.json", "--recompute", "budget", "--budget", "2.4MiB"], "budget.json"),
]


def timed(args: list[str], cwd: Path) -> tuple[float, float, int]:
    """(wall s, CPU s of the command and its children, exit code) of `python -m roam_cli`"""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    code = subprocess.run([sys.executable, "-m", "roam_cli", "-q", *args], cwd=cwd, capture_output=True,
                          check=False).returncode
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


def main(argv: list[str]) -> dict:
    ap = harness.options(__name__, __doc__)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each command (the least wall and CPU kept)")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run([sys.executable, "-m", "roam_cli", "-q", "make-training-graph", str(SAMPLE), "-o", "step.onnx",
                        "--in-graph-optimizer"], cwd=work, check=True)
        for cmd, out in COMMANDS:
            runs = [timed(cmd, work) for _ in range(args.repeat)]
            rows.append({"command": "roam " + " ".join(cmd).replace("pictures", "pictures/"),
                         "wall_s": round(min(r[0] for r in runs), 1), "cpu_s": round(min(r[1] for r in runs), 1),
                         "exit": runs[-1][2], "answer": answer(work / out)})
            print(f"{rows[-1]['command']}: {rows[-1]['wall_s']} s", file=sys.stderr, flush=True)
    return {"repeat": args.repeat, "rows": rows}


def table(results: dict) -> str:
    rows = results["rows"]

    def said(a) -> str:
        if a is None:
            return "–"
        if isinstance(a, dict):
            return f"needs {a['needed_bytes']:,} B, {a['extra_flops'] or 0:,} extra FLOPs"
        return f"{len(a)} points, {min(p[0] for p in a):,} B at the lowest"

    slow = [r["command"] for r in rows if r["wall_s"] > LIMIT_SECONDS]
    return (harness.markdown_table(["command", "wall s", "CPU s", "exit", "answer"],
                                   [[f"`{r['command']}`", r["wall_s"], r["cpu_s"], r["exit"], said(r["answer"])]
                                    for r in rows], "lrrrl")
            + f"\nThe least of {results['repeat']} run(s) of each; {len(rows) - len(slow)} of {len(rows)} within "
            f"{LIMIT_SECONDS} s wall.\n")
