#!/usr/bin/env python3
"""The benchmark suite: training graphs of standard models, without weights, from one command.

    python -m benchmarks.suite                      # every model -> benchmarks/.cache/suite/<model>/
    python -m benchmarks.suite --only gpt2_small,bert_base --out DIR
    python -m benchmarks.suite --list               # the models and their sizes
    python -m benchmarks.suite --tiny --forward-only --out tests/fixtures   # the test fixtures
    python -m benchmarks.suite --only gpt2_xl --layers 2 --out DIR   # gpt2_xl_2l: 2 of its 48 blocks

The benchmarks that plan the suite read it from benchmarks/.cache/suite (their --suite option).

Each model is a Hugging Face model built from its configuration on `torch.device("meta")`: no
download, no weight is ever allocated (random-weight configs, so nothing is folded or merged by
value either). For each model, in `<out>/<model>/`:

- `forward.onnx`: forward (+ the model's own loss for language models), exported with
  `roam_cli.frontend.torch_export` (torch.onnx dynamo exporter; every parameter survives as an
  initializer pointing into `weights.bin`, which is never written);
- `training_model.onnx`, `optimizer_model.onnx`: `roam make-training-graph forward.onnx
  --loss ... --backend ort-artifacts --fused` (ONNX Runtime artifacts as ORT writes them, its
  fused ops kept: forward, loss, backward, gradient accumulation; AdamW);
- `full_step.onnx`: the same with `--in-graph-optimizer` (one graph: forward, backward, AdamW);
- `model.json`: the model's row of the table below (sizes, parameters, nodes, seconds).

The parameters `make-training-graph` finds by itself must be PyTorch's trainable parameter
tensors, count and elements; the script stops if not. Prints one row per model.

Needs the `bench` extra (torch, transformers, onnxscript)."""

from __future__ import annotations

import argparse
import json
import logging
import resource
import sys
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from benchmarks.harness import CACHE

DEFAULT_OUT = CACHE / "suite"
SEED = 1234


@dataclass(frozen=True)
class Model:
    name: str
    family: str  # gpt2 | bert | t5 | vit | resnet | llama
    config: dict = field(hash=False)
    batch: int = 1
    seq: int = 0  # tokens (language models) or image side in pixels (vision)
    meta: bool = True  # False: built on the CPU with its initial weights (embedded in forward.onnx)

    @property
    def size(self) -> str:
        return f"batch {self.batch}, " + (f"{self.seq}x{self.seq} image" if self.family in ("vit", "resnet")
                                           else f"sequence {self.seq}")


GPT2 = dict(vocab_size=50257, n_positions=1024, bos_token_id=0, eos_token_id=0)
BERT = dict(vocab_size=30522, max_position_embeddings=512)
MODELS = [
    # batch 1 where the parameters, gradients and optimizer state dominate memory
    Model("gpt2_small", "gpt2", dict(GPT2, n_layer=12, n_embd=768, n_head=12), batch=4, seq=256),
    Model("gpt2_medium", "gpt2", dict(GPT2, n_layer=24, n_embd=1024, n_head=16), batch=1, seq=512),
    Model("gpt2_large", "gpt2", dict(GPT2, n_layer=36, n_embd=1280, n_head=20), batch=1, seq=512),
    Model("bert_base", "bert", dict(BERT, num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                                    intermediate_size=3072), batch=8, seq=128),
    Model("bert_large", "bert", dict(BERT, num_hidden_layers=24, hidden_size=1024, num_attention_heads=16,
                                     intermediate_size=4096), batch=1, seq=512),
    Model("vit_base", "vit", dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                  intermediate_size=3072, image_size=224, patch_size=16, num_labels=1000),
          batch=8, seq=224),
    Model("resnet50", "resnet", dict(embedding_size=64, hidden_sizes=[256, 512, 1024, 2048], depths=[3, 4, 6, 3],
                                     layer_type="bottleneck", num_labels=1000), batch=8, seq=224),
    Model("t5_small", "t5", dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8,
                                 decoder_start_token_id=0), batch=4, seq=128),
    Model("gpt2_xl", "gpt2", dict(GPT2, n_layer=48, n_embd=1600, n_head=25), batch=1, seq=512),
]
# Built only when named (--only): the LLaMA architecture (RMSNorm, rotary embeddings, SiLU gate,
# grouped-query attention) at a toy size, which no default suite model has, and a smaller batch.
NAMED_ONLY = [
    Model("llama_tiny", "llama", dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64),
          batch=2, seq=16, meta=False),  # torch.export fails on its rotary embedding on the meta device
    # GPT-2 small at batch 1 x 128, where the parameters and AdamW state outweigh the activations
    Model("gpt2_small_b1s128", "gpt2", dict(GPT2, n_layer=12, n_embd=768, n_head=12), batch=1, seq=128),
]
TINY = [  # the same families at toy sizes: the test fixtures (tests/fixtures/<model>/forward.onnx)
    Model("tiny_gpt2", "gpt2", dict(vocab_size=512, n_positions=64, n_layer=1, n_embd=32, n_head=2,
                                    bos_token_id=0, eos_token_id=0), batch=2, seq=16),
    Model("tiny_bert", "bert", dict(vocab_size=512, max_position_embeddings=64, num_hidden_layers=1, hidden_size=32,
                                    num_attention_heads=2, intermediate_size=64), batch=2, seq=16),
    Model("tiny_resnet", "resnet", dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic",
                                        num_labels=10), batch=2, seq=32),
]


