"""torch.compile's `activation_memory_budget`: peak memory and FLOPs of one training step per budget.

    python -m benchmarks run recompute/tradeoff_torch [--only gpt2_small,bert_base] [--budgets 0.1,0.2,0.3,0.5,0.7,1.0]

PyTorch's side of recompute/tradeoff, which reads this record (needs torch and transformers, the
`bench` extra; about 35 min for GPT-2 small and BERT-base at the 6 budgets; the toy models
of `suite.TINY` in seconds). For each model named and each budget:

- the model is built as recompute/pytorch_memory builds it (suite.build: the suite's configs,
  random weights, use_cache=False, eager attention, train mode) and everything runs inside
  `FakeTensorMode`: no real memory, no real arithmetic, the suite's batch and sequence sizes;
- the forward and loss are compiled by AOT Autograd as torch.compile's inductor backend does it:
  inductor's decomposition table and `min_cut_rematerialization_partition(compiler="inductor")`,
  which reads `torch._functorch.config.activation_memory_budget`; the forward and backward graphs
  run as they are (no code generation: the `aot_eager_decomp_partition` backend's recipe), so their
  aten ops pass through dispatch where the trackers see them. Dynamo is not used: it runs a frame
  eagerly when a dispatch mode (MemTracker, FlopCounterMode) is active, and it cannot trace the
  model under FakeTensorMode, so `aot_function` over `torch.func.functional_call` takes its place
  (the same decompositions, partitioner and budget);
- step 1 (compiles, creates AdamW's moments), step 2: forward + backward under `FlopCounterMode`
  (products and attention only, 2·M·N·K per product: recomputed forwards count again), then the
  optimizer step; step 3, measured: `MemTracker` around forward, backward, `AdamW(foreach=True)`
  step and zero_grad, with the model, optimizer and inputs registered (`track_external`), so the
  peak's total counts parameters, gradients, AdamW state, activations and temporaries: the same
  things as a roam plan's persistent bytes + arena of the full step.

Extra FLOPs % = (FLOPs at the budget - eager FLOPs) / eager FLOPs, eager being the uncompiled model
counted the same way. The results have torch's version and per model: the eager step (FLOPs, peak)
and per budget the peak by kind, the total, the FLOPs and the seconds."""

from __future__ import annotations

import functools
import logging
import sys
import time
import warnings

from benchmarks import harness

TAKES = "about 35 min (GPT-2 small and BERT-base at 6 budgets); needs the bench extra (torch, transformers)"


def measure(spec, budget: float | None) -> dict:
    """One model at one activation_memory_budget (None: eager, uncompiled): FLOPs of forward +
    backward and the peak of a whole training step by kind."""
    import torch
    import torch._functorch.config as functorch_config
    from functorch.compile import (
        aot_function,
        make_boxed_compiler,
        min_cut_rematerialization_partition,
    )
    from torch._inductor.compile_fx import select_decomp_table
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.utils.flop_counter import FlopCounterMode

    from benchmarks import suite
    from benchmarks.recompute import pytorch_memory

    t0 = time.time()
    wrapper, meta_args, *_ = suite.build(spec)
    for m in wrapper.modules():  # a warning that reads input ids' values (BERT): tracing cannot
        if hasattr(m, "warn_if_padding_and_no_attention_mask"):
            m.warn_if_padding_and_no_attention_mask = lambda *args, **kwargs: None
    with FakeTensorMode(allow_non_fake_inputs=True):  # the graphs' real constants (a scalar 0 of the masks)
        pytorch_memory.materialize(wrapper)
        args = tuple(torch.empty(a.shape, dtype=a.dtype) for a in meta_args)
        params, buffers = dict(wrapper.named_parameters()), dict(wrapper.named_buffers())

        def loss(params, buffers, *inputs):
            return torch.func.functional_call(wrapper, (params, buffers), inputs)

        if budget is None:
            step = loss
        else:  # a graph's forward, not the module: the trackers' module hooks must not wrap it
            nop = make_boxed_compiler(lambda gm, _: gm.forward)
            step = aot_function(loss, fw_compiler=nop, bw_compiler=nop, decompositions=select_decomp_table(),
                                partition_fn=functools.partial(min_cut_rematerialization_partition,
                                                               compiler="inductor"))
        optimizer = torch.optim.AdamW(list(params.values()), foreach=True)
        with functorch_config.patch(activation_memory_budget=1.0 if budget is None else budget):
            loss_value = step(params, buffers, *args)  # compiles the forward and partitions at this budget
            # the backward graph is compiled at its first call, from a deep copy that holds its real
            # constants, which FakeTensorMode refuses to copy: that call runs outside the mode (the
            # fake tensors still compute as fake ones)
            with unset_fake_temporarily():
                loss_value.backward()
        optimizer.step()
        optimizer.zero_grad()
        counter = FlopCounterMode(display=False)
        with counter:
            step(params, buffers, *args).backward()
        optimizer.step()
        optimizer.zero_grad()
        tracker = MemTracker()
        tracker.track_external(wrapper, optimizer, *args)
        with tracker:
            step(params, buffers, *args).backward()
            optimizer.step()
            optimizer.zero_grad()
        peak = pytorch_memory._by_kind(tracker.get_tracker_snapshot("peak"))
    return {"budget": budget, "peak": peak, "total_bytes": peak["Total"], "flops": int(counter.get_total_flops()),
            "seconds": time.time() - t0}


