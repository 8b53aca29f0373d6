#!/usr/bin/env python3
"""PyTorch FSDP2's per-rank peak memory and communication for one training step (roam's rank plans' reference).

    /work/venvs/torch/bin/python benchmarks/fsdp2_memory.py                      # every row
    /work/venvs/torch/bin/python benchmarks/fsdp2_memory.py --only gpt2_small-n8,llama_7b-n8 \\
        --json benchmarks/results/fsdp2_memory.json

Rows (`ROWS`): GPT-2 small at N = 8 ranks, the LLaMA-7B architecture at N = 8, the 70B-class step at
N = 8 and N = 64, the 405B-class step at N = 64. The models are the project's own: GPT-2 small is
`suite.py`'s (batch 4 × 256, here the rank's batch: global batch 32 × 256 at N = 8), LLaMA-7B is
`pytorch_memory.py`'s (1 × 512), the 70B- and 405B-class are `scale.py`'s `MODELS` in its base variant
(eager attention, one key/value head per head, the model's own loss, 1 × 512). scale.py's steps have a
fixed batch, so by the rank-step contract the step is the rank's own and the global batch is N × it:
every LLaMA row runs 1 × 512 per rank, N × 512 in all. Each is built by `suite.build` on "meta" (a
`LanguageModelLoss` around the Hugging Face model, train mode, dropout as configured), then made fake
CPU tensors by `pytorch_memory.materialize` inside `FakeTensorMode`: nothing is allocated, no
arithmetic is done, so even the 405B-class model is measured whole (all 126 blocks, no layer count
scaled) in about a minute per step on this 2-core machine.

FSDP2 as its documentation sets it up: a fake process group of N ranks (`FakeStore`,
`dist.init_process_group("fake", rank=0, world_size=N)`, a 1-D CPU `DeviceMesh`), `fully_shard` on each
transformer block, then on the root (the embeddings, final norm and LM head are the root's group; GPT-2's
tied embedding/head weight once), `torch.optim.AdamW(model.parameters(), foreach=True)` made after
`fully_shard` (so it holds the sharded DTensor parameters). Precisions: float32, and bf16 as
`MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)` (float32 sharded masters, gradients
and AdamW state; parameters all-gathered and computed in bf16; gradients reduce-scattered in float32).
Policies (`POLICIES`): FSDP2's default (`reshard_after_forward=None`: True for the blocks, False for the
root), `reshard` (True everywhere: every unit gathered again in the backward), `keep` (False everywhere:
each unit gathered once a step and kept from its forward to its backward). Prefetching is FSDP2's
default in each: no explicit forward prefetch (`set_modules_to_forward_prefetch` unset), and in the
backward the implicit prefetch of the unit before in forward order (`FSDPParamGroup._backward_prefetch`),
so a block's backward runs with the next block's all-gather already out.

The step measured is the SECOND one (forward, the model's loss, backward, `optimizer.step()`,
`zero_grad()`), with `torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker(model, optimizer)`
entered around it alone: the first step creates AdamW's moments, as in every training run but the
first step. The tracker's peak gives the bytes by kind (sharded/unsharded parameters and gradients,
optimizer state, activations, backward temporaries, all-gather and reduce-scatter buffers, buffers,
inputs); the fwd+bwd peak is read when `optimizer.step()` starts, the optimizer's own peak by a watch
that reads the tracker's total after every operator of the step.

What was wrong with "LLaMA-7B at N = 8: 86,754 MiB of optimizer bytes" (issue 40), reproduced by
`--unpatched` (the tracker around the FIRST step, torch's DTensor left as it is): the optimizer state is
sharded (its moments are 6,426 MiB = 2 × 3,213 MiB, the rank's parameter bytes). The other 80,328 MiB are
tensors that no rank allocates: DTensor's sharding propagation (`ShardingPropagator.
_propagate_tensor_meta_non_cached`) runs each operator it has not seen yet once more on fake tensors of
the GLOBAL (unsharded) shapes to learn its output's shape, in `detect_fake_mode() or FakeTensorMode()`.
On a GPU there is no fake mode around, so it makes its own and FSDPMemTracker, which skips every
operator run under another fake mode than the one active when it was entered, ignores them. Under the
FakeTensorMode that the whole measurement runs in, `detect_fake_mode()` returns that very mode: the
propagation's global-shape tensors are counted, and as `_in_opt` is set, filed under optimizer state.
In the first step AdamW's state creation (`zeros_like` of each DTensor parameter) and every foreach
operator of its update are new to the propagator's cache; the peak is at `_foreach_addcdiv_(params,
exp_avgs, sqrt temporaries)`, whose propagation rebuilds its three lists at full size, 3 × N = 24 times
the rank's parameter bytes, beside the real 2 moments and the 1 sqrt temporary: 27 × 3,213 = 86,754 MiB
(and the tracker's peak total 93,181 MiB with the sharded parameters and gradients). GPT-2 small has the
same phantom, but its backward peak is higher, which hid it. The propagator's cache is process-wide and
keyed by the DTensor shapes: in later steps (or a later run on the same float32 shards, as `--unpatched`'s
bf16 row after its float32 one) nothing is rebuilt, so the second step alone measures right, by luck of
the cache. This script measures the second step AND gives the propagation a fake mode of its own
(`own_propagation_mode`), as on a GPU, so no global-shape tensor is ever counted, and checks every row,
stopping if one figure differs: the tracker's sharded parameters, gradients and AdamW state equal the
hand figures below to the byte (AdamW's also summed from `optimizer.state`'s local shards); the
optimizer's peak equals parameters + gradients + moments + foreach AdamW's one parameter-sized
temporary (the sqrt of exp_avg_sq) + buffers + inputs; the collectives FSDP2 issued equal the hand
communication below; and the activations alive after the forward equal those of the plain unsharded
model with parameters of the compute dtype at the rank's batch, measured by the plain MemTracker.

Hand figures (from the model's parameter shapes and N, not from FSDP2's objects): FSDP2 shards each
parameter on dim 0 into N chunks of ceil(d0 / N) rows, padded (every rank stores the padded chunk), so
a rank's parameter bytes are P/N = 4 · sum over parameters of ceil(d0 / N) · (numel / d0) (float32
masters in both precisions); gradients P/N the same; AdamW 2 · P/N + 4 bytes of `step` per parameter
tensor. A unit's all-gather buffer is N · (its sharded numel) elements of the parameter dtype (the
gathered unit, padding included); the table gives the root's and a block's.

Communication per rank and step, from those sizes (and checked against the collectives FSDP2 issued
in the measured step: c10d `_allgather_base_` outputs, `_reduce_scatter_base_` inputs): the all-gather
of every unit in the forward, again in the backward for every unit resharded after its forward, the
reduce-scatter of every unit's gradients (float32). The all-gather and reduce-scatter columns are the
collectives' buffer bytes B (a gathered unit, a unit's unsharded gradients); a collective moves
(N - 1)/N · B in and out of each rank on a ring, and "traffic per rank" is that, summed.

MiB are 2**20 bytes, GiB 2**30. The tables go to stdout, progress and each measurement's seconds to
stderr; --json writes every figure (after each row, atomically). "at": the phase of the step in which
the peak was reached; "gathered at peak": the tracker's unsharded parameters and all-gather buffers at
the peak as hand units (the root's, k blocks'). Needs torch (2.13 was used) and transformers; not imported
by roam_cli."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's roam_cli (suite.build uses its meta-device builder)
sys.path.insert(0, str(ROOT / "benchmarks"))
import pytorch_memory  # (materialize, environment, LLaMA-7B)
import scale  # (the 70B- and 405B-class models)
import suite  # (GPT-2 small, the builder)

MIB, GIB = 2**20, 2**30
CPU = torch.device("cpu")


def _scale_model(size: str) -> suite.Model:
    """scale.py's `size`-class LLaMA in its base variant, as a suite model (suite.build adds
    use_cache=False and eager attention, as scale.export_forward does)."""
    s, v = scale.MODELS[size], scale.VARIANTS["base"]
    return suite.Model(size, "llama", dict(vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.intermediate,
                                           num_hidden_layers=s.layers, num_attention_heads=s.heads,
                                           num_key_value_heads=v.kv_heads or s.heads), batch=v.batch, seq=v.seq)


@dataclass(frozen=True)
class Row:
    model: suite.Model  # its batch is the rank's
    ranks: int


_MODELS = {m.name: m for m in suite.MODELS + pytorch_memory.NAMED_ONLY}
ROWS = {
    "gpt2_small-n8": Row(_MODELS["gpt2_small"], 8),
    "llama_7b-n8": Row(_MODELS["llama_7b"], 8),
    "70b-n8": Row(_scale_model("70b"), 8),
    "70b-n64": Row(_scale_model("70b"), 64),
    "405b-n64": Row(_scale_model("405b"), 64),
}
PRECISIONS = ("float32", "bf16")
POLICIES = {"default": None, "reshard": True, "keep": False}  # fully_shard's reshard_after_forward


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
    """DTensor's sharding propagation in a fake mode of its own, as on a GPU (see the docstring: under the
    measurement's FakeTensorMode it would reuse that mode and FSDPMemTracker would count its global-shape
    tensors)."""
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
    if set(snapshot) - {CPU}:
        raise RuntimeError(f"expected the CPU only, got {list(snapshot)}")
    return {getattr(k, "value", str(k)): int(v) for k, v in snapshot.get(CPU, {}).items()}


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


def plain_forward_activations(spec: suite.Model, dtype: torch.dtype) -> int:
    """The activation bytes alive after the forward of the plain (unsharded, single-device) model with
    parameters of `dtype` (the compute dtype of the precision), at the same batch, measured by the plain
    MemTracker: what FSDP2's forward must keep too, an independent check of the FSDP tracker's activations."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

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


