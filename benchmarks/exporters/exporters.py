"""Exporter x model: how many of PyTorch's parameters `roam make-training-graph` recovers.

Each model is a tiny configuration of its architecture (2 layers, hidden 32, small vocabulary and
images; ResNet-50's 16 bottleneck blocks at 1/16 of the width), built from its Hugging Face
configuration with fresh weights (`--perturb`: moved a little, as after training): no download.
Each is exported four ways, with the exporter's default options:

- dynamo:      torch.onnx.export(model, args, "model.onnx", kwargs=..., dynamo=True)   (external data)
- torchscript: torch.onnx.export(model, args, "model.onnx", kwargs=..., dynamo=False)
- optimum:     model.save_pretrained(DIR); optimum.exporters.onnx.main_export(DIR, OUT, task=TASK,
               monolith=True)   (one file, as a training graph needs; validation skipped for time)
- roam:        roam_cli.frontend.torch_export.export(model, args, ...)

and, with `--exporters`, the same with the option roam's warnings name: `optimize=False`
(dynamo-optimize-false), `do_constant_folding=False` (torchscript-no-folding, optimum-no-folding).

Then `roam make-training-graph model.onnx -o train.onnx --loss LOSS --json` runs on each, and a
cell is the count of PyTorch's trainable parameters that are trainable in the training graph
under their own name, over PyTorch's count, then how many other initializers it trains, and the
warnings roam printed.

    python -m benchmarks run exporters/exporters                   # the table in docs/training-graphs.md
    python -m benchmarks run exporters/exporters.perturb --perturb   # weights as after training
    python -m benchmarks run exporters/exporters.unfolded --perturb --exporters dynamo-optimize-false,torchscript-no-folding,optimum-no-folding
    python -m benchmarks run exporters/exporters --only gpt2,bert --exporters dynamo --out DIR

Needs the bench extra (torch, transformers <4.58 for optimum-onnx, onnxscript) and optimum-onnx;
a few minutes. tests/frontend/test_exporters.py imports `build`, `export` and `pytorch_parameters`."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import torch
except ImportError:  # the records' tables need no torch; measuring does
    torch = None

from benchmarks import harness

TAKES = "a few minutes; needs the bench extra (torch, transformers <4.58, onnxscript) and optimum-onnx"
SEED = 0
BATCH, SEQ, IMAGE = 2, 8, 32


def configs():
    import transformers as hf

    eager = dict(attn_implementation="eager")
    return {  # name: (config, model class, optimum task, language model?)
        "gpt2": (hf.GPT2Config(vocab_size=128, n_positions=32, n_layer=2, n_embd=32, n_head=2, use_cache=False,
                               **eager), hf.GPT2LMHeadModel, "text-generation", True),
        "bert": (hf.BertConfig(vocab_size=128, max_position_embeddings=32, num_hidden_layers=2, hidden_size=32,
                               num_attention_heads=2, intermediate_size=64, **eager), hf.BertForMaskedLM,
                 "fill-mask", True),
        "vit": (hf.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                             image_size=IMAGE, patch_size=8, num_labels=10, **eager),
                hf.ViTForImageClassification, "image-classification", False),
        "t5": (hf.T5Config(vocab_size=128, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
                           decoder_start_token_id=0, use_cache=False, **eager),
               hf.T5ForConditionalGeneration, "text2text-generation", True),
        "resnet50": (hf.ResNetConfig(embedding_size=8, hidden_sizes=[16, 32, 64, 128], depths=[3, 4, 6, 3],
                                     layer_type="bottleneck", num_labels=10),
                     hf.ResNetForImageClassification, "image-classification", False),
        "llama": (hf.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                                 use_cache=False, **eager), hf.LlamaForCausalLM, "text-generation", True),
    }


PERTURB = False  # --perturb: every parameter moved a little, as training leaves it (no two equal)


def build(name: str):
    """(model in train mode, positional args, keyword args, --loss)."""
    config, cls, _, language = configs()[name]
    torch.manual_seed(SEED)
    model = cls(config).train()
    if PERTURB:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 1e-3)
    if language:
        ids = torch.randint(0, config.vocab_size, (BATCH, SEQ))
        return model, (ids,), {"labels": ids}, "none"  # the model's own loss is its first output
    return model, (torch.randn(BATCH, 3, IMAGE, IMAGE),), {}, "cross-entropy"


EXPORTERS = ("dynamo", "torchscript", "optimum", "roam")
UNFOLDED = ("dynamo-optimize-false", "torchscript-no-folding", "optimum-no-folding")  # the fixes roam names


def export(exporter: str, name: str, folder: Path) -> Path:
    """Export model `name` into `folder`; returns the ONNX file to make a training graph of."""
    with contextlib.redirect_stdout(sys.stderr):  # the exporters print their progress
        return export_quietly(exporter, name, folder)


def export_quietly(exporter: str, name: str, folder: Path) -> Path:
    model, args, kwargs, _ = build(name)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    if exporter in ("dynamo", "dynamo-optimize-false"):
        torch.onnx.export(model, args, str(path), kwargs=kwargs, dynamo=True, optimize=exporter == "dynamo")
    elif exporter in ("torchscript", "torchscript-no-folding"):
        torch.onnx.export(model, args, str(path), kwargs=kwargs, dynamo=False,
                          do_constant_folding=exporter == "torchscript")
    elif exporter in ("optimum", "optimum-no-folding"):
        from optimum.exporters.onnx import main_export

        saved = folder / "saved"
        model.save_pretrained(saved)
        task = configs()[name][2]
        main_export(str(saved), str(folder), task=task, monolith=True, do_validation=False,
                    do_constant_folding=exporter == "optimum")
    elif exporter == "roam":
        from roam_cli.core.fileio import write_atomic
        from roam_cli.frontend import torch_export

        wrapper = Wrapped(model, list(kwargs))
        exported = torch_export.export(wrapper, args + tuple(kwargs.values()), ["x", *kwargs], ["out"], prefix="m.")
        write_atomic(path, exported.model.SerializeToString())
    else:
        raise ValueError(exporter)
    return path


class Wrapped(torch.nn.Module if torch else object):
    """model(x, **named) -> its first output (the loss when labels are given, else the logits)."""

    def __init__(self, m, names):
        super().__init__()
        self.m, self.names = m, names

    def forward(self, x, *rest):
        return self.m(x, **dict(zip(self.names, rest)))[0]


def pytorch_parameters(model) -> list[set[str]]:
    """Each trainable parameter tensor as the set of its names (tied weights have several)."""
    names: dict[int, set[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if p.requires_grad:
            names.setdefault(id(p), set()).add(name.removeprefix("m."))
    return list(names.values())


# optimum exports with dynamic axes by these names; roam's backward needs them bound (--dim)
OPTIMUM_DIMS = {"batch_size": BATCH, "sequence_length": SEQ, "encoder_sequence_length": SEQ,
                "decoder_sequence_length": SEQ, "num_channels": 3, "height": IMAGE, "width": IMAGE}


def command(exporter: str, name: str, folder: Path | None = None) -> list[str]:
    loss = "cross-entropy" if exporter.startswith("optimum") else build_loss(name)
    dims = []
    if folder is not None and exporter.startswith("optimum"):
        import onnx

        from roam_cli.frontend.shapes import symbolic_dims

        named = symbolic_dims(onnx.load(str(folder / "model.onnx"), load_external_data=False))
        dims = [x for d, n in OPTIMUM_DIMS.items() if d in named for x in ("--dim", f"{d}={n}")]
    return ["roam", "make-training-graph", "model.onnx", "-o", "train.onnx", "--loss", loss, *dims, "--json"]


def build_loss(name: str) -> str:
    return "none" if configs()[name][3] else "cross-entropy"


def cell(exporter: str, name: str, out: Path) -> dict:
    """Export, make the training graph, count the PyTorch parameters trainable under their names."""
    folder = out / f"{name}-{exporter}"
    want = pytorch_parameters(build(name)[0])
    try:
        export(exporter, name, folder)
    except Exception as e:  # the exporter's own failure: reported in the cell
        return dict(model=name, exporter=exporter, params=len(want), error=f"export fails: {type(e).__name__}: "
                    f"{str(e).strip().splitlines()[0][:80] if str(e).strip() else ''}")
    argv = command(exporter, name, folder)
    proc = subprocess.run([sys.executable, "-m", "roam_cli", *argv[1:]], cwd=folder, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(harness.ROOT)))
    if proc.returncode != 0:
        return dict(model=name, exporter=exporter, params=len(want), error=proc.stderr.strip().splitlines()[-1])
    made = json.loads(proc.stdout)
    trainable = set(made["trainable"])
    kept = sum(1 for aliases in want if aliases & trainable)
    others = len(trainable - set().union(*want))  # trainable, but no PyTorch parameter's name
    return dict(model=name, exporter=exporter, params=len(want), kept=kept, others=others, warnings=made["warnings"],
                folded=len(made["folded"]), merged=sum(map(len, made["merged"].values())),
                missing=len(made["missing"]), constants=len(made["constants"]))


def summary(r: dict) -> str:
    if "error" in r:
        return r["error"]
    lost = [f"{r[k]} {k}" for k in ("folded", "merged", "missing") if r[k]]
    return (f"{r['kept']}/{r['params']}" + (f" + {r['others']} other trainable" if r["others"] else "")
            + (f" (warns: {', '.join(lost)})" if lost else ""))


def main(argv: list[str]) -> dict:
    harness.needs_torch(torch, __name__)
    p = harness.options(__name__, __doc__)
    p.add_argument("--only", help="comma-separated models (default: gpt2,bert,vit,t5,resnet50,llama)")
    p.add_argument("--exporters", default=",".join(EXPORTERS),
                   help="comma-separated, of " + ", ".join(EXPORTERS + UNFOLDED))
    p.add_argument("--out", type=Path, help="keep the exports here (default: a temporary folder)")
    p.add_argument("--perturb", action="store_true", help="perturb every parameter before export (as after training)")
    a = p.parse_args(argv)
    global PERTURB
    PERTURB = a.perturb
    harness.quiet_torch(torch)
    models = a.only.split(",") if a.only else list(configs())
    exporters = a.exporters.split(",")
    with tempfile.TemporaryDirectory() as scratch:
        out = a.out or Path(scratch)
        cells = []
        for m in models:
            for e in exporters:
                cells.append(cell(e, m, out))
                print(f"{m} / {e}: {summary(cells[-1])}", file=sys.stderr, flush=True)
    return {"perturb": a.perturb, "exporters": exporters, "cells": cells}


def table(results: dict) -> str:
    """Model x exporter: PyTorch's parameters trainable under their names; then roam's warnings."""
    exporters = results["exporters"]
    rows: dict[str, dict[str, dict]] = {}
    for c in results["cells"]:
        rows.setdefault(c["model"], {})[c["exporter"]] = c
    out = harness.markdown_table(
        ["model", "PyTorch parameters", *exporters],
        [[m, next(iter(cells.values()))["params"], *(summary(cells[e]) if e in cells else "—" for e in exporters)]
         for m, cells in rows.items()], "lr" + "l" * len(exporters))
    warned = [f"- {c['model']}, {c['exporter']}: {w}" for c in results["cells"] for w in c.get("warnings", [])]
    if warned:
        out += "\nWarnings, as make-training-graph printed them" + (" (weights perturbed)" if results["perturb"] else "") \
            + ":\n\n" + "\n".join(warned) + "\n"
    return out
