"""The weights back: export -> make-training-graph -> optimize -> train 3 steps -> PyTorch.

For GPT-2 (tied LM head; the dynamo exporter's default folds the head into a transposed
constant), LLaMA (grouped-query attention; every Linear weight folded into a transposed `val_*`),
Mistral (the same, its head tied to its embedding), BERT (masked-LM head: decoder weight and bias
each tied, exported with optimize=False, since the default precomputes the position lookups)
and ResNet (BatchNorm; exported with optimize=False, since the default folds it into the
convolutions, which make-training-graph refuses), and GPT-2 with optimize=False too (the default
precomputes the position embedding's lookup: that parameter is lost): tiny configurations, random
weights moved by N(0, 0.02^2), dropout 0, the module in eval mode as users export it. Each is
exported with torch.onnx.export(dynamo=True), made a full step with AdamW inside
(`--optimizer-setting convention=pytorch`: torch.optim.AdamW's maths, eps added after the bias
correction), planned, and trained 3 steps on one fixed batch with `roam train --inputs ...
--save-weights W.safetensors --save-model trained.onnx` (learning rate 1e-3). Then:

1. the safetensors file is loaded into a fresh copy of the PyTorch module with
   `load_state_dict(strict=False)` (a tied weight is written under each of its names; the keys
   still missing are listed: those the export lost): its
   logits on a new batch (eval mode) against ONNX Runtime's on trained.onnx: the largest
   |difference| relative to the largest logit. The keys missing on load and the parameters the
   export lost are listed;
2. PyTorch's own 3 steps of torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
   weight_decay=0) on the same batch (train mode: BatchNorm on batch statistics) against the saved
   parameters: the largest |difference| over every parameter the export holds.

    python -m benchmarks run exporters/weights_roundtrip                 # six exports, a few minutes
    python -m benchmarks run exporters/weights_roundtrip.smoke --only resnet

Needs the bench extra (torch, transformers, onnxscript) and safetensors."""

from __future__ import annotations

import copy
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort

try:
    import torch
except ImportError:  # the records' tables need no torch; measuring does
    torch = None

from benchmarks import harness

TAKES = "a few minutes; needs the bench extra (torch, transformers, onnxscript) and safetensors"

SEED, BATCH, SEQ, IMAGE, LR, EPS, STEPS = 0, 2, 8, 32, 1e-3, 1e-8, 3
ROAM = [sys.executable, "-m", "roam_cli"]


def gpt2():
    import transformers as hf

    return hf.GPT2LMHeadModel(hf.GPT2Config(vocab_size=128, n_positions=32, n_layer=2, n_embd=32, n_head=2,
                                            use_cache=False, attn_implementation="eager", resid_pdrop=0,
                                            embd_pdrop=0, attn_pdrop=0))


def models():
    import transformers as hf

    return {
        "gpt2": (gpt2, "language", True),
        "gpt2-optimize-false": (gpt2, "language", False),
        "llama": (lambda: hf.LlamaForCausalLM(hf.LlamaConfig(
            vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=32, use_cache=False, attn_implementation="eager")),
            "language", True),
        "mistral": (lambda: hf.MistralForCausalLM(hf.MistralConfig(
            vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=1, max_position_embeddings=32, use_cache=False, attn_implementation="eager",
            tie_word_embeddings=True)), "language", True),
        "bert-optimize-false": (lambda: hf.BertForMaskedLM(hf.BertConfig(
            vocab_size=128, max_position_embeddings=32, num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
            intermediate_size=64, hidden_dropout_prob=0, attention_probs_dropout_prob=0,
            attn_implementation="eager")), "language", False),
        "resnet": (lambda: hf.ResNetForImageClassification(hf.ResNetConfig(
            embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_labels=10)),
            "image", False),
    }


def batch(kind: str, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + k)
    if kind == "language":
        return torch.randint(0, 128, (BATCH, SEQ), generator=g), torch.randint(0, 128, (BATCH, SEQ), generator=g)
    return torch.randn(BATCH, 3, IMAGE, IMAGE, generator=g), torch.randint(0, 10, (BATCH,), generator=g)


def loss_of(model, x, labels):
    logits = model(x).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def roam(*args) -> None:
    r = subprocess.run([*ROAM, *map(str, args)], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"roam {args[0]} exited {r.returncode}: {r.stderr.strip()}")


