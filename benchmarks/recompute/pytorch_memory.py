"""PyTorch's own memory and FLOPs for one training step of each suite model, eager vs gradient checkpointing.

    python -m benchmarks run recompute/pytorch_memory                  # every model of suite.MODELS, about 4 min
    python -m benchmarks run recompute/pytorch_memory --only gpt2_small,bert_base
    python -m benchmarks run recompute/pytorch_memory.amp --amp bf16,fp16 --only gpt2_small,bert_base,gpt2_xl,llama_7b

The reference figures that roam's plans are compared with (recompute/recompute, recompute/tradeoff;
the `.amp` record: precision/amp_memory). Needs torch and transformers (the `bench` extra); nothing
is downloaded and no real memory is allocated. For each model of `suite.MODELS`:

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

Mixed precision (--amp bf16, fp16 or bf16,fp16): each model eager (no checkpointing) in float32 and in
PyTorch AMP as it is used on GPUs, in one run, so the before and after come from the same code:

- the forward and the loss under `torch.autocast("cpu", dtype)`, backward and the AdamW step outside it;
  parameters and AdamW moments stay float32 (master weights; the script stops if one is not, or if
  MemTracker's Parameter bytes at the peak are not the float32 parameters' bytes); fp16 adds
  `torch.amp.GradScaler`: scale(loss).backward(), scaler.step(optimizer), scaler.update(). Its step always
  runs the optimizer (whether an inf was found cannot be read from a fake tensor; skipping is the rare
  step); its inf check and unscaling are in place (`_amp_foreach_non_finite_check_and_unscale_`), so the
  scaler adds scalars only;
- autocast casts each parameter that feeds a low-precision operator once per forward (its cache of
  low-precision weight copies, cleared when the autocast region exits; the copies that the backward needs
  stay alive until their backward operator has run). MemTracker files them under Activation, inside the
  transient; `WeightCopies` watches them: the bytes made and those alive at the fwd+bwd peak;
- the autocast is the CPU's, since the fake tensors are CPU tensors (fake CUDA tensors do not run on a
  build without CUDA). CUDA's operator lists differ (aten/src/ATen/autocast_mode.h and .cpp): of what these
  models run in low precision, CUDA runs pow (GPT-2's gelu_new) and softmax (BERT's attention; GPT-2's
  input is float32 already, through its float32 mask, and LLaMA asks for float32) in float32, and so
  keeps more bytes for the backward. The CPU's dropout differs from CUDA's fused one too, in float32 as
  well: it multiplies by a noise tensor of the input's dtype, which the backward keeps, where CUDA's keeps
  a bool mask. docs/benchmarks/recompute.md gives what each difference is worth.

`llama_7b` (the LLaMA-7B architecture at 1 x 512, `NAMED_ONLY`) is measured when --only names it; so
are the suite's toy models (`suite.TINY`: tiny_gpt2, tiny_bert, tiny_resnet), for a run in seconds.

The results: torch's and transformers' versions and, per model, the batch and size, parameter,
optimizer-state and moment bytes, and per variant (eager, checkpointing) the step's peak bytes by kind,
the peak bytes by kind before the optimizer step, both transients, the FLOPs and the seconds; with
--amp, per precision (`precisions`: float32, bf16, fp16) the same for the eager step, plus the weight
copies' bytes (`weight_copy_bytes`, `weight_copy_at_peak_bytes`). Other benchmarks import `step_memory`,
`materialize` and `NAMED_ONLY` from here. Without torch the module still imports (for `table`)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
import warnings
import weakref

from benchmarks import harness

try:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from benchmarks import suite  # the model table and builder
except ImportError:  # the bench extra is missing: table() still renders a record
    torch = suite = None
    TorchDispatchMode = object

TAKES = "about 4 min (--amp bf16,fp16 on 4 models: 7.5 min); needs the bench extra (torch, transformers)"
MIB = harness.MIB
# Measured only when named (--only). Not in suite.py, whose models are exported to ONNX: the LLaMA family
# does not export on "meta" (suite.NAMED_ONLY's llama_tiny) and this one's float32 weights on the CPU are 25 GiB.
NAMED_ONLY = [] if suite is None else [
    suite.Model("llama_7b", "llama", dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                                          num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32),
                batch=1, seq=512),  # suite.build adds use_cache=False and eager attention
]


def _storage_key(t: torch.Tensor) -> int:
    """What identifies the storage behind `t` (shared by its views and tied weights)."""
    st = t.untyped_storage()
    return id(st) if not hasattr(st, "_cdata") else st._cdata


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors`."""
    seen, total = set(), 0
    for t in tensors:
        key = _storage_key(t)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
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