def measure(row: Row, mesh, precision: str, policy: str, unpatched: bool = False) -> dict:
    """One row, precision and policy: the tracker's figures of the second step beside the hand figures.
    `unpatched`: the issue's measurement instead, the tracker around the FIRST step with DTensor's
    propagation left in the measurement's fake mode (its optimizer bytes only; no checks)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    t0, c0 = time.time(), time.process_time()
    wrapper, meta_args, *_ = suite.build(row.model)
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if precision == "bf16"
          else MixedPrecisionPolicy())
    param_bytes = 2 if precision == "bf16" else 4
    h = hand(wrapper, row.ranks, param_bytes)
    comm = communication(h, row.ranks, policy, param_bytes)
    with FakeTensorMode(), contextlib.nullcontext() if unpatched else own_propagation_mode():
        pytorch_memory.materialize(wrapper)
        args = tuple(torch.empty(a.shape, dtype=a.dtype) for a in meta_args)
        for unit in [*blocks(wrapper), wrapper]:
            fully_shard(unit, mesh=mesh, reshard_after_forward=POLICIES[policy], mp_policy=mp)
        optimizer = torch.optim.AdamW(wrapper.parameters(), foreach=True)
        if not unpatched:
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
    if not unpatched:
        r["plain_activations_after_forward"] = plain_forward_activations(row.model, mp.param_dtype or torch.float32)
        check(r)
    r["seconds"], r["cpu_seconds"] = time.time() - t0, time.process_time() - c0
    return r


def check(r: dict) -> None:
    """The tracker's figures against the hand figures (see the docstring); stops the script if one differs."""
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
    return f"{gathered / MIB:,.0f} MiB"


