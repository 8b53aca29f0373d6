"""Does roam train what users export? 27 architectures x 3 exporters, each training graph against PyTorch autograd.

The corpus: Hugging Face architectures in tiny configurations (2 layers or stages, hidden 32-64,
vocabulary 128; batch 2, 8 tokens or 32x32 images), built from their configuration with random
weights (seed 0, every parameter then moved by N(0, 0.02^2): `autograd_check.fresh`), every
configured dropout probability 0 and the architecture's own tie_word_embeddings, no download.
Each model is put in eval mode, as `from_pretrained` gives it and as users export it, and exported
three ways (causal LMs take an all-ones attention_mask beside input_ids in all three; with
transformers 4.57 the TorchScript exporter fails on most of them either way, `unordered_map::at`:
it cannot trace the vmap that builds their causal masks):

- dynamo:                torch.onnx.export(model, args, path, kwargs=..., dynamo=True)  (optimize=True)
- dynamo-optimize-false: the same with optimize=False
- torchscript:           torch.onnx.export(model, args, path, kwargs=..., dynamo=False, opset_version=17)

An export that fails is recorded with the exporter's first line, not counted against roam, and so is
one whose graph takes an input beyond the model's (Falcon's TorchScript trace: a traced integer). Then
`roam make-training-graph model.onnx -o train.onnx --loss cross-entropy --json` runs (the venv's
`roam`, its exit code and stderr kept). Of a training graph written:
- whether ONNX Runtime creates a session for it (the target: no graph written that it refuses);
- it runs once on PyTorch's weights (each parameter input by its PyTorch name; an input under
  another name, a constant the exporter made, gets the export's value) and one batch, and each
  gradient it computes for an input named like a PyTorch parameter is compared with
  autograd's: the same module in train mode, F.cross_entropy (mean) on the same logits and labels
  (LM logits viewed as [tokens, vocab]; SegFormer's [B, C, H', W'] against labels [B, H', W']).
  The error is ||g_roam - g_torch|| / ||g_torch|| (`autograd_check.relative_errors`, whose
  exact-zero gradients are apart); a tensor's tolerance is max(1e-4, 10 x ||g32 - g64|| / ||g64||),
  g64 from a float64 copy of the module: PyTorch's own float32 noise floor. A zero-gradient
  tensor passes when roam's ||g_roam - g_torch|| is within 10 x ||g32 - g64|| or below the 1e-6 of
  the largest gradient's norm that made it one;
- parameters trained / PyTorch's: a PyTorch parameter (one that gets a gradient; tied ones once,
  under `named_parameters()`'s name) counts when the graph trains an input of one of its names (a
  tied parameter is one tensor under several names: `roam train --save-weights` writes it under
  the name trained, and `load_state_dict` fills the one tensor), its gradient compared under that
  name; those it does not train are listed, with whether roam's stderr warnings named them.

Each (model, exporter) cell runs in its own process (`benchmarks/cells.py`), killed after
`--timeout` seconds; `--jobs` cells at a time. The exports and training graphs stay in `--out`
(default benchmarks/.cache/exporters_corpus/<model>-<exporter>/), where
`exporters/gradcheck_corpus` reads them.

    python -m benchmarks run exporters/exporters_corpus                       # every cell, about 10 min
    python -m benchmarks run exporters/exporters_corpus.mobilenet --only mobilenet-v2-default,mobilenet-v2
    python -m benchmarks run exporters/exporters_corpus.smoke --only gpt2,bert --exporters dynamo

Needs the bench extra (torch, transformers 4.57, onnxscript) and `roam` installed in the same
environment. scale/census and precision/amp_corpus build their models with `configs`,
`model_and_batch` and `export`."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx

try:
    import torch
except ImportError:  # the records' tables need no torch; measuring does
    torch = None
from onnx import numpy_helper

from benchmarks import cells, harness
from benchmarks.exporters.autograd_check import (GRADIENT_BUFFER, TOLERANCE, fresh, relative_errors, roam_gradients,
    session, torch_gradients)
from benchmarks.exporters.exporters import Wrapped
from roam_cli.core.errors import first_line

TAKES = "about 10 min (81 cells, 2 at a time); needs the bench extra (torch, transformers 4.57, onnxscript)"
BATCH, SEQ, IMAGE = 2, 8, 32
EXPORTERS = ("dynamo", "dynamo-optimize-false", "torchscript")
ROAM = Path(sys.executable).parent / "roam"


def configs():
    """name -> (config, model class, kind): causal / masked (language models), image, segmentation."""
    import transformers as hf

    eager = dict(attn_implementation="eager")
    lm = dict(vocab_size=128, max_position_embeddings=32, use_cache=False, **eager)
    llama = dict(lm, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2)  # grouped-query attention: 2 key/value heads for 4 query heads
    encoder = dict(vocab_size=128, max_position_embeddings=32, hidden_size=32, num_hidden_layers=2,
                   num_attention_heads=2, intermediate_size=64, **eager)
    vit = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=IMAGE,
               patch_size=8, num_labels=10, **eager)
    return {
        "gpt2": (hf.GPT2Config(vocab_size=128, n_positions=32, n_layer=2, n_embd=32, n_head=2, use_cache=False,
                               **eager), hf.GPT2LMHeadModel, "causal"),
        "gpt-neo": (hf.GPTNeoConfig(num_layers=2, hidden_size=32, num_heads=2, window_size=4,
                                    attention_types=[[["global", "local"], 1]], **lm), hf.GPTNeoForCausalLM, "causal"),
        "gpt-neox": (hf.GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                      **lm), hf.GPTNeoXForCausalLM, "causal"),
        "opt": (hf.OPTConfig(hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=2,
                             word_embed_proj_dim=32, **lm), hf.OPTForCausalLM, "causal"),
        "bloom": (hf.BloomConfig(vocab_size=128, hidden_size=32, n_layer=2, n_head=2, use_cache=False, **eager),
                  hf.BloomForCausalLM, "causal"),
        "llama-gqa": (hf.LlamaConfig(**llama), hf.LlamaForCausalLM, "causal"),
        "mistral": (hf.MistralConfig(**llama), hf.MistralForCausalLM, "causal"),
        "qwen2": (hf.Qwen2Config(**llama), hf.Qwen2ForCausalLM, "causal"),
        "qwen3": (hf.Qwen3Config(head_dim=16, **llama), hf.Qwen3ForCausalLM, "causal"),
        "phi3": (hf.Phi3Config(pad_token_id=0, bos_token_id=1, eos_token_id=2, **llama), hf.Phi3ForCausalLM,
                 "causal"),
        "gemma": (hf.GemmaConfig(head_dim=16, **llama), hf.GemmaForCausalLM, "causal"),
        "falcon": (hf.FalconConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   use_cache=False, **eager), hf.FalconForCausalLM, "causal"),
        "bert": (hf.BertConfig(**encoder), hf.BertForMaskedLM, "masked"),
        "roberta": (hf.RobertaConfig(**dict(encoder, max_position_embeddings=40)),  # positions start after padding
                    hf.RobertaForMaskedLM, "masked"),
        "distilbert": (hf.DistilBertConfig(vocab_size=128, max_position_embeddings=32, dim=32, n_layers=2, n_heads=2,
                                           hidden_dim=64, **eager), hf.DistilBertForMaskedLM, "masked"),
        "albert": (hf.AlbertConfig(embedding_size=16, **encoder), hf.AlbertForMaskedLM, "masked"),
        "electra": (hf.ElectraConfig(embedding_size=16, **encoder), hf.ElectraForMaskedLM, "masked"),
        "deberta-v2": (hf.DebertaV2Config(relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=16,
                                          max_relative_positions=-1, position_biased_input=False,
                                          norm_rel_ebd="layer_norm", share_att_key=True, **encoder),  # DeBERTa-v3's
                       hf.DebertaV2ForMaskedLM, "masked"),
        "vit": (hf.ViTConfig(**vit), hf.ViTForImageClassification, "image"),
        "deit": (hf.DeiTConfig(**vit), hf.DeiTForImageClassification, "image"),
        "swin": (hf.SwinConfig(image_size=IMAGE, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2],
                               window_size=4, num_labels=10, **eager), hf.SwinForImageClassification, "image"),
        "convnext": (hf.ConvNextConfig(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], num_labels=10),
                     hf.ConvNextForImageClassification, "image"),
        "resnet": (hf.ResNetConfig(embedding_size=8, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic",
                                   num_labels=10), hf.ResNetForImageClassification, "image"),
        "mobilenet-v2": (hf.MobileNetV2Config(image_size=IMAGE, depth_multiplier=0.25, num_labels=10),
                         hf.MobileNetV2ForImageClassification, "image"),
        # the default width at 32x32: its last stages are 1x1, so each BatchNorm normalises 2 values per
        # channel and float32's rounding in the forward moves ReLU6 inputs near 0 across it; PyTorch's own
        # float32 gradients are then 28 % from float64's at the stem, and roam's 30-50 % from PyTorch's
        # float32 ones while 7.5 % from float64's: the `roam64` figure says which is nearer the truth
        "mobilenet-v2-default": (hf.MobileNetV2Config(image_size=IMAGE, num_labels=10),
                                 hf.MobileNetV2ForImageClassification, "image"),
        "efficientnet": (hf.EfficientNetConfig(image_size=IMAGE, width_coefficient=0.25, depth_coefficient=0.25,
                                               hidden_dim=320, num_labels=10),  # round_filters(1280) at 0.25
                         hf.EfficientNetForImageClassification,
                         "image"),
        "segformer": (hf.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                                         patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2],
                                         mlp_ratios=[2, 2], decoder_hidden_size=32, num_labels=10),
                      hf.SegformerForSemanticSegmentation, "segmentation"),
    }


def no_dropout(config):
    """Every dropout-like probability of `config` (dropout, pdrop, drop_path, drop_connect, ...) set to 0."""
    for key, value in vars(config).items():
        if "drop" in key and isinstance(value, (int, float)) and not isinstance(value, bool):
            setattr(config, key, 0.0)
    return config


def model_and_batch(name: str):
    """(model in eval mode, the batch by input name, the labels)."""
    config, cls, kind = configs()[name]
    model = fresh(cls, no_dropout(config)).eval()
    assert all(m.p == 0 for m in model.modules() if isinstance(m, torch.nn.Dropout)), name
    rng = np.random.default_rng(0)
    if kind in ("causal", "masked"):
        feeds = {"input_ids": rng.integers(0, config.vocab_size, (BATCH, SEQ))}
        if kind == "causal":
            feeds["attention_mask"] = np.ones((BATCH, SEQ), np.int64)
    else:
        feeds = {"pixel_values": rng.standard_normal((BATCH, 3, IMAGE, IMAGE)).astype(np.float32)}
    with torch.no_grad():
        shape = Wrapped(model, list(feeds)[1:])(*map(torch.from_numpy, feeds.values())).shape
    # the class axis: 1 for segmentation ([B, C, H', W'] logits), the last otherwise
    classes, rest = (shape[1], (shape[0], *shape[2:])) if kind == "segmentation" else (shape[-1], shape[:-1])
    return model, feeds, rng.integers(0, classes, tuple(rest))


def export(model, feeds: dict[str, np.ndarray], exporter: str, path: Path) -> None:
    first, *rest = feeds
    args, kwargs = (torch.from_numpy(feeds[first]),), {k: torch.from_numpy(feeds[k]) for k in rest}
    if exporter == "torchscript":
        torch.onnx.export(model, args, str(path), kwargs=kwargs, dynamo=False, opset_version=17)
    else:
        options = {"optimize": False} if exporter == "dynamo-optimize-false" else {}
        torch.onnx.export(model, args, str(path), kwargs=kwargs, dynamo=True, **options)


def cell(name: str, exporter: str, folder: Path) -> dict:
    """Export model `name` with `exporter` into `folder`, make its training graph, check it."""
    harness.quiet_torch(torch)
    model, feeds, labels = model_and_batch(name)
    weights = {n: t.detach().numpy().copy() for n, t in [*model.named_parameters(remove_duplicate=False),
                                                          *model.named_buffers(remove_duplicate=False)]}
    r = dict(model=name, exporter=exporter)
    try:
        export(model, feeds, exporter, folder / "model.onnx")
    except Exception as e:  # noqa: BLE001  (the exporter's own failure: the cell says it)
        return r | {"export_error": f"{type(e).__name__}: {first_line(e)}"}
    forward = onnx.load(str(folder / "model.onnx"))
    constants = {t.name: t for t in forward.graph.initializer}
    batch_inputs = [i.name for i in forward.graph.input if i.name not in constants]  # TorchScript's: input.1, ...
    if len(batch_inputs) > len(feeds):  # a value the trace made an input: no batch of the model's fills it
        extra = ", ".join(batch_inputs[len(feeds):])
        return r | {"export_error": f"the export takes inputs the model does not: {extra}"}
    proc = subprocess.run([str(ROAM), "make-training-graph", "model.onnx", "-o", "train.onnx", "--loss",
                           "cross-entropy", "--json"], cwd=folder, capture_output=True, text=True)
    lines = proc.stderr.strip().splitlines()
    r |= dict(exit=proc.returncode, warnings=[x.removeprefix("warning: ") for x in lines if x.startswith("warning: ")],
              stderr=[x for x in lines if not x.startswith("warning: ")])

    wrapped = Wrapped(model.train(), list(feeds)[1:])
    grads = torch_gradients(wrapped, feeds, labels)
    grads64 = torch_gradients(copy.deepcopy(wrapped).double(), feeds, labels, torch.float64)
    r["pytorch"] = list(grads)
    if proc.returncode != 0:
        return r
    train = onnx.load(str(folder / "train.onnx"))
    trained = [i.name[: -len(GRADIENT_BUFFER)] for i in train.graph.input if i.name.endswith(GRADIENT_BUFFER)]
    aliases: dict[int, list[str]] = {}
    for n, t in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(t), []).append(n)
    # a tied parameter is one tensor under several PyTorch names: trained under any of them, it is trained
    # (roam train --save-weights writes it under that name, and load_state_dict fills the one tensor)
    trained_as = {names[0]: next((a for a in names if a in trained), None) for names in aliases.values()}
    untrained = [p for p in grads if trained_as.get(p) is None]
    named = [p for p in untrained if any(re.search(rf"(?<![\w.]){re.escape(p)}(?![\w.])", w) for w in r["warnings"])]
    listed = accounted(json.loads(proc.stdout))
    r |= dict(trained=[p for p in grads if trained_as.get(p)], other_trained=[p for p in trained if p not in
                                                                               trained_as.values()],
              trained_as={p: a for p, a in trained_as.items() if a and a != p and p in grads},
              untrained=untrained, untrained_named=named, untrained_listed=[p for p in untrained if p in listed])
    try:
        session(train)
        r["ort_loads"] = True
    except Exception as e:  # noqa: BLE001
        return r | {"ort_loads": False, "ort_error": one_line(e)}

    values = {n: feeds[n] if n in feeds else list(feeds.values())[k] for k, n in enumerate(batch_inputs)}
    for i in train.graph.input:
        if i.name in weights:
            values[i.name] = weights[i.name]
        elif i.name in constants:
            values[i.name] = numpy_helper.to_array(constants[i.name])
    unknown = [p for p in trained if p not in values]
    if unknown:
        return r | {"run_error": f"{len(unknown)} trained inputs are neither PyTorch parameters nor initializers of "
                                 f"the export, so nothing gives their values: {', '.join(unknown[:4])}"}
    try:
        ours = roam_gradients(train, {**values, "labels": labels})
    except Exception as e:  # noqa: BLE001
        return r | {"run_error": f"{type(e).__name__}: {one_line(e)}"}

    compared = {p: grads[p] for p in r["trained"]}
    if not compared:
        return r
    errors, noise = relative_errors({p: ours[trained_as[p]] for p in compared}, compared)
    off64 = {p: float(np.linalg.norm(grads[p] - grads64[p]) / np.linalg.norm(grads64[p])) for p in errors}
    largest = max(float(np.linalg.norm(g)) for g in compared.values())
    r["errors"] = {p: (e, max(TOLERANCE, 10 * off64[p])) for p, e in errors.items()}
    # each side's distance to float64: where PyTorch's float32 noise is large, which one is nearer
    r["to_float64"] = {p: (float(np.linalg.norm(ours[trained_as[p]] - grads64[p]) / np.linalg.norm(grads64[p])),
                           off64[p]) for p in errors}
    r["noise"] = {p: (diff, max(1e-6 * largest, 10 * float(np.linalg.norm(grads[p] - grads64[p]))))
                  for p, (_, diff) in noise.items()}
    r["over"] = [p for p, (e, tol) in (r["errors"] | r["noise"]).items() if not e <= tol]
    return r


def accounted(made: dict) -> set[str]:
    """Every name roam's --json output gives as folded, merged, missing or tied (the warnings show
    four of each kind)."""
    names = set(made["missing"])
    for key in ("folded", "merged", "tied"):  # name -> name, or name -> [names]
        for k, v in made[key].items():
            names |= {k, *([v] if isinstance(v, str) else v)}
    return names


def one_line(e: Exception) -> str:
    """ONNX Runtime's message, whose lines all matter, as one line."""
    return " ".join(str(e).split())[:300]


