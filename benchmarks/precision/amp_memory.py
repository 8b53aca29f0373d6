"""roam's plans of mixed-precision steps against PyTorch AMP eager's memory: GPT-2 small 4 x 256,
BERT-base 8 x 128, GPT2-XL 1 x 512, the LLaMA-7B architecture 1 x 512.

The exports are made without weights, as the suite makes them (`benchmarks/suite.py`: the models on
the meta device, the model's own loss; LLaMA as scale/scale exports it), into `--cache`
(default benchmarks/.cache/amp/<model>/). Each is made into its float32 step and its bf16 AMP step by
`make-training-graph --loss none --in-graph-optimizer [--precision bf16]` (roam's backward,
AdamW inside), and each step is planned by `roam optimize --jobs 2` with `--recompute off` (order
and layout alone) and `--recompute free`. PyTorch's figures are recompute/pytorch_memory's
record `recompute/pytorch_memory.amp` (`--amp bf16,fp16`: MemTracker under FakeTensorMode, the
forward under torch.autocast, foreach AdamW, the second step).

The comparison is of the bytes a step needs beyond its float32 parameters and AdamW moments (the
same in both): PyTorch's transient (peak - parameters - moments: activations, gradients, the bf16
weight copies autocast caches, the optimizer's temporaries) against roam's (persistent + arena -
parameters - moments: the arena, plus the step counter, constants and the batch roam counts as
persistent). The totals are beside them.

    python -m benchmarks run recompute/pytorch_memory.amp --amp bf16,fp16 --only gpt2_small,bert_base,gpt2_xl,llama_7b
    python -m benchmarks run precision/amp_memory                   # about 5 min once the steps are built
    python -m benchmarks run precision/amp_memory.smoke --only gpt2_small

The steps missing from the cache are exported and built first: that needs the bench extra (torch,
transformers) and about 10 minutes more for the four; the planning is roam alone."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import harness

TAKES = "about 5 min to plan; building the steps first needs the bench extra (torch, transformers), 10 min more"
MODELS = ("gpt2_small", "bert_base", "gpt2_xl", "llama_7b")
PRECISIONS = ("fp32", "bf16")
PYTORCH = "recompute/pytorch_memory.amp"  # PyTorch AMP eager's record: --amp bf16,fp16 on MODELS


def build(name: str, cache: Path) -> Path:
    """<cache>/<model>/forward.onnx, the export without weights (kept when already there)."""
    folder = cache / name
    forward = folder / "forward.onnx"
    if forward.exists():
        return forward
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.exit(f"{forward} is missing: building it needs the bench extra (pip install -e '.[bench]')")
    from benchmarks import suite
    from benchmarks.scale import scale

    folder.mkdir(parents=True, exist_ok=True)
    if name == "llama_7b":
        scale.export_forward(scale.Llama(32, 4096, 11008, 32), scale.Variant(), folder)
    else:
        suite.export(next(m for m in suite.MODELS if m.name == name), cache)
    return forward


def step(forward: Path, precision: str) -> Path:
    out = forward.with_name(f"step.{precision}.onnx")
    if not out.exists():
        args = ["make-training-graph", forward, "-o", out, "--loss", "none", "--in-graph-optimizer"]
        subprocess.run([sys.executable, "-m", "roam_cli", "-q", *map(str, args),
                        *(["--precision", precision] if precision != "fp32" else [])], check=True)
    return out


def plan(step_path: Path, recompute: str) -> dict:
    out = step_path.with_name(f"{step_path.stem}.{recompute}.plan.json")
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "roam_cli", "-q", "optimize", str(step_path), "-o", str(out), "--jobs", "2",
                    "--recompute", recompute], check=True)
    seconds = time.perf_counter() - t
    p = json.loads(out.read_text())
    kinds: dict[str, int] = {}
    for t_ in p["tensors"]:
        if t_["offset"] is None and "alias_of" not in t_:
            kinds[t_["kind"]] = kinds.get(t_["kind"], 0) + t_["bytes"]
    peak = p["peak_step"]
    copies = sum(t_["bytes"] for t_ in p["tensors"] if "copy_of" in t_ and t_["offset"] is not None
                 and t_["first_step"] <= peak <= t_["last_step"])
    return {"persistent": p["persistent_bytes"], "arena": p["arena_bytes"], "peak_live": p["peak_live_bytes"],
            "masters_and_moments": kinds.get("parameter", 0) + kinds.get("optimizer_state", 0),
            "copies_at_peak": copies, "seconds": round(seconds, 1),
            "added": len(p.get("recompute", {}).get("nodes", ()))}


def pytorch_figures() -> dict:
    """{(model, precision): {transient, peak}} in bytes, from PyTorch AMP eager's record (transient: the
    step's peak less parameters and optimizer state); {} when it has not been measured."""
    if not harness.results_path(PYTORCH).exists():
        print(f"no {PYTORCH} record: PyTorch's columns stay empty", file=sys.stderr)
        return {}
    names = {"float32": "fp32"}
    return {(m["model"], names.get(p, p)): {"transient": r["transient_bytes"], "peak": r["peak"]["Total"]}
            for m in harness.load(PYTORCH)["results"]["models"] for p, r in m["precisions"].items() if r.get("ok")}


