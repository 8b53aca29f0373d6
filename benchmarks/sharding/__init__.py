"""One rank of fully sharded data parallelism (`roam shard --ranks N`) planned like any step, against
PyTorch FSDP2 on the same models at the same per-rank batch and number of ranks: GPT-2 small at 8
ranks and LLaMA steps (7B, 70B and 405B class, 1 × 512 tokens a rank) at 8 and 64, in float32 and
bf16. FSDP2's side is measured by FSDPMemTracker under FakeTensorMode with a fake process group
(each transformer block a unit, foreach AdamW, the second step), under its three resharding
policies; roam's side is the plan of the rank step with `--recompute free`, `off`, and `budget` at
FSDP2 default's peak, each verified. Memory: roam's persistent bytes plus its arena against the
tracker's peak; communication: the bytes a rank sends per step, and the exposed time estimated by
the same ring formula on the same device profile (NVLink at 8 ranks, InfiniBand at 64)."""

from benchmarks import harness

TITLE = "Sharding: rank steps against PyTorch FSDP2"
HEADLINES = [("sharding/fsdp2_compare", [])]
DETAILS = "docs/benchmarks/sharding.md"

_WORKLOAD = "70B-class LLaMA step, 64 ranks, float32"


def readme_rows(load) -> list[dict]:
    """roam's per-rank memory against FSDP2's default peak (`free`), and what a rank sends when roam
    is held to FSDP2's memory (`budget`)."""
    rows = load("sharding/fsdp2_compare")
    r = next(r for r in rows if r["row"] == "70b-n64" and r["precision"] == "float32")
    fsdp2 = r["fsdp2"]["default"]
    peak = fsdp2["peak"]["Total"]
    sent = (sum(fsdp2["communication"][k] for k in ("all_gather_forward_bytes", "all_gather_backward_bytes",
                                                   "reduce_scatter_bytes")) * (r["ranks"] - 1) // r["ranks"])
    free, budget = r["roam"]["free"], r["roam"]["budget"]
    assert budget["per_rank_bytes"] <= peak
    return [{"against": "PyTorch FSDP2 (default policy)", "workload": _WORKLOAD,
             "figure": f"{harness.signed_percent(free['per_rank_bytes'] / peak - 1)} memory per rank",
             "record": "sharding/fsdp2_compare"},
            {"against": "PyTorch FSDP2 (default policy)", "workload": _WORKLOAD + ", at FSDP2's memory per rank",
             "figure": f"{harness.signed_percent(budget['communication']['sent_bytes'] / sent - 1)} bytes sent per rank",
             "record": "sharding/fsdp2_compare"}]
