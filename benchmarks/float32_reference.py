#!/usr/bin/env python3
"""How far float32 itself is from exact, in PyTorch alone, on autograd_check's models: the floor
under any float32 backward's agreement with PyTorch's.

    PYTHONPATH=. python benchmarks/float32_reference.py --only resnet50,t5

For each model (autograd_check's configuration, weights, batches and AdamW settings): PyTorch's
float32 gradients against its float64 ones (the largest and the median ||g32 - g64|| / ||g64|| over
the parameter tensors), the largest relative difference of the 20 AdamW steps' losses, float32
against float64, and the same 20 steps in float32 with AdamW written as roam's in-graph step writes
it (ONNX Runtime's form: eps added to sqrt(v) before the bias correction) against torch.optim.AdamW.
Needs torch and transformers (the benchmark environment)."""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import autograd_check as ac  # noqa: E402  (the models, weights and batches of the comparison)
from exporters import Wrapped  # noqa: E402


def gradients(model, feeds, labels, names, dtype) -> dict[str, torch.Tensor]:
    m = copy.deepcopy(model).to(dtype)
    ac.torch_loss(Wrapped(m, names[1:]), feeds, labels, dtype).backward()
    return {n: p.grad.double() for n, p in m.named_parameters() if p.grad is not None}


def losses(model, config, names, language, dtype, ort_form: bool) -> list[float]:
    m = copy.deepcopy(model).to(dtype)
    w, params = Wrapped(m, names[1:]), list(m.parameters())
    torch_opt = None if ort_form else torch.optim.AdamW(params, lr=ac.LR, betas=(0.9, 0.999), eps=ac.EPS,
                                                       weight_decay=0.0)
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    out = []
    for k in range(ac.STEPS):
        for p in params:
            p.grad = None
        loss = ac.torch_loss(w, *ac.batch(config, names, language, k), dtype)
        loss.backward()
        out.append(float(loss))
        if torch_opt is not None:
            torch_opt.step()
            continue
        bias1, bias2 = 1 - 0.9 ** (k + 1), 1 - 0.999 ** (k + 1)
        with torch.no_grad():
            for p, (m1, m2) in zip(params, moments):
                if p.grad is not None:
                    m1.mul_(0.9).add_(p.grad * 0.1)
                    m2.mul_(0.999).add_(p.grad * p.grad * 0.001)
                    p.sub_(ac.LR * bias2 ** 0.5 / bias1 * m1 / (m2.sqrt() + ac.EPS))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="resnet50,t5")
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(2)
    print("| model | grad: float32 vs float64, worst (median) | 20-step loss: float32 vs float64 | "
          "20-step loss: roam's AdamW form vs torch.optim.AdamW, float32 |\n|---|---:|---:|---:|")
    for name in args.only.split(","):
        config, cls, names, language = ac.configs(args.layers, {"gpt2"})[name]
        torch.manual_seed(ac.SEED)
        model = cls(config).train()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        feeds, labels = ac.batch(config, names, language, 0)
        g32, g64 = (gradients(model, feeds, labels, names, d) for d in (torch.float32, torch.float64))
        off = [float((g32[n] - g64[n]).norm() / g64[n].norm()) for n in g64 if g64[n].norm() > 0]
        rel = lambda a, b: max(abs(x - y) / abs(y) for x, y in zip(a, b))  # noqa: E731
        l32, l64, ours = (losses(model, config, names, language, d, f)
                          for d, f in ((torch.float32, False), (torch.float64, False), (torch.float32, True)))
        print(f"| {name} | {max(off):.1e} ({statistics.median(off):.1e}) | {rel(l32, l64):.1e} | {rel(ours, l32):.1e} |",
              flush=True)


if __name__ == "__main__":
    main()
