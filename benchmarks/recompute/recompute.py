"""Recomputation against PyTorch's own: roam's transient memory and extra FLOPs beside PyTorch eager and gradient checkpointing.

    python -m benchmarks run recompute/recompute [--suite DIR] [--only gpt2_small,bert_base]

Needs the suite's graphs (`python -m benchmarks.suite`, the bench extra) and PyTorch's figures, the
record of recompute/pytorch_memory; roam alone runs here. About 30 min for the 9 suite models on 2 cores.

For every suite model with graphs in <suite>/<model>/ and PyTorch figures, both graph variants are
planned with `roam optimize --recompute off`, `free`, and `budget` at PyTorch checkpointing's memory:
- full_step.onnx (forward, backward, in-graph AdamW) against PyTorch's whole step;
- training_model.onnx (ONNX Runtime artifacts: forward, backward, gradient accumulation) against
  PyTorch's forward + backward (the peak before optimizer.step()).

Transient MiB: roam's arena (persistent bytes excluded, as PyTorch's parameters and AdamW state
are); PyTorch's is MemTracker's peak minus those. Budget: roam's persistent bytes + PyTorch
checkpointing's transient bytes. Extra FLOPs: roam's from static shapes (products 2·M·N·K, other
ops one per element) as a share of the step's FLOPs counted the same way; PyTorch's from
FlopCounterMode (products only) against its eager step. Every plan is checked by `roam verify`.
Each `roam optimize` runs as its own command; its wall time is part of the results."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness

TAKES = "about 30 min (9 suite models, 2 graphs each); needs the suite and the recompute/pytorch_memory record"
VARIANTS = {"full_step.onnx": ("full step", "transient_bytes"),
            "training_model.onnx": ("artifacts", "transient_before_optimizer_bytes")}


def roam(*args: str) -> tuple[int, str, float]:
    t = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "roam_cli", "-q", *args], capture_output=True, text=True)
    return run.returncode, (run.stderr or run.stdout).strip(), time.perf_counter() - t


def plan(graph: Path, folder: Path, mode: str, budget: int | None, jobs: int) -> dict:
    """One `roam optimize` of `graph` with --recompute `mode`: its figures, verified."""
    out = folder / f"{graph.parent.name}-{graph.stem}-{mode}.json"
    args = ["optimize", str(graph), "-o", str(out), "--recompute", mode, "--jobs", str(jobs)]
    if budget is not None:
        args += ["--budget", str(budget)]
    code, message, seconds = roam(*args)
    if code != 0:
        return {"failed": message.splitlines()[-1] if message else f"exit {code}", "seconds": seconds}
    p = json.loads(out.read_text())
    verified, why, _ = roam("verify", str(graph), str(out))
    r = p.get("recompute", {})
    return {"arena_bytes": p["arena_bytes"], "persistent_bytes": p["persistent_bytes"], "seconds": seconds,
            "extra_flops": r.get("extra_flops", 0), "step_flops": r.get("step_flops"), "nodes_added": len(r.get("nodes", ())),
            "peak_node": p["order"][p["peak_step"]], "verified": verified == 0 or why}


def main(argv: list[str]) -> list[dict]:
    ap = harness.options(__name__, __doc__)
    ap.add_argument("--suite", type=Path, default=harness.CACHE / "suite", help="the suite's graphs (default %(default)s)")
    ap.add_argument("--only", default=None, help="comma-separated model names")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--pytorch", default="recompute/pytorch_memory", help="the record of PyTorch's figures")
    args = ap.parse_args(argv)
    harness.needs(args.suite, "python -m benchmarks.suite (the bench extra), or --suite DIR")
    harness.needs(harness.results_path(args.pytorch), f"python -m benchmarks run {args.pytorch}")
    pytorch = {m["model"]: m for m in harness.load(args.pytorch)["results"]["models"]}
    models = [m for m in pytorch if (args.suite / m).is_dir()]
    if args.only:
        models = [m for m in models if m in args.only.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="roam-recompute-") as tmp:
        for model in models:
            torch_figures = pytorch[model]
            for file, (variant, key) in VARIANTS.items():
                graph = args.suite / model / file
                if not graph.is_file():
                    continue
                eager = torch_figures["eager"][key]
                ckpt = torch_figures["checkpointing"][key] if torch_figures["checkpointing"].get("ok") else None
                row = {"model": model, "size": torch_figures["label"], "variant": variant,
                       "pytorch_eager_bytes": eager, "pytorch_checkpointing_bytes": ckpt,
                       "pytorch_checkpointing_extra_pct": torch_figures.get("extra_flops_pct")}
                for mode in ("off", "free"):
                    row[mode] = plan(graph, Path(tmp), mode, None, args.jobs)
                    print(f"{model} {variant} {mode}: {row[mode]}", file=sys.stderr, flush=True)
                if ckpt is not None and "persistent_bytes" in row["off"]:
                    budget = row["off"]["persistent_bytes"] + ckpt
                    row["budget_bytes"] = budget
                    row["budget"] = plan(graph, Path(tmp), "budget", budget, args.jobs)
                    print(f"{model} {variant} budget: {row['budget']}", file=sys.stderr, flush=True)
                rows.append(row)
    return rows


def pct(x) -> str:
    return "–" if x is None else f"{x:.2f}"


def extra(r: dict) -> str:
    if "arena_bytes" not in r:
        return "–"
    return pct(100 * r["extra_flops"] / r["step_flops"]) if r.get("step_flops") else "0.00"


def cell(r: dict | None) -> str:
    if r is None:
        return "n/a"
    if "arena_bytes" not in r:
        return "fails: " + r["failed"][:60]
    return harness.mib(r["arena_bytes"]) + ("" if r["verified"] is True else " (verify failed)")


def table(rows: list[dict]) -> str:
    header = ["model", "variant", "PyTorch eager", "PyTorch ckpt", "ckpt extra FLOPs %", "roam off", "roam free",
              "free extra FLOPs %", "roam budget (at ckpt)", "budget extra FLOPs %", "free vs off", "free vs eager",
              "plan s (off/free/budget)"]
    body = []
    for r in rows:
        off, free, budget = r["off"], r["free"], r.get("budget")
        vs_off = (f"{free['arena_bytes'] / off['arena_bytes'] - 1:+.1%}"
                  if "arena_bytes" in free and "arena_bytes" in off and off["arena_bytes"] else "–")
        vs_eager = f"{free['arena_bytes'] / r['pytorch_eager_bytes'] - 1:+.1%}" if "arena_bytes" in free else "–"
        seconds = "/".join(f"{x['seconds']:.1f}" for x in (off, free, budget) if x is not None)
        has_ckpt = r["pytorch_checkpointing_bytes"] is not None
        body.append([f"{r['model']} ({r['size']})", r["variant"], harness.mib(r["pytorch_eager_bytes"]),
                     harness.mib(r["pytorch_checkpointing_bytes"]) if has_ckpt else "n/a",
                     pct(r["pytorch_checkpointing_extra_pct"]) if has_ckpt else "n/a", cell(off), cell(free),
                     extra(free), cell(budget), extra(budget) if budget else "n/a", vs_off, vs_eager, seconds])
    return (harness.markdown_table(header, body, "ll" + "r" * 11)
            + "\nTransient MiB, every plan verified by `roam verify`. PyTorch: MemTracker under FakeTensorMode "
            "(recompute/pytorch_memory: eager attention, AdamW foreach, second step; ckpt = transformers' "
            "gradient_checkpointing_enable()). The full step is compared with PyTorch's whole step, the artifacts "
            "graph with PyTorch's forward + backward. roam budget: `--recompute budget --budget <roam persistent + "
            "PyTorch ckpt transient>`. Extra FLOPs: roam counts products 2·M·N·K and one per element for other ops, "
            "PyTorch (FlopCounterMode) products only.\n")
