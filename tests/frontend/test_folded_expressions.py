"""Parameters TorchScript's constant folding folded into an expression's value, told by name.

Gemma's RMSNorm computes `x * (1 + weight)`. `torch.onnx.export(..., dynamo=False)` (default
`do_constant_folding=True`) folds `1 + weight` into an anonymous constant (`onnx::Mul_577`): the
weight is gone, and no weight place (a MatMul's, a Conv's) shows the constant is one. TorchScript
keeps no record of the module's parameters; its node scopes (`/model/layers.0/input_layernorm/Mul_1`)
and the constant's place show it: a float vector, as long as a width of the model, read only
elementwise inside a leaf module that holds no parameter of that name. The graphs below are built by
hand in the shape of that export (no torch)."""

import numpy as np
import pytest
from conftest import roam
from onnx import TensorProto, numpy_helper
from onnx_builder import model, node, save

from roam_cli.frontend import parameters, training_graph

HIDDEN, VOCAB = 4, 16
NORMS = {"onnx::Mul_5": "model.layers.0.input_layernorm.weight", "onnx::Mul_7": "model.norm.weight"}


def gemma(extra_nodes=(), extra_inits=None, producer="pytorch", norm_reads=None, scoped=True):
    """TorchScript's Gemma, one layer: embedding (kept), RMSNorm reading the folded `1 + w`
    (onnx::Mul_5), q_proj's transposed weight (onnx::MatMul_6), the final RMSNorm (onnx::Mul_7)."""
    reads = norm_reads or {"onnx::Mul_5": "/model/layers.0/input_layernorm/Mul_1", "onnx::Mul_7": "/model/norm/Mul_1"}

    def name(n):
        return n if scoped else "node_" + n.rsplit("/", 1)[-1].lower()

    nodes = [node("Gather", ["model.embed_tokens.weight", "input_ids"], ["e"], name=name("/model/embed_tokens/Gather")),
             node("Mul", ["e", "e"], ["sq"], name=name("/model/layers.0/input_layernorm/Mul")),
             node("Mul", ["sq", "onnx::Mul_5"], ["n0"], name=name(reads["onnx::Mul_5"])),
             node("MatMul", ["n0", "onnx::MatMul_6"], ["q"], name=name("/model/layers.0/self_attn/q_proj/MatMul")),
             node("Add", ["q", "e"], ["h"], name=name("/model/layers.0/Add")),
             node("Mul", ["h", "onnx::Mul_7"], ["n1"], name=name(reads["onnx::Mul_7"])),
             *extra_nodes,
             node("Identity", ["n1"], ["y"], name=name("/Identity"))]
    rng = np.random.default_rng(0)
    inits = {"model.embed_tokens.weight": rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32),
             "onnx::Mul_5": 1 + 0.02 * rng.standard_normal(HIDDEN).astype(np.float32),  # 1 + w, folded
             "onnx::MatMul_6": rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32),  # q_proj.weight.T
             "onnx::Mul_7": 1 + 0.02 * rng.standard_normal(HIDDEN).astype(np.float32),
             **(extra_inits or {})}
    m = model(nodes, [("input_ids", [2, 3], TensorProto.INT64)], [("y", [2, 3, HIDDEN])], inits)
    m.producer_name = producer
    return m


def test_a_gemma_rmsnorm_weight_folded_into_one_plus_w_is_named_with_the_fix():
    found = parameters.find(gemma())
    assert found.parameters == ["model.embed_tokens.weight"]
    assert found.folded == {"onnx::Mul_5": NORMS["onnx::Mul_5"],
                            "onnx::MatMul_6": "model.layers.0.self_attn.q_proj.weight",
                            "onnx::Mul_7": NORMS["onnx::Mul_7"]}
    assert found.expressions == ["onnx::Mul_5", "onnx::Mul_7"]
    assert found.merged == {} and found.missing == [] and found.computed == []
    transposed, expression = found.warnings()
    assert "onnx::MatMul_6 (model.layers.0.self_attn.q_proj.weight)" in transposed
    assert "onnx::Mul" not in transposed  # each constant in one line, with its own fix
    assert expression.startswith("2 parameters were folded by the exporter into the value of an expression")
    assert "onnx::Mul_5 (model.layers.0.input_layernorm.weight)" in expression
    assert "onnx::Mul_7 (model.norm.weight)" in expression
    assert "--trainable onnx::Mul_5,onnx::Mul_7 " in expression and "do_constant_folding=False" in expression


def test_the_folded_constants_are_listed_under_folded_and_train_as_they_are_when_asked(tmp_path):
    s = training_graph.survey(gemma())
    assert s.names()["folded"]["onnx::Mul_5"] == NORMS["onnx::Mul_5"]
    assert "onnx::Mul_5" not in s.trainable and "onnx::Mul_5" in s.constants
    chosen = training_graph.survey(gemma(), trainable=["onnx::Mul_*"])
    assert chosen.trainable == ["model.embed_tokens.weight", "onnx::Mul_5", "onnx::Mul_7"]
    assert not any("expression" in w for w in chosen.warnings())  # trained as they are: nothing left to tell
    r = roam("make-training-graph", save(gemma(), tmp_path / "m.onnx"), "-o", tmp_path / "t.onnx", "--loss", "mse",
             "--json")
    assert r.code == 0, r.err
    made = r.json()
    assert {c: made["folded"][c] for c in NORMS} == NORMS and "onnx::Mul_5" not in made["trainable"]
    assert any("model.norm.weight" in w and "--trainable onnx::Mul_5,onnx::Mul_7" in w for w in made["warnings"])