def measure(spec: suite.Model, checkpointing: bool, amp: str | None = None) -> dict:
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

    return step_memory(wrapper, meta_args, loss_kind, spec.batch, prepare, amp=amp)


def step_memory(wrapper: torch.nn.Module, meta_args: tuple, loss_kind: str, batch: int, prepare=lambda: None,
                amp: str | None = None) -> dict:
    """The figures of the second AdamW training step of `wrapper(*meta_args)` (module and inputs on
    "meta"), under FakeTensorMode: loss "cross-entropy" (class labels, `batch` of them, against the
    output), "mse" (a target of the output's shape) or "none" (the output is the loss). `prepare()`
    runs first under the mode; what it returns other than None is returned instead (a refusal).
    `amp` ("bf16", "fp16"; None: float32): mixed precision as `Precision` runs it, and the bytes of
    autocast's low-precision parameter copies are added (`weight_copy_*`)."""
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
        precision = Precision(amp, optimizer)

        # step 1: creates the AdamW moments; forward + backward FLOPs counted here
        counter = FlopCounterMode(display=False)
        with counter:
            precision.forward_backward(loss_fn)
        precision.optimizer_step()
        flops = int(counter.get_total_flops())

        state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        moments = [v for s in optimizer.state.values() for k, v in s.items() if k in ("exp_avg", "exp_avg_sq")]
        if amp and any(t.dtype != torch.float32 for t in params + moments):
            raise RuntimeError("AMP: a parameter or AdamW moment is not float32 (master weights)")
        param_bytes = _storage_bytes(params)
        state_bytes = _storage_bytes(state)
        moment_bytes = _storage_bytes(moments)

        # step 2: measured; the peak so far is also read when step() starts (forward, loss and backward only)
        tracker = MemTracker()
        tracker.track_external(wrapper, optimizer, *args, *extra_inputs)
        before_step = {}
        hook = optimizer.register_step_pre_hook(
            lambda *_: before_step.update(_by_kind(tracker.get_tracker_snapshot("peak"))))
        copies = WeightCopies(tracker, params, precision.dtype) if amp else contextlib.nullcontext()
        with tracker:
            with copies:
                precision.forward_backward(loss_fn)
            precision.optimizer_step()
        hook.remove()
        peak = _by_kind(tracker.get_tracker_snapshot("peak"))
    if amp and peak["Parameter"] != param_bytes:  # the low-precision copies are not filed as parameters
        raise RuntimeError(f"AMP: MemTracker's Parameter bytes {peak['Parameter']:,} are not the float32 "
                           f"parameters' {param_bytes:,}")
    if amp and copies.peak != before_step["Total"]:
        raise RuntimeError("AMP: the weight copies were not read at the tracker's fwd+bwd peak")
    total = peak["Total"]
    return dict(ok=True, peak=peak, peak_before_optimizer=before_step, param_bytes=param_bytes,
                optimizer_state_bytes=state_bytes, moment_bytes=moment_bytes,
                transient_bytes=total - param_bytes - state_bytes,
                transient_before_optimizer_bytes=before_step["Total"] - param_bytes - state_bytes,
                flops=flops, seconds=time.time() - t0, **(copies.figures() if amp else {}))


AMP_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}  # torch dtypes by name: torch may be missing
AUTOCAST_DEVICE = "cpu"  # the fake tensors are CPU tensors (see the docstring for CUDA's op lists)


class Precision:
    """The training step's calls in float32 (amp None: loss.backward(), optimizer.step(), as before) or
    in PyTorch AMP as it is used on GPUs: the forward and the loss under `torch.autocast` (parameters and
    AdamW state stay float32), backward and the step outside it, and for fp16 a GradScaler:
    scale(loss).backward(), scaler.step(optimizer), scaler.update()."""

    def __init__(self, amp: str | None, optimizer: torch.optim.Optimizer):
        self.amp, self.optimizer = amp, optimizer
        self.dtype = getattr(torch, AMP_DTYPES[amp]) if amp else torch.float32
        self.scaler = _FakeGradScaler(AUTOCAST_DEVICE) if amp == "fp16" else None

    def forward_backward(self, loss_fn) -> None:
        with torch.autocast(AUTOCAST_DEVICE, self.dtype) if self.amp else contextlib.nullcontext():
            loss = loss_fn()
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def optimizer_step(self) -> None:
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad()


