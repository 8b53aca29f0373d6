"""roam's backward against PyTorch autograd: every parameter gradient, and 20 AdamW steps' losses.

For each model, built from its Hugging Face configuration (the published sizes: GPT-2 small,
BERT-base, ViT-base/16 at 224, T5-small, ResNet-50, and a LLaMA-architecture model with RMSNorm,
RoPE, SiLU and grouped-query attention, 2 key/value heads for 8 query heads) with random weights
(seed 0, every parameter then moved by N(0, 0.02^2) so no two are equal) and every dropout
probability 0, no download:

1. the module (train mode; it returns its logits) is exported by `roam_cli.frontend.torch_export`
   (torch.onnx dynamo export with optimize=False; every parameter kept under its PyTorch name);
2. `make-training-graph --loss cross-entropy` (roam's backward, `training_graph.make`) writes the
   training graph and, with `--in-graph-optimizer`, the full AdamW step, both in standard ONNX;
3. onnxruntime runs the training graph on PyTorch's weights and one batch: each parameter's
   gradient is compared with PyTorch autograd's for the same loss (`F.cross_entropy`, mean, over
   the logits flattened to [tokens, classes]); the error of a tensor is the norm-based relative
   error ||g_roam - g_torch||_2 / ||g_torch||_2, and the table gives the largest over the
   parameter tensors and its name. Beside it, both float32 gradients against PyTorch's float64
   run of the same module and batch (the largest ||g - g64|| / ||g64||): where PyTorch's own
   float32 gradients are farther than 1e-4 from float64's, no float32 backward can meet the
   1e-4 target, and the figure that says whether roam's is right is its distance to float64. A tensor whose exact gradient is zero (an attention key's bias:
   softmax is invariant to it) has float noise for a gradient in both: those whose PyTorch norm is
   below 1e-6 of the model's largest are listed apart with their absolute norms;
4. the full step runs 20 times (a new batch each step, learning rate 1e-4, the moments and the
   parameters fed back), beside `torch.optim.AdamW(lr=1e-4, betas=(0.9, 0.999), eps=1e-6,
   weight_decay=0)` on the same batches; the figure is the largest
   |loss_roam - loss_torch| / |loss_torch| over the 20 steps. eps is 1e-10 in both, not the
   in-graph AdamW's default 1e-6: that AdamW is ONNX Runtime's, which adds eps to sqrt(v) before the
   bias correction and PyTorch after it, so at step 1 ONNX Runtime's eps weighs as ~32 eps would in
   PyTorch; with eps 1e-6 that moves the elements whose gradients are ~1e-6 differently (LLaMA, one
   layer: 8.2e-5 after 20 steps, against 6.4e-7 with 1e-10).

`--layers N` sets num_hidden_layers (encoder and decoder for T5) of every model but GPT-2 small,
which runs at its full 12 layers unless `--layers` names it too (`--full gpt2`). Batch 2, 32 tokens
(224x224 images).

    python -m benchmarks run exporters/autograd_check                       # about 20 min, peak RSS 12 GiB
    python -m benchmarks run exporters/autograd_check.smoke --only llama --layers 1

Needs the bench extra (torch, transformers, onnxscript). Its models, batches and comparisons are
also exporters_corpus's, float32_reference's and precision/amp_corpus's."""

from __future__ import annotations

import copy
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the records' tables need no torch; measuring does
    torch = F = None

from benchmarks import harness
from benchmarks.exporters.exporters import Wrapped  # module -> its first output
from roam_cli.backward.step import build as roam_backward
from roam_cli.core.memory import INPLACE_KEY
from roam_cli.frontend import torch_export, training_graph

TAKES = "about 20 min, peak RSS 12 GiB; needs the bench extra (torch, transformers, onnxscript)"

SEED, BATCH, SEQ, IMAGE = 0, 2, 32, 224
STEPS, LR, EPS = 20, 1e-4, 1e-10
TOLERANCE = 1e-4


