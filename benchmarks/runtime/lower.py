"""What lowering costs in memory: each training graph fused (ONNX Runtime's training ops) and lowered
(`roam lower`, standard ONNX), planned with the same options, side by side.

    python -m benchmarks run runtime/lower                                   # the bundled sample
    python -m benchmarks run runtime/lower benchmarks/.cache/suite [--only gpt2_small,resnet50] -- --jobs 1

A folder stands for every training_model.onnx and full_step.onnx under it (the suite's, from
`python -m benchmarks.suite`, which keeps ORT's fused ops). Options after `--` go to both `roam
optimize` runs. Per graph: nodes fused -> lowered, the nodes left outside standard ONNX, peak live
and arena bytes of both plans, and the lowered plan's arena as a multiple of the fused one's. roam's
install only; minutes a suite graph (each planned twice), about an hour for the whole suite."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness

TAKES = "seconds (the sample); about an hour for the whole suite (benchmarks/.cache/suite)"
SAMPLE = harness.ROOT / "sample_models" / "gpt2_tiny" / "training_model.onnx"
GRAPHS = ("training_model.onnx", "full_step.onnx")


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


def main(argv: list[str]) -> list[dict]:
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = harness.options(__name__, __doc__)
    ap.add_argument("paths", nargs="*", type=Path, default=[SAMPLE])
    ap.add_argument("--only", help="models (folder names), comma-separated")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for graph in graphs(args.paths, set(args.only.split(",")) if args.only else None):
            rows.append(measure(graph, Path(tmp), extra))
            print(f"{rows[-1]['graph']}: ratio {rows[-1]['ratio']:.4f}", file=sys.stderr, flush=True)
    return rows


def table(results: list[dict]) -> str:
    def mib(n):
        return harness.mib(n, 2)

    return harness.markdown_table(
        ["graph", "nodes fused", "nodes lowered", "non-standard left", "peak live MiB fused", "peak live MiB lowered",
         "arena MiB fused", "arena MiB lowered", "arena lowered / fused"],
        [[r["graph"], f"{r['nodes'][0]:,}", f"{r['nodes'][1]:,}", r["nonstandard_after"],
          mib(r["fused"]["peak_live_bytes"]), mib(r["lowered"]["peak_live_bytes"]), mib(r["fused"]["arena_bytes"]),
          mib(r["lowered"]["arena_bytes"]), f"{r['ratio']:.4f}"] for r in results])


if __name__ == "__main__":
    sys.exit("run it as: python -m benchmarks run runtime/lower [options]")