# --- the driver: one process per cell ------------------------------------------------------------


def outcome(r: dict) -> str:
    """The cell's status, as the progress lines say it."""
    if "crash" in r:
        return "crash"
    if "export_error" in r:
        return "export fails"
    return "built" if r["exit"] == 0 else f"refused (exit {r['exit']})"


def summary(rows: list[dict], exporters: list[str]) -> str:
    """Counts per exporter: each outcome over the exports made."""
    checks = {
        "exports made": lambda r: "export_error" not in r and "crash" not in r,
        "training graph built": lambda r: r.get("exit") == 0,
        "ORT loads the graph written": lambda r: r.get("ort_loads") is True,
        "gradients within tolerance on the parameters roam trains": lambda r: "errors" in r and not r["over"],
        "every parameter PyTorch trains is trained": lambda r: "trained" in r and not r["untrained"],
        "all of the above": lambda r: "errors" in r and not r["over"] and not r["untrained"],
        "refused in one line (exit 2)": lambda r: r.get("exit") == 2 and len(r["stderr"]) == 1,
        "roam fails otherwise (internal error, traceback)": lambda r: r.get("exit") not in (None, 0)
        and not (r["exit"] == 2 and len(r["stderr"]) == 1),
        "written graphs ORT refuses": lambda r: r.get("ort_loads") is False,
        "written graphs that fail to run": lambda r: "run_error" in r,
        "exporter fails (not counted)": lambda r: "export_error" in r,
        "cell crashed or timed out": lambda r: "crash" in r,
    }
    groups = {e: [r for r in rows if r["exporter"] == e] for e in exporters} | {"all": rows}
    made = {e: sum(checks["exports made"](r) for r in g) for e, g in groups.items()}
    return harness.markdown_table(
        ["outcome", *groups],
        [[what, *(f"{sum(map(test, g))}/{made[e] if what != 'exporter fails (not counted)' else len(g)}"
                  for e, g in groups.items())] for what, test in checks.items()])


