"""Planning time and quality at scale: 7B-, 70B- and 405B-class LLaMA training steps, in the
variants users make, each planned `--recompute off --gap 0` and `--recompute free --gap 0.01`.

    python -m benchmarks.scale.scale --build [--only 70b]          # make the steps (torch, onnxruntime-training)
    python -m benchmarks run scale/scale [--only 70b-base,405b] [--runs off:0,free:0.01]

The steps are made as docs/training-graphs.md makes LLaMA-architecture steps without weights:
`transformers.LlamaForCausalLM` built from its configuration on `torch.device("meta")`, exported
with `roam_cli.frontend.torch_export`, then `make-training-graph --in-graph-optimizer` (AdamW inside
the graph) into `<cache>/<export>/<step>` (default cache benchmarks/.cache/scale; a step already
there is kept; variants that differ only in the backward share the export). Building both sizes,
every variant, takes about two hours of exports; each needs the fused environment's torch and
onnxruntime-training.

Each size is made in the variants of `VARIANTS` (`--only` takes sizes, which stand for every
variant but `bf16`, and steps such as `70b-sdpa` or `70b-bf16`). The base is the eager attention, one key/value head per head, the loss inside the
model's forward (transformers' own, shifted), batch 1 × 512, and ONNX Runtime's artifacts with
their fused ops (`--backend ort-artifacts --fused`). Each other variant flips some of these:
`sdpa` attention; `gqa`, 8 key/value heads as the released 70B and 405B models have; `loss-route`,
the export returns logits and make adds the cross-entropy (`--loss cross-entropy`) on logits
flattened to [B·S, V]; `3d-logits`, the same on logits [B, S, V], with roam's backward (ONNX
Runtime's CrossEntropyLoss block gives them labels [B, S], which its SoftmaxCrossEntropyLoss,
reading the classes at axis 1, refuses when the step runs); `4x2048`, batch 4 × 2,048;
`roam-backward`, roam's own backward in standard ONNX (`--backend roam`); `sdpa-gqa-roam`, all
of sdpa, gqa, loss-route and roam-backward at once; `bf16`, roam's backward making the mixed-
precision step (`--precision bf16`: float32 masters and AdamW state, the matrix products in bf16).

Each plan is one `roam optimize STEP -o PLAN --jobs 2 --recompute MODE --gap GAP` command under
`/usr/bin/time -v` (wall time, CPU time of the command and its workers, peak RSS; on a shared
machine the CPU time is the figure that compares runs), then `roam verify`; the results give peak
live bytes, the order's lower bound and the gap to it, the layout's fragmentation (arena / peak
live - 1). Planning needs only roam: about 20 minutes for both sizes' sixteen steps, two plans each.
The plans are written into `--plans` (default: a temporary folder)."""

from __future__ import annotations

import argparse
import importlib
import dataclasses
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks import harness

TAKES = "about 20 min for 70b,405b; needs the steps (python -m benchmarks.scale.scale --build: torch, ~2 h)"
CACHE = harness.CACHE / "scale"
GIB = 2**30


@dataclass(frozen=True)
class Llama:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    vocab: int = 32000


@dataclass(frozen=True)
class Variant:
    """How a user makes the step: the export's choices, then the backward's."""

    attention: str = "eager"  # transformers' attn_implementation: eager or sdpa
    kv_heads: int | None = None  # grouped-query attention's key/value heads; None: one per head
    loss: str = "model"  # model: the export returns the model's own loss; route: logits, make adds cross-entropy
    flat_logits: bool = True  # with the loss route: logits [B·S, V], else [B, S, V]
    batch: int = 1
    seq: int = 512
    route: str = "ort"  # ort: ONNX Runtime's artifacts, fused ops kept; roam: roam's backward, standard ONNX
    precision: str | None = None  # make-training-graph --precision (roam's backward): bf16 or fp16

    def export(self, size: str) -> str:
        """The folder of the export (shared by the variants that differ only in the route)."""
        logits = "" if self.loss == "model" else "-flat" if self.flat_logits else "-3d"
        return (f"{size}-{self.attention}-{'gqa' if self.kv_heads else 'mha'}-loss-{self.loss}{logits}-"
                f"{self.batch}x{self.seq}")


