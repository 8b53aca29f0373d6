#!/usr/bin/env python3
"""Scale: 70B- and 405B-class LLaMA training steps planned with --recompute off and free.

    /work/venvs/exporters/bin/python benchmarks/scale.py --build          # make the steps (torch)
    python benchmarks/scale.py [--only 70b] [--json benchmarks/results/scale.json]

The steps are made as docs/training-graphs.md makes LLaMA-architecture steps without weights:
`transformers.LlamaForCausalLM` built from its configuration on `torch.device("meta")`, exported
with `roam_cli.frontend.torch_export`, then `make-training-graph --backend ort-artifacts --fused
--in-graph-optimizer` (ONNX Runtime's artifacts, its fused ops kept, AdamW inside the graph) into
`<cache>/<model>/full_step.onnx` (default cache /work/scale_cache; a step already there is kept).
`--route roam` makes `roam_step.onnx` with roam's own backward in standard ONNX instead.

Each plan is one `roam optimize STEP -o PLAN --jobs 2 --recompute MODE --gap GAP` command under
`/usr/bin/time -v` (wall time, CPU time of the command and its workers, peak RSS; on a shared
machine the CPU time is the figure that compares runs); the table prints peak live bytes, the order's lower
bound and the gap to it, the layout's fragmentation (arena / peak live - 1), and `roam verify`."""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path("/work/scale_cache")
GIB = 2**30


@dataclass(frozen=True)
class Llama:
    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    batch: int = 1
    seq: int = 512
    vocab: int = 32000


MODELS = {
    "70b": Llama("llama_70b", 80, 8192, 28672, 64),
    "405b": Llama("llama_405b", 126, 16384, 53248, 128),
    "tiny": Llama("llama_tiny_scale", 4, 64, 128, 4),  # the route's smoke test
}
STEP = {"ort": "full_step.onnx", "roam": "roam_step.onnx"}


def export_forward(spec: Llama, folder: Path) -> Path:
    """<folder>/forward.onnx: the model and its own causal-LM loss, exported without weights."""
    import logging
    import warnings

    import torch
    import transformers as hf
    import transformers.masking_utils as masks

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from suite import LanguageModelLoss

    from roam_cli.core.fileio import write_atomic
    from roam_cli.frontend import torch_export

    warnings.filterwarnings("ignore")
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)

    # Two meta-device gaps of torch 2.13 / transformers 4.57, closed without changing the maths:
    # the rotary embedding opens torch.autocast on the input's device ("meta" has no autocast
    # dtype), and the eager causal mask builds a 0-d torch.tensor(0.0) on that device, a constant
    # with no data that the exporter's constant folding then cannot read.
    class Autocast(torch.autocast):
        def __init__(self, device_type, *args, **kwargs):
            super().__init__("cpu" if device_type == "meta" else device_type, *args, **kwargs)

    def eager_mask(*args, dtype=torch.float32, **kwargs):
        kwargs.pop("allow_is_causal_skip", None)
        mask = masks.sdpa_mask(*args, allow_is_causal_skip=False, allow_torch_fix=False, **kwargs)
        return torch.where(mask, 0.0, torch.finfo(dtype).min).to(dtype)

    torch.autocast = Autocast
    masks.AttentionMaskInterface._global_mapping["eager"] = eager_mask
    config = hf.LlamaConfig(vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
                            num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                            num_key_value_heads=spec.heads, attn_implementation="eager", use_cache=False)
    with torch.device("meta"):
        model = hf.LlamaForCausalLM(config)
    model.train()
    ids = torch.zeros((spec.batch, spec.seq), dtype=torch.int64, device="meta")
    exported = torch_export.export(LanguageModelLoss(model), (ids, ids.clone()), ["input_ids", "labels"], ["loss"],
                                   prefix="m.")
    path = folder / "forward.onnx"
    write_atomic(path, exported.model.SerializeToString())
    return path


