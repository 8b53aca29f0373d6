"""roam's mixed-precision steps (`make-training-graph --precision bf16|fp16`: float32 masters, the
AMP policy of torch's CUDA lists) against PyTorch AMP (`torch.autocast`, and `torch.amp.GradScaler`
for fp16). Memory: the same models exported without weights, roam's plan of the bf16 step (order
and layout alone, and with `--recompute free`) against PyTorch AMP eager's peak measured by
MemTracker under FakeTensorMode (recompute/pytorch_memory.amp), both less the float32 parameters
and AdamW moments they share. Loss curves: 50 AdamW steps of roam's step, run from its plan on the
CPU provider with each 16-bit op emulated (`roam emulate`), against PyTorch AMP on the same batches,
with an overflow injected into fp16's loss scale. The AMP corpus checks gradients against autocast
and makes, plans, verifies and trains the step of every export of the exporter corpus. This
machine runs torch's CPU autocast, whose op lists differ from CUDA's (docs/precision.md)."""

from benchmarks import harness

TITLE = "Mixed precision: AMP steps against PyTorch AMP"
# The records whose tables open the area's section (and what `python -m benchmarks run precision` runs).
HEADLINES = [("precision/amp_memory", []), ("precision/amp_curves", [])]
DETAILS = "docs/benchmarks/precision.md"


def readme_rows(load) -> list[dict]:
    """AMP memory of GPT-2 small's bf16 step against PyTorch AMP eager; the loss curves against PyTorch AMP."""
    rows = []
    try:
        memory = {(r["model"], r["precision"]): r for r in load("precision/amp_memory")}
    except OSError:
        memory = {}
    r = memory.get(("gpt2_small", "bf16"))
    if r and r["pytorch"]:
        theirs = r["pytorch"]["transient"]
        off, free = (harness.signed_percent((r['transient'][m] - theirs) / theirs) for m in ("off", "free"))
        rows.append({"against": "PyTorch AMP eager (bf16 autocast)", "workload": "GPT-2 small bf16 step, 4 × 256",
                     "figure": f"{off} transient memory; {free} with --recompute free", "record": "precision/amp_memory"})
    try:
        curves = load("precision/amp_curves")
    except OSError:
        curves = []
    if curves:
        same = sum(c["torch_skipped"] == c["roam_skipped"] for c in curves)
        rows.append({"against": "PyTorch AMP (autocast, GradScaler)", "workload": f"50 AdamW steps, "
                     f"{len({c['model'] for c in curves})} models in bf16 and fp16",
                     "figure": f"losses within {max(c['max_rel'] for c in curves):.1e} (relative); GradScaler's "
                     f"skipped steps matched in {same} of {len(curves)} runs", "record": "precision/amp_curves"})
    return rows