LAYER_KEYS = ("n_layer", "num_hidden_layers", "num_layers")  # GPT-2, BERT and ViT, T5


def with_layers(spec: Model, layers: int) -> Model:
    """The same architecture with `layers` blocks (hidden size, heads, vocabulary unchanged: every
    op kind and shape of the full model), named `<model>_<layers>l`: numerics on models too large
    to run whole. Built on the CPU with its random initial weights, embedded in forward.onnx."""
    key = next((k for k in LAYER_KEYS if k in spec.config), None)
    if key is None:
        raise SystemExit(f"{spec.name}: --layers applies to the transformers only")
    return replace(spec, name=f"{spec.name}_{layers}l", config={**spec.config, key: layers}, meta=False)


def build(spec: Model, meta: bool = True):
    """(module in train mode, example args, input names, output names, --loss) for a model."""
    import transformers as hf

    from roam_cli.frontend import torch_export

    family = {
        "gpt2": (hf.GPT2Config, hf.GPT2LMHeadModel, dict(use_cache=False)),
        "llama": (hf.LlamaConfig, hf.LlamaForCausalLM, dict(use_cache=False)),
        "bert": (hf.BertConfig, hf.BertForMaskedLM, {}),
        "t5": (hf.T5Config, hf.T5ForConditionalGeneration, dict(use_cache=False)),
        "vit": (hf.ViTConfig, hf.ViTForImageClassification, {}),
        "resnet": (hf.ResNetConfig, hf.ResNetForImageClassification, {}),
    }
    config_cls, model_cls, extra = family[spec.family]
    attention = {} if spec.family == "resnet" else dict(attn_implementation="eager")  # plain MatMul/Softmax
    config = config_cls(**spec.config, **extra, **attention)
    model = torch_export.weightless(lambda: model_cls(config)) if meta else model_cls(config)
    model.train()
    device = "meta" if meta else "cpu"
    gen = torch.Generator().manual_seed(SEED)
    if spec.family in ("vit", "resnet"):
        wrapper = Logits(model)
        pixels = torch.randn(spec.batch, 3, spec.seq, spec.seq, generator=gen).to(device)
        return wrapper, (pixels,), ["pixel_values"], ["logits"], "cross-entropy"
    wrapper = LanguageModelLoss(model)
    ids = torch.randint(0, config.vocab_size, (spec.batch, spec.seq), generator=gen).to(device)
    return wrapper, (ids, ids.clone()), ["input_ids", "labels"], ["loss"], "none"


class LanguageModelLoss(torch.nn.Module):
    """input_ids, labels -> the model's own training loss (shifted for causal LMs, masked LM for BERT,
    decoder inputs from labels for T5)."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, labels):
        return self.m(input_ids=input_ids, labels=labels).loss


class Logits(torch.nn.Module):
    """pixel_values -> class logits; make-training-graph adds the cross-entropy loss."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, pixel_values):
        return self.m(pixel_values=pixel_values).logits


