"""PyTorch FSDP2's per-rank peak memory and communication for one training step: the reference
roam's rank plans are compared with (sharding/fsdp2_compare).

    python -m benchmarks run sharding/fsdp2_memory [--only gpt2_small-n8,llama_7b-n8] [--precisions float32,bf16]
        [--policies default,reshard,keep]

Rows (`ROW_NAMES`): GPT-2 small at N = 8 ranks, the LLaMA-7B architecture at N = 8, the 70B-class step at
N = 8 and N = 64, the 405B-class step at N = 64. The models are the project's own: GPT-2 small is
the suite's (batch 4 × 256 per rank: global batch 32 × 256 at N = 8), LLaMA-7B is
recompute/pytorch_memory's (1 × 512), the 70B and 405B classes are scale/scale's `MODELS` in its base
variant (eager attention, one key/value head per head, the model's own loss, 1 × 512 per rank). Each
is built by `suite.build` on "meta", then made fake CPU tensors inside `FakeTensorMode`: nothing is
allocated, no arithmetic is done, so even the 405B-class model is measured whole (all 126 blocks).

FSDP2 as its documentation sets it up: a fake process group of N ranks and its 1-D CPU mesh,
`fully_shard` on each transformer block, then on the root (embeddings, final norm, LM head; a tied
weight once), `torch.optim.AdamW(model.parameters(), foreach=True)` made after `fully_shard`.
Precisions: float32, and bf16 as `MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`.
Policies (`POLICIES`): `default` (`reshard_after_forward=None`: True for the blocks, False for the
root), `reshard` (True everywhere), `keep` (False everywhere); FSDP2's default prefetching.

The step measured is the SECOND one (forward, the model's loss, backward, `optimizer.step()`,
`zero_grad()`; the first creates AdamW's moments), with `FSDPMemTracker(model, optimizer)` around it
alone; DTensor's sharding propagation gets a fake mode of its own, as on a GPU
(`own_propagation_mode`). The tracker's peak gives the bytes by kind; the fwd+bwd peak is read when
`optimizer.step()` starts, the optimizer's peak by a watch that reads the tracker after every
operator. Every row is checked, and the run stops if one figure differs: the sharded parameters,
gradients and AdamW state equal the hand figures to the byte; the optimizer's peak equals
parameters + gradients + moments + foreach AdamW's one parameter-sized temporary + buffers + inputs;
the collectives FSDP2 issued equal the hand communication; the activations alive after the forward
equal those of the plain unsharded model (MemTracker) at the rank's batch.

Hand figures (from the parameter shapes and N): FSDP2 pads each parameter's dim 0 to N chunks of
ceil(d0 / N) rows, so a rank's parameter bytes are P/N = 4 · Σ ceil(d0 / N) · numel / d0 (float32
masters in both precisions); gradients the same; AdamW 2 · P/N + 4 bytes of `step` per tensor. A
unit's all-gather buffer is N · its sharded numel elements of the parameter dtype. Communication per
step: every unit gathered in the forward, again in the backward if resharded, every unit's gradients
reduce-scattered in float32; a ring moves (N − 1)/N of each buffer in and out of a rank ("traffic").

Needs torch and transformers (the bench extra); about 30 min for every row on the 2-core machine
(FakeTensorMode: the figures do not depend on the machine)."""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
import warnings

from benchmarks import harness

try:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
except ImportError:  # table() needs no torch
    torch = None
    TorchDispatchMode = object

TAKES = "about 30 min (every row); needs the bench extra (torch, transformers)"
ROW_NAMES = ("gpt2_small-n8", "llama_7b-n8", "70b-n8", "70b-n64", "405b-n64")
PRECISIONS = ("float32", "bf16")
POLICIES = {"default": None, "reshard": True, "keep": False}  # fully_shard's reshard_after_forward


def rows_to_measure() -> dict:
    """Row name -> (the suite model, its batch the rank's; N)."""
    from benchmarks import suite
    from benchmarks.recompute import pytorch_memory
    from benchmarks.scale import scale

    def scale_model(size: str):
        """scale's `size`-class LLaMA in its base variant, as a suite model (suite.build adds
        use_cache=False and eager attention, as scale's export does)."""
        s, v = scale.MODELS[size], scale.VARIANTS["base"]
        return suite.Model(size, "llama", dict(vocab_size=s.vocab, hidden_size=s.hidden,
                                               intermediate_size=s.intermediate, num_hidden_layers=s.layers,
                                               num_attention_heads=s.heads, num_key_value_heads=v.kv_heads or s.heads),
                           batch=v.batch, seq=v.seq)

    models = {m.name: m for m in suite.MODELS + pytorch_memory.NAMED_ONLY}
    return {"gpt2_small-n8": (models["gpt2_small"], 8), "llama_7b-n8": (models["llama_7b"], 8),
            "70b-n8": (scale_model("70b"), 8), "70b-n64": (scale_model("70b"), 64),
            "405b-n64": (scale_model("405b"), 64)}