class _FakeGradScaler(torch.amp.GradScaler if torch else object):
    """GradScaler whose step always runs the optimizer: it decides by reading found_inf's value
    (`.item()`), which a fake tensor does not have. Skipping on overflow is the rare step; the inf check
    and unscaling (`_amp_foreach_non_finite_check_and_unscale_`, in place) and update() still run."""

    def _maybe_opt_step(self, optimizer, optimizer_state, *args, **kwargs):
        return optimizer.step(*args, **kwargs)


class WeightCopies(TorchDispatchMode):
    """The low-precision copies of the parameters that autocast makes (`_to_copy` of a parameter to the
    AMP dtype; its cache makes one per parameter and forward), which MemTracker files under Activation
    with everything else the forward makes. Entered inside the tracker around forward and backward, it
    reads the tracker's total after every operator, as the tracker updates its peak: the bytes made, and
    those alive when the total was highest, i.e. at the fwd+bwd peak (`peak`: that total)."""

    def __init__(self, tracker, params, dtype: torch.dtype):
        super().__init__()
        self.tracker, self.dtype = tracker, dtype
        self.params = {_storage_key(p) for p in params}
        self.copies: list[weakref.ref] = []  # to the copies' storages: weak, so watching keeps none alive
        self.made = self.at_peak = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if (func is torch.ops.aten._to_copy.default and out.dtype == self.dtype
                and _storage_key(args[0]) in self.params):
            self.copies.append(weakref.ref(out.untyped_storage()))
            self.made += out.untyped_storage().nbytes()
        total = _by_kind(self.tracker.get_tracker_snapshot("current")).get("Total", 0)
        if total > self.peak:
            self.peak = total
            self.at_peak = sum(st.nbytes() for ref in self.copies if (st := ref()) is not None)
        return out

    def figures(self) -> dict:
        return dict(weight_copy_bytes=self.made, weight_copy_at_peak_bytes=self.at_peak)


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


def run_amp_model(spec: suite.Model, amps: list[str]) -> dict:
    """One model eager (no checkpointing) in float32 and in each of `amps`: the before and after of one run."""
    t0 = time.time()
    runs = {precision: measure(spec, checkpointing=False, amp=None if precision == "float32" else precision)
            for precision in ("float32", *amps)}
    f32 = runs["float32"]
    return dict(model=spec.name, family=spec.family, batch=spec.batch, size=spec.seq, label=size_label(spec),
                param_bytes=f32["param_bytes"], optimizer_state_bytes=f32["optimizer_state_bytes"],
                moment_bytes=f32["moment_bytes"], precisions=runs, seconds=time.time() - t0)


def environment() -> dict:
    """The versions of what is measured (the machine is the harness's)."""
    import transformers
    return dict(torch=torch.__version__, transformers=transformers.__version__)


def table(results: dict) -> str:
    """Eager and checkpointing per model, or (an --amp run) one line per model and precision."""
    rows = results["models"]
    amp = bool(rows) and "precisions" in rows[0]
    lines = [amp_table(rows) if amp else step_table(rows), AMP_NOTE if amp else NOTE]
    lines += [f"{r['model']}: checkpointing n/a: {r['checkpointing']['reason']}."
              for r in ([] if amp else rows) if not r["checkpointing"]["ok"]]
    lines.append(f"torch {results['torch']}, transformers {results['transformers']}.")
    return "\n\n".join(lines) + "\n"


def step_table(rows: list[dict]) -> str:
    header = ["model", "batch×size", "params+moments MiB", "eager transient MiB", "checkpointing transient MiB",
              "eager fwd+bwd transient MiB", "checkpointing fwd+bwd transient MiB", "eager step GFLOPs",
              "checkpointing extra FLOPs %", "seconds"]
    body = []
    for r in rows:
        e, c = r["eager"], r["checkpointing"]
        ckpt = (lambda key: harness.mib(c[key])) if c["ok"] else (lambda key: "n/a")
        body.append([r["model"], r["label"], harness.mib(r["param_bytes"] + r["moment_bytes"]),
                     harness.mib(e["transient_bytes"]), ckpt("transient_bytes"),
                     harness.mib(e["transient_before_optimizer_bytes"]), ckpt("transient_before_optimizer_bytes"),
                     f"{e['flops'] / 1e9:,.1f}", f"{r['extra_flops_pct']:+.1f}" if c["ok"] else "n/a",
                     f"{r['seconds']:.1f}"])
    return harness.markdown_table(header, body, "ll" + "r" * 8).rstrip()


