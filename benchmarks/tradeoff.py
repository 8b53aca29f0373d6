#!/usr/bin/env python3
"""roam's memory / extra-FLOPs front beside torch.compile's `activation_memory_budget` (BENCHMARKS.md,
"The memory / extra-FLOPs front against torch.compile").

    python benchmarks/tradeoff_torch.py --json benchmarks/results/tradeoff_torch.json   # PyTorch's side (bench extra)
    python benchmarks/tradeoff.py [--suite /work/suite_cache] [--only gpt2_small,bert_base] [--time-limit 900]

For each model (the suite's full step, <suite>/<model>/full_step.onnx: forward, backward and
in-graph AdamW), `roam tradeoff` sweeps the front (`--points`, `--time-limit` for the sweep), its
plans written and each checked again by `roam verify` with the source model, as its own command.
The picture (docs/images/tradeoff_<model>.png) and the table compare, at every torch.compile budget
measured (benchmarks/tradeoff_torch.py), PyTorch's peak with the smallest roam plan on the front
whose extra FLOPs are no more than PyTorch's at that budget; PyTorch eager and transformers'
whole-layer checkpointing (benchmarks/results/pytorch_memory.json) are marked.

Memory, both sides, is the whole training step's: roam's persistent + arena (parameters, AdamW
moments and step counters, inputs; activations, gradients, temporaries), PyTorch's MemTracker peak
total of a training step (parameters, gradients, optimizer state, activations, temporaries,
buffers, inputs). Extra FLOPs: roam's as `recompute` counts them (products 2·M·N·K, other ops one
per element) over the step's FLOPs counted the same way; PyTorch's from FlopCounterMode, which counts
products and attention only (recomputed elementwise ops are free to it), over its eager step's. The
table compares on PyTorch's terms: at each budget, roam's smallest plan whose recomputed products
(the plan's `recompute.by_class.compute` FLOPs, also 2·M·N·K) are no more than PyTorch's extra
FLOPs; both as a share of PyTorch's eager step. The picture plots each side in its own terms."""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
IMAGES = ROOT / "docs" / "images"
MIB = 2**20


def roam(*args: str) -> tuple[int, str, float]:
    t = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "roam_cli", "-q", *args], capture_output=True, text=True)
    return run.returncode, (run.stderr or run.stdout).strip(), time.perf_counter() - t


def references(model: str) -> list[tuple[str, int, float]]:
    """PyTorch eager and checkpointing: (name, peak bytes of the step, extra FLOPs %)."""
    rows = {m["model"]: m for m in json.loads((RESULTS / "pytorch_memory.json").read_text())["models"]}
    if model not in rows:
        return []
    r = rows[model]
    marks = [("PyTorch eager", r["eager"]["peak"]["Total"], 0.0)]
    if r["checkpointing"].get("ok"):
        marks.append(("PyTorch whole-layer checkpointing", r["checkpointing"]["peak"]["Total"], r["extra_flops_pct"]))
    return marks


def sweep(model: str, graph: Path, points: int, time_limit: float, plans: Path) -> dict:
    out = RESULTS / f"tradeoff_{model}.json"
    args = ["tradeoff", str(graph), "-o", str(out), "--points", str(points), "--time-limit", str(time_limit),
            "--plans", str(plans), "--jobs", "1"]
    for name, size, pct in references(model):
        args += ["--mark", f"{name}={size}@{pct}%"]
    code, message, seconds = roam(*args)
    if code != 0:
        raise SystemExit(f"{model}: roam tradeoff failed: {message}")
    front = json.loads(out.read_text())
    for p in front["points"]:  # again, as a user would: the source model and the written plan
        code, message, _ = roam("verify", str(graph), p["plan"])
        p["verify_command"] = "ok" if code == 0 else message
        p["plan"] = Path(p["plan"]).name
    front["wall_seconds"] = seconds
    out.write_text(json.dumps(front, indent=1) + "\n")
    return front


def product_flops(front: dict, plans: Path) -> None:
    """Each point's recomputed products (the `compute` class: MatMul, Gemm, attention, at 2·M·N·K),
    what FlopCounterMode counts, from its plan's `recompute.by_class`."""
    for p in front["points"]:
        if "extra_product_flops" not in p:
            plan = json.loads((plans / p["plan"]).read_text())
            p["extra_product_flops"] = plan["recompute"]["by_class"].get("compute", {}).get("flops", 0)


def at_most(front: dict, flops: int) -> dict | None:
    """The front's smallest plan that recomputes no more product FLOPs than `flops`."""
    fitting = [p for p in front["points"] if p["extra_product_flops"] <= flops]
    return min(fitting, key=lambda p: p["total_bytes"]) if fitting else None


def torch_points(torch_results: dict, model: str) -> list[dict]:
    row = torch_results.get("models", {}).get(model)
    if not row:
        return []
    eager = row["eager"]["flops"]
    return [{"budget": float(b), "total_bytes": r["total_bytes"], "extra_flops": r["flops"] - eager,
             "eager_flops": eager, "extra_flops_pct": (r["flops"] - eager) / eager * 100}
            for b, r in sorted(row["budgets"].items(), key=lambda kv: float(kv[0]))]