def configs(layers: int, full: set[str]):
    import transformers as hf

    def depth(name, **kw):
        return {} if name in full else kw

    no_dropout = dict(attn_implementation="eager")
    return {  # name: (config, class, input names, language model?)
        "gpt2": (hf.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                               **depth("gpt2", n_layer=layers), **no_dropout), hf.GPT2LMHeadModel, ["input_ids"], True),
        "bert": (hf.BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                               **depth("bert", num_hidden_layers=layers), **no_dropout),
                 hf.BertForMaskedLM, ["input_ids"], True),
        "vit": (hf.ViTConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=1000,
                             **depth("vit", num_hidden_layers=layers), **no_dropout),
                hf.ViTForImageClassification, ["pixel_values"], False),
        "t5": (hf.T5Config(d_model=512, d_kv=64, d_ff=2048, num_heads=8, dropout_rate=0.0, decoder_start_token_id=0,
                           use_cache=False, **depth("t5", num_layers=layers, num_decoder_layers=layers), **no_dropout),
               hf.T5ForConditionalGeneration, ["input_ids", "decoder_input_ids"], True),
        "resnet50": (hf.ResNetConfig(embedding_size=64, hidden_sizes=[256, 512, 1024, 2048], depths=[3, 4, 6, 3],
                                     layer_type="bottleneck", num_labels=1000),
                     hf.ResNetForImageClassification, ["pixel_values"], False),
        "llama": (hf.LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1376, num_attention_heads=8,
                                 num_key_value_heads=2, max_position_embeddings=128, attention_dropout=0.0,
                                 use_cache=False, **depth("llama", num_hidden_layers=layers), **no_dropout),
                  hf.LlamaForCausalLM, ["input_ids"], True),
    }