def export(spec: Model, out: Path, meta: bool = True):
    """Export one model to <out>/<model>/forward.onnx; returns (path, module, --loss, export seconds)."""
    from roam_cli.core.fileio import write_atomic
    from roam_cli.frontend import torch_export

    folder = out / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    wrapper, args, inputs, outputs, loss = build(spec, meta)
    exported = torch_export.export(wrapper, args, inputs, outputs, prefix="m.")
    write_atomic(folder / "forward.onnx", exported.model.SerializeToString())
    return folder / "forward.onnx", wrapper, loss, exported.seconds


def make(spec: Model, out: Path, meta: bool = True) -> dict:
    """Export one model and make both training graphs; returns the row for the table."""
    import onnx

    from roam_cli.core.fileio import write_atomic
    from roam_cli.frontend import training_graph

    forward, wrapper, loss, export_s = export(spec, out, meta)
    folder = forward.parent
    params = list(wrapper.parameters())  # unique tensors: tied weights count once

    t = time.time()
    made = training_graph.make(forward, folder / "training_model.onnx", loss=loss,
                               optimizer_path=folder / "optimizer_model.onnx", fused=True)
    artifacts_s = time.time() - t
    t = time.time()
    training_graph.make(forward, folder / "full_step.onnx", loss=loss, in_graph=True, fused=True)
    full_s = time.time() - t
    found = made.survey
    expected = (len(params), sum(p.numel() for p in params))
    if (len(found.trainable), found.elements) != expected:
        raise SystemExit(f"{spec.name}: make-training-graph found {len(found.trainable)} parameter tensors "
                         f"({found.elements:,} elements), PyTorch has {expected[0]} ({expected[1]:,})")
    nodes = {p.name: len(onnx.load(str(p), load_external_data=False).graph.node)
             for p in (forward, folder / "training_model.onnx", folder / "full_step.onnx")}
    row = dict(model=spec.name, size=spec.size, params=expected[0], elements=expected[1],
               forward=nodes["forward.onnx"], training=nodes["training_model.onnx"],
               full_step=nodes["full_step.onnx"], export_s=export_s, artifacts_s=artifacts_s, full_step_s=full_s)
    write_atomic(folder / "model.json", json.dumps(row, indent=1))  # what order_layout/suite_plans.py reports
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument("--only", help="comma-separated model names (default: all, in the listed order)")
    p.add_argument("--tiny", action="store_true", help="the toy-sized models (test fixtures) instead")
    p.add_argument("--forward-only", action="store_true", help="only export forward.onnx (how the fixtures are made)")
    p.add_argument("--layers", type=int, help="keep only this many transformer blocks (named <model>_<N>l)")
    p.add_argument("--list", action="store_true", help="list the models and exit")
    a = p.parse_args(argv)
    warnings.filterwarnings("ignore")  # the exporter warns about every traced HF construct
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    logging.getLogger("torch._export").setLevel(logging.ERROR)
    pool = TINY if a.tiny else MODELS
    named = pool + ([] if a.tiny else NAMED_ONLY)
    if a.list:
        for m in named:
            print(f"{m.name:12} {m.family:7} {m.size}")
        return 0
    chosen = pool if not a.only else [m for m in named if m.name in a.only.split(",")]
    unknown = set(a.only.split(",")) - {m.name for m in named} if a.only else set()
    if unknown:
        p.error(f"unknown models: {', '.join(sorted(unknown))} (see --list)")
    if a.layers:
        chosen = [with_layers(m, a.layers) for m in chosen]
    header = ("model", "size", "param tensors", "parameters", "forward nodes", "training nodes", "full-step nodes",
              "export s", "artifacts s", "full step s")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header), flush=True)
    if a.forward_only:
        for spec in chosen:
            print(f"wrote {export(spec, a.out, meta=spec.meta)[0]}")
        return 0
    for spec in chosen:
        r = make(spec, a.out, meta=spec.meta)
        print(f"| {r['model']} | {r['size']} | {r['params']} | {r['elements']:,} | {r['forward']:,} | "
              f"{r['training']:,} | {r['full_step']:,} | {r['export_s']:.1f} | {r['artifacts_s']:.1f} | "
              f"{r['full_step_s']:.1f} |", flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"\npeak RSS {peak:.1f} GiB; graphs in {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
