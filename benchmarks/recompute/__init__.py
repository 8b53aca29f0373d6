"""roam's `optimize --recompute off | free | budget` plans each suite model's full step and ONNX Runtime
artifacts graph; its transient bytes (the arena: parameters and AdamW state excluded) stand beside
PyTorch's own for the same model, step and sizes, measured by PyTorch's MemTracker in FakeTensorMode
(the second AdamW step's peak minus parameters and AdamW state), eager and with transformers' whole-layer
gradient checkpointing; `budget` is planned at checkpointing's memory, to compare extra FLOPs at equal
memory. `roam tradeoff`'s memory / extra-FLOPs front stands beside torch.compile's
`activation_memory_budget`, and `roam remat` beside Moccasin (CP-SAT) on Moccasin's public graphs at
0.8 and 0.9 of the given order's peak. Every roam plan is checked by `roam verify` (schedules by
`roam remat --check`) as its own command."""

from benchmarks import harness

TITLE = "Recomputation against PyTorch, torch.compile and Moccasin"
HEADLINES = [("recompute/recompute", []), ("recompute/remat_peers", [])]
DETAILS = "docs/benchmarks/recompute.md"


def readme_rows(load) -> list[dict]:
    """GPT-2 small's full step against PyTorch eager and checkpointing; Moccasin on its own graphs."""
    rows = []
    step = next((r for r in load("recompute/recompute") if r["model"] == "gpt2_small" and r["variant"] == "full step"),
                None)
    if step is not None and "arena_bytes" in step["free"]:
        free, eager = step["free"]["arena_bytes"], step["pytorch_eager_bytes"]
        rows.append({"against": "PyTorch eager", "workload": f"GPT-2 small full step ({step['size']})",
                     "figure": f"{harness.signed_percent(free / eager - 1)} transient memory ({free / 2**20:,.0f} against "
                               f"{eager / 2**20:,.0f} MiB) at {100 * step['free']['extra_flops'] / step['free']['step_flops']:.2f} % "
                               "extra FLOPs", "record": "recompute/recompute"})
        budget, ckpt = step.get("budget", {}), step["pytorch_checkpointing_bytes"]
        if "arena_bytes" in budget and ckpt:
            rows.append({"against": "PyTorch gradient checkpointing", "workload": f"GPT-2 small full step ({step['size']})",
                         "figure": f"{100 * budget['extra_flops'] / budget['step_flops']:.2f} % extra FLOPs against "
                                   f"{step['pytorch_checkpointing_extra_pct']:.1f} % at its transient memory "
                                   f"({budget['arena_bytes'] / 2**20:,.0f} against {ckpt / 2**20:,.0f} MiB)",
                         "record": "recompute/recompute"})
    peers = load("recompute/remat_peers")
    possible = [r for r in peers["rows"] if r["roam"]["status"] != "infeasible"]
    roam_valid = sum(r["roam"].get("check") == "valid" for r in possible)
    both = [r for r in possible if r["roam"].get("check") == "valid" and r["moccasin"].get("check") == "valid"]
    moccasin_valid = sum(r["moccasin"].get("check") == "valid" for r in possible)
    at_most = sum(round(r["roam"]["overhead_percent"], 3) <= round(r["moccasin"]["overhead_percent"], 3) for r in both)
    rows.append({"against": "Moccasin (CP-SAT)",
                 "workload": f"Moccasin's {len({r['graph'] for r in peers['rows']})} public graphs at 0.8 and 0.9 of "
                             f"the peak, {peers['time_limit']:g} s each",
                 "figure": f"a valid schedule on {roam_valid} of {len(possible)} instances that may have one (Moccasin: "
                           f"{moccasin_valid}); compute at most Moccasin's on {at_most} of the {len(both)} both solve",
                 "record": "recompute/remat_peers"})
    return rows