def roundtrip(name: str, folder: Path) -> dict:
    from safetensors.torch import load_file

    build, kind, optimized = models()[name]
    torch.manual_seed(SEED)
    model = build()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.eval()
    x, labels = batch(kind, 0)
    export = folder / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, (x,), None, dynamo=True, optimize=optimized)
    program.save(str(export))  # torch's ONNXProgram: weights in external data beside it
    data_input = program.model_proto.graph.input[0].name
    step, plan = folder / f"{name}.step.onnx", folder / f"{name}.plan.json"
    roam("make-training-graph", export, "-o", step, "--loss", "cross-entropy", "--in-graph-optimizer",
         "--optimizer-setting", f"eps={EPS}", "--optimizer-setting", "convention=pytorch")
    roam("optimize", step, "-o", plan)
    np.savez(folder / "batch.npz", **{data_input: x.numpy(), "labels": labels.numpy(),
                                      "learning_rate": np.array([LR], np.float32)})
    saved, trained = folder / f"{name}.safetensors", folder / f"{name}.trained.onnx"
    roam("train", step, "--plan", plan, "--steps", STEPS, "--inputs", folder / "batch.npz",
         "--save-weights", saved, "--save-model", trained)
    # 1. the weights into PyTorch, the logits against the trained export
    loaded = copy.deepcopy(model)
    written = load_file(str(saved))
    missing, unexpected = loaded.load_state_dict(written, strict=False)
    names_of: dict[int, list[str]] = {}  # a tied parameter is one tensor under several names
    for n, p in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(n)
    x_new, _ = batch(kind, 1)
    with torch.no_grad():
        theirs = loaded(x_new).logits.numpy()
    options = ort.SessionOptions()
    options.log_severity_level = 3
    ours = ort.InferenceSession(str(trained), options, providers=["CPUExecutionProvider"]).run(
        None, {data_input: x_new.numpy()})[0]
    logits_error = float(np.abs(ours - theirs).max() / np.abs(theirs).max())
    # 2. PyTorch's own steps
    reference = copy.deepcopy(model).train()
    opt = torch.optim.AdamW(reference.parameters(), lr=LR, betas=(0.9, 0.999), eps=EPS, weight_decay=0.0)
    for _ in range(STEPS):
        opt.zero_grad()
        loss_of(reference, x, labels).backward()
        opt.step()
    state = loaded.state_dict()
    lost = [names[0] for names in names_of.values() if not set(names) & set(written)]  # roam's warning names them
    worst, worst_name = 0.0, ""
    for n, p in reference.named_parameters():
        if n in lost:
            continue
        d = float((state[n] - p.detach()).abs().max())
        if d > worst:
            worst, worst_name = d, n
    moved = max(float((p.detach() - q.detach()).abs().max()) for p, q in zip(reference.parameters(), model.parameters()))
    return {"model": name.split("-")[0], "export": "dynamo" + ("" if optimized else " optimize=False"),
            "parameters": len(list(model.parameters())), "written": len(written),
            "lost_by_the_export": lost, "missing_on_load": list(missing),
            "unexpected_on_load": list(unexpected),
            "logits_error": logits_error,
            "weights_error": worst, "weights_worst": worst_name, "moved": moved}


def main(argv: list[str]) -> list[dict]:
    harness.needs_torch(torch, __name__)
    ap = harness.options(__name__, __doc__)
    ap.add_argument("--only", default=",".join(models()))
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only.split(","):
            rows.append(roundtrip(name, Path(tmp)))
            print(f"{name}: weights {rows[-1]['weights_error']:.1e} from PyTorch's", file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict]) -> str:
    return harness.markdown_table(
        ["model", "export", "PyTorch parameters", "tensors written", "keys missing on load", "lost by the export (warned)",
         "logits vs trained.onnx (rel.)", "weights vs PyTorch's 3 AdamW steps (max abs)", "largest move of a weight"],
        [[r["model"], r["export"], r["parameters"], r["written"], ", ".join(r["missing_on_load"]) or "—",
          ", ".join(r["lost_by_the_export"]) or "—", f"{r['logits_error']:.1e}",
          f"{r['weights_error']:.1e} ({r['weights_worst']})", f"{r['moved']:.1e}"] for r in rows], "llrrllrrr")