def main(argv: list[str]) -> dict:
    p = harness.options(__name__, __doc__)
    p.add_argument("--only", default="gpt2_small,bert_base", help="comma-separated suite model names")
    p.add_argument("--budgets", default="0.1,0.2,0.3,0.5,0.7,1.0")
    a = p.parse_args(argv)
    import torch
    import transformers

    from benchmarks import suite
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    logging.getLogger("torch").setLevel(logging.ERROR)
    names = a.only.split(",")
    unknown = set(names) - {m.name for m in suite.MODELS + suite.TINY}
    if unknown:
        p.error(f"unknown models: {', '.join(sorted(unknown))}")
    budgets = [float(b) for b in a.budgets.split(",")]
    results = {"torch": torch.__version__, "models": {}}
    for spec in [m for m in suite.MODELS + suite.TINY if m.name in names]:
        row = results["models"][spec.name] = {"batch": spec.batch, "seq": spec.seq, "budgets": {}}
        row["eager"] = measure(spec, None)
        print(f"{spec.name} eager: {row['eager']['total_bytes']:,} B, {row['eager']['flops']:,} FLOPs",
              file=sys.stderr, flush=True)
        for b in budgets:
            r = row["budgets"][str(b)] = measure(spec, b)
            extra = (r["flops"] - row["eager"]["flops"]) / row["eager"]["flops"] * 100
            print(f"{spec.name} budget {b}: {r['total_bytes']:,} B, extra FLOPs {extra:+.2f} %, {r['seconds']:.0f} s",
                  file=sys.stderr, flush=True)
    return results


def table(results: dict) -> str:
    """Per model and budget: the step's peak and the extra FLOPs against the uncompiled model."""
    body = []
    for model, row in results["models"].items():
        eager = row["eager"]
        body.append([model, "eager (uncompiled)", harness.mib(eager["total_bytes"]), "0.00",
                     f"{eager['seconds']:.0f}" if "seconds" in eager else "–"])
        for b, r in sorted(row["budgets"].items(), key=lambda kv: float(kv[0])):
            body.append([model, f"{float(b):g}", harness.mib(r["total_bytes"]),
                         f"{(r['flops'] - eager['flops']) / eager['flops'] * 100:.2f}", f"{r['seconds']:.0f}"])
    return (harness.markdown_table(["model", "activation_memory_budget", "step peak MiB (MemTracker)",
                                    "extra FLOPs % (FlopCounterMode)", "seconds"], body, "llrrr")
            + f"\ntorch {results['torch']}; FakeTensorMode at the suite's batch and sequence.\n")
