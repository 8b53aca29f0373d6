#!/usr/bin/env python3
"""Build ONNX Runtime *training* graphs of GPT-2 for testing roam's planner.

Needs (only for this script): torch, transformers (5.x), onnxscript, onnx,
onnxruntime-training (1.19.x): ``pip install '.[bench]'`` with torch's CPU build
(``pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu``).

Usage (from the repository root)::

    # Tiny GPT-2 (committed): 2 layers, hidden 64, 2 heads, vocab 512,
    # 64 positions, batch 2, sequence 32, dropout 0.1, real (seeded) weights.
    python sample_models/make_gpt2_tiny.py --check

    # GPT-2 small graph without weights (not committed): 12 layers, hidden 768,
    # 12 heads, vocab 50257, 1024 positions, batch 4, sequence 256.
    python sample_models/make_gpt2_tiny.py --preset small
    # ...which is the same as
    python sample_models/make_gpt2_tiny.py --layers 12 --hidden 768 --heads 12 \
        --vocab 50257 --positions 1024 --batch 4 --seq 256 \
        --out /work/suite_cache/gpt2_small --no-weights

What it does
------------
1. Builds ``GPT2LMHeadModel`` (eager attention, dropout kept, train mode). With
   weights, parameters are the seeded init plus a small seeded perturbation so
   no two parameter tensors are equal. With ``--no-weights`` the model lives on
   ``torch.device("meta")`` and no parameter data ever exists.
2. Exports ``Wrapper(input_ids, labels) -> loss`` (the HF causal-LM loss, i.e.
   logits shifted by one and SoftmaxCrossEntropyLoss with ignore_index=-100)
   with ``torch.onnx.export(..., dynamo=True, optimize=False)``, opset 18.
3. ``roam_cli.frontend.torch_export.export``: lifts every parameter out of the initializer
   list into a graph input, runs the exporter's optimizer
   (``ONNXProgram.optimize()``), puts the parameters back as initializers
   (embedded data, or external data pointing into a sparse file that is never
   written for ``--no-weights``). Parameters are therefore never
   constant-folded (e.g. wpe gathered at constant positions) or merged (equal
   initializers), while the rest of the graph is cleaned up as with the
   exporter's default ``optimize=True``.
4. ``roam_cli.frontend.training_graph.repair``: adds the optional outputs the ORT
   gradient builders need (LayerNormalization Mean/InvStdDev, Dropout mask,
   SoftmaxCrossEntropyLoss log_prob); ir_version 10.
5. ``roam_cli.frontend.training_graph.build`` (what ``roam make-training-graph`` uses;
   the same onnxblock calls as ``artifacts.generate_artifacts``) with
   ``requires_grad`` = all parameters, loss ``none`` (the graph output already
   is the loss) and AdamW. With ``--no-weights`` the checkpoint is not written
   (it would need the weights). All written models have ir_version <= 10 so
   onnxruntime 1.19 loads them.
6. ``--check`` loads training/eval/optimizer models in a plain
   ``onnxruntime.InferenceSession`` and runs them once on random feeds; with
   weights it also compares the eval loss with PyTorch.

Deterministic (fixed seeds) and re-runnable: outputs are overwritten.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

from roam_cli.frontend import torch_export, training_graph

SEED = 1234
HERE = Path(__file__).resolve().parent

PRESETS = {
    "tiny": dict(layers=2, hidden=64, heads=2, vocab=512, positions=64, batch=2, seq=32,
                 out=str(HERE / "gpt2_tiny"), no_weights=False),
    "small": dict(layers=12, hidden=768, heads=12, vocab=50257, positions=1024, batch=4, seq=256,
                  out="/work/suite_cache/gpt2_small", no_weights=True),
}


def log(*a):
    print(*a, flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                   help="defaults for the other flags (default: tiny)")
    p.add_argument("--layers", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--positions", type=int, help="n_positions (wpe rows)")
    p.add_argument("--batch", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--dropout", type=float, default=0.1,
                   help="resid/embd/attn dropout probability (default 0.1, as GPT-2)")
    p.add_argument("--out", help="artifact directory")
    p.add_argument("--no-weights", dest="no_weights", action="store_true", default=None,
                   help="meta-device model, sparse external data, no checkpoint")
    p.add_argument("--check", action="store_true",
                   help="load the artifacts in onnxruntime.InferenceSession and run one step")
    args = p.parse_args(argv)
    for k, v in PRESETS[args.preset].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


def seed_everything(seed=SEED):
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)


# --------------------------------------------------------------------------- model

def build_model(args):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=args.vocab, n_positions=args.positions, n_embd=args.hidden,
        n_layer=args.layers, n_head=args.heads,
        resid_pdrop=args.dropout, embd_pdrop=args.dropout, attn_pdrop=args.dropout,
        bos_token_id=0, eos_token_id=0, use_cache=False,
        attn_implementation="eager",  # plain MatMul/Softmax attention, no SDPA
    )
    if args.no_weights:
        with torch.device("meta"):
            model = GPT2LMHeadModel(cfg)
    else:
        model = GPT2LMHeadModel(cfg)
        gen = torch.Generator().manual_seed(SEED + 1)
        with torch.no_grad():  # make every parameter tensor distinct
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    model.train()

    class Wrapper(torch.nn.Module):
        """input_ids, labels -> scalar causal-LM loss (labels shifted inside)."""

        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, labels):
            return self.m(input_ids=input_ids, labels=labels, use_cache=False).loss

    return Wrapper(model), model


# --------------------------------------------------------------------------- check

def rand_feed(sess, args, real=None, seq=None, seed=SEED + 3):
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        if i.type.startswith("seq("):  # optimizer model: one sequence entry per parameter
            if i.name == "params":
                feeds[i.name] = [np.array(a) for a in seq]
            elif i.name == "gradients":
                feeds[i.name] = [np.asarray(rng.standard_normal(a.shape) * 1e-3, np.float32) for a in seq]
            else:
                feeds[i.name] = [np.zeros_like(a) for a in seq]
        elif real is not None and i.name in real:
            feeds[i.name] = real[i.name]
        elif i.type == "tensor(int64)":
            feeds[i.name] = rng.integers(0, args.vocab, shape, dtype=np.int64)
        elif i.type == "tensor(bool)":
            feeds[i.name] = np.ones(shape, dtype=bool)
        elif i.name.endswith(".accumulation.buffer"):
            feeds[i.name] = np.zeros(shape, dtype=np.float32)  # InPlaceAccumulatorV2 writes here
        elif i.name == "learning_rate":
            feeds[i.name] = np.array(1e-3, np.float32).reshape(shape)
        elif i.name == "step":
            feeds[i.name] = np.ones(shape, np.int64)
        else:
            feeds[i.name] = np.asarray(rng.standard_normal(shape) * 0.02, dtype=np.float32)
    return feeds


def check(args, out, hf_model):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    real = None
    if not args.no_weights:
        real = {n: p.detach().numpy() for n, p in hf_model.named_parameters()}
    tr = ort.InferenceSession(str(out / "training_model.onnx"), so, providers=["CPUExecutionProvider"])
    feeds = rand_feed(tr, args, real)
    res = tr.run(None, feeds)
    names = [o.name for o in tr.get_outputs()]
    loss = float(np.asarray(res[names.index("loss")]))
    nz = sum(1 for k, v in feeds.items() if k.endswith(".accumulation.buffer") and np.any(v != 0))
    nbuf = sum(1 for k in feeds if k.endswith(".accumulation.buffer"))
    log(f"check: training step ran, loss={loss:.4f}, {nz}/{nbuf} grad buffers became non-zero")
    if not np.isfinite(loss) or nz != nbuf:
        raise SystemExit("check failed: training step")

    ev = ort.InferenceSession(str(out / "eval_model.onnx"), so, providers=["CPUExecutionProvider"])
    efeeds = {i.name: feeds[i.name] for i in ev.get_inputs()}
    eloss = float(np.asarray(ev.run(["loss"], efeeds)[0]))
    msg = f"check: eval step ran, loss={eloss:.4f}"
    if real is not None:
        import torch

        hf_model.eval()
        with torch.no_grad():
            ids = torch.from_numpy(efeeds["input_ids"])
            lab = torch.from_numpy(efeeds["labels"])
            tloss = float(hf_model(input_ids=ids, labels=lab, use_cache=False).loss)
        hf_model.train()
        msg += f", PyTorch eval loss={tloss:.4f}"
        if abs(tloss - eloss) > 1e-4 * max(1.0, abs(tloss)):
            raise SystemExit(msg + " -> MISMATCH")
    log(msg)

    if real is not None and args.dropout == 0:  # no randomness: gradients must match PyTorch
        import torch

        hf_model.zero_grad()
        ids = torch.from_numpy(feeds["input_ids"])
        lab = torch.from_numpy(feeds["labels"])
        hf_model(input_ids=ids, labels=lab, use_cache=False).loss.backward()
        worst = 0.0
        for n, p in hf_model.named_parameters():
            g = feeds[f"{n}_grad.accumulation.buffer"]
            worst = max(worst, float(np.abs(g - p.grad.numpy()).max() / (np.abs(p.grad.numpy()).max() + 1e-12)))
        log(f"check: gradients vs PyTorch, worst relative max-abs error {worst:.2e}")
        if worst > 1e-3:
            raise SystemExit("check failed: gradients differ from PyTorch")

    opt_path = out / "optimizer_model.onnx"
    if opt_path.exists():
        op = ort.InferenceSession(str(opt_path), so, providers=["CPUExecutionProvider"])
        params = [feeds[i.name] for i in tr.get_inputs() if f"{i.name}_grad.accumulation.buffer" in feeds]
        ofeeds = rand_feed(op, args, None, seq=params)
        before = [a.copy() for a in ofeeds["params"]]
        flag = op.run(None, ofeeds)[0]
        moved = sum(1 for a, b in zip(before, ofeeds["params"]) if np.any(a != b))
        log(f"check: optimizer step ran (AdamWOptimizer, {len(params)} params in sequences, "
            f"updated_flag={bool(np.asarray(flag).ravel()[0])}, {moved} params changed in place)")


# ---------------------------------------------------------------------------- main

def main(argv=None):
    args = parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    seed_everything()
    log(f"config: layers={args.layers} hidden={args.hidden} heads={args.heads} vocab={args.vocab} "
        f"positions={args.positions} batch={args.batch} seq={args.seq} dropout={args.dropout} "
        f"weights={'no (meta device)' if args.no_weights else 'yes'} -> {out}")

    import torch

    wrapper, hf_model = build_model(args)
    n_torch = len(list(hf_model.parameters()))  # unique tensors (wte/lm_head tied)
    n_torch_elems = sum(p.numel() for p in hf_model.parameters())

    dev = "meta" if args.no_weights else "cpu"
    gen = torch.Generator().manual_seed(SEED + 2)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen).to(dev)
    exported = torch_export.export(wrapper, (ids, ids.clone()), ["input_ids", "labels"], ["loss"], prefix="m.",
                                   log=log)
    mp = exported.model
    fixed = training_graph.repair(mp)
    training_graph.clamp_ir(mp)
    log(f"forward graph: {len(mp.graph.node)} nodes, {len(exported.parameters)} parameters; "
        f"added outputs: {dict(fixed)}")
    if not args.no_weights:
        onnx.checker.check_model(mp)

    t = time.time()
    chosen = training_graph.survey(mp, requires_grad=exported.parameters)
    built = training_graph.build(mp, chosen, loss="none", optimizer="adamw")
    for name, proto in (("training_model.onnx", built.training), ("eval_model.onnx", built.eval),
                        ("optimizer_model.onnx", built.optimizer)):
        onnx.save(proto, str(out / name))
    if args.no_weights:
        (out / "checkpoint").unlink(missing_ok=True)  # stale weights from an earlier run with weights
        log("checkpoint: skipped (--no-weights)")
    else:
        training_graph.write_checkpoint(built.parameters, out, out / "checkpoint")
    log(f"training artifacts: {time.time() - t:.1f}s")

    tm = onnx.load(str(out / "training_model.onnx"), load_external_data=False)
    inputs = [i.name for i in tm.graph.input]
    bufs = {n[: -len("_grad.accumulation.buffer")] for n in inputs if n.endswith("_grad.accumulation.buffer")}
    trainable = [n for n in inputs if n in bufs]
    log(f"training_model.onnx: {len(tm.graph.node)} nodes, {len(tm.graph.input)} inputs, "
        f"{len(tm.graph.output)} outputs, ir_version {tm.ir_version}, opsets "
        f"{sorted((o.domain, o.version) for o in tm.opset_import)}")
    n_onnx_elems = sum(int(np.prod([d.dim_value for d in i.type.tensor_type.shape.dim]))
                       for i in tm.graph.input if i.name in bufs)
    log(f"trainable parameters: ONNX {len(trainable)} tensors / {n_onnx_elems} elements; "
        f"PyTorch {n_torch} tensors / {n_torch_elems} elements")
    if len(trainable) != n_torch or n_onnx_elems != n_torch_elems:
        log("WARNING: parameter count mismatch")
    hist = Counter((n.domain or "ai.onnx", n.op_type) for n in tm.graph.node)
    log("ops: " + ", ".join(f"{d}::{o}={c}" for (d, o), c in sorted(hist.items(), key=lambda x: -x[1])))
    for p in sorted(out.iterdir()):
        size = sum(f.stat().st_size for f in p.rglob("*")) if p.is_dir() else p.stat().st_size
        log(f"  {p.name}: {size} bytes")

    if args.check:
        check(args, out, hf_model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
