#!/usr/bin/env python3
"""roam's memory / cost front of a rank step with FSDP2's three fixed policies beside it (issue 40).

    python benchmarks/fsdp2_front.py [--row gpt2_small-n8] [--precision float32] [--points 8] \\
        [--plot benchmarks/results/fsdp2_front] [--json benchmarks/results/fsdp2_front.json]

roam's side: `roam tradeoff RANK.onnx --device PROFILE --points N`, RANK the row's rank step as
benchmarks/fsdp2_compare.py shards it (its --work folder, default /work/fsdp2_compare): verified
plans from every gathered parameter kept to every one gathered again and past it, each with its
per-rank bytes, what the rank sends per step, and the exposed communication the plan's order
leaves (docs/sharding.md). FSDP2's side: benchmarks/results/fsdp2_compare.json's row, its peaks
(FSDPMemTracker), bytes sent and estimated exposed time per policy (`default`: the blocks gathered
again in the backward, the root kept; `reshard`: every unit gathered again; `keep`: none).

On the picture's cost axis a policy sits where roam's price puts its gathers again: each unit
FSDP2 gathers again costs the ring's time on the same profile for its bytes (one collective per
unit), as FLOPs of the device (recompute/problem.py, GatherPrice), a share of the step's FLOPs."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from roam_cli import recompute  # noqa: E402
from roam_cli.frontend.onnx_import import import_model  # noqa: E402
from roam_cli.recompute.flops import graph_flops  # noqa: E402

MIB, GIB = 2**20, 2**30
POLICIES = ("default", "reshard", "keep")


def regathered_units(policy: str, hand: dict) -> list[int]:
    """The gathered bytes of each unit FSDP2 gathers again in the backward under `policy`."""
    blocks = list(hand["block_gathered_bytes"])
    return {"default": blocks, "reshard": blocks + [hand["root_gathered_bytes"]], "keep": []}[policy]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--row", default="gpt2_small-n8")
    ap.add_argument("--precision", default="float32")
    ap.add_argument("--points", type=int, default=8)
    ap.add_argument("--compare", type=Path, default=ROOT / "benchmarks/results/fsdp2_compare.json",
                    help="benchmarks/fsdp2_compare.py's JSON (FSDP2's figures, the rank step's path)")
    ap.add_argument("--plot", type=Path, default=ROOT / "benchmarks/results/fsdp2_front")
    ap.add_argument("--json", dest="json_out", type=Path, default=ROOT / "benchmarks/results/fsdp2_front.json")
    args = ap.parse_args(argv)
    row = next(r for r in json.loads(args.compare.read_text())["rows"]
               if r["row"] == args.row and r["precision"] == args.precision)
    rank, device = Path(row["roam"]["rank_step"]), row["roam"]["device"]
    graph = import_model(rank).graph
    price = recompute.gather_price(graph, device)
    front_path = args.json_out.with_name(args.json_out.stem + ".roam.json")
    marks, policies = [], {}
    for policy in POLICIES:
        run = row["fsdp2"][policy]
        units = regathered_units(policy, run["hand"])
        policies[policy] = {"peak_bytes": run["peak"]["Total"],
                            "sent_bytes": sum(run["communication"][k] for k in (
                                "all_gather_forward_bytes", "all_gather_backward_bytes", "reduce_scatter_bytes"))
                            * (row["ranks"] - 1) // row["ranks"],
                            "exposed_seconds": row["fsdp2_estimate"][policy]["exposed_seconds"],
                            "price": sum(price.of(b) for b in units)}
    command = [sys.executable, "-m", "roam_cli", "-q", "tradeoff", str(rank), "-o", str(front_path), "--points",
               str(args.points), "--device", device, "--plot", str(args.plot), "--json"]
    step_flops = graph_flops(graph)  # as the plans' records count it
    for policy, p in policies.items():
        marks += ["--mark", f"FSDP2 {policy}={p['peak_bytes']}@{100 * p['price'] / step_flops:.6f}%"]
    front = json.loads(subprocess.run(command + marks, check=True, capture_output=True, text=True).stdout)
    print(f"| {args.row} {args.precision} | per-rank MiB | price, % of the step | sent GiB | exposed ms |")
    print("|---|---:|---:|---:|---:|")
    for p in front["points"]:
        print(f"| roam: {p['label']} | {p['total_bytes'] / MIB:,.0f} | {p['price_pct']:.3f} | "
              f"{p['sent_bytes'] / GIB:.2f} | {p['exposed_seconds'] * 1e3:.1f} |")
    for policy, p in policies.items():
        print(f"| FSDP2 {policy} | {p['peak_bytes'] / MIB:,.0f} | {100 * p['price'] / step_flops:.3f} | "
              f"{p['sent_bytes'] / GIB:.2f} | {p['exposed_seconds'] * 1e3:.1f} |")
    args.json_out.write_text(json.dumps({"row": args.row, "precision": args.precision, "rank_step": str(rank),
                                         "device": device, "step_flops": step_flops, "roam": front,
                                         "fsdp2": policies}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