def amp_table(rows: list[dict]) -> str:
    """One line per precision (float32 makes no weight copies: "–")."""
    header = ["model", "batch×size", "precision", "params+moments MiB", "transient MiB", "fwd+bwd transient MiB",
              "weight copies made MiB", "weight copies at fwd+bwd peak MiB", "peak MiB", "seconds"]
    body = []
    for r in rows:
        for precision, e in r["precisions"].items():
            body.append([r["model"], r["label"], precision, harness.mib(r["param_bytes"] + r["moment_bytes"], 1),
                         harness.mib(e["transient_bytes"], 1), harness.mib(e["transient_before_optimizer_bytes"], 1),
                         harness.mib(e.get("weight_copy_bytes"), 1), harness.mib(e.get("weight_copy_at_peak_bytes"), 1),
                         harness.mib(e["peak"]["Total"], 1), f"{e['seconds']:.1f}"])
    return harness.markdown_table(header, body, "lll" + "r" * 7).rstrip()


NOTE = ("Transient = peak of the second training step (MemTracker, FakeTensorMode) minus parameters and AdamW "
        "state (moments and step counters); fwd+bwd: the same at the peak before optimizer.step() starts; "
        "params+moments = parameters + exp_avg + exp_avg_sq. GFLOPs: forward + backward, matmul/conv/attention only "
        "(FlopCounterMode). Checkpointing: transformers' gradient_checkpointing_enable() (whole layers, non-reentrant).")
AMP_NOTE = ("Eager (no checkpointing). precision: float32, or PyTorch AMP: forward and loss under "
            "torch.autocast(\"cpu\", dtype), backward and the AdamW step outside it, parameters and "
            "AdamW moments float32 (fp16: GradScaler). Transient = peak of the second training step (MemTracker, "
            "FakeTensorMode) minus parameters and AdamW state; fwd+bwd: the same at the peak before the optimizer step; "
            "weight copies: autocast's low-precision copies of the parameters, made in the forward and alive at the "
            "fwd+bwd peak (MemTracker files them under Activation: inside the transient); peak: parameters, AdamW "
            "state and transient.")


def choose(p: argparse.ArgumentParser, only: str | None) -> list:
    """The models of --only (suite.MODELS, NAMED_ONLY and suite.TINY, in that order), or suite.MODELS."""
    if not only:
        return suite.MODELS
    names = only.split(",")
    known = suite.MODELS + NAMED_ONLY + suite.TINY
    unknown = set(names) - {m.name for m in known}
    if unknown:
        p.error(f"unknown models: {', '.join(sorted(unknown))} (python -m benchmarks.suite --list; "
                f"{', '.join(m.name for m in NAMED_ONLY + suite.TINY)})")
    return [m for m in known if m.name in names]


def main(argv: list[str]) -> dict:
    p = harness.options(__name__, __doc__)
    p.add_argument("--only", help="comma-separated model names (default: all of suite.MODELS, in suite.py's order; "
                                  "llama_7b and the toy models only when named)")
    p.add_argument("--amp", help="mixed precision, bf16, fp16 or bf16,fp16: each model eager in float32 and in "
                                 "these (default: float32 only, eager and checkpointing)")
    a = p.parse_args(argv)
    harness.needs_torch(torch, __name__)
    amps = a.amp.split(",") if a.amp else []
    if set(amps) - set(AMP_DTYPES):
        p.error(f"--amp takes {', '.join(AMP_DTYPES)}")
    warnings.filterwarnings("ignore")
    import transformers
    transformers.logging.set_verbosity_error()
    logging.getLogger("torch").setLevel(logging.ERROR)
    rows = []
    for spec in choose(p, a.only):
        print(f"{spec.name}...", file=sys.stderr, flush=True)
        rows.append(run_amp_model(spec, amps) if amps else run_model(spec))
    return dict(environment(), models=rows)
