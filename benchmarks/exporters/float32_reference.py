"""How far float32 itself is from exact, in PyTorch alone, on autograd_check's models: the floor
under any float32 backward's agreement with PyTorch's.

For each model (autograd_check's configuration, weights, batches and AdamW settings): PyTorch's
float32 gradients against its float64 ones (the largest and the median ||g32 - g64|| / ||g64|| over
the parameter tensors), the largest relative difference of the 20 AdamW steps' losses, float32
against float64, and the same 20 steps in float32 with AdamW written as roam's in-graph step writes
it (ONNX Runtime's form: eps added to sqrt(v) before the bias correction) against torch.optim.AdamW.

    python -m benchmarks run exporters/float32_reference                   # ResNet-50 and T5, a few minutes
    python -m benchmarks run exporters/float32_reference.gpt2 --only gpt2

Needs the bench extra (torch, transformers)."""

from __future__ import annotations

import copy
import statistics
import sys

try:
    import torch
except ImportError:  # the records' tables need no torch; measuring does
    torch = None

from benchmarks import harness
from benchmarks.exporters import (
    autograd_check as ac,  # the models, weights and batches of the comparison
)
from benchmarks.exporters.exporters import Wrapped

TAKES = "a few minutes; needs the bench extra (torch, transformers)"


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


def main(argv: list[str]) -> list[dict]:
    harness.needs_torch(torch, __name__)
    ap = harness.options(__name__, __doc__)
    ap.add_argument("--only", default="resnet50,t5")
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    rows = []
    for name in args.only.split(","):
        config, cls, names, language = ac.configs(args.layers, {"gpt2"})[name]
        model = ac.fresh(cls, config).train()
        feeds, labels = ac.batch(config, names, language, 0)
        g32, g64 = (gradients(model, feeds, labels, names, d) for d in (torch.float32, torch.float64))
        off = [float((g32[n] - g64[n]).norm() / g64[n].norm()) for n in g64 if g64[n].norm() > 0]
        rel = lambda a, b: max(abs(x - y) / abs(y) for x, y in zip(a, b))  # noqa: E731
        l32, l64, ours = (losses(model, config, names, language, d, f)
                          for d, f in ((torch.float32, False), (torch.float64, False), (torch.float32, True)))
        rows.append({"model": name, "grad_worst": max(off), "grad_median": statistics.median(off),
                     "loss_32_vs_64": rel(l32, l64), "loss_ort_form_vs_torch": rel(ours, l32)})
        print(f"{name}: gradients {max(off):.1e} from float64", file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict]) -> str:
    return harness.markdown_table(
        ["model", "grad: float32 vs float64, worst (median)", "20-step loss: float32 vs float64",
         "20-step loss: roam's AdamW form vs torch.optim.AdamW, float32"],
        [[r["model"], f"{r['grad_worst']:.1e} ({r['grad_median']:.1e})", f"{r['loss_32_vs_64']:.1e}",
          f"{r['loss_ort_form_vs_torch']:.1e}"] for r in rows])
