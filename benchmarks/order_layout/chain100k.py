"""A synthetic chain of N Relu nodes (default 10,000 to 100,000): does `roam optimize` load and plan it
with a fast strategy in bounded time and memory, and does `roam verify` check it?

Every Relu writes into its input (ONNX Runtime's in-place kernel), so the chain is one storage of N
names. Each command runs as its own process: its wall time and peak resident memory (from wait4),
the plan's own time per phase, and the planning time (the phases after import) per node. The
exponent k of n^k says how the planning time grows from the smallest chain to the largest: 1 is
linear, 2 quadratic.

    python -m benchmarks run order_layout/chain100k                  # 10,000, 20,000, 50,000 and 100,000 nodes
    python -m benchmarks run order_layout/chain100k.small --nodes 1000 2000 --order original --layout first-fit

Needs only roam; about 2 minutes on two cores. (tests/cli/test_hostile.py builds its chains with
`chain` and times them with `measure`.)"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from benchmarks import harness

TAKES = "about 2 min; needs only roam"


def chain(n: int) -> onnx.ModelProto:
    """x -> Relu -> Relu -> ... (n nodes) over float[64] tensors: one 256-byte tensor per node."""
    nodes = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"], name=f"relu{i}") for i in range(n)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [64])],
                              [helper.make_tensor_value_info(f"t{n}", TensorProto.FLOAT, [64])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def measure(args: list[str]) -> tuple[int, float, int, str]:
    """(exit code, wall seconds, peak RSS bytes, stderr) of one process."""
    start = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, time.perf_counter() - start, usage.ru_maxrss * 1024, stderr


def main(argv: list[str]) -> dict:
    ap = harness.options(__name__, __doc__)
    ap.add_argument("--nodes", type=int, nargs="+", default=[10_000, 20_000, 50_000, 100_000])
    ap.add_argument("--order", default="original")
    ap.add_argument("--layout", default="first-fit")
    args = ap.parse_args(argv)
    rows = []
    roam = [sys.executable, "-m", "roam_cli", "-q"]
    with tempfile.TemporaryDirectory() as d:
        for n in args.nodes:
            model_path, plan_path = Path(d) / f"chain{n}.onnx", Path(d) / f"chain{n}.json"
            onnx.save(chain(n), str(model_path))
            code, wall, rss, err = measure([*roam, "optimize", str(model_path), "-o", str(plan_path),
                                            "--order", args.order, "--layout", args.layout])
            row = {"nodes": n, "optimize_exit": code, "optimize_s": round(wall, 2), "optimize_rss_mib": round(rss / 2**20),
                   "phases": None, "planning_us_per_node": None, "verify_exit": None, "verify_s": None,
                   "verify_rss_mib": None, "error": None}
            if code == 0:
                seconds = json.loads(plan_path.read_text())["stats"]["seconds"]
                row["phases"] = {k: round(v, 2) for k, v in seconds.items()}
                row["planning_us_per_node"] = round(sum(v for k, v in seconds.items() if k != "import") / n * 1e6)
                code, wall, rss, err = measure([*roam, "verify", str(model_path), str(plan_path)])
                row.update(verify_exit=code, verify_s=round(wall, 2), verify_rss_mib=round(rss / 2**20))
            if code != 0:
                row["error"] = err.strip()[-300:]
            rows.append(row)
            print(f"{n:,} nodes: optimize {row['optimize_s']} s, verify {row['verify_s']} s", file=sys.stderr,
                  flush=True)
    planned = {r["nodes"]: r["planning_us_per_node"] for r in rows if r["planning_us_per_node"]}
    exponent = None
    if len(planned) > 1:
        (a, ta), (b, tb) = min(planned.items()), max(planned.items())
        exponent = round(1 + math.log(tb / ta) / math.log(b / a), 2)
    if any(r["error"] for r in rows):
        print("a command failed: " + next(r["error"] for r in rows if r["error"]), file=sys.stderr)
    return {"order": args.order, "layout": args.layout, "rows": rows, "exponent": exponent}


def table(results: dict) -> str:
    def phases(r):
        return ", ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in r["phases"].items()) if r["phases"] else ""

    def seconds(v):
        return "–" if v is None else f"{v:.1f}"

    lines = [[f"{r['nodes']:,}", f"{r['optimize_s']:.1f}" + ("" if r["optimize_exit"] == 0 else f" (exit {r['optimize_exit']})"),
              seconds(r["verify_s"]) + ("" if r["verify_exit"] in (0, None) else f" (exit {r['verify_exit']})"),
              f"{r['optimize_rss_mib']:,}", "–" if r["planning_us_per_node"] is None else r["planning_us_per_node"],
              phases(r) or r["error"] or ""] for r in results["rows"]]
    grows = (f" The planning time grows as n^{results['exponent']:.2f} from the smallest chain to the largest "
             "(1 is linear)." if results["exponent"] is not None else "")
    return (harness.markdown_table(["nodes", "optimize s", "verify s", "peak RSS MiB (optimize)", "planning µs/node",
                                   "plan phases (s)"], lines, "rrrrrl")
            + f"\n`roam optimize --order {results['order']} --layout {results['layout']}`, then `roam verify`, each "
            f"in its own process; wall time includes about a second of the process's start.{grows}\n")