def test_one_constant_standing_for_several_norms_is_folded_once_and_merged():
    """A fresh Gemma's norms are all zeros, so every `1 + w` is the same: TorchScript keeps one constant
    and reads it in the other modules through Identity nodes."""
    m = gemma()
    for n in m.graph.node:
        if n.name == "/model/norm/Mul_1":
            n.input[1] = "onnx::Mul_8"
    m.graph.node.insert(0, node("Identity", ["onnx::Mul_5"], ["onnx::Mul_8"], name="Identity_3"))
    m.graph.initializer.remove(next(t for t in m.graph.initializer if t.name == "onnx::Mul_7"))
    found = parameters.find(m)
    assert found.expressions == ["onnx::Mul_5"] and found.folded["onnx::Mul_5"] == NORMS["onnx::Mul_5"]
    assert found.merged == {NORMS["onnx::Mul_5"]: ["model.norm.weight"]}


def test_a_scope_without_the_models_prefix_is_rooted_at_its_ancestors_parameters():
    """OPT-like: the model calls its decoder directly, so scopes start at `decoder` while the
    parameters are `model.decoder....`; the norm keeps no parameter to root it by."""
    m = gemma(norm_reads={"onnx::Mul_5": "/decoder/layers.0/norm/Mul_1", "onnx::Mul_7": "/decoder/norm/Mul_1"})
    m.graph.initializer.append(numpy_helper.from_array(np.zeros(HIDDEN, np.float32), "model.decoder.layers.0.fc.bias"))
    m.graph.node.insert(1, node("Add", ["e", "model.decoder.layers.0.fc.bias"], ["unused"],
                                name="/decoder/layers.0/fc/Add"))
    found = parameters.find(m)
    assert found.folded["onnx::Mul_5"] == "model.decoder.layers.0.norm.weight"
    assert found.folded["onnx::Mul_7"] == "model.decoder.norm.weight"


@pytest.mark.parametrize("case", ["module-keeps-its-weight", "container-module", "no-width-of-the-model",
                                  "scalar", "table", "read-as-data-too", "dynamo-names", "no-scope"])
def test_no_warning_where_the_constant_is_no_parameter(case):
    """Constants a TorchScript export holds that are not a parameter's expression: a module scaling
    by a constant beside its own kept weight, a container's (non-leaf) vector, a rotary frequency
    vector no weight is as long as, a scalar (Gemma's embedding scale), a 2-D table (Swin's
    relative position bias: `computed`), a vector also read as data; and graphs without scopes."""
    extra_nodes, extra_inits, kw = [], {}, {}
    if case == "module-keeps-its-weight":
        extra_nodes = [node("Mul", ["n1", "model.final.weight"], ["f0"], name="/model/final/Mul"),
                       node("Mul", ["f0", "onnx::Mul_9"], ["f1"], name="/model/final/Mul_1")]
        extra_inits = {"model.final.weight": np.ones(HIDDEN, np.float32), "onnx::Mul_9": np.full(HIDDEN, 2, np.float32)}
    elif case == "container-module":  # /model/layers.0 has child scopes: it is no leaf
        extra_nodes = [node("Mul", ["n1", "onnx::Mul_9"], ["f1"], name="/model/layers.0/Mul_3")]
        extra_inits = {"onnx::Mul_9": np.full(HIDDEN, 2, np.float32)}
    elif case == "no-width-of-the-model":  # inv_freq-like: 3 long, no weight has a dimension of 3
        extra_nodes = [node("Mul", ["t", "onnx::Mul_9"], ["f1"], name="/model/rotary_emb/Mul")]
        extra_inits = {"onnx::Mul_9": np.ones(3, np.float32), "t": np.ones((3, 1), np.float32)}
    elif case == "scalar":
        extra_nodes = [node("Mul", ["e", "onnx::Mul_9"], ["f1"], name="/model/embed_scale/Mul")]
        extra_inits = {"onnx::Mul_9": np.array(2.0, np.float32)}
    elif case == "table":
        extra_nodes = [node("Add", ["n1", "onnx::Add_9"], ["f1"], name="/model/bias_table/Add")]
        extra_inits = {"onnx::Add_9": np.ones((HIDDEN, HIDDEN), np.float32)}
    elif case == "read-as-data-too":
        extra_nodes = [node("Mul", ["n1", "onnx::Mul_9"], ["f0"], name="/model/scale/Mul"),
                       node("Concat", ["onnx::Mul_9", "onnx::Mul_9"], ["f1"], name="/model/scale/Concat", axis=0)]
        extra_inits = {"onnx::Mul_9": np.full(HIDDEN, 2, np.float32)}
    elif case == "dynamo-names":  # dynamo names nodes node_mul_1: no scope, and its record tells missing ones
        kw = dict(scoped=False)
    elif case == "no-scope":  # a constant read by a node outside any module
        extra_nodes = [node("Mul", ["n1", "onnx::Mul_9"], ["f1"], name="/Mul_3")]
        extra_inits = {"onnx::Mul_9": np.full(HIDDEN, 2, np.float32)}
    m = gemma(extra_nodes, extra_inits, **kw)
    found = parameters.find(m)
    if case == "dynamo-names":
        assert found.expressions == [] and "onnx::Mul_5" not in found.folded
        return
    assert found.expressions == ["onnx::Mul_5", "onnx::Mul_7"]  # the norms still are
    assert "onnx::Mul_9" not in found.folded and "onnx::Add_9" not in found.folded
    assert not any("onnx::Mul_9" in w for w in found.warnings())
    if case == "table":
        assert found.computed == ["onnx::Add_9 (read in model.bias_table)"]