MODELS = {
    "7b": Llama(32, 4096, 11008, 32),  # LLaMA-2-7B (issue 40's comparison with FSDP2 at N = 8)
    "70b": Llama(80, 8192, 28672, 64),
    "405b": Llama(126, 16384, 53248, 128),
    "tiny": Llama(4, 64, 128, 16),  # the variants' smoke test (16 heads: gqa groups them in pairs)
}
VARIANTS = {
    "base": Variant(),
    "sdpa": Variant(attention="sdpa"),
    "gqa": Variant(kv_heads=8),
    "loss-route": Variant(loss="route"),
    "3d-logits": Variant(loss="route", flat_logits=False, route="roam"),
    "4x2048": Variant(batch=4, seq=2048),
    "roam-backward": Variant(route="roam"),
    "sdpa-gqa-roam": Variant(attention="sdpa", kv_heads=8, loss="route", route="roam"),
    "bf16": Variant(route="roam", precision="bf16"),
}
STEP = {"ort": "full_step.onnx", "roam": "roam_step.onnx"}


def quiet_meta_export() -> None:
    """Close two meta-device gaps of torch 2.13 / transformers 4.57 without changing the maths (and
    quiet the exporter): the rotary embedding opens torch.autocast on the input's device ("meta"
    has no autocast dtype), and the eager causal mask builds a 0-d torch.tensor(0.0) on that
    device, a constant with no data that the exporter's constant folding then cannot read."""
    import logging
    import warnings

    import torch
    import transformers.masking_utils as masks

    warnings.filterwarnings("ignore")
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)

    class Autocast(torch.autocast):
        def __init__(self, device_type, *args, **kwargs):
            super().__init__("cpu" if device_type == "meta" else device_type, *args, **kwargs)

    def eager_mask(*args, dtype=torch.float32, **kwargs):
        kwargs.pop("allow_is_causal_skip", None)
        mask = masks.sdpa_mask(*args, allow_is_causal_skip=False, allow_torch_fix=False, **kwargs)
        return torch.where(mask, 0.0, torch.finfo(dtype).min).to(dtype)

    torch.autocast = Autocast
    masks.AttentionMaskInterface._global_mapping["eager"] = eager_mask


def export_forward(spec: Llama, variant: Variant, folder: Path) -> Path:
    """<folder>/forward.onnx: the model returning its own causal-LM loss or its logits, without weights."""
    import torch
    import transformers as hf

    from benchmarks.suite import LanguageModelLoss
    from roam_cli.core.fileio import write_atomic
    from roam_cli.frontend import torch_export

    quiet_meta_export()

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids):
            logits = self.m(input_ids=input_ids).logits
            return logits.flatten(0, 1) if variant.flat_logits else logits

    config = hf.LlamaConfig(vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
                            num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                            num_key_value_heads=variant.kv_heads or spec.heads, attn_implementation=variant.attention,
                            use_cache=False)
    with torch.device("meta"):
        model = hf.LlamaForCausalLM(config)
    model.train()
    ids = torch.zeros((variant.batch, variant.seq), dtype=torch.int64, device="meta")
    if variant.loss == "model":
        exported = torch_export.export(LanguageModelLoss(model), (ids, ids.clone()), ["input_ids", "labels"], ["loss"],
                                       prefix="m.")
    else:
        exported = torch_export.export(Logits(model), (ids,), ["input_ids"], ["logits"], prefix="m.")
    path = folder / "forward.onnx"
    write_atomic(path, exported.model.SerializeToString())
    return path