def optimizer_hand(h: dict, opt: dict) -> int:
    """The optimizer step's peak: parameters, gradients, AdamW state, foreach AdamW's one parameter-sized
    temporary (sqrt of exp_avg_sq), buffers and inputs, and the 0-d 1.0 it adds to the CPU step counters."""
    return (2 * h["sharded_param_bytes"] + h["sharded_grad_bytes"] + h["adamw_bytes"] + opt["Buffer"] + opt["Inputs"]
            + 4)


def kinds_mib(d: dict, *names: str) -> str:
    return " | ".join(f"{d.get(n, 0) / MIB:,.0f}" for n in names)


BREAKDOWN = ("Sharded Param", "Sharded Grad", "OptState", "Unsharded Param", "Unsharded Grad", "All Gather",
             "Reduce Scatter", "Activation", "Temp")
HEADER = ("row", "N", "batch per rank (global)", "precision", "peak MiB", "at", "sharded params", "sharded grads",
          "AdamW state", "unsharded params", "unsharded grads", "all-gather", "reduce-scatter", "activations", "temp",
          "hand P/N", "hand AdamW 2P/N", "hand gathered root / block", "gathered at peak", "optimizer peak",
          "hand optimizer peak")
UNPATCHED_HEADER = ("row", "precision", "first step's peak MiB", "its optimizer bytes MiB",
                    "optimizer phase's peak MiB",
                    "its optimizer bytes MiB", "AdamW state after the step MiB (local shards)")
POLICY_HEADER = ("row", "precision", "policy", "peak MiB", "at", "gathered at peak", "fwd+bwd peak MiB",
                 "all-gather fwd GiB",
                 "all-gather bwd GiB", "reduce-scatter GiB", "traffic per rank GiB", "seconds (CPU)")


def table_row(name: str, row: Row, r: dict) -> str:
    h, peak, opt = r["hand"], r["peak"], r["optimizer_peak"]
    m = row.model
    return (f"| {name} | {row.ranks} | {m.batch}×{m.seq} ({row.ranks * m.batch}×{m.seq}) | {r['precision']} | "
            f"{peak['Total'] / MIB:,.0f} | {r['peak_phase']} | {kinds_mib(peak, *BREAKDOWN)} | "
            f"{h['sharded_param_bytes'] / MIB:,.0f} | {h['adamw_bytes'] / MIB:,.0f} | "
            f"{h['root_gathered_bytes'] / MIB:,.0f} / {max(h['block_gathered_bytes']) / MIB:,.0f} | "
            f"{gathered_at_peak(peak, h)} | {opt['Total'] / MIB:,.0f} | {optimizer_hand(h, opt) / MIB:,.0f} |")