def causes(rows: list[dict]) -> dict[str, list[tuple[str, str]]]:
    """Every failure text, grouped by its shape (names and numbers blanked): cause -> [(cell, text)]."""
    found: dict[str, list[tuple[str, str]]] = {}

    def add(kind: str, text: str, r: dict) -> None:
        shape = re.sub(r"(?<!\w)'[^']*'(?!\w)|\"[^\"]*\"|\b(onnx::|val_)\w+|[\w/:]+(\.[\w/:]+)+", "§", text)
        shape = re.sub(r"§(, §)*(, \.\.\.)?", "…", re.sub(r"\d+", "N", shape))
        found.setdefault(f"{kind}: {shape[:200]}", []).append((f"{r['model']}/{r['exporter']}", text))

    for r in rows:
        if "crash" in r or "export_error" in r:
            add("cell" if "crash" in r else "export", r.get("crash") or r["export_error"], r)
        elif r["exit"] != 0:
            add(f"roam exit {r['exit']}", " / ".join(r["stderr"]), r)
        else:
            for key, kind in (("ort_error", "ORT refuses"), ("run_error", "run fails")):
                if key in r:
                    add(kind, r[key], r)
            if r.get("over"):
                add("gradients over tolerance", ", ".join(f"{p} {(r['errors'] | r['noise'])[p][0]:.1e}"
                                                          for p in r["over"][:4]), r)
            named, listed = r.get("untrained_named", []), r.get("untrained_listed", [])
            for why, names in (("named by a warning", named),
                               ("in --json but in no warning", [p for p in listed if p not in named]),
                               ("neither warned about nor in --json", [p for p in r.get("untrained", [])
                                                                        if p not in listed + named])):
                if names:
                    add("untrained", f"{why}: {', '.join(names)}", r)
            for w in r["warnings"]:
                add("warning", w, r)
    return found


