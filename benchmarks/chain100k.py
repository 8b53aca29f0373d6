"""A synthetic chain of N Relu nodes (default 10,000 and 100,000): does `roam optimize` load and
plan it with a fast strategy in bounded time and memory, and does `roam verify` check it?

    python benchmarks/chain100k.py                       # 10,000 and 100,000 nodes
    python benchmarks/chain100k.py --nodes 100000 --order original --layout first-fit

Each command runs as its own process; the table gives its wall time and peak resident memory
(from wait4), and the plan's own time per phase."""

import argparse
import json
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
    ap.add_argument("--nodes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--order", default="original")
    ap.add_argument("--layout", default="first-fit")
    args = ap.parse_args()

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"roam optimize --order {args.order} --layout {args.layout}")
    header = f"{'nodes':>8} {'command':9} {'exit':>4} {'wall s':>7} {'peak RSS MiB':>12}   plan phases (s)"
    print(header)
    failed = False
    with tempfile.TemporaryDirectory() as d:
        for n in args.nodes:
            model_path, plan_path = Path(d) / f"chain{n}.onnx", Path(d) / f"chain{n}.json"
            onnx.save(chain(n), str(model_path))
            roam = [sys.executable, "-m", "roam_cli"]
            code, wall, rss, err = measure([*roam, "-q", "optimize", str(model_path), "-o", str(plan_path),
                                            "--order", args.order, "--layout", args.layout])
            phases = ""
            if code == 0:
                seconds = json.loads(plan_path.read_text())["stats"]["seconds"]
                phases = ", ".join(f"{k} {v:.1f}" for k, v in seconds.items())
            print(f"{n:>8} {'optimize':9} {code:>4} {wall:>7.1f} {rss / 2**20:>12.0f}   {phases or err.strip()}")
            failed |= code != 0
            if code == 0:
                code, wall, rss, err = measure([*roam, "-q", "verify", str(model_path), str(plan_path)])
                print(f"{n:>8} {'verify':9} {code:>4} {wall:>7.1f} {rss / 2**20:>12.0f}   {err.strip()}")
                failed |= code != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