def batch(config, names: list[str], language: bool, k: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Batch k: the inputs by name and the labels (a token per position, or a class per image)."""
    rng = np.random.default_rng(1000 + k)
    if language:
        feeds = {n: rng.integers(0, config.vocab_size, (BATCH, SEQ)).astype(np.int64) for n in names}
        return feeds, rng.integers(0, config.vocab_size, (BATCH, SEQ)).astype(np.int64)
    feeds = {names[0]: rng.standard_normal((BATCH, 3, IMAGE, IMAGE)).astype(np.float32)}
    return feeds, rng.integers(0, config.num_labels, (BATCH,)).astype(np.int64)


def fresh(cls, config):
    """`cls(config)` with random weights (seed 0), every parameter then moved by N(0, 0.02^2) so
    that no two are equal (a fresh model's equal LayerNorm weights are merged by exporters)."""
    torch.manual_seed(SEED)
    model = cls(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """F.cross_entropy (mean) with the class axis where roam's loss finds it: the last when the
    labels have the logits' shape without it (a language model's [tokens, vocab] view), else axis 1."""
    if logits.dim() >= 3 and labels.shape == logits.shape[:-1]:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    return F.cross_entropy(logits, labels)


def torch_loss(wrapped, feeds: dict, labels: np.ndarray, dtype=None):
    dtype = dtype or torch.float32
    logits = wrapped(*(torch.from_numpy(v).to(dtype) if v.dtype == np.float32 else torch.from_numpy(v)
                       for v in feeds.values()))
    return cross_entropy(logits, torch.from_numpy(labels))


def torch_gradients(wrapped, feeds: dict, labels: np.ndarray, dtype=None) -> dict[str, np.ndarray]:
    """PyTorch autograd's gradient of `torch_loss` for every parameter that gets one, by
    `named_values` name (tied parameters once)."""
    wrapped.zero_grad()
    torch_loss(wrapped, feeds, labels, dtype).backward()
    return {k: p.grad.numpy().copy() for k, p in named_values(wrapped).items()
            if isinstance(p, torch.nn.Parameter) and p.grad is not None}


def named_values(module) -> dict[str, torch.Tensor]:
    """Canonical name (torch_export's: tied tensors under their first name) -> parameter or buffer."""
    params, buffers = torch_export.canonical_names(module, "m.")
    out = {params[n]: p for n, p in module.named_parameters(remove_duplicate=False)}
    out.update({buffers[n]: b for n, b in module.named_buffers(remove_duplicate=False)})
    return out


def session(model: onnx.ModelProto):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


GRADIENT_BUFFER = "_grad.accumulation.buffer"  # <parameter> + this: its accumulator, an input of the graph


def roam_gradients(train: onnx.ModelProto, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One run of a training graph in roam's layout on `values` (parameters, batch and labels by
    input name) with zeroed accumulators: the gradient of each parameter it trains, read from
    `<parameter>_grad` (made an output of `train`, in place)."""
    trained = [i.name[: -len(GRADIENT_BUFFER)] for i in train.graph.input if i.name.endswith(GRADIENT_BUFFER)]
    train.graph.output.extend(onnx.helper.make_empty_tensor_value_info(f"{p}_grad") for p in trained)
    s = session(train)
    inputs = {**values, "lazy_reset_grad": np.ones(1, bool)}
    inputs.update({f"{p}{GRADIENT_BUFFER}": np.zeros(values[p].shape, np.float32) for p in trained})
    fed = {i.name for i in s.get_inputs()}
    return dict(zip(trained, s.run([f"{p}_grad" for p in trained], {k: v for k, v in inputs.items() if k in fed})))


def relative_errors(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray]
                    ) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """||ours - theirs|| / ||theirs|| per tensor of `theirs` (inf where `ours` has none). A tensor
    whose exact gradient is zero (an attention key's bias: softmax is invariant to it) has float
    noise for a gradient in both: those whose norm is below 1e-6 of the largest come apart, as
    (their norm, ||ours - theirs||)."""
    norm = {p: float(np.linalg.norm(g)) for p, g in theirs.items()}
    largest = max(norm.values())
    errors, noise = {}, {}
    for p, g in theirs.items():
        diff = float(np.linalg.norm(ours[p] - g)) if p in ours else float("inf")
        if norm[p] < 1e-6 * largest:
            noise[p] = (norm[p], diff)
        else:
            errors[p] = diff / norm[p]
    return errors, noise


def check(name: str, layers: int, full: set[str], folder: Path) -> dict:
    config, cls, names, language = configs(layers, full)[name]
    model = fresh(cls, config).train()
    wrapped = Wrapped(model, names[1:])
    feeds0, labels0 = batch(config, names, language, 0)
    t = time.time()
    exported = torch_export.export(wrapped, tuple(torch.from_numpy(v) for v in feeds0.values()), names, ["logits"],
                                   prefix="m.")
    export_s = time.time() - t
    forward = folder / f"{name}.onnx"
    onnx.save(exported.model, str(forward))
    del exported
    values = {k: v.detach().numpy().copy() for k, v in named_values(wrapped).items()}

    # PyTorch: the gradients at the start, then 20 AdamW steps
    grads = torch_gradients(wrapped, feeds0, labels0)
    # the same gradients in float64: how far float32 itself is from them, PyTorch's and roam's
    grads64 = torch_gradients(copy.deepcopy(wrapped).double(), feeds0, labels0, torch.float64)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=EPS, weight_decay=0.0)
    theirs = []
    for k in range(STEPS):
        opt.zero_grad()
        loss = torch_loss(wrapped, *batch(config, names, language, k))
        loss.backward()
        opt.step()
        theirs.append(float(loss))
    del model, wrapped, opt
    gc.collect()

    # roam: the training graph and the full step, run on onnxruntime
    t = time.time()
    made = training_graph.make(forward, folder / f"{name}.train.onnx", loss="cross-entropy", backward=roam_backward,
                               in_graph=False, optimizer_path=folder / f"{name}.optimizer.onnx")
    build_s = time.time() - t
    training_graph.make(forward, folder / f"{name}.step.onnx", loss="cross-entropy", backward=roam_backward,
                        in_graph=True, optimizer_settings={"eps": str(EPS)})
    train = onnx.load(str(folder / f"{name}.train.onnx"))
    ours = roam_gradients(train, {**values, **feeds0, "labels": labels0})
    trainable = list(ours)
    del train
    gc.collect()

    errors, noise = relative_errors(ours, grads)
    worst = max(errors, key=errors.get)

    def off_float64(got: dict) -> tuple[float, str]:
        """The largest ||g - g64|| / ||g64|| over the tensors compared above, and where."""
        off = {p: float(np.linalg.norm(got[p] - grads64[p]) / np.linalg.norm(grads64[p])) for p in errors}
        at = max(off, key=off.get)
        return off[at], at

    step = onnx.load(str(folder / f"{name}.step.onnx"))
    pairs = json.loads(next(m.value for m in step.metadata_props if m.key == INPLACE_KEY))
    s = session(step)
    fed = {i.name for i in s.get_inputs()}
    state = {k: v for k, v in values.items() if k in fed}
    for p in trainable:
        state[f"{p}.exp_avg"] = np.zeros_like(values[p])
        state[f"{p}.exp_avg_sq"] = np.zeros_like(values[p])
    state["step"] = np.zeros(1, np.int64)
    outs = [o.name for o in s.get_outputs()]
    loss_name = step.graph.output[0].name
    del step
    losses = []
    for k in range(STEPS):
        feeds, labels = batch(config, names, language, k)
        got = dict(zip(outs, s.run(None, {**state, **feeds, "labels": labels,
                                          "learning_rate": np.array([LR], np.float32)})))
        losses.append(float(got[loss_name]))
        state.update({pairs[o]: v for o, v in got.items() if o in pairs})
    loss_error = max(abs(a - b) / abs(b) for a, b in zip(losses, theirs))
    return dict(model=name, layers="full" if name in full or name == "resnet50" else layers,
                tensors=len(grads), params=int(sum(v.size for k, v in values.items() if k in grads)),
                worst=errors[worst], worst_name=worst, noise={p: list(v) for p, v in noise.items()},
                roam_off64=list(off_float64(ours)), torch_off64=list(off_float64(grads)),
                missing=sorted(set(grads) - set(ours)), extra=sorted(set(ours) - set(grads)),
                unreached=list(made.survey.unreached),
                loss_error=loss_error, first=[theirs[0], losses[0]], last=[theirs[-1], losses[-1]],
                export_s=round(export_s, 1), build_s=round(build_s, 1))


def main(argv: list[str]) -> list[dict]:
    harness.needs_torch(torch, __name__)
    ap = harness.options(__name__, __doc__)
    ap.add_argument("--only", default="gpt2,bert,vit,t5,resnet50,llama")
    ap.add_argument("--layers", type=int, default=2, help="num_hidden_layers of the reduced models (default 2)")
    ap.add_argument("--full", default="gpt2", help="models at their published depth (default gpt2)")
    args = ap.parse_args(argv)
    harness.quiet_torch(torch, 2)
    full = set(filter(None, args.full.split(",")))
    rows = []
    for name in args.only.split(","):
        try:
            with tempfile.TemporaryDirectory() as scratch:
                rows.append(check(name, args.layers, full, Path(scratch)))
        except Exception as e:  # noqa: BLE001  (the row says why; the other models still run)
            rows.append({"model": name, "error": f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}"})
        r = rows[-1]
        print(f"{name}: {r['error'] if 'error' in r else format(r['worst'], '.1e')}", file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict]) -> str:
    """One row per model: the worst gradient error, both float32 runs against float64, the 20-step losses."""
    out = []
    for r in rows:
        if "error" in r:
            out.append([r["model"], f"fails: {r['error']}", *["–"] * 9])
            continue
        noise = "; ".join(f"{p} ({a:.1e}, {b:.1e})" for p, (a, b) in r["noise"].items()) or "–"
        flag = "" if r["worst"] <= TOLERANCE and r["loss_error"] <= TOLERANCE and not r.get("missing") else " **over**"
        (ours64, ours64_at), (theirs64, theirs64_at) = r["roam_off64"], r["torch_off64"]
        out.append([r["model"], r["layers"], r["tensors"], f"{r['params']:,}", f"{r['worst']:.1e}{flag}",
                    r["worst_name"], noise, f"{ours64:.1e} ({ours64_at})", f"{theirs64:.1e} ({theirs64_at})",
                    f"{r['loss_error']:.1e}", f"{r['first'][0]:.4f} → {r['last'][0]:.4f} / "
                                              f"{r['first'][1]:.4f} → {r['last'][1]:.4f}"])
    text = harness.markdown_table(
        ["model", "layers", "param tensors", "parameters", "worst grad rel. error (norm)", "at",
         "zero-gradient tensors (torch norm, diff norm)", "against float64: roam", "against float64: PyTorch float32",
         "20-step loss rel. error", "loss step 1 → 20 (torch / roam)"], out, "llrrrllrrrl")
    missing = [f"- {r['model']}: gradients missing {r['missing']}, extra {r['extra']}" for r in rows
               if r.get("missing") or r.get("extra")]
    return text + ("\n" + "\n".join(missing) + "\n" if missing else "")
