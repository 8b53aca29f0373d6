"""A step as other tools write it: the optimizer appended after the whole backward (the order
`loss.backward(); optimizer.step()` gives) and the new parameters and moments graph outputs that
replace their inputs (a functional step: the caller donates the old state), paired by the model's
metadata, not by roam's names. A 40-layer synthetic transformer (test_recompute_scale's, no torch):
`--recompute free --gap 0.01` with the default limits must lay it out within a tenth of 1 % of its
peak, the plan must verify, and the updates must run where they fit, not where the file puts them.

Two steps, each ordered within 1 % of roam's lower bound and never above the plan without
recomputation: the transformer (activations outweigh weights), and a weight-heavy MLP (40 layers
of 32x32 weights on a batch of 2: a layer's gradient is 4 KiB, its activation 256 B), where the
file's order, which holds every gradient until the updates, peaks far above the plan."""

import json

import numpy as np
import onnx
import pytest
from conftest import roam
from onnx_builder import model, node, save
from small_models import functional, transformer

from roam_cli.backward.step import build as roam_backward
from roam_cli.core import memory
from roam_cli.frontend import training_graph
from roam_cli.frontend.onnx_import import import_model

LAYERS = 40
WIDTH, BATCH = 32, 2


def mlp(layers: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits, nodes, x = {}, [], "x"
    for layer in range(layers):
        inits[f"w{layer}.weight"] = (rng.standard_normal([WIDTH, WIDTH]) / WIDTH).astype(np.float32)
        nodes += [node("MatMul", [x, f"w{layer}.weight"], [f"h{layer}"]), node("Tanh", [f"h{layer}"], [f"a{layer}"])]
        x = f"a{layer}"
    nodes += [node("Mul", [x, x], ["square"]), node("ReduceMean", ["square"], ["loss"], keepdims=0)]
    return model(nodes, [("x", [BATCH, WIDTH])], [("loss", [])], initializers=inits)



# the 40-layer transformer plans within the gap in 12 s: the slow run; the MLP in the default one
@pytest.fixture(scope="module", params=[pytest.param("transformer", marks=pytest.mark.slow), "mlp"])
def functional_step(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    save((transformer if request.param == "transformer" else mlp)(LAYERS), d / "forward.onnx")
    training_graph.make(d / "forward.onnx", d / "step.onnx", loss="none", in_graph=True, backward=roam_backward)
    save(functional(d / "step.onnx"), d / "functional.onnx")
    return d / "functional.onnx", d, request.param


def test_the_functional_step_pairs_every_new_state_with_its_input(functional_step):
    path, _, name = functional_step
    step = onnx.load(path)
    pairs = json.loads({p.key: p.value for p in step.metadata_props}[memory.INPLACE_KEY])
    assert not any(o.name.endswith(".out") for o in step.graph.output)
    # each weight paired (transformer: q, k, up, down per layer; MLP: one), as are its two moments
    weights = (4 if name == "transformer" else 1) * LAYERS
    assert sum(1 for old in pairs.values() if old.endswith(".weight")) == weights
    assert sum(1 for old in pairs.values() if "exp_avg" in old) == 2 * weights
    mm = memory.build(import_model(path).graph)
    assert mm.node_class.count("update") > 10 * LAYERS  # AdamW's elementwise nodes, many per parameter
    assert all(mm.storage_of[new] == old for new, old in pairs.items())  # no bytes of their own


def test_a_functional_step_plans_within_the_gap(functional_step):
    path, d, name = functional_step
    run = roam("optimize", path, "-o", d / "plan.json", "--recompute", "free", "--gap", "0.01")
    assert run.code == 0, run.err
    plan = json.loads((d / "plan.json").read_text())
    assert plan["arena_bytes"] <= plan["peak_live_bytes"] * 1.001
    assert roam("verify", d / plan["model"]["path"], d / "plan.json").code == 0
    assert plan["peak_live_bytes"] <= plan["stats"]["order"]["lower_bound_bytes"] * 1.01
    # never above the plan without recomputation
    run = roam("optimize", path, "-o", d / "off.json", "--recompute", "off", "--gap", "0.01")
    assert run.code == 0, run.err
    off = json.loads((d / "off.json").read_text())
    assert plan["persistent_bytes"] + plan["arena_bytes"] <= off["persistent_bytes"] + off["arena_bytes"]
    if name == "mlp":
        # in the file's order the 40 weights' 4 KiB gradients (160 KiB) are all live when the
        # updates start; planned, each update runs once its gradient is made
        run = roam("optimize", path, "-o", d / "file_order.json", "--recompute", "free", "--order", "original")
        assert run.code == 0, run.err
        file_order = json.loads((d / "file_order.json").read_text())
        assert file_order["peak_live_bytes"] >= LAYERS * WIDTH * WIDTH * 4
        assert plan["peak_live_bytes"] < file_order["peak_live_bytes"] / 4
