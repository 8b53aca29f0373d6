"""A synthetic chain of N Relu nodes (default 10,000 to 100,000): does `roam optimize` load and
plan it with a fast strategy in bounded time and memory, and does `roam verify` check it? Every
Relu writes into its input (ONNX Runtime's in-place kernel), so the chain is one storage of N names.

    python benchmarks/chain100k.py                       # 10,000, 20,000, 50,000 and 100,000 nodes
    python benchmarks/chain100k.py --nodes 100000 --order original --layout first-fit

Each command runs as its own process; the table gives its wall time and peak resident memory
(from wait4) and microseconds per node of it (a second or so of it is the process's start), the
plan's own time per phase, and the planning time (the phases after import) per node. The last
line gives how the planning time grows from the smallest chain to the largest, as the exponent k
of n^k: 1 is linear, 2 quadratic."""

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx
from onnx import TensorProto, helper


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[10_000, 20_000, 50_000, 100_000])
    ap.add_argument("--order", default="original")
    ap.add_argument("--layout", default="first-fit")
    args = ap.parse_args()

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"roam optimize --order {args.order} --layout {args.layout}")
    print(f"{'nodes':>8} {'command':9} {'exit':>4} {'wall s':>7} {'wall µs/node':>12} {'peak RSS MiB':>12} "
          f"{'plan µs/node':>12}   plan phases (s)")
    failed = False
    planning: dict[int, float] = {}  # nodes -> µs per node
    with tempfile.TemporaryDirectory() as d:
        for n in args.nodes:
            model_path, plan_path = Path(d) / f"chain{n}.onnx", Path(d) / f"chain{n}.json"
            onnx.save(chain(n), str(model_path))
            roam = [sys.executable, "-m", "roam_cli"]
            code, wall, rss, err = measure([*roam, "-q", "optimize", str(model_path), "-o", str(plan_path),
                                            "--order", args.order, "--layout", args.layout])
            phases, us = "", ""
            if code == 0:
                seconds = json.loads(plan_path.read_text())["stats"]["seconds"]
                phases = ", ".join(f"{k} {v:.1f}" for k, v in seconds.items())
                planning[n] = sum(v for k, v in seconds.items() if k != "import") / n * 1e6
                us = f"{planning[n]:.0f}"
            print(f"{n:>8} {'optimize':9} {code:>4} {wall:>7.1f} {wall / n * 1e6:>12.0f} {rss / 2**20:>12.0f} "
                  f"{us:>12}   {phases or err.strip()}")
            failed |= code != 0
            if code == 0:
                code, wall, rss, err = measure([*roam, "-q", "verify", str(model_path), str(plan_path)])
                print(f"{n:>8} {'verify':9} {code:>4} {wall:>7.1f} {wall / n * 1e6:>12.0f} {rss / 2**20:>12.0f} "
                      f"{'':>12}   {err.strip()}")
                failed |= code != 0
    if len(planning) > 1:
        (a, ta), (b, tb) = min(planning.items()), max(planning.items())
        print(f"planning time from {a:,} to {b:,} nodes: ~ n^{1 + math.log(tb / ta) / math.log(b / a):.2f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
