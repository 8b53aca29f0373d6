#!/usr/bin/env python3
"""PyTorch's own memory and FLOPs for one training step of each suite model, eager vs gradient checkpointing.

    python benchmarks/pytorch_memory.py                          # every model of suite.MODELS
    python benchmarks/pytorch_memory.py --only gpt2_small,bert_base --json OUT.json

The reference figures that roam's plans are compared with. For each model of `suite.MODELS`:

- the Hugging Face model is built by `suite.build(spec)` as the suite's export builds it (the suite's
  model table and configurations, batch and sequence/image sizes; eager attention; train mode, so
  dropout is active as in the ONNX export; on the "meta" device), then its parameters and buffers are
  made CPU tensors (tied weights kept tied) inside `torch._subclasses.fake_tensor.FakeTensorMode`, the
  mode everything below runs in: no real memory is allocated and no real arithmetic is done (the
  inputs are fake tensors of the suite's shapes and dtypes);
- the loss is the suite's export's: the model's own loss for the language models (causal LM loss
  with labels = input ids for GPT-2, masked-LM loss for BERT, T5's seq2seq loss with labels = input
  ids), and `torch.nn.functional.cross_entropy` (mean) of the logits against `batch` random class
  labels for ViT and ResNet (what `roam make-training-graph --loss cross-entropy` adds);
- a training step is forward, loss, backward, `torch.optim.AdamW(model.parameters(), foreach=True)`
  step, `zero_grad()` (grads set to None). The first step creates the AdamW moments; the SECOND step
  is the one measured, with `torch.distributed._tools.mem_tracker.MemTracker` entered around that step
  alone (model, optimizer and inputs registered with `track_external`, so parameters, the moments and
  the inputs are counted from the start), and `get_tracker_snapshot("peak")` gives the bytes by kind
  (Parameter, Buffer, Gradient, Activation, Temp, Optstate, Other) at the step's peak;
- transient bytes = peak total - parameter bytes - optimizer-state bytes, where parameter bytes are
  the storages of `model.parameters()` (tied weights once) and optimizer-state bytes are the storages
  of every tensor in `optimizer.state` after the first step: exp_avg and exp_avg_sq (one parameter-size
  each) plus one 4-byte `step` counter per parameter tensor. Nothing else is subtracted: gradients,
  activations, backward temporaries, buffers (BERT's position-id buffers, ResNet's BatchNorm running
  statistics: under 1 MiB) and the inputs stay in transient, and so do the parameter-sized temporaries
  of the foreach AdamW update, which MemTracker files under Optstate while `step()` runs;
- the checkpointing variant is the same after `model.gradient_checkpointing_enable()` (transformers'
  whole-layer checkpointing, `torch.utils.checkpoint` with use_reentrant=False, transformers' default).
  A family whose model does not support it (`supports_gradient_checkpointing` is False: ResNet) gets
  "n/a" and the reason;
- FLOPs: `torch.utils.flop_counter.FlopCounterMode` around the first step's forward, loss and backward
  (the optimizer step excluded), in the same FakeTensorMode. It counts only matmul, convolution and
  attention kernels (at 2*M*N*K for a matmul), not elementwise or reduction operators, whereas roam
  counts matmul/conv at 2*M*N*K and elementwise at one per element; that is fine for the extra FLOPs
  of checkpointing, which are recomputed forwards, dominated by matmuls. Extra FLOPs % =
  (checkpointing - eager) / eager * 100.

The step's peak can be the optimizer's: with checkpointing the activations shrink below what the foreach
update needs (gradients plus a parameter-sized temporary: transient = 2 x parameter bytes). So the peak
is also read when `optimizer.step()` starts (a step pre-hook reads the tracker's peak snapshot): the
forward + loss + backward peak, whose transient part is the "fwd+bwd" column.

MiB are 2**20 bytes. The JSON (--json) has, per model: the batch and size, parameter, optimizer-state
and moment bytes, and per variant (eager, checkpointing) the step's peak bytes by kind, the peak bytes by
kind before the optimizer step, both transients, the FLOPs and the seconds. The markdown table goes to
stdout, progress to stderr.

Needs torch and transformers (the `bench` extra); standalone, not imported by roam_cli."""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import suite  # noqa: E402  (benchmarks/suite.py: the model table and builder)