def picture(model: str, front: dict, compiled: list[dict], path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 6), layout="constrained")
    ax = fig.add_subplot()
    pts = front["points"]
    xs, ys = [p["extra_flops_pct"] for p in pts], [p["total_bytes"] / MIB for p in pts]
    ax.step(xs, ys, where="post", color="#4e79a7", alpha=0.6)
    ax.plot(xs, ys, "o", color="#4e79a7", label=f"roam tradeoff: {len(pts)} verified plans (persistent + arena)")
    if front["dominated"]:
        ax.plot([p["extra_flops_pct"] for p in front["dominated"]], [p["total_bytes"] / MIB for p in front["dominated"]],
                "x", color="#bab0ab", label="roam: dominated plans (dropped)")
    if compiled:
        ax.plot([c["extra_flops_pct"] for c in compiled], [c["total_bytes"] / MIB for c in compiled], "s-",
                color="#f28e2c", label="torch.compile activation_memory_budget (MemTracker peak, FlopCounterMode)")
        for c in compiled:
            ax.annotate(f"{c['budget']:g}", (c["extra_flops_pct"], c["total_bytes"] / MIB), textcoords="offset points",
                        xytext=(4, 4), fontsize=8, color="#f28e2c")
    for (name, size, pct), marker in zip(references(model), ("*", "D")):
        ax.plot([pct], [size / MIB], marker, markersize=11, color="#76448a" if marker == "*" else "#e15759",
                label=f"{name}: {size / MIB:,.0f} MiB, {pct:.1f} % extra FLOPs")
    ax.set_xscale("symlog", linthresh=0.1)
    ax.set_ylim(0, max(ys + [c["total_bytes"] / MIB for c in compiled] + [s / MIB for _, s, _ in references(model)]) * 1.1)
    ax.set_xlabel("extra FLOPs, % of the step (symmetric log scale, linear below 0.1 %)")
    ax.set_ylabel("memory of the training step (MiB)")
    ax.set_title(f"{model} full training step (AdamW): memory against recomputation")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.11), ncol=1, fontsize=9, frameon=False)
    fig.savefig(path, dpi=120)


def render(model: str, front: dict, compiled: list[dict]) -> list[str]:
    lines = ["| torch.compile budget | PyTorch MiB | PyTorch extra product FLOPs % | roam MiB, at most those | "
             "roam extra product FLOPs % | roam extra FLOPs %, all ops | roam − PyTorch MiB |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for c in compiled:
        p = at_most(front, c["extra_flops"])
        if p is None:
            lines.append(f"| {c['budget']:g} | {c['total_bytes'] / MIB:,.0f} | {c['extra_flops_pct']:.2f} | – | – | – | – |")
            continue
        diff = (p["total_bytes"] - c["total_bytes"]) / MIB
        lines.append(f"| {c['budget']:g} | {c['total_bytes'] / MIB:,.0f} | {c['extra_flops_pct']:.2f} | "
                     f"{p['total_bytes'] / MIB:,.0f} | {100 * p['extra_product_flops'] / c['eager_flops']:.2f} | "
                     f"{p['extra_flops_pct']:.3f} | {diff:+,.0f} |")
    return lines


def front_table(front: dict) -> list[str]:
    lines = ["| point | persistent + arena MiB | arena MiB | extra FLOPs % | nodes added | verified |",
             "|---|---:|---:|---:|---:|---|"]
    for p in front["points"]:
        lines.append(f"| {p['label']} | {p['total_bytes'] / MIB:,.1f} | {p['arena_bytes'] / MIB:,.1f} | "
                     f"{p['extra_flops_pct']:.3f} | {p['nodes_added']} | "
                     f"{'yes' if p['verified'] and p.get('verify_command', 'ok') == 'ok' else 'NO'} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", type=Path, default=Path("/work/suite_cache"))
    ap.add_argument("--only", default="gpt2_small,bert_base")
    ap.add_argument("--points", type=int, default=10)
    ap.add_argument("--time-limit", type=float, default=900.0, help="seconds for each model's sweep")
    ap.add_argument("--plans", type=Path, default=Path("/tmp/roam-tradeoff-plans"))
    ap.add_argument("--torch", type=Path, default=RESULTS / "tradeoff_torch.json")
    ap.add_argument("--reuse", action="store_true", help="use the fronts already in benchmarks/results")
    ap.add_argument("--markdown", type=Path, default=RESULTS / "tradeoff.md")
    a = ap.parse_args(argv)
    torch_results = json.loads(a.torch.read_text()) if a.torch.is_file() else {}
    text = [f"Memory / extra-FLOPs fronts, {datetime.date.today()}: `python benchmarks/tradeoff.py` "
            f"({platform.machine()}, Python {platform.python_version()}); torch {torch_results.get('torch', '–')}.", ""]
    for model in a.only.split(","):
        out = RESULTS / f"tradeoff_{model}.json"
        if a.reuse and out.is_file():
            front = json.loads(out.read_text())
        else:
            front = sweep(model, a.suite / model / "full_step.onnx", a.points, a.time_limit, a.plans / model)
        product_flops(front, a.plans / model)
        (RESULTS / f"tradeoff_{model}.json").write_text(json.dumps(front, indent=1) + "\n")
        compiled = torch_points(torch_results, model)
        IMAGES.mkdir(parents=True, exist_ok=True)
        picture(model, front, compiled, IMAGES / f"tradeoff_{model}.png")
        text += [f"### {model}: {len(front['points'])} points, {len(front['dominated'])} dominated, "
                 f"{front['probes']} budget programs, {front.get('wall_seconds', front['seconds']):.0f} s", ""]
        text += front_table(front) + [""] + render(model, front, compiled) + [""]
        print("\n".join(text[-(len(front["points"]) + len(compiled) + 8):]), flush=True)
    a.markdown.write_text("\n".join(text) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
