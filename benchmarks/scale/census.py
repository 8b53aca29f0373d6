"""Census of planning quality: every step form roam makes or reads, planned `off` and `free`: how
many plans end within 1 % of their order's lower bound, worst first.

    python -m benchmarks.scale.census --build corpus,recipe    # the corpus and recipe steps (torch, onnxruntime-training)
    python -m benchmarks run scale/census [--recipe DIR]          # recipe, suite, amp, scale, ranks
    python -m benchmarks run scale/census.corpus --only corpus

A step is planned twice, each by one `roam optimize STEP -o PLAN --jobs 2` under `/usr/bin/time -v`
(scale/scale's `plan`: wall and CPU seconds, peak RSS, then `roam verify`): `--recompute off --gap 0`
(the order proven or as close as the search gets) and `--recompute free --gap 0.01` (the targets'
settings). A row says the gap of the plan's peak to its order's lower bound, the layout's
fragmentation (arena / peak - 1), and whether the free plan needs more device bytes than the plan
without recomputation made beside it (never, by construction; checked: `free <= off`). Planning
needs only roam: about 20 minutes for the default families (62 plans), 15 for the corpus (294).

The families, each a folder of the cache (`--cache`, default benchmarks/.cache/census) or another
benchmark's:
- `corpus`: benchmarks/exporters/exporters_corpus.py's 26 architectures in tiny configurations, exported by
  torch's exporter as users export them (dynamo, optimize=False and its default), each made into
  a full AdamW step by `make-training-graph --loss cross-entropy --in-graph-optimizer` in float32,
  and with `--precision bf16` and `fp16` (AMP, float32 masters). `--build corpus` makes them.
- `recipe`: the shared three-script recipe (`--recipe`, default benchmarks/.cache/foreign-steps:
  its README, `llama7b.step.onnx` and `make/`; transformers on the meta
  device, `torch.onnx.export(dynamo=True, optimize=False, opset 18)`, ONNX Runtime's
  `generate_artifacts` as it comes, AdamW appended as 14 plain nodes per parameter after the
  whole backward): the shared LLaMA-2-7B step itself, and `--build recipe` makes LLaMA at other
  sizes and batch shapes, LLaMA with grouped-query attention, and Qwen2 (biased q/k/v
  projections, untied 152k-token head) with the recipe's own scripts (`--recipe`).
- `suite`: benchmarks/suite.py's graphs (GPT-2 small to XL, BERT, ViT, ResNet-50, T5; ONNX
  Runtime's artifacts training graphs and roam's full steps; `--suite-cache`).
- `amp`: precision/amp_memory's bf16 AMP steps (GPT2-XL, LLaMA-7B; `--amp-cache`), and roam's
  bf16 AMP step of the recipe's Qwen2-7B export (`make-training-graph --in-graph-optimizer
  --precision bf16`, made by `--build recipe`).
- `scale`, `foreign`: scale/scale's and scale/foreign's families (their caches; build them there).
- `ranks`: `roam shard --ranks N` of recipe steps (one rank of FSDP), planned as any step.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import harness
from benchmarks.scale.scale import plan
from roam_cli.core.units import format_bytes

TAKES = "about 20 min (62 plans; the corpus variant 15 min); needs the steps built (--build, torch)"
CACHE = harness.CACHE / "census"
RECIPE = harness.CACHE / "foreign-steps"  # the shared recipe: its llama7b.step.onnx and make/
PRECISIONS = ("fp32", "bf16", "fp16")
CORPUS_EXPORTERS = ("dynamo-optimize-false", "dynamo")
# (name, architecture, layers, hidden, heads, kv heads, intermediate, vocab, batch, seq): the recipe's
# steps beyond the shared one (LLaMA-2-70B's shape is the 70B class, LLaMA-3-405B's the 405B class)
RECIPE_STEPS = (
    ("llama-7b-4x1024", "llama", 32, 4096, 32, 32, 11008, 32000, 4, 1024),
    ("llama-70b", "llama", 80, 8192, 64, 64, 28672, 32000, 1, 512),
    ("llama-70b-gqa-2x2048", "llama", 80, 8192, 64, 8, 28672, 32000, 2, 2048),
    ("llama-405b", "llama", 126, 16384, 128, 128, 53248, 32000, 1, 512),
    ("qwen2-7b", "qwen2", 28, 3584, 28, 4, 18944, 152064, 1, 512),
)
RANKS = (("llama-7b", 8, "nvlink4-gpu"), ("llama-70b", 64, "infiniband-ndr-gpu"))
RECIPE_AMP = ("qwen2-7b",)  # recipe exports also made into roam's bf16 AMP step (an architecture never tuned for)
RUNS = (("off", "0"), ("free", "0.01"))


def corpus_steps(cache: Path) -> list[tuple[str, Path]]:
    return sorted((f"{p.parent.name}-{p.stem.split('.')[1]}", p) for p in (cache / "corpus").glob("*/step.*.onnx"))


def build_corpus(cache: Path, only: list[str] | None) -> None:
    """Each architecture exported each way, each export made into its steps; one process per export
    (a failing exporter costs its cell, not the run)."""
    from benchmarks.exporters import exporters_corpus as corpus

    for name in only or corpus.configs():
        for exporter in CORPUS_EXPORTERS:
            folder = cache / "corpus" / f"{name}-{exporter}"
            folder.mkdir(parents=True, exist_ok=True)
            if not (folder / "model.onnx").exists():
                proc = subprocess.run([sys.executable, "-m", "benchmarks.scale.census", "--export-cell",
                                       f"{name}:{exporter}", "--cache", str(cache)], capture_output=True, text=True,
                                      timeout=600, cwd=harness.ROOT)
                if proc.returncode:
                    print(f"{folder.name}: export failed: {proc.stderr.strip().splitlines()[-1:]}", flush=True)
                    continue
            for precision in PRECISIONS:
                step = folder / f"step.{precision}.onnx"
                if step.exists():
                    continue
                made = subprocess.run([sys.executable, "-m", "roam_cli", "-q", "make-training-graph", "model.onnx",
                                       "-o", step.name, "--loss", "cross-entropy", "--in-graph-optimizer",
                                       *(["--precision", precision] if precision != "fp32" else [])],
                                      cwd=folder, capture_output=True, text=True)
                print(f"{folder.name} {precision}: {'made' if made.returncode == 0 else made.stderr.strip()[-200:]}",
                      flush=True)


def export_cell(cell: str, cache: Path) -> None:
    from benchmarks.exporters import exporters_corpus as corpus

    name, exporter = cell.split(":")
    model, feeds, _ = corpus.model_and_batch(name)
    corpus.export(model, feeds, exporter, cache / "corpus" / f"{name}-{exporter}" / "model.onnx")


def recipe_export(arch: str, layers: int, hidden: int, heads: int, kv: int, inter: int, vocab: int, batch: int,
                  seq: int, out: Path) -> None:
    """The recipe's step 1 for `arch` (llama | qwen2): make/meta_export.py's export, with the key/value
    heads and the architecture as parameters (its weights on the meta device, an external data file
    never written)."""
    import onnx
    import torch
    import transformers as hf
    from onnx import TensorProto, helper

    cls, config = {"llama": (hf.LlamaForCausalLM, hf.LlamaConfig), "qwen2": (hf.Qwen2ForCausalLM, hf.Qwen2Config)}[arch]
    cfg = config(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                 intermediate_size=inter, vocab_size=vocab, max_position_embeddings=4096, tie_word_embeddings=False)
    cfg._attn_implementation = "eager"
    with torch.device("meta"):
        model = cls(cfg)

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(input_ids=ids, use_cache=False).logits.reshape(-1, vocab)

    program = torch.onnx.export(Logits(model), (torch.randint(0, vocab, (batch, seq), device="meta"),), dynamo=True,
                                opset_version=18, optimize=False)
    program.save(str(out), include_initializers=False)
    exported = onnx.load(str(out), load_external_data=False)
    location, offset = out.name + ".data", 0
    for name, value in program.model.graph.initializers.items():
        dims = [int(d) for d in value.shape]
        nbytes = int(torch.Size(dims).numel()) * helper.tensor_dtype_to_np_dtype(int(value.dtype)).itemsize
        t = TensorProto(name=name, dims=dims, data_type=int(value.dtype), data_location=TensorProto.EXTERNAL)
        for k, v in (("location", location), ("offset", str(offset)), ("length", str(nbytes))):
            entry = t.external_data.add()
            entry.key, entry.value = k, v
        exported.graph.initializer.append(t)
        offset += -(-nbytes // 4096) * 4096
    onnx.save(exported, str(out))
    with open(out.with_name(location), "wb") as f:
        f.truncate(offset)  # sparse: no disk


def build_recipe(cache: Path, recipe: Path, only: list[str] | None) -> None:
    """Each of RECIPE_STEPS made by the recipe: the export above, then make/artifacts.py and
    make/adamw_suffix.py as they come."""
    for name, *shape in RECIPE_STEPS:
        if only and name not in only:
            continue
        folder = cache / "recipe" / name
        folder.mkdir(parents=True, exist_ok=True)
        if (folder / "step.onnx").exists():
            continue
        if not (folder / "model.onnx").exists():
            recipe_export(*shape, folder / "model.onnx")
        data = (folder / "model.onnx.data").stat().st_size
        subprocess.run([sys.executable, recipe / "make" / "artifacts.py", "model.onnx", "art", str(data)], cwd=folder,
                       check=True, capture_output=True)
        subprocess.run([sys.executable, recipe / "make" / "adamw_suffix.py", "art/training_model.onnx", "step.onnx"],
                       cwd=folder, check=True)
    for name in RECIPE_AMP:
        folder = cache / "recipe" / name
        if (folder / "model.onnx").exists() and not (folder / "step.bf16.onnx").exists():
            subprocess.run([sys.executable, "-m", "roam_cli", "-q", "make-training-graph", "model.onnx", "-o",
                            "step.bf16.onnx", "--loss", "cross-entropy", "--in-graph-optimizer", "--precision", "bf16"],
                           cwd=folder, check=True)


def recipe_steps(cache: Path, recipe: Path) -> list[tuple[str, Path]]:
    shared = [("llama-7b", recipe / "llama7b.step.onnx")] if (recipe / "llama7b.step.onnx").exists() else []
    return shared + sorted((p.parent.name, p) for p in (cache / "recipe").glob("*/step.onnx"))


def rank_steps(cache: Path, recipe: Path) -> list[tuple[str, Path, str]]:
    """(name, rank step, device profile) of RANKS, sharded now where not yet."""
    steps = dict(recipe_steps(cache, recipe))
    out = []
    for name, ranks, device in RANKS:
        if name not in steps:
            continue
        rank = cache / "ranks" / f"{name}-n{ranks}.onnx"
        if not rank.exists():
            rank.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([sys.executable, "-m", "roam_cli", "-q", "shard", str(steps[name]), "--ranks", str(ranks),
                            "-o", str(rank)], check=True)
        out.append((f"{name}-n{ranks}", rank, device))
    return out


def cache_steps(folder: Path, pattern: str) -> list[tuple[str, Path]]:
    return sorted((f"{p.parent.name}/{p.name}", p) for p in folder.glob(pattern)) if folder.exists() else []


def row(family: str, name: str, step: Path, mode: str, gap: str, plans: Path, device: str | None) -> dict:
    key = f"{family}-{name.replace('/', '-')}"
    r = plan(key, step, plans, mode, 2, gap, device)
    if "failed" not in r and mode != "off":  # the plan without recomputation it was made beside
        before = json.loads((plans / f"{key}-{mode}-{gap}.json").read_text())["stats"]["recompute"]["before"]
        r["off_beside_bytes"] = r["persistent_bytes"] + before["arena_bytes"]
    return r | {"family": family, "step": name, "path": str(step)}


def needed(r: dict) -> int | None:
    return r["persistent_bytes"] + r["arena_bytes"] if "failed" not in r else None


def above_off(pair: dict[str, dict]) -> bool | None:
    """Whether the free plan needs more device bytes than the plan without recomputation made
    beside it (the one `optimize --recompute free` weighs it against; an `off` run of its own may
    differ by what a time-limited search finds under other load), None when either failed."""
    if "free" not in pair or "off_beside_bytes" not in pair["free"]:
        return None
    return needed(pair["free"]) > pair["free"]["off_beside_bytes"]


def family_steps(family: str, args) -> list[tuple[str, Path, str | None]]:
    """(name, step, device profile) of a family's steps that are made (a family not built yields none)."""
    found = {"corpus": lambda: corpus_steps(args.cache),
             "recipe": lambda: recipe_steps(args.cache, args.recipe),
             "suite": lambda: (cache_steps(args.suite_cache, "*/training_model.onnx")
                               + cache_steps(args.suite_cache, "*/full_step.onnx")),
             "amp": lambda: (cache_steps(args.amp_cache, "*/step.bf16.onnx")
                             + cache_steps(args.cache / "recipe", "*/step.bf16.onnx")),
             "scale": lambda: cache_steps(args.scale_cache, "*/*step*.onnx"),
             "foreign": lambda: cache_steps(args.foreign_cache, "*/step.*.onnx"),
             "ranks": lambda: []}[family]()
    steps = [(name, path, None) for name, path in found]
    if family == "ranks":
        steps += rank_steps(args.cache, args.recipe)
    return steps