def blocks(wrapper: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a suite language model (GPT-2 or LLaMA)."""
    m = wrapper.m
    return list(m.transformer.h if hasattr(m, "transformer") else m.model.layers)


@contextlib.contextmanager
def fake_world(ranks: int):
    """A fake process group of `ranks` ranks, this process rank 0, and its 1-D CPU mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    # (importing fake_pg registered the "fake" backend)
    dist.init_process_group("fake", rank=0, world_size=ranks, store=FakeStore())
    try:
        yield init_device_mesh("cpu", (ranks,))
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def own_propagation_mode():
    """DTensor's sharding propagation in a fake mode of its own, as on a GPU. It runs each operator it
    has not seen yet once more on fake tensors of the GLOBAL (unsharded) shapes, in `detect_fake_mode()
    or FakeTensorMode()`; under the measurement's FakeTensorMode that is the measurement's own mode, so
    FSDPMemTracker would count those global-shape tensors (in the first step, filed as optimizer state:
    3 × N times the rank's parameter bytes at foreach AdamW's addcdiv). On a GPU there is no fake mode
    around and the tracker skips them; this gives the propagation the same."""
    import torch.distributed.tensor._sharding_prop as prop

    saved = prop.detect_fake_mode
    prop.detect_fake_mode = lambda *args: None
    try:
        yield
    finally:
        prop.detect_fake_mode = saved


class StepWatch(TorchDispatchMode):
    """Entered inside the tracker around the measured step: the bytes of the collectives FSDP2 issues
    (all-gather outputs by phase, reduce-scatter inputs), and in the optimizer phase the tracker's total
    after every operator: the optimizer's peak and its snapshot. `step` records the tracker's state at
    the end of the forward."""

    def __init__(self, tracker):
        super().__init__()
        self.tracker, self.phase = tracker, "forward"
        self.gathered = {"forward": 0, "backward": 0}
        self.reduced = 0
        self.optimizer_peak, self.optimizer_snapshot = 0, {}
        self.after_forward, self.forward_peak = {}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor

        if any(t is DTensor for t in types):  # as the tracker: see the local operators DTensor runs
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.c10d._allgather_base_.default:
            self.gathered[self.phase] += args[0].untyped_storage().nbytes()
        elif func is torch.ops.c10d._reduce_scatter_base_.default:
            self.reduced += args[1].untyped_storage().nbytes()
        if self.phase == "optimizer":
            snapshot = _by_kind(self.tracker.get_tracker_snapshot("current"))
            if snapshot["Total"] > self.optimizer_peak:
                self.optimizer_peak, self.optimizer_snapshot = snapshot["Total"], snapshot
        return out

    def peak_phase(self, fwd_bwd_peak: int) -> str:
        """The phase that first reached the step's peak."""
        if self.optimizer_peak > fwd_bwd_peak:
            return "optimizer"
        return "forward" if self.forward_peak == fwd_bwd_peak else "backward"


def _by_kind(snapshot: dict) -> dict:
    """FSDPMemTracker snapshot {device: {kind: bytes}} -> {kind name: bytes} (CPU only under FakeTensorMode)."""
    cpu = torch.device("cpu")
    if set(snapshot) - {cpu}:
        raise RuntimeError(f"expected the CPU only, got {list(snapshot)}")
    return {getattr(k, "value", str(k)): int(v) for k, v in snapshot.get(cpu, {}).items()}


def hand(wrapper: torch.nn.Module, ranks: int, param_bytes: int) -> dict:
    """The sharded parts and the units' gathered sizes from the parameter shapes and N (see the docstring).
    `param_bytes`: bytes of an element of the gathered parameters (2 in bf16, 4 in float32)."""
    def shard_numel(params) -> int:
        return sum(math.ceil(p.shape[0] / ranks) * (p.numel() // p.shape[0]) for p in params)

    units = [list(b.parameters()) for b in blocks(wrapper)]
    in_blocks = {id(p) for u in units for p in u}
    root = [p for p in wrapper.parameters() if id(p) not in in_blocks]  # tied weights once
    params = root + [p for u in units for p in u]
    shard = 4 * shard_numel(params)
    return dict(parameter_tensors=len(params), parameters=sum(p.numel() for p in params),
                sharded_param_bytes=shard, sharded_grad_bytes=shard,
                adamw_bytes=2 * shard + 4 * len(params),
                root_gathered_bytes=ranks * shard_numel(root) * param_bytes,
                block_gathered_bytes=[ranks * shard_numel(u) * param_bytes for u in units],
                buffer_bytes=sum(b.numel() * b.element_size() for b in wrapper.buffers()))


def communication(h: dict, ranks: int, policy: str, param_bytes: int) -> dict:
    """Collective buffer bytes per step and the per-rank ring traffic, from the hand sizes."""
    blocks_gathered = sum(h["block_gathered_bytes"])
    gather_forward = h["root_gathered_bytes"] + blocks_gathered
    gather_backward = {"default": blocks_gathered, "reshard": gather_forward, "keep": 0}[policy]
    reduce = gather_forward // param_bytes * 4  # float32 gradients (reduce_dtype)
    return dict(all_gather_forward_bytes=gather_forward, all_gather_backward_bytes=gather_backward,
                reduce_scatter_bytes=reduce,
                traffic_bytes=(gather_forward + gather_backward + reduce) * (ranks - 1) // ranks)


def plain_forward_activations(spec, dtype) -> int:
    """The activation bytes alive after the forward of the plain (unsharded, single-device) model with
    parameters of `dtype` (the compute dtype of the precision), at the same batch, measured by the plain
    MemTracker: what FSDP2's forward must keep too, an independent check of the FSDP tracker's activations."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from benchmarks import suite
    from benchmarks.recompute import pytorch_memory

    wrapper, meta_args, *_ = suite.build(spec)
    cast: dict[int, torch.nn.Parameter] = {}  # tied weights stay tied
    for m in wrapper.modules():  # the parameters only: FSDP2's MixedPrecisionPolicy leaves buffers as they are
        for k, t in m._parameters.items():
            if t is not None:
                m._parameters[k] = cast.setdefault(id(t), torch.nn.Parameter(t.to(dtype)))
    with FakeTensorMode():
        pytorch_memory.materialize(wrapper)
        args = tuple(torch.empty(a.shape, dtype=a.dtype) for a in meta_args)
        tracker = MemTracker()
        tracker.track_external(wrapper, *args)
        with tracker:
            loss = wrapper(*args)
            kept = _by_kind(tracker.get_tracker_snapshot("current"))["Activation"]
        del loss
    return kept


def step(wrapper, args, optimizer, watch: StepWatch | None = None) -> None:
    """Forward (the model's loss), backward, AdamW step, gradients set to None."""
    loss = wrapper(*args)
    if watch:
        watch.after_forward = _by_kind(watch.tracker.get_tracker_snapshot("current"))
        watch.forward_peak = _by_kind(watch.tracker.get_tracker_snapshot("peak"))["Total"]
        watch.phase = "backward"
    loss.backward()
    if watch:
        watch.phase = "optimizer"
    optimizer.step()
    optimizer.zero_grad()


def measure(spec, ranks: int, mesh, precision: str, policy: str) -> dict:
    """One row, precision and policy: the tracker's figures of the second step beside the hand figures."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from benchmarks import suite
    from benchmarks.recompute import pytorch_memory

    t0, c0 = time.time(), time.process_time()
    wrapper, meta_args, *_ = suite.build(spec)
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if precision == "bf16"
          else MixedPrecisionPolicy())
    param_bytes = 2 if precision == "bf16" else 4
    h = hand(wrapper, ranks, param_bytes)
    comm = communication(h, ranks, policy, param_bytes)
    with FakeTensorMode(), own_propagation_mode():
        pytorch_memory.materialize(wrapper)
        args = tuple(torch.empty(a.shape, dtype=a.dtype) for a in meta_args)
        for unit in [*blocks(wrapper), wrapper]:
            fully_shard(unit, mesh=mesh, reshard_after_forward=POLICIES[policy], mp_policy=mp)
        optimizer = torch.optim.AdamW(wrapper.parameters(), foreach=True)
        step(wrapper, args, optimizer)  # the first step: AdamW's moments
        tracker = FSDPMemTracker(wrapper, optimizer)
        tracker.track_inputs(args)
        watch = StepWatch(tracker)
        before_optimizer = {}
        hook = optimizer.register_step_pre_hook(
            lambda *_: before_optimizer.update(_by_kind(tracker.get_tracker_snapshot("peak"))))
        with tracker, watch:
            step(wrapper, args, optimizer, watch)
        hook.remove()
        peak = _by_kind(tracker.get_tracker_snapshot("peak"))
        state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        state_bytes = sum(getattr(v, "_local_tensor", v).untyped_storage().nbytes() for v in state)
    r = dict(precision=precision, policy=policy, peak=peak, peak_phase=watch.peak_phase(before_optimizer["Total"]),
             fwd_bwd_peak=before_optimizer, optimizer_peak=watch.optimizer_snapshot, optimizer_state_bytes=state_bytes,
             hand=h,
             communication=comm, collectives=dict(all_gather_forward_bytes=watch.gathered["forward"],
                                                  all_gather_backward_bytes=watch.gathered["backward"],
                                                  reduce_scatter_bytes=watch.reduced),
             activations_after_forward=watch.after_forward.get("Activation", 0))
    r["plain_activations_after_forward"] = plain_forward_activations(spec, mp.param_dtype or torch.float32)
    check(r)
    r["seconds"], r["cpu_seconds"] = time.time() - t0, time.process_time() - c0
    return r


def check(r: dict) -> None:
    """The tracker's figures against the hand figures (see the docstring); stops the run if one differs."""
    h, peak, opt, fb = r["hand"], r["peak"], r["optimizer_peak"], r["fwd_bwd_peak"]
    expected = {
        "sharded parameters": (fb["Sharded Param"], h["sharded_param_bytes"]),
        "AdamW state at the fwd+bwd peak": (fb["OptState"], h["adamw_bytes"]),
        "AdamW state + sqrt temporary at the optimizer peak": (opt["OptState"],
                                                               h["adamw_bytes"] + h["sharded_param_bytes"]),
        "AdamW state (optimizer.state, local shards)": (r["optimizer_state_bytes"], h["adamw_bytes"]),
        "gradients at the optimizer step": (opt["Sharded Grad"], h["sharded_grad_bytes"]),
        "optimizer peak": (opt["Total"], optimizer_hand(h, opt)),
        "step peak = max(fwd+bwd, optimizer)": (peak["Total"], max(fb["Total"], opt["Total"])),
        "buffers": (opt["Buffer"], h["buffer_bytes"]),
        "activations after the forward (plain model, MemTracker)": (r["activations_after_forward"],
                                                                    r["plain_activations_after_forward"]),
        "collectives issued": (r["collectives"], {k: v for k, v in r["communication"].items() if k != "traffic_bytes"}),
    }
    wrong = [f"{name}: tracker {got}, hand {want}" for name, (got, want) in expected.items() if got != want]
    if wrong:
        raise RuntimeError(f"{r['precision']} {r['policy']}: " + "; ".join(wrong))


def gathered_at_peak(peak: dict, h: dict) -> str:
    """The tracker's unsharded parameters + all-gather buffers at the peak as the hand units: "root + k
    blocks" where it is exactly that (the blocks are of one size), else MiB."""
    gathered = peak["Unsharded Param"] + peak["All Gather"]
    if gathered == 0:
        return "none"
    root, block = h["root_gathered_bytes"], h["block_gathered_bytes"][0]
    for with_root in (True, False):
        rest = gathered - root * with_root
        if len(set(h["block_gathered_bytes"])) == 1 and rest >= 0 and rest % block == 0:
            return ("root + " if with_root else "") + f"{rest // block} block{'s' if rest != block else ''}"
    return f"{harness.mib(gathered)} MiB"


def optimizer_hand(h: dict, opt: dict) -> int:
    """The optimizer step's peak: parameters, gradients, AdamW state, foreach AdamW's one parameter-sized
    temporary (sqrt of exp_avg_sq), buffers and inputs, and the 0-d 1.0 it adds to the CPU step counters."""
    return (2 * h["sharded_param_bytes"] + h["sharded_grad_bytes"] + h["adamw_bytes"] + opt["Buffer"] + opt["Inputs"]
            + 4)


def main(argv: list[str]) -> dict:
    p = harness.options(__name__, __doc__)
    p.add_argument("--only", help=f"comma-separated rows (default: all): {', '.join(ROW_NAMES)}")
    p.add_argument("--precisions", default=",".join(PRECISIONS), help="float32, bf16 or both (default)")
    p.add_argument("--policies", default=",".join(POLICIES), help=f"of {', '.join(POLICIES)} (default: all)")
    a = p.parse_args(argv)
    names = a.only.split(",") if a.only else list(ROW_NAMES)
    precisions, policies = a.precisions.split(","), a.policies.split(",")
    for given, known, what in ((names, ROW_NAMES, "row"), (precisions, PRECISIONS, "precision"),
                               (policies, POLICIES, "policy")):
        unknown = [x for x in given if x not in known]
        if unknown:
            p.error(f"unknown {what} {', '.join(unknown)} (known: {', '.join(known)})")
    harness.needs_torch(torch, __name__)
    warnings.filterwarnings("ignore")
    import transformers
    transformers.logging.set_verbosity_error()
    logging.getLogger("torch").setLevel(logging.ERROR)

    specs = rows_to_measure()
    rows = []
    for name in names:
        spec, ranks = specs[name]
        print(f"{name}...", file=sys.stderr, flush=True)
        t0, c0 = time.time(), time.process_time()
        runs = []
        with fake_world(ranks) as mesh:
            for precision in precisions:
                for policy in policies:
                    r = measure(spec, ranks, mesh, precision, policy)
                    runs.append(r)
                    print(f"  {precision} {policy}: {r['peak']['Total'] / harness.MIB:,.0f} MiB, {r['seconds']:.0f} s",
                          file=sys.stderr, flush=True)
        rows.append(dict(row=name, model=spec.name, ranks=ranks, batch_per_rank=spec.batch, seq=spec.seq,
                         global_batch=ranks * spec.batch, runs=runs,
                         seconds=time.time() - t0, cpu_seconds=time.process_time() - c0))
    return {"torch": torch.__version__, "transformers": transformers.__version__, "rows": rows}


BREAKDOWN = ("Sharded Param", "Sharded Grad", "OptState", "Unsharded Param", "Unsharded Grad", "All Gather",
             "Reduce Scatter", "Activation", "Temp")


def table(results: dict) -> str:
    """FSDP2's default policy with the peak's breakdown beside the hand figures; then every policy's
    peak and communication. MiB unless GiB."""
    mib, gib = harness.mib, lambda n: harness.gib(n, 2)
    default, policies = [], []
    for row in results["rows"]:
        n, b, s = row["ranks"], row["batch_per_rank"], row["seq"]
        for r in row["runs"]:
            h, peak, opt, c = r["hand"], r["peak"], r["optimizer_peak"], r["communication"]
            if r["policy"] == "default":
                default.append([row["row"], n, f"{b}×{s} ({n * b}×{s})", r["precision"], mib(peak["Total"]),
                                r["peak_phase"], *(mib(peak.get(k, 0)) for k in BREAKDOWN),
                                mib(h["sharded_param_bytes"]), mib(h["adamw_bytes"]),
                                f"{mib(h['root_gathered_bytes'])} / {mib(max(h['block_gathered_bytes']))}",
                                gathered_at_peak(peak, h), mib(opt["Total"]), mib(optimizer_hand(h, opt))])
            policies.append([row["row"], r["precision"], r["policy"], mib(peak["Total"]), r["peak_phase"],
                             gathered_at_peak(peak, h), mib(r["fwd_bwd_peak"]["Total"]),
                             gib(c["all_gather_forward_bytes"]), gib(c["all_gather_backward_bytes"]),
                             gib(c["reduce_scatter_bytes"]), gib(c["traffic_bytes"]),
                             f"{r['seconds']:.0f} ({r['cpu_seconds']:.0f})"])
    first = harness.markdown_table(
        ["row", "N", "batch per rank (global)", "precision", "peak MiB", "at", "sharded params", "sharded grads",
         "AdamW state", "unsharded params", "unsharded grads", "all-gather", "reduce-scatter", "activations", "temp",
         "hand P/N", "hand AdamW 2P/N", "hand gathered root / block", "gathered at peak", "optimizer peak",
         "hand optimizer peak"], default, "lrllrl" + "r" * 12 + "lrr")
    second = harness.markdown_table(
        ["row", "precision", "policy", "peak MiB", "at", "gathered at peak", "fwd+bwd peak MiB", "all-gather fwd GiB",
         "all-gather bwd GiB", "reduce-scatter GiB", "traffic per rank GiB", "seconds (CPU)"], policies,
        "lllrllrrrrrr")
    return first + "\n" + second


if __name__ == "__main__":
    sys.exit("run it as: python -m benchmarks run sharding/fsdp2_memory [options]")