MIB = 2**20


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors`."""
    seen, total = set(), 0
    for t in tensors:
        st = t.untyped_storage()
        key = id(st) if not hasattr(st, "_cdata") else st._cdata
        if key not in seen:
            seen.add(key)
            total += st.nbytes()
    return total


def materialize(module: torch.nn.Module) -> None:
    """Replace the module's meta parameters and buffers by uninitialised CPU tensors, in place: fake
    ones when called under FakeTensorMode. A tensor shared by several modules (tied weights) stays
    shared. (Building under FakeTensorMode directly fails: transformers' weight initialisation reads
    values, e.g. trunc_normal_'s data-dependent loop for ViT; on "meta" it is skipped.)"""
    memo: dict[int, torch.Tensor] = {}

    def new(t: torch.Tensor, parameter: bool) -> torch.Tensor:
        if id(t) not in memo:
            e = torch.empty(t.shape, dtype=t.dtype, device="cpu")
            memo[id(t)] = torch.nn.Parameter(e, requires_grad=t.requires_grad) if parameter else e
        return memo[id(t)]

    for m in module.modules():
        for k, t in m._parameters.items():
            if t is not None:
                m._parameters[k] = new(t, True)
        for k, t in m._buffers.items():
            if t is not None:
                m._buffers[k] = new(t, False)


def _by_kind(snapshot: dict) -> dict:
    """MemTracker snapshot {device: {kind: bytes}} -> {kind name: bytes} (one device: cpu under FakeTensorMode)."""
    if len(snapshot) > 1:
        raise RuntimeError(f"expected one device, got {list(snapshot)}")
    (kinds,) = snapshot.values() if snapshot else ({},)
    return {getattr(k, "value", str(k)): int(v) for k, v in kinds.items()}


def size_label(spec: suite.Model) -> str:
    return f"{spec.batch}×{spec.seq}²" if spec.family in ("vit", "resnet") else f"{spec.batch}×{spec.seq}"


def measure(spec: suite.Model, checkpointing: bool) -> dict:
    """One model, one variant: {'ok': False, 'reason': ...} or the figures of the second step."""
    wrapper, meta_args, _inputs, _outputs, loss_kind = suite.build(spec)  # on "meta", as the suite exports
    hf_model = wrapper.m

    def prepare() -> dict | None:
        if not checkpointing:
            return None
        if not getattr(hf_model, "supports_gradient_checkpointing", False):
            return dict(ok=False, reason=f"{type(hf_model).__name__}.supports_gradient_checkpointing "
                                         "is False (transformers has no checkpointing for this family)")
        hf_model.gradient_checkpointing_enable()
        if not hf_model.is_gradient_checkpointing:
            return dict(ok=False, reason="gradient_checkpointing_enable() did not enable it")
        return None

    return step_memory(wrapper, meta_args, loss_kind, spec.batch, prepare)


def step_memory(wrapper: torch.nn.Module, meta_args: tuple, loss_kind: str, batch: int, prepare=lambda: None) -> dict:
    """The figures of the second AdamW training step of `wrapper(*meta_args)` (module and inputs on
    "meta"), under FakeTensorMode: loss "cross-entropy" (class labels, `batch` of them, against the
    output), "mse" (a target of the output's shape) or "none" (the output is the loss). `prepare()`
    runs first under the mode; what it returns other than None is returned instead (a refusal)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.utils.flop_counter import FlopCounterMode

    t0 = time.time()
    with FakeTensorMode():
        materialize(wrapper)
        args = tuple(torch.empty(a.shape, dtype=a.dtype) for a in meta_args)
        refused = prepare()
        if refused is not None:
            return refused
        if loss_kind == "cross-entropy":  # what make-training-graph --loss cross-entropy adds to the logits
            labels = torch.empty(batch, dtype=torch.int64)  # class indices

            def loss_fn():
                return torch.nn.functional.cross_entropy(wrapper(*args), labels)
            extra_inputs = (labels,)
        elif loss_kind == "mse":  # make-training-graph --loss mse: a target of the output's shape
            with torch.no_grad():
                target = torch.empty_like(wrapper(*args))

            def loss_fn():
                return torch.nn.functional.mse_loss(wrapper(*args), target)
            extra_inputs = (target,)
        else:  # the model's own loss (LanguageModelLoss)
            def loss_fn():
                return wrapper(*args)
            extra_inputs = ()
        params = list(wrapper.parameters())
        optimizer = torch.optim.AdamW(params, foreach=True)

        # step 1: creates the AdamW moments; forward + backward FLOPs counted here
        counter = FlopCounterMode(display=False)
        with counter:
            loss_fn().backward()
        optimizer.step()
        optimizer.zero_grad()
        flops = int(counter.get_total_flops())

        state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        moments = [v for s in optimizer.state.values() for k, v in s.items() if k in ("exp_avg", "exp_avg_sq")]
        param_bytes = _storage_bytes(params)
        state_bytes = _storage_bytes(state)
        moment_bytes = _storage_bytes(moments)

        # step 2: measured; the peak so far is also read when step() starts (forward, loss and backward only)
        tracker = MemTracker()
        tracker.track_external(wrapper, optimizer, *args, *extra_inputs)
        before_step = {}
        hook = optimizer.register_step_pre_hook(
            lambda *_: before_step.update(_by_kind(tracker.get_tracker_snapshot("peak"))))
        with tracker:
            loss_fn().backward()
            optimizer.step()
            optimizer.zero_grad()
        hook.remove()
        peak = _by_kind(tracker.get_tracker_snapshot("peak"))
    total = peak["Total"]
    return dict(ok=True, peak=peak, peak_before_optimizer=before_step, param_bytes=param_bytes,
                optimizer_state_bytes=state_bytes, moment_bytes=moment_bytes,
                transient_bytes=total - param_bytes - state_bytes,
                transient_before_optimizer_bytes=before_step["Total"] - param_bytes - state_bytes,
                flops=flops, seconds=time.time() - t0)


def run_model(spec: suite.Model) -> dict:
    t0 = time.time()
    eager = measure(spec, checkpointing=False)
    ckpt = measure(spec, checkpointing=True)
    row = dict(model=spec.name, family=spec.family, batch=spec.batch, size=spec.seq, label=size_label(spec),
               param_bytes=eager["param_bytes"], optimizer_state_bytes=eager["optimizer_state_bytes"],
               moment_bytes=eager["moment_bytes"], eager=eager, checkpointing=ckpt,
               extra_flops_pct=((ckpt["flops"] - eager["flops"]) / eager["flops"] * 100) if ckpt["ok"] else None,
               seconds=time.time() - t0)
    return row


def environment() -> dict:
    import transformers
    return dict(python=platform.python_version(), torch=torch.__version__, transformers=transformers.__version__,
                machine=f"{platform.system()} {platform.machine()}, {platform.processor() or 'cpu'}",
                node=platform.node())


HEADER = ("model", "batch×size", "params+moments MiB", "eager transient MiB", "checkpointing transient MiB",
          "eager fwd+bwd transient MiB", "checkpointing fwd+bwd transient MiB", "eager step GFLOPs",
          "checkpointing extra FLOPs %", "seconds")


def table_row(r: dict) -> str:
    e, c = r["eager"], r["checkpointing"]
    return (f"| {r['model']} | {r['label']} | {(r['param_bytes'] + r['moment_bytes']) / MIB:,.0f} | "
            f"{e['transient_bytes'] / MIB:,.0f} | " + (f"{c['transient_bytes'] / MIB:,.0f}" if c["ok"] else "n/a")
            + f" | {e['transient_before_optimizer_bytes'] / MIB:,.0f} | "
            + (f"{c['transient_before_optimizer_bytes'] / MIB:,.0f}" if c["ok"] else "n/a")
            + f" | {e['flops'] / 1e9:,.1f} | " + (f"{r['extra_flops_pct']:+.1f}" if c["ok"] else "n/a")
            + f" | {r['seconds']:.1f} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--only", help="comma-separated model names (default: all, in suite.py's order)")
    p.add_argument("--json", type=Path, help="write every figure to this JSON file")
    a = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    import transformers
    transformers.logging.set_verbosity_error()
    logging.getLogger("torch").setLevel(logging.ERROR)
    chosen = suite.MODELS
    if a.only:
        names = a.only.split(",")
        unknown = set(names) - {m.name for m in suite.MODELS}
        if unknown:
            p.error(f"unknown models: {', '.join(sorted(unknown))} (suite.py --list)")
        chosen = [m for m in suite.MODELS if m.name in names]
    env = environment()
    print("| " + " | ".join(HEADER) + " |\n|" + "---|" * len(HEADER), flush=True)
    rows = []
    for spec in chosen:
        print(f"{spec.name}...", file=sys.stderr, flush=True)
        r = run_model(spec)
        rows.append(r)
        print(table_row(r), flush=True)
        if a.json:  # after every model, so a long run keeps what it has
            a.json.write_text(json.dumps(dict(environment=env, mib=MIB, models=rows), indent=1))
    print()
    print("Transient = peak of the second training step (MemTracker, FakeTensorMode) minus parameters and AdamW "
          "state (moments and step counters); fwd+bwd: the same at the peak before optimizer.step() starts; "
          "params+moments = parameters + exp_avg + exp_avg_sq. GFLOPs: "
          "forward + backward, matmul/conv/attention only (FlopCounterMode). Checkpointing: transformers' "
          "gradient_checkpointing_enable() (whole layers, non-reentrant).")
    for r in rows:
        if not r["checkpointing"]["ok"]:
            print(f"\n{r['model']}: checkpointing n/a: {r['checkpointing']['reason']}.")
    print(f"\nPython {env['python']}, torch {env['torch']}, transformers {env['transformers']}; {env['machine']} "
          "(FakeTensorMode: figures do not depend on the machine).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