def main(argv: list[str]) -> list[dict]:
    harness.needs_torch(torch, __name__)
    p = harness.options(__name__, __doc__)
    p.add_argument("--only", help="comma-separated models (default: all)")
    p.add_argument("--exporters", default=",".join(EXPORTERS), help="comma-separated, of " + ", ".join(EXPORTERS))
    p.add_argument("--jobs", type=int, default=2, help="cells at a time (default 2)")
    p.add_argument("--timeout", type=int, default=300, help="seconds per cell (default 300)")
    p.add_argument("--out", type=Path, default=harness.CACHE / "exporters_corpus",
                   help="the exports and training graphs, a folder per cell "
                        "(default: benchmarks/.cache/exporters_corpus)")
    a = p.parse_args(argv)
    models = a.only.split(",") if a.only else list(configs())
    exporters = a.exporters.split(",")
    unknown = sorted(set(models) - set(configs())) + sorted(set(exporters) - set(EXPORTERS))
    if unknown:
        p.error(f"unknown: {', '.join(unknown)}")
    out = a.out.resolve()
    with ThreadPoolExecutor(a.jobs) as pool:
        futures = [(m, e, pool.submit(cells.run_cell, __name__, f"{m}:{e}", out / f"{m}-{e}", a.timeout,
                                      {"model": m, "exporter": e})) for m in models for e in exporters]
        rows = []
        for m, e, f in futures:
            rows.append(f.result())
            print(f"{m} / {e}: {outcome(rows[-1])} ({rows[-1]['seconds']:.0f} s)", file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict]) -> str:
    """The counts per exporter, then every cell that is not all green, grouped by cause."""
    exporters = list(dict.fromkeys(r["exporter"] for r in rows))
    out = [summary(rows, exporters),
           "Failures, untrained parameters and warnings by cause (cells named model/exporter):\n"]
    for cause, found in sorted(causes(rows).items(), key=lambda kv: -len(kv[1])):
        out.append(f"- **{cause}** ({len(found)}): {', '.join(c for c, _ in found)}")
    return "\n".join(out) + "\n"


def one_cell(spec: str, out: Path) -> dict:
    """The cell process: `--cell MODEL:EXPORTER --out FOLDER`."""
    name, exporter = spec.split(":")
    return cell(name, exporter, out)


if __name__ == "__main__":  # a cell, run by benchmarks.cells.run_cell
    cells.serve(one_cell)
