#!/usr/bin/env python3
"""What lowering costs in memory: each training graph fused (ONNX Runtime's training ops) and
lowered (`roam lower`, standard ONNX), planned with the same options, side by side.

    python benchmarks/lower.py                                  # the bundled sample
    python benchmarks/lower.py /work/suite_cache --only gpt2_small,bert_base,resnet50
    python benchmarks/lower.py step.onnx other/training_model.onnx -- --time-limit 60

A folder stands for every training_model.onnx and full_step.onnx under it. Options after `--`
go to both `roam optimize` runs. Prints one row per graph: nodes fused -> lowered, peak live and
arena bytes of both plans, and the lowered plan's arena as a multiple of the fused one's (issue
18 asks for at most 1.02)."""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_models" / "gpt2_tiny" / "training_model.onnx"
GRAPHS = ("training_model.onnx", "full_step.onnx")
MIB = 2**20


def roam(*args: str) -> str:
    run = subprocess.run([sys.executable, "-m", "roam_cli", "-q", *args], capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"roam {' '.join(args)}: {(run.stderr or run.stdout).strip().splitlines()[-1]}")
    return run.stdout


def graphs(paths: list[Path], only: set[str] | None) -> list[Path]:
    found = []
    for p in paths:
        found += sorted(q for name in GRAPHS for q in p.rglob(name)) if p.is_dir() else [p]
    return [g for g in found if not only or g.parent.name in only]


def measure(graph: Path, folder: Path, extra: list[str]) -> dict:
    lowered = folder / f"{graph.parent.name}-{graph.stem}.lowered.onnx"
    summary = json.loads(roam("lower", str(graph), "-o", str(lowered), "--json"))
    row = {"graph": f"{graph.parent.name}/{graph.name}", "nodes": (summary["nodes_before"], summary["nodes_after"]),
           "nonstandard_after": summary["nonstandard_after"]}
    for form, path in (("fused", graph), ("lowered", lowered)):
        plan_path = folder / f"{lowered.stem}.{form}.json"
        t = time.perf_counter()
        roam("optimize", str(path), "-o", str(plan_path), *extra)
        plan = json.loads(plan_path.read_text())
        row[form] = {"peak_live_bytes": plan["peak_live_bytes"], "arena_bytes": plan["arena_bytes"],
                     "persistent_bytes": plan["persistent_bytes"], "seconds": round(time.perf_counter() - t, 1)}
    row["ratio"] = row["lowered"]["arena_bytes"] / row["fused"]["arena_bytes"]
    return row


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", type=Path, default=[SAMPLE])
    ap.add_argument("--only", help="Suite models (folder names), comma-separated.")
    ap.add_argument("--json", type=Path, help="Also write the rows here.")
    args = ap.parse_args(argv)
    rows = []
    print(f"# {platform.node()}, {platform.processor() or platform.machine()}; roam optimize {' '.join(extra)}")
    print(f"{'graph':40} {'nodes fused->lowered':>21} {'peak live MiB fused/lowered':>28} "
          f"{'arena MiB fused/lowered':>24} {'ratio':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for graph in graphs(args.paths, set(args.only.split(",")) if args.only else None):
            r = measure(graph, Path(tmp), extra)
            rows.append(r)
            f, lo = r["fused"], r["lowered"]
            print(f"{r['graph']:40} {r['nodes'][0]:>10,} -> {r['nodes'][1]:>7,} "
                  f"{f['peak_live_bytes'] / MIB:>13.2f} / {lo['peak_live_bytes'] / MIB:>10.2f} "
                  f"{f['arena_bytes'] / MIB:>11.2f} / {lo['arena_bytes'] / MIB:>10.2f} {r['ratio']:>7.4f}", flush=True)
            if args.json:  # after every row: the large graphs take minutes each
                args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