def step_path(cache: Path, size: str, variant: Variant) -> Path:
    name = STEP[variant.route]
    return cache / variant.export(size) / (name.replace(".onnx", f".{variant.precision}.onnx") if variant.precision
                                           else name)


def build(size: str, variant: Variant, cache: Path) -> Path:
    """The step of `variant` of the `size`-class model (kept when already in the cache)."""
    step = step_path(cache, size, variant)
    if step.exists():
        return step
    step.parent.mkdir(parents=True, exist_ok=True)
    forward = step.parent / "forward.onnx"
    t = time.time()
    if not forward.exists():
        export_forward(MODELS[size], variant, step.parent)
        print(f"{step.parent.name}: exported in {time.time() - t:.0f} s", flush=True)
    from roam_cli.frontend import training_graph

    t = time.time()
    loss = "none" if variant.loss == "model" else "cross-entropy"
    if variant.route == "ort":
        training_graph.make(forward, step, loss=loss, in_graph=True, fused=True)
    else:
        from roam_cli.backward.step import build as roam_backward

        training_graph.make(forward, step, loss=loss, in_graph=True, backward=roam_backward, precision=variant.precision)
    print(f"{step.parent.name}: {step.name} in {time.time() - t:.0f} s", flush=True)
    return step


def timed(*args: str) -> tuple[int, str, float, float, float]:
    """(exit code, stderr tail, wall seconds, CPU seconds, peak RSS GiB) of one `roam` command."""
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "roam_cli", "-q", *args]
    t = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", run.stderr)
    cpu = sum(float(x) for x in re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", run.stderr))
    message = "\n".join(line for line in run.stderr.splitlines() if not line.startswith("\t"))
    return run.returncode, message.strip(), wall, cpu, int(rss.group(1)) / 2**20 if rss else float("nan")


def plan(name: str, step: Path, folder: Path, mode: str, jobs: int, stop_gap: str, device: str | None = None) -> dict:
    out = folder / f"{name}-{mode}-{stop_gap}.json"
    code, message, wall, cpu, rss = timed("optimize", str(step), "-o", str(out), "--jobs", str(jobs), "--recompute", mode,
                                          "--gap", stop_gap, *(["--device", device] if device else []))
    row = {"mode": mode, "stop_gap": float(stop_gap), "seconds": round(wall, 1), "cpu_seconds": round(cpu, 1),
           "rss_gib": round(rss, 2)}
    if code != 0:
        return row | {"failed": message.splitlines()[-1] if message else f"exit {code}"}
    p = json.loads(out.read_text())
    stats = p["stats"]
    verified = subprocess.run([sys.executable, "-m", "roam_cli", "-q", "verify", str(step), str(out)],
                              capture_output=True, text=True, check=False).returncode == 0
    order = stats["order"]
    return row | {"nodes": len(p["order"]), "nodes_added": len(p.get("recompute", {}).get("nodes", ())),
                  "persistent_bytes": p["persistent_bytes"], "peak_live_bytes": p["peak_live_bytes"],
                  "arena_bytes": p["arena_bytes"],
                  "bound_bytes": order.get("lower_bound_bytes"),
                  "gap": p["peak_live_bytes"] / order["lower_bound_bytes"] - 1 if order.get("lower_bound_bytes") else None,
                  "proven": order.get("proven_optimal"), "fragmentation": p["arena_bytes"] / p["peak_live_bytes"] - 1,
                  "phases": stats.get("seconds"), "verified": verified}


def chosen(only: str, models: dict = MODELS, variants: dict = VARIANTS) -> list[tuple[str, str]]:
    """The (size, variant) pairs `--only` names: a size stands for all its variants but `bf16` (the
    precision benchmarks' step, named on its own: 70b-bf16)."""
    picked = []
    for item in only.split(","):
        size, _, name = item.partition("-")
        if size not in models or (name and name not in variants):
            raise SystemExit(f"unknown step {item!r}: a size ({', '.join(models)}) or SIZE-VARIANT "
                             f"({', '.join(variants)})")
        picked += [(size, v) for v in ([name] if name else [v for v in variants if v != "bf16"])]
    return list(dict.fromkeys(picked))


def runs_of(text: str) -> list[tuple[str, str]]:
    """`off:0,free:0.01` -> [("off", "0"), ("free", "0.01")]: each step's plans, recompute mode and --gap."""
    return [tuple(run.split(":")) for run in text.split(",")]


def run_plans(steps: list[tuple[str, Path, dict]], runs: list[tuple[str, str]], jobs: int,
              plans: Path | None) -> list[dict]:
    """Plan each (name, step, variant) with each (recompute mode, gap) of `runs`: one row per plan."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = plans or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for name, step, variant in steps:
            for mode, stop_gap in runs:
                r = plan(name, step, folder, mode, jobs, stop_gap)
                rows.append(r | {"step": name, "variant": variant})
                print(f"{name} {mode} --gap {stop_gap}: " + (r["failed"] if "failed" in r else
                      f"{r['seconds']} s, {order_words(r)}, fragmentation {100 * r['fragmentation']:.3f} %"),
                      file=sys.stderr, flush=True)
    return rows


def main(argv: list[str]) -> dict:
    args = plan_options(__name__, __doc__, "comma-separated sizes (7b, 70b, 405b, tiny), variants (70b-sdpa)",
                        CACHE).parse_args(argv)
    return plan_steps(args, [(f"{size}-{name}", step_path(args.cache, size, VARIANTS[name]), VARIANTS[name])
                             for size, name in chosen(args.only)], __name__)


def plan_options(module: str, doc: str, only: str, cache: Path) -> argparse.ArgumentParser:
    """The options of a benchmark that plans a family of steps it builds into `cache` (this one,
    scale/foreign)."""
    ap = harness.options(module, doc)
    ap.add_argument("--only", default="70b,405b", help=only)
    ap.add_argument("--cache", type=Path, default=cache)
    ap.add_argument("--runs", default="off:0,free:0.01", help="comma-separated RECOMPUTE:GAP plans of each step")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--plans", type=Path, help="folder to keep the plans in (default: a temporary one)")
    return ap


def plan_steps(args, steps: list[tuple[str, Path, object]], module: str) -> dict:
    """Each (name, path, variant) step planned as --runs says; a step not built stops the run, saying
    how `module` builds it."""
    for name, path, _ in steps:
        harness.needs(path, f"make it with `python -m {module} --build --only {name}` (torch)")
    rows = run_plans([(name, path, dataclasses.asdict(variant)) for name, path, variant in steps], runs_of(args.runs), args.jobs,
                     args.plans)
    return {"jobs": args.jobs, "rows": rows}


def order_words(r: dict) -> str:
    if r.get("proven"):
        return "proven optimal"
    return "–" if r.get("gap") is None else f"within {100 * r['gap']:.2f} %"


def plan_cells(r: dict) -> list[str]:
    """wall s (CPU s), peak live GiB (bound), order, fragmentation of one plan."""
    if "failed" in r:
        return [f"{r['seconds']:.1f} ({r['cpu_seconds']:.1f})", f"failed: {r['failed'][:80]}", "", ""]
    added = f" +{r['nodes_added']:,} nodes" if r["nodes_added"] else ""
    return [f"{r['seconds']:.1f} ({r['cpu_seconds']:.1f})",
            f"{harness.gib(r['peak_live_bytes'])} ({harness.gib(r['bound_bytes'])}){added}",
            order_words(r), f"{100 * r['fragmentation']:.3f} %"]


def table(results: dict) -> str:
    """One line per step, its plans side by side (each recompute mode and --gap of the run); one line
    per plan where a step has more than two."""
    rows = results["rows"]
    runs = list(dict.fromkeys((r["mode"], r["stop_gap"]) for r in rows))
    by_step: dict[str, dict] = {}
    for r in rows:
        by_step.setdefault(r["step"], {})[(r["mode"], r["stop_gap"])] = r
    if len(runs) > 2:
        text = harness.markdown_table(
            ["step", "recompute", "--gap", "wall s (CPU s)", "peak live GiB (bound)", "order", "fragmentation",
             "peak RSS GiB", "verifies"],
            [[r["step"], r["mode"], f"{r['stop_gap']:g}", *plan_cells(r), f"{r['rss_gib']:.2f}",
              "" if "failed" in r else "yes" if r["verified"] else "NO"] for r in rows], "llrrrlrrl")
        return text + "\n" + summary_line(results, len(by_step))
    head = ["step", "nodes"]
    for mode, g in runs:
        head += [f"{mode} --gap {g:g}: wall s (CPU s)", "peak live GiB (bound)", "order", "fragmentation"]
    head += ["peak RSS GiB", "verifies"]
    lines = []
    for step, plans in by_step.items():
        done = [r for r in plans.values() if "failed" not in r]
        nodes = min((r["nodes"] - r["nodes_added"] for r in done), default=None)
        line = [step, "–" if nodes is None else f"{nodes:,}"]
        for run in runs:
            line += plan_cells(plans[run]) if run in plans else ["", "", "", ""]
        line += [f"{max((r['rss_gib'] for r in plans.values()), default=0):.2f}",
                 "yes" if done and all(r["verified"] for r in done) and len(done) == len(plans) else "NO"]
        lines.append(line)
    text = harness.markdown_table(head, lines, "lr" + "rrlr" * len(runs) + "rl")
    return text + "\n" + summary_line(results, len(by_step))


def summary_line(results: dict, steps: int) -> str:
    rows = results["rows"]
    planned = [r for r in rows if "failed" not in r]
    within = sum((r.get("gap") or 0) <= 0.01 for r in planned)
    return (f"{len(rows)} plans of {steps} steps, `roam optimize --jobs {results['jobs']}` each: "
            f"{within} of {len(planned)} within 1 % of their order's bound, {sum(bool(r.get('proven')) for r in planned)} "
            f"proven optimal, fragmentation at most {100 * max((r['fragmentation'] for r in planned), default=0):.3f} %, "
            f"{len(rows) - len(planned)} failed, {sum(not r['verified'] for r in planned)} not verified. Wall "
            f"seconds: {walls(planned)}. Nodes: the step's own; `free` adds the recomputed ones.\n")


def walls(rows: list[dict]) -> str:
    """The range of wall seconds per size and run: "70b off 13.7–23.2, free 14.7–18.3; ..." """
    spans: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        spans.setdefault(r["step"].split("-")[0], {}).setdefault(f"{r['mode']} --gap {r['stop_gap']:g}", []).append(
            r["seconds"])
    return "; ".join(f"{size} " + ", ".join(f"{run} {min(v):.1f}–{max(v):.1f}" if len(v) > 1 else f"{run} {v[0]:.1f}"
                                            for run, v in runs.items()) for size, runs in spans.items())


def build_steps(module: str, cache: Path, steps) -> None:
    """`python -m MODULE --build [--only ...] [--cache DIR]`: the steps `steps(only)` names, each
    (size, variant), built by the module's `build` (torch, onnxruntime-training)."""
    b = argparse.ArgumentParser(prog=f"python -m {module} --build")
    b.add_argument("--build", action="store_true", required=True)
    b.add_argument("--only", default="70b,405b")
    b.add_argument("--cache", type=Path, default=cache)
    a = b.parse_args()
    build_one = importlib.import_module(module).build
    for size, variant in steps(a.only):
        print(build_one(size, variant, a.cache), flush=True)


if __name__ == "__main__":
    build_steps("benchmarks.scale.scale", CACHE, lambda only: [(size, VARIANTS[name]) for size, name in chosen(only)])
