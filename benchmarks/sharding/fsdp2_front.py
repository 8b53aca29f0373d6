"""roam's memory / cost front of a rank step, with FSDP2's three fixed policies beside it.

    python -m benchmarks run sharding/fsdp2_front [--row gpt2_small-n8] [--precision float32] [--points 8]

roam's side: `roam tradeoff RANK.onnx --device PROFILE --points N`, RANK the row's rank step as
sharding/fsdp2_compare shards it (its --work folder): verified plans from every gathered parameter
kept down to every one gathered again and past it, each with its per-rank bytes, what the rank sends
per step and the exposed communication its order leaves. FSDP2's side: sharding/fsdp2_compare's
record of the row, its peaks (FSDPMemTracker), bytes sent and estimated exposed time per policy
(`default`: the blocks gathered again in the backward, the root kept; `reshard`: every unit gathered
again; `keep`: none).

On the cost axis a policy sits where roam's price puts its gathers again: each unit FSDP2 gathers
again costs the ring's time on the same profile for its bytes (one collective per unit), as FLOPs of
the device (recompute/problem.py, GatherPrice), a share of the step's FLOPs. The picture (front.png,
front.svg) goes to --plot. Needs fsdp2_compare's rank step of the row; GPT-2 small's front takes
about 6 min on the 2-core machine."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import harness

TAKES = "about 6 min (GPT-2 small, 8 points); needs sharding/fsdp2_compare's rank step and record"
POLICIES = ("default", "reshard", "keep")


def regathered_units(policy: str, hand: dict) -> list[int]:
    """The gathered bytes of each unit FSDP2 gathers again in the backward under `policy`."""
    blocks = list(hand["block_gathered_bytes"])
    return {"default": blocks, "reshard": blocks + [hand["root_gathered_bytes"]], "keep": []}[policy]


def main(argv: list[str]) -> dict:
    from roam_cli import recompute
    from roam_cli.frontend.onnx_import import import_model
    from roam_cli.recompute.flops import graph_flops

    ap = harness.options(__name__, __doc__)
    ap.add_argument("--row", default="gpt2_small-n8")
    ap.add_argument("--precision", default="float32")
    ap.add_argument("--points", type=int, default=8)
    ap.add_argument("--compare", default="sharding/fsdp2_compare", help="the record of FSDP2's figures")
    ap.add_argument("--work", type=Path, default=harness.CACHE / "fsdp2_compare",
                    help="sharding/fsdp2_compare's --work (the rank steps)")
    ap.add_argument("--plot", type=Path, default=harness.RESULTS / "sharding" / "fsdp2_front",
                    help="the picture's folder")
    args = ap.parse_args(argv)
    row = next(r for r in harness.load(args.compare)["results"]
               if r["row"] == args.row and r["precision"] == args.precision)
    rank = harness.needs(args.work / f"{args.row}.{args.precision}.rank.onnx",
                         f"python -m benchmarks run sharding/fsdp2_compare --only {args.row} makes it")
    device = row["roam"]["device"]
    graph = import_model(rank).graph
    price = recompute.gather_price(graph, device)
    policies = {}
    for policy in POLICIES:
        run = row["fsdp2"][policy]
        policies[policy] = {"peak_bytes": run["peak"]["Total"],
                            "sent_bytes": sum(run["communication"][k] for k in (
                                "all_gather_forward_bytes", "all_gather_backward_bytes", "reduce_scatter_bytes"))
                            * (row["ranks"] - 1) // row["ranks"],
                            "exposed_seconds": row["fsdp2_estimate"][policy]["exposed_seconds"],
                            "price": sum(price.of(b) for b in regathered_units(policy, run["hand"]))}
    step_flops = graph_flops(graph)  # as the plans' records count it
    marks = []
    for policy, p in policies.items():
        marks += ["--mark", f"FSDP2 {policy}={p['peak_bytes']}@{100 * p['price'] / step_flops:.6f}%"]
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "roam_cli", "-q", "tradeoff", str(rank), "-o", str(Path(tmp) / "front.json"),
                   "--points", str(args.points), "--device", device, "--plot", str(args.plot), "--json"]
        front = json.loads(subprocess.run(command + marks, check=True, capture_output=True, text=True).stdout)
    return {"row": args.row, "precision": args.precision, "rank_step": str(rank), "device": device,
            "step_flops": step_flops, "roam": front, "fsdp2": policies}


def table(results: dict) -> str:
    rows = [[f"roam: {p['label']}", harness.mib(p["total_bytes"]), f"{p['price_pct']:.3f}",
             harness.gib(p["sent_bytes"]), f"{p['exposed_seconds'] * 1e3:.1f}"] for p in results["roam"]["points"]]
    rows += [[f"FSDP2 {policy}", harness.mib(p["peak_bytes"]), f"{100 * p['price'] / results['step_flops']:.3f}",
              harness.gib(p["sent_bytes"]), f"{p['exposed_seconds'] * 1e3:.1f}"]
             for policy, p in results["fsdp2"].items()]
    return harness.markdown_table([f"{results['row']} {results['precision']}", "per-rank MiB", "price, % of the step",
                                   "sent GiB", "exposed ms"], rows)


if __name__ == "__main__":
    sys.exit("run it as: python -m benchmarks run sharding/fsdp2_front [options]")