def build(spec: Llama, cache: Path, route: str) -> Path:
    """The step of `spec` made by `route` (kept when already in the cache)."""
    folder = cache / spec.name
    step = folder / STEP[route]
    if step.exists():
        return step
    folder.mkdir(parents=True, exist_ok=True)
    forward = folder / "forward.onnx"
    t = time.time()
    if not forward.exists():
        export_forward(spec, folder)
        print(f"{spec.name}: exported in {time.time() - t:.0f} s", flush=True)
    from roam_cli.frontend import training_graph

    t = time.time()
    if route == "ort":
        training_graph.make(forward, step, loss="none", in_graph=True, fused=True)
    else:
        from roam_cli.backward.step import build as roam_backward

        training_graph.make(forward, step, loss="none", in_graph=True, backward=roam_backward)
    print(f"{spec.name}: {step.name} in {time.time() - t:.0f} s", flush=True)
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


def plan(step: Path, folder: Path, mode: str, jobs: int, stop_gap: str) -> dict:
    out = folder / f"{step.parent.name}-{step.stem}-{mode}-{stop_gap}.json"
    code, message, wall, cpu, rss = timed("optimize", str(step), "-o", str(out), "--jobs", str(jobs), "--recompute", mode,
                                          "--gap", stop_gap)
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
                  "peak_live_bytes": p["peak_live_bytes"], "arena_bytes": p["arena_bytes"],
                  "bound_bytes": order.get("lower_bound_bytes"),
                  "gap": p["peak_live_bytes"] / order["lower_bound_bytes"] - 1 if order.get("lower_bound_bytes") else None,
                  "proven": order.get("proven_optimal"), "fragmentation": p["arena_bytes"] / p["peak_live_bytes"] - 1,
                  "phases": stats.get("seconds"), "verified": verified}


def gib(n) -> str:
    return "–" if n is None else f"{n / GIB:,.2f}"


def row_md(name: str, r: dict) -> str:
    if "failed" in r:
        return (f"| {name} | {r['mode']} | {r['stop_gap']:g} | {r['seconds']:.1f} | {r['cpu_seconds']:.1f} | {r['rss_gib']:.2f} | "
                f"failed: {r['failed']} | | | | | |")
    gap = "proven optimal" if r["proven"] else ("–" if r["gap"] is None else f"within {100 * r['gap']:.2f} %")
    return (f"| {name} | {r['mode']} | {r['stop_gap']:g} | {r['seconds']:.1f} | {r['cpu_seconds']:.1f} | {r['rss_gib']:.2f} | {r['nodes']:,} (+{r['nodes_added']:,}) | "
            f"{gib(r['peak_live_bytes'])} | {gib(r['bound_bytes'])} | {gap} | {100 * r['fragmentation']:.3f} % | "
            f"{'yes' if r['verified'] else 'NO'} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="70b,405b", help="comma-separated: 70b, 405b, tiny")
    ap.add_argument("--cache", type=Path, default=CACHE)
    ap.add_argument("--route", choices=sorted(STEP), default="ort",
                    help="ort: ORT's fused artifacts (default); roam: roam's own backward, standard ONNX")
    ap.add_argument("--build", action="store_true", help="only make the steps (needs torch, onnxruntime-training)")
    ap.add_argument("--modes", default="off,free")
    ap.add_argument("--gaps", default="0", help="comma-separated values of optimize --gap")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", dest="json_out", type=Path)
    args = ap.parse_args(argv)
    specs = [MODELS[m] for m in args.only.split(",")]
    if args.build:
        for spec in specs:
            print(build(spec, args.cache, args.route))
        return 0
    rows = []
    print("| step | recompute | --gap | wall s | CPU s | peak RSS GiB | nodes (added) | peak live GiB | bound GiB | order | fragmentation | verifies |\n"
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for spec in specs:
            step = args.cache / spec.name / STEP[args.route]
            if not step.exists():
                raise SystemExit(f"{step} is missing: make it with --build (in /work/venvs/exporters)")
            for mode, stop_gap in itertools.product(args.modes.split(","), args.gaps.split(",")):
                r = plan(step, Path(tmp), mode, args.jobs, stop_gap) | {"step": spec.name, "route": args.route}
                rows.append(r)
                print(row_md(spec.name, r), flush=True)
                if args.json_out:  # after every row: a 405B-class run takes many minutes
                    meta = {"date": datetime.date.today().isoformat(),
                            "machine": f"{platform.machine()}, {platform.python_version()}",
                            "command": "python " + " ".join(["benchmarks/scale.py",
                                                             *(argv if argv is not None else sys.argv[1:])])}
                    args.json_out.write_text(json.dumps(meta | {"rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
