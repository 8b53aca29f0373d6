"""Recomputation at depth: a synthetic transformer training step of a hundred layers (forward,
roam's backward, in-graph AdamW; small tensors), built here without torch, planned by the CLI
with `--recompute free` and its default limits. Every layer gives the min-cut the same cheap
values to recompute, so the copies number at least one per layer; the order must still be
proven optimal (peak live == roam's lower bound) and the layout must reach the peak exactly
(zero fragmentation), as on the same graph without recomputing; `roam verify` accepts the plan.

Per layer (sequence 64, hidden 8, MLP 16): LayerNorm -> q, k projections -> scores q·kᵀ ->
Softmax -> attention · x -> residual -> MatMul, Relu, MatMul -> residual; the loss is the mean
square of the last output. Activations (the 64x64 scores) outweigh the weights, as in the
long-sequence steps recomputing is for."""

import json
from pathlib import Path

import pytest
from conftest import roam
from onnx_builder import save
from small_models import transformer

from roam_cli.backward.step import build as roam_backward
from roam_cli.frontend import training_graph

LAYERS = 100


@pytest.fixture(scope="module")
def deep_step(tmp_path_factory):
    d = tmp_path_factory.mktemp("deep")
    forward = Path(save(transformer(LAYERS), d / "forward.onnx"))
    training_graph.make(forward, d / "step.onnx", loss="none", in_graph=True, backward=roam_backward)
    return d / "step.onnx", d


@pytest.mark.slow  # 20 s; test_recompute plans and trains the sample's step with its copies
def test_a_hundred_layer_step_recomputes_with_a_proven_order_and_no_fragmentation(deep_step):
    step, d = deep_step
    r = roam("-q", "optimize", step, "-o", d / "plan.json", "--recompute", "free")
    assert r.code == 0, r.err
    plan = json.loads((d / "plan.json").read_text())
    order, layout = plan["stats"]["order"], plan["stats"]["layout"]
    assert len(plan["recompute"]["nodes"]) >= LAYERS
    before = plan["stats"]["recompute"]["before"]
    assert plan["peak_live_bytes"] < before["peak_live_bytes"]
    assert order["proven_optimal"] and order["lower_bound_bytes"] == plan["peak_live_bytes"]
    assert plan["arena_bytes"] == plan["peak_live_bytes"], layout.get("fallback")
    v = roam("verify", step, d / "plan.json")
    assert v.code == 0, v.out + v.err