def main(argv: list[str]) -> list[dict]:
    p = harness.options(__name__, __doc__)
    p.add_argument("--only", default=",".join(MODELS))
    p.add_argument("--cache", type=Path, default=harness.CACHE / "amp",
                   help="the exports and steps (default benchmarks/.cache/amp)")
    a = p.parse_args(argv)
    theirs = pytorch_figures()
    rows = []
    for name in a.only.split(","):
        forward = build(name, a.cache)
        for precision in PRECISIONS:
            path = step(forward, precision)
            off, free = plan(path, "off"), plan(path, "free")
            ours = {mode: r["persistent"] + r["arena"] - r["masters_and_moments"] for mode, r in (("off", off),
                                                                                                  ("free", free))}
            rows.append({"model": name, "precision": precision, "off": off, "free": free,
                         "pytorch": theirs.get((name, precision), {}), "transient": ours})
            print(f"{name} {precision}: planned in {off['seconds']} / {free['seconds']} s", file=sys.stderr, flush=True)
    return rows


LABELS = {"gpt2_small": "GPT-2 small, 4 × 256", "bert_base": "BERT-base, 8 × 128", "gpt2_xl": "GPT2-XL, 1 × 512",
          "llama_7b": "LLaMA-7B arch., 1 × 512"}


def table(rows: list[dict]) -> str:
    """MiB. Transient: what the step needs beyond its float32 parameters and AdamW moments."""
    def mib(n):
        return harness.mib(n, 1)

    def against(ours: int, theirs: int | None) -> str:
        return "–" if not theirs else harness.signed_percent((ours - theirs) / theirs)

    out = []
    for r in rows:
        t, off, free = r["pytorch"], r["off"], r["free"]
        total = {mode: r[mode]["persistent"] + r[mode]["arena"] for mode in ("off", "free")}
        out.append([LABELS.get(r["model"], r["model"]), r["precision"], f"{mib(t.get('transient'))} / {mib(t.get('peak'))}",
                    f"{mib(r['transient']['off'])} / {mib(total['off'])} ({mib(off['copies_at_peak'])})",
                    f"{against(r['transient']['off'], t.get('transient'))} / {against(total['off'], t.get('peak'))}",
                    f"{mib(r['transient']['free'])} / {mib(total['free'])} (+{free['added']:,})",
                    f"{against(r['transient']['free'], t.get('transient'))} / {against(total['free'], t.get('peak'))}",
                    f"{off['seconds']} / {free['seconds']}"])
    return harness.markdown_table(
        ["model", "precision", "PyTorch eager (autocast in bf16): transient / total", "roam order + layout: transient / total "
         "(bf16 weight copies live at the peak)", "vs PyTorch", "roam --recompute free: transient / total (nodes added)",
         "vs PyTorch", "plan s (off / free)"], out, "llrrrrrr")
