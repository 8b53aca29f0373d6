"""roam's memory / extra-FLOPs front beside torch.compile's `activation_memory_budget`.

    python -m benchmarks run recompute/tradeoff_torch          # PyTorch's side (bench extra), about 35 min
    python -m benchmarks run recompute/tradeoff [--suite DIR] [--only gpt2_small,bert_base] [--time-limit 900]

Needs the suite's graphs (`python -m benchmarks.suite`) and matplotlib; reads the records of
recompute/tradeoff_torch and recompute/pytorch_memory when they exist. About --time-limit per model
plus the verifications (the 2026-12-04 run: --time-limit 600, 15 min for both models).

For each model (the suite's full step, <suite>/<model>/full_step.onnx: forward, backward and
in-graph AdamW), `roam tradeoff` sweeps the front (`--points`, `--time-limit` for the sweep), its
plans written (under --plans) and each checked again by `roam verify` with the source model, as its
own command. The picture (<--pictures>/tradeoff_<model>.png, default docs/images) and the table
compare, at every torch.compile budget measured (recompute/tradeoff_torch), PyTorch's peak with the
smallest roam plan on the front whose extra FLOPs are no more than PyTorch's at that budget; PyTorch
eager and transformers' whole-layer checkpointing (recompute/pytorch_memory) are marked.

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

import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import harness

TAKES = "about 15 min at --time-limit 600 (GPT-2 small and BERT-base); needs the suite and matplotlib"
MIB = harness.MIB


def roam(*args: str) -> tuple[int, str, float]:
    t = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "roam_cli", "-q", *args], capture_output=True, text=True)
    return run.returncode, (run.stderr or run.stdout).strip(), time.perf_counter() - t


def references(model: str, record: str) -> list[tuple[str, int, float]]:
    """PyTorch eager and checkpointing (recompute/pytorch_memory): (name, peak bytes of the step, extra FLOPs %)."""
    if not harness.results_path(record).is_file():
        return []
    rows = {m["model"]: m for m in harness.load(record)["results"]["models"]}
    if model not in rows:
        return []
    r = rows[model]
    marks = [("PyTorch eager", r["eager"]["peak"]["Total"], 0.0)]
    if r["checkpointing"].get("ok"):
        marks.append(("PyTorch whole-layer checkpointing", r["checkpointing"]["peak"]["Total"], r["extra_flops_pct"]))
    return marks


def sweep(model: str, graph: Path, points: int, time_limit: float, plans: Path, pytorch: str) -> dict:
    plans.mkdir(parents=True, exist_ok=True)
    out = plans / "front.json"
    args = ["tradeoff", str(graph), "-o", str(out), "--points", str(points), "--time-limit", str(time_limit),
            "--plans", str(plans), "--jobs", "1"]
    for name, size, pct in references(model, pytorch):
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
    """The front, torch.compile's budgets and the marks (PyTorch eager, checkpointing), from the results alone."""
    from matplotlib.figure import Figure

    marks = [(m["name"], m["total_bytes"], m["extra_flops_pct"]) for m in front.get("marks", ())]
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
    for (name, size, pct), marker in zip(marks, ("*", "D")):
        ax.plot([pct], [size / MIB], marker, markersize=11, color="#76448a" if marker == "*" else "#e15759",
                label=f"{name}: {size / MIB:,.0f} MiB, {pct:.1f} % extra FLOPs")
    ax.set_xscale("symlog", linthresh=0.1)
    ax.set_ylim(0, max(ys + [c["total_bytes"] / MIB for c in compiled] + [s / MIB for _, s, _ in marks]) * 1.1)
    ax.set_xlabel("extra FLOPs, % of the step (symmetric log scale, linear below 0.1 %)")
    ax.set_ylabel("memory of the training step (MiB)")
    ax.set_title(f"{model} full training step (AdamW): memory against recomputation")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.11), ncol=1, fontsize=9, frameon=False)
    fig.savefig(path, dpi=120)


def main(argv: list[str]) -> dict:
    ap = harness.options(__name__, __doc__)
    ap.add_argument("--suite", type=Path, default=harness.CACHE / "suite", help="the suite's graphs (default %(default)s)")
    ap.add_argument("--only", default="gpt2_small,bert_base")
    ap.add_argument("--points", type=int, default=10)
    ap.add_argument("--time-limit", type=float, default=900.0, help="seconds for each model's sweep")
    ap.add_argument("--plans", type=Path, default=harness.CACHE / "tradeoff-plans", help="the fronts' plans, by model")
    ap.add_argument("--pictures", type=Path, default=harness.ROOT / "docs" / "images",
                    help="where tradeoff_<model>.png go (default %(default)s)")
    ap.add_argument("--torch", default="recompute/tradeoff_torch", help="the record of torch.compile's budgets")
    ap.add_argument("--pytorch", default="recompute/pytorch_memory", help="the record of PyTorch eager and checkpointing")
    a = ap.parse_args(argv)
    torch_results = harness.load(a.torch)["results"] if harness.results_path(a.torch).is_file() else {}
    results = {"torch": torch_results.get("torch"), "models": {}}
    for model in a.only.split(","):
        graph = harness.needs(a.suite / model / "full_step.onnx", "python -m benchmarks.suite (the bench extra), or --suite DIR")
        front = sweep(model, graph, a.points, a.time_limit, a.plans / model, a.pytorch)
        product_flops(front, a.plans / model)
        compiled = torch_points(torch_results, model)
        a.pictures.mkdir(parents=True, exist_ok=True)
        picture(model, front, compiled, a.pictures / f"tradeoff_{model}.png")
        results["models"][model] = {"front": front, "compiled": compiled}
        print(f"{model}: {len(front['points'])} points, {front['wall_seconds']:.0f} s", file=sys.stderr, flush=True)
    return results


def table(results: dict) -> str:
    out = []
    for model, r in results["models"].items():
        front, compiled = r["front"], r["compiled"]
        out += [f"**{model}**: {len(front['points'])} points, {len(front['dominated'])} dominated, "
                f"{front['probes']} budget programs, {front.get('wall_seconds', front['seconds']):.0f} s", ""]
        out += front_table(front) + [""] + render(model, front, compiled) + [""]
    out.append(f"PyTorch: torch {results['torch'] or '–'}, recompute/tradeoff_torch (torch.compile's budgets) and "
               "recompute/pytorch_memory (eager, checkpointing). The second table compares on PyTorch's terms: roam's "
               "smallest plan whose recomputed products (2·M·N·K) are no more than PyTorch's extra FLOPs at that budget, "
               "both as a share of PyTorch's eager step; memory is the whole step's (roam: persistent + arena; "
               "PyTorch: MemTracker's peak total).")
    return "\n".join(out) + "\n"


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