def options(prog: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--steps", help="only the steps whose name contains one of these (comma-separated)")
    ap.add_argument("--cache", type=Path, default=CACHE)
    ap.add_argument("--recipe", type=Path, default=RECIPE, help="the shared recipe's folder (its step and make/)")
    return ap


def main(argv: list[str]) -> dict:
    ap = options("python -m benchmarks run scale/census")
    ap.add_argument("--only", default="recipe,suite,amp,scale,ranks",
                    help="families: corpus, recipe, suite, amp, scale, foreign, ranks (the corpus is its own record: "
                         "scale/census.corpus --only corpus)")
    ap.add_argument("--suite-cache", type=Path, default=harness.CACHE / "suite")
    ap.add_argument("--amp-cache", type=Path, default=harness.CACHE / "amp")
    ap.add_argument("--scale-cache", type=Path, default=harness.CACHE / "scale")
    ap.add_argument("--foreign-cache", type=Path, default=harness.CACHE / "foreign")
    ap.add_argument("--plans", type=Path, help="keep the plans here (default: a temporary folder)")
    args = ap.parse_args(argv)
    picked = args.steps.split(",") if args.steps else None
    work = [(family, *step) for family in args.only.split(",") for step in family_steps(family, args)]
    if picked:
        work = [w for w in work if any(p in w[1] for p in picked)]
    if not work:
        sys.exit(f"no steps of {args.only} are made: `python -m benchmarks.scale.census --build corpus,recipe`, "
                 "`python -m benchmarks.suite`, and the scale and precision benchmarks' --build make them")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        plans = args.plans or Path(tmp)
        plans.mkdir(parents=True, exist_ok=True)
        for family, name, path, device in work:
            for mode, gap in RUNS:
                rows.append(row(family, name, path, mode, gap, plans, device))
                r = rows[-1]
                print(f"{family} {name} {mode}: " + (r["failed"] if "failed" in r else
                      f"gap {100 * r['gap']:.2f} %, fragmentation {100 * r['fragmentation']:.3f} %, {r['seconds']:.1f} s"),
                      file=sys.stderr, flush=True)
    return {"rows": rows}


def group(r: dict) -> str:
    """The census's summary groups: the family, and for the corpus its precision."""
    return f"corpus {r['step'].rsplit('-', 1)[-1]}" if r["family"] == "corpus" else r["family"]


def summary(rows: list[dict]) -> dict:
    by_step: dict[tuple[str, str], dict[str, dict]] = {}
    for r in rows:
        by_step.setdefault((r["family"], r["step"]), {})[r["mode"]] = r
    planned = [r for r in rows if "failed" not in r]
    within = [r for r in planned if r["gap"] <= 0.01]
    return {"plans": len(rows), "steps": len(by_step), "planned": len(planned), "within": len(within),
            "steps_within": sum(all("failed" not in r and r["gap"] <= 0.01 for r in pair.values())
                                for pair in by_step.values()),
            "over_3": sum(r["gap"] > 0.03 for r in planned),
            "worst_gap": max((r["gap"] for r in planned), default=0),
            "fragmentation": max((r["fragmentation"] for r in planned), default=0),
            "not_verified": sum(not r["verified"] for r in planned),
            "free_above_off": sum(bool(above_off(pair)) for pair in by_step.values())}


def table(results: dict, worst: int = 8) -> str:
    """Each family's plans summed up, then the worst plans, then the census's line."""
    rows = results["rows"]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((group(r), r["mode"]), []).append(r)
    lines = []
    for (name, mode), rs in groups.items():
        ok = [r for r in rs if "failed" not in r]
        lines.append([name, mode, len(rs), sum(r["gap"] <= 0.01 for r in ok), sum(r["gap"] > 0.03 for r in ok),
                      f"{100 * max((r['gap'] for r in ok), default=0):.2f} %",
                      f"{100 * max((r['fragmentation'] for r in ok), default=0):.3f} %",
                      f"{max((r['seconds'] for r in ok), default=0):.1f}",
                      f"{max((r['rss_gib'] for r in ok), default=0):.2f}", len(rs) - len(ok),
                      sum(r["verified"] for r in ok)])
    text = harness.markdown_table(["family", "recompute", "plans", "within 1 %", "over 3 %", "worst gap",
                                   "fragmentation at most", "wall s at most", "RSS GiB at most", "failed",
                                   "verified"], lines, "llrrrrrrrrr")
    by_step: dict[tuple[str, str], dict[str, dict]] = {}
    for r in rows:
        by_step.setdefault((r["family"], r["step"]), {})[r["mode"]] = r
    tail = []
    for r in sorted(rows, key=lambda r: -(r.get("gap") or 0) if "failed" not in r else -1e9)[:worst]:
        if "failed" in r:
            tail.append([r["family"], r["step"], r["mode"], f"failed: {r['failed'][:120]}"] + [""] * 8)
            continue
        above = above_off(by_step[(r["family"], r["step"])])
        tail.append([r["family"], r["step"], r["mode"], format_bytes(r["peak_live_bytes"]),
                     format_bytes(r["bound_bytes"]), f"{100 * r['gap']:.2f} %", f"{100 * r['fragmentation']:.3f} %",
                     f"{r['seconds']:.1f}", f"{r['cpu_seconds']:.1f}", f"{r['rss_gib']:.2f}",
                     "yes" if r["verified"] else "NO", "–" if above is None else "NO" if above else "yes"])
    if tail:
        text += f"\nThe worst {len(tail)} plans:\n\n" + harness.markdown_table(
            ["family", "step", "recompute", "peak", "bound", "gap", "fragmentation", "wall s", "CPU s", "RSS GiB",
             "verifies", "free <= off"], tail, "lll" + "r" * 7 + "ll")
    s = summary(rows)
    return (text + f"\n{s['plans']} plans of {s['steps']} steps: {s['within']} of {s['planned']} within 1 % of their "
            f"bound ({100 * s['within'] / max(s['planned'], 1):.1f} %; both plans of {s['steps_within']} of "
            f"{s['steps']} steps), {s['over_3']} above 3 %, the worst {100 * s['worst_gap']:.2f} %; fragmentation "
            f"at most {100 * s['fragmentation']:.3f} %; {s['plans'] - s['planned']} failed; {s['not_verified']} not "
            f"verified; free above off on {s['free_above_off']} steps. `off` is `--recompute off --gap 0`, `free` "
            "`--recompute free --gap 0.01`, `--jobs 2`.\n")


if __name__ == "__main__":  # only --build (make steps) and --export-cell (its worker)
    b = options("python -m benchmarks.scale.census --build")
    b.add_argument("--build", help="make these families' steps: corpus (torch), recipe (torch, onnxruntime-training)")
    b.add_argument("--export-cell", help=argparse.SUPPRESS)
    a = b.parse_args()
    if a.export_cell:
        export_cell(a.export_cell, a.cache)
    elif a.build:
        only = a.steps.split(",") if a.steps else None
        for fam in a.build.split(","):
            {"corpus": lambda: build_corpus(a.cache, only), "recipe": lambda: build_recipe(a.cache, a.recipe, only)}[fam]()
    else:
        b.error("--build FAMILIES (the benchmark itself: python -m benchmarks run scale/census)")
