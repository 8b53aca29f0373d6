"""A slice of the census (benchmarks/scale/census.py): steps made from exports as users make them, planned
with the targets' settings, at their bound.

Two architectures of the exporter corpus (GPT-2; LLaMA with grouped-query attention), exported by
torch's exporter (dynamo, optimize=False), made into full AdamW steps in float32 and in bf16 AMP
(`make-training-graph --in-graph-optimizer --precision bf16`), each planned `--recompute off` and
`free` with `--gap 0.01`: the plan without recomputation within 1 % of its order's lower bound,
every plan verified, the free plan never above the off plan. (The free plans of these tiny steps,
whose weights outweigh their activations, stand further from their bounds: BENCHMARKS.md, "Census".)
Needs torch and transformers (CI's training environment); skipped elsewhere."""

import importlib.util
import json
from pathlib import Path

import pytest
from conftest import roam

ROOT = Path(__file__).resolve().parents[2]


def corpus():
    for name in ("torch", "transformers", "onnxscript"):
        pytest.importorskip(name, reason=f"{name} is not installed (see benchmarks/scale/census.py)")
    return importlib.import_module("benchmarks.exporters.exporters_corpus")


@pytest.fixture(scope="module", params=["gpt2", "llama-gqa"])
def export(request, tmp_path_factory):
    c = corpus()
    d = tmp_path_factory.mktemp(request.param)
    model, feeds, _ = c.model_and_batch(request.param)
    c.export(model, feeds, "dynamo-optimize-false", d / "model.onnx")
    return d


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_step_users_make_plans_at_its_bound(export, precision):
    d = export
    step = d / f"step.{precision}.onnx"
    made = roam("make-training-graph", d / "model.onnx", "-o", step, "--loss", "cross-entropy", "--in-graph-optimizer",
                *(["--precision", precision] if precision != "fp32" else []))
    assert made.code == 0, made.err
    needs = {}
    for mode in ("off", "free"):
        plan_path = d / f"{precision}.{mode}.json"
        r = roam("optimize", step, "-o", plan_path, "--recompute", mode, "--gap", "0.01", "--jobs", "2")
        assert r.code == 0, r.err
        plan = json.loads(plan_path.read_text())
        if mode == "off":
            assert plan["peak_live_bytes"] <= plan["stats"]["order"]["lower_bound_bytes"] * 1.01
        assert roam("verify", step, plan_path).code == 0
        needs[mode] = plan["persistent_bytes"] + plan["arena_bytes"]
    assert needs["free"] <= needs["off"]
