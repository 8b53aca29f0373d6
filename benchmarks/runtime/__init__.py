"""The plan run on ONNX Runtime itself: real training steps (forward, backward, in-graph AdamW) in
ORT's own session, once with ORT's BFC arena (its default, and grown by exactly what is asked) and
once allocating from roam's arena at the plan's offsets (`roam train`), each in a fresh process, on
the sample, the tiny fixtures and suite models, in both forms: ORT's fused training ops on
onnxruntime-training and standard ONNX (roam's backward) on today's onnxruntime. Bytes are what each
arena grew to besides the state; loss and state are checked against a plain ORT session, and step
times are medians of both sessions stepped in turn. Lowering (`roam lower`: the fused ops written as
standard ONNX) is measured on the suite's graphs: both forms planned with the same options (arena
bytes), and run on the same random inputs (largest relative difference, another onnxruntime runs it).
The hostile sweep runs the commands users run as a hostile user would (corrupt files, outputs aimed
at inputs, bad values, full and read-only file systems, signals at every stage) and counts the cases
that break the contract of docs/reliability.md: one line, the right exit code, nothing overwritten or
left behind."""

from benchmarks import harness

TITLE = "Running the plan on ONNX Runtime, and lowering"
_SUITE = "benchmarks/.cache/suite"
HEADLINES = [
    ("runtime/allocator", [f"{_SUITE}/bert_base", f"{_SUITE}/gpt2_small", f"{_SUITE}/gpt2_small_b1s128",
                           f"{_SUITE}/resnet50", "--make", "standard", "--workspace", "calibrate", "--steps", "6",
                           "--compare", "6"]),
    ("runtime/lower", [_SUITE, "--", "--jobs", "1"]),
    ("runtime/hostile_sweep", []),
    ("runtime/data_rss", []),
    ("runtime/kill_resume", []),
    ("runtime/corpus_offsets", []),
]
DETAILS = "docs/benchmarks/runtime.md"


def readme_rows(load) -> list[dict]:
    """GPT-2 small's step in ORT's own session, ORT's default arena against roam's plan; and the
    largest arena lowering costs over the suite's graphs."""
    r = next(r for r in load("runtime/allocator")["rows"] if r["graph"] == "gpt2_small/full_step.onnx")
    ort, roam = r["runs"]["ort"]["bytes"], r["runs"]["roam"]["bytes"]
    lowered = load("runtime/lower")
    worst = max(x["ratio"] for x in lowered)
    return [{"against": "ONNX Runtime's own arena (BFC, default)",
             "workload": "GPT-2 small full step 4 × 256 (standard ONNX)",
             "figure": f"{harness.signed_percent(roam / ort - 1)} memory besides weights and optimizer state",
             "record": "runtime/allocator"},
            {"against": "ONNX Runtime's fused training ops",
             "workload": f"the suite's {len(lowered)} training graphs and full steps, lowered to standard ONNX",
             "figure": f"{harness.signed_percent(worst - 1)} arena at most", "record": "runtime/lower"}]
