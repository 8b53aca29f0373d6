#!/usr/bin/env python3
"""roam's plans of mixed-precision steps against PyTorch AMP eager's memory, on the models the
issue names: GPT-2 small 4 x 256, BERT-base 8 x 128, GPT2-XL 1 x 512, the LLaMA-7B architecture 1 x 512.

    /work/venvs/torch/bin/python benchmarks/amp_memory.py --build          # the exports and steps (torch)
    python benchmarks/amp_memory.py --json benchmarks/results/amp_memory.json

The exports are made without weights, as the suite makes them (`benchmarks/suite.py`: the models on
the meta device, the model's own loss; LLaMA as `benchmarks/scale.py` exports it), into `--cache`
(default /work/amp_cache). Each is made into its float32 step and its bf16 AMP step by
`make-training-graph --loss none --in-graph-optimizer [--precision bf16]` (roam's backward,
AdamW inside), and each step is planned by `roam optimize --jobs 2` with `--recompute off` (order
and layout alone) and `--recompute free`. PyTorch's figures are benchmarks/pytorch_memory.py's
(`--amp bf16`: MemTracker under FakeTensorMode, the forward under torch.autocast, foreach AdamW,
the second step), read from its JSON (`--pytorch`).

The comparison is of the bytes a step needs beyond its float32 parameters and AdamW moments (the
same in both): PyTorch's transient (peak - parameters - moments: activations, gradients, the bf16
weight copies autocast caches, the optimizer's temporaries) against roam's (persistent + arena -
parameters - moments: the arena, plus the step counter, constants and the batch roam counts as
persistent). The totals are beside them."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path("/work/amp_cache")
MIB = 2**20
MODELS = ("gpt2_small", "bert_base", "gpt2_xl", "llama_7b")
PRECISIONS = ("fp32", "bf16")


def build(name: str, cache: Path) -> Path:
    """<cache>/<model>/forward.onnx, the export without weights (kept when already there)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import scale
    import suite

    folder = cache / name
    forward = folder / "forward.onnx"
    if forward.exists():
        return forward
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


def pytorch_figures(path: Path) -> dict:
    """{(model, precision): {transient, peak}} in bytes, from pytorch_memory.py's JSON (transient: the
    step's peak less parameters and optimizer state)."""
    if not path.exists():
        return {}
    names = {"float32": "fp32"}
    return {(m["model"], names.get(p, p)): {"transient": r["transient_bytes"], "peak": r["peak"]["Total"]}
            for m in json.loads(path.read_text())["models"] for p, r in m["precisions"].items() if r.get("ok")}


def mib(n) -> str:
    return "–" if n is None else f"{n / MIB:,.1f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--only", default=",".join(MODELS))
    p.add_argument("--cache", type=Path, default=CACHE)
    p.add_argument("--build", action="store_true", help="only make the exports and steps (needs torch)")
    p.add_argument("--pytorch", type=Path, default=ROOT / "benchmarks/results/pytorch_memory_amp.json")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    names = a.only.split(",")
    if a.build:
        for name in names:
            forward = build(name, a.cache)
            for precision in PRECISIONS:
                print(step(forward, precision), flush=True)
        return 0
    theirs = pytorch_figures(a.pytorch)
    rows = []
    print("| model | precision | PyTorch eager: transient / peak MiB | roam order + layout: transient / total MiB "
          "(bf16 weight copies at the peak) | roam --recompute free: transient / total MiB (nodes added) | plan s "
          "(off / free) |")
    print("|---|---|---:|---:|---:|---:|")
    for name in names:
        for precision in PRECISIONS:
            path = a.cache / name / f"step.{precision}.onnx"
            off, free = plan(path, "off"), plan(path, "free")
            ours = {mode: r["persistent"] + r["arena"] - r["masters_and_moments"] for mode, r in (("off", off),
                                                                                                  ("free", free))}
            t = theirs.get((name, precision), {})
            rows.append({"model": name, "precision": precision, "off": off, "free": free, "pytorch": t,
                         "transient": ours})
            print(f"| {name} | {precision} | {mib(t.get('transient'))} / {mib(t.get('peak'))} | "
                  f"{mib(ours['off'])} / {mib(off['persistent'] + off['arena'])} ({mib(off['copies_at_peak'])}) | "
                  f"{mib(ours['free'])} / {mib(free['persistent'] + free['arena'])} (+{free['added']:,}) | "
                  f"{off['seconds']} / {free['seconds']} |", flush=True)
            if a.json:
                a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
