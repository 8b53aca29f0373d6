"""LLaMA-architecture full AdamW steps of the 70B and 405B classes, made without weights (meta-device
export) in the variants users make (eager or sdpa attention, grouped-query attention, the loss in or
outside the model, batch 4 × 2,048, ONNX Runtime's fused backward or roam's own), each planned by one
`roam optimize --jobs 2` command twice: `--recompute off --gap 0` (the order proven optimal or as close
as the search gets) and `--recompute free --gap 0.01` (recomputation, stopping within 1 % of the
bound), then checked by `roam verify`. Each plan gives its wall and CPU seconds and peak RSS, its peak
of live bytes against the order's lower bound, and the layout's fragmentation (arena / peak − 1).
The census plans every other step form roam makes or reads the same two ways (steps made by
ONNX Runtime's generate_artifacts with an appended AdamW, the suite, bf16 AMP steps, FSDP rank steps,
26 exported architectures) and counts the plans within 1 % of their bound."""

TITLE = "Planning at scale: 70B- and 405B-class steps, and the census of step forms"
# The records whose tables open the area's section (and what `python -m benchmarks run scale` runs).
HEADLINES = [("scale/scale", []), ("scale/census", [])]
DETAILS = "docs/benchmarks/scale.md"


def readme_rows(load) -> list[dict]:
    """The 70B- and 405B-class steps' free plans (time and distance to the bound), and the census."""
    from benchmarks.scale.census import summary

    rows = []
    plans = load("scale/scale")["rows"]
    for size, words in (("70b", "70B"), ("405b", "405B")):
        r = next((r for r in plans if r["step"] == f"{size}-base" and r["mode"] == "free" and "failed" not in r), None)
        if r is None:
            continue
        rows.append({"against": "the order's lower bound",
                     "workload": f"LLaMA {words}-class full AdamW step, `--recompute free --gap 0.01`",
                     "figure": f"within {100 * r['gap']:.2f} % in {r['seconds']:.0f} s, fragmentation "
                               f"{100 * r['fragmentation']:.3f} %, {r['rss_gib']:.1f} GiB RSS",
                     "record": "scale/scale"})
    for record, steps in (("scale/census", "step forms (foreign-made, suite, bf16 AMP, 70B/405B, FSDP ranks)"),
                          ("scale/census.corpus", "steps made from the exporter corpus (26 architectures, 3 exporters, "
                                                  "float32 and AMP)")):
        s = summary(load(record)["rows"])
        rows.append({"against": "the order's lower bound", "workload": f"census: {s['steps']} {steps}",
                     "figure": f"{s['within']} of {s['planned']} plans within 1 % (worst {100 * s['worst_gap']:.1f} % "
                               f"above), fragmentation at most {100 * s['fragmentation']:.2f} %",
                     "record": record})
    return rows