def policy_row(name: str, r: dict) -> str:
    c = r["communication"]
    return (f"| {name} | {r['precision']} | {r['policy']} | {r['peak']['Total'] / MIB:,.0f} | {r['peak_phase']} | "
            f"{gathered_at_peak(r['peak'], r['hand'])} | "
            f"{r['fwd_bwd_peak']['Total'] / MIB:,.0f} | {c['all_gather_forward_bytes'] / GIB:,.2f} | "
            f"{c['all_gather_backward_bytes'] / GIB:,.2f} | {c['reduce_scatter_bytes'] / GIB:,.2f} | "
            f"{c['traffic_bytes'] / GIB:,.2f} | {r['seconds']:.0f} ({r['cpu_seconds']:.0f}) |")


def markdown(header) -> str:
    return "| " + " | ".join(header) + " |\n|" + "---|" * len(header)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--only", help=f"comma-separated rows (default: all): {', '.join(ROWS)}")
    p.add_argument("--precisions", default=",".join(PRECISIONS), help="float32, bf16 or both (default)")
    p.add_argument("--policies", default=",".join(POLICIES), help=f"of {', '.join(POLICIES)} (default: all)")
    p.add_argument("--unpatched", action="store_true",
                   help="reproduce the issue's measurement (first step, DTensor propagation counted): "
                        "its optimizer bytes, default policy")
    p.add_argument("--json", type=Path, help="write every figure to this JSON file")
    a = p.parse_args(argv)
    names = a.only.split(",") if a.only else list(ROWS)
    precisions, policies = a.precisions.split(","), a.policies.split(",")
    for given, known, what in ((names, ROWS, "row"), (precisions, PRECISIONS, "precision"),
                               (policies, POLICIES, "policy")):
        unknown = [x for x in given if x not in known]
        if unknown:
            print(f"fsdp2_memory: unknown {what} {', '.join(unknown)} (known: {', '.join(known)})", file=sys.stderr)
            return 2
    warnings.filterwarnings("ignore")
    import transformers
    transformers.logging.set_verbosity_error()
    logging.getLogger("torch").setLevel(logging.ERROR)
    from roam_cli.core.fileio import write_atomic

    env = pytorch_memory.environment()
    if a.unpatched:
        print(markdown(UNPATCHED_HEADER))
    rows, tables = [], ([], [])
    for name in names:
        row = ROWS[name]
        print(f"{name}...", file=sys.stderr, flush=True)
        t0, c0 = time.time(), time.process_time()
        runs = []
        with fake_world(row.ranks) as mesh:
            for precision in precisions:
                for policy in ["default"] if a.unpatched else policies:
                    r = measure(row, mesh, precision, policy, unpatched=a.unpatched)
                    runs.append(r)
                    print(f"  {precision} {policy}: {r['peak']['Total'] / MIB:,.0f} MiB, {r['seconds']:.0f} s, "
                          f"CPU {r['cpu_seconds']:.0f} s",
                          file=sys.stderr, flush=True)
                    if a.unpatched:
                        print(f"| {name} | {precision} | {kinds_mib(r['peak'], 'Total', 'OptState')} | "
                              f"{kinds_mib(r['optimizer_peak'], 'Total', 'OptState')} | "
                              f"{r['optimizer_state_bytes'] / MIB:,.0f} |", flush=True)
        m = row.model
        rows.append(dict(row=name, model=m.name, ranks=row.ranks, batch_per_rank=m.batch, seq=m.seq,
                         global_batch=row.ranks * m.batch, unpatched=a.unpatched, runs=runs,
                         seconds=time.time() - t0, cpu_seconds=time.process_time() - c0))
        print(f"{name}: {rows[-1]['seconds']:.0f} s, CPU {rows[-1]['cpu_seconds']:.0f} s", file=sys.stderr, flush=True)
        if a.json:  # after every row, so a long run keeps what it has
            write_atomic(a.json, json.dumps(dict(environment=env, mib=MIB, rows=rows), indent=1) + "\n")
        if not a.unpatched:
            tables[0].extend(table_row(name, row, r) for r in runs if r["policy"] == "default")
            tables[1].extend(policy_row(name, r) for r in runs)
    if a.unpatched:
        return 0
    print(markdown(HEADER))
    print("\n".join(tables[0]))
    print()
    print(markdown(POLICY_HEADER))
    print("\n".join(tables[1]))
    print("\nSeconds per row, wall (CPU; the machine may be shared): "
          + ", ".join(f"{r['row']} {r['seconds']:.0f} ({r['cpu_seconds']:.0f})" for r in rows) + ".")
    print(f"Python {env['python']}, torch {env['torch']}, transformers {env['transformers']}; {env['machine']} "
          "(FakeTensorMode: figures do not depend on the machine).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
