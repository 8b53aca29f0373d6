"""`roam make-training-graph`: exporter repairs, the parameter survey, the in-graph optimizer.

Without torch: repairs and survey on hand-built graphs, and the full step made from the committed
artifacts training graph, run in ONNX Runtime against the artifacts optimizer and a numpy AdamW.
With torch (skipped otherwise): tiny GPT-2, BERT and ResNet exported, both variants made and run."""

import importlib.util
import json
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import ROOT, SAMPLE, in_runnable_form, needs_ort_training, roam
from onnx import TensorProto, helper
from onnx_builder import model, node, save

from roam_cli import pipeline
from roam_cli.core.errors import RoamError
from roam_cli.core.memory import INPLACE_KEY
from roam_cli.frontend import shapes, training_graph
from roam_cli.frontend.optimizer_graph import SGD, AdamW, full_step, gradient_accumulators
from roam_cli.frontend.providers import TRAINING_OPS
from roam_cli.frontend.synthetic import synthetic_feeds
from roam_cli.verify import verify

SAMPLE_OPTIMIZER = SAMPLE.parent / "optimizer_model.onnx"


def session(m) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    data = m.SerializeToString() if isinstance(m, onnx.ModelProto) else str(m)
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def step_feeds(sess, seed=0) -> dict:
    """Synthetic feeds a training step accepts: second moments and variances >= 0, buffers zero."""
    feeds = synthetic_feeds(sess, seed)
    for name, value in feeds.items():
        if name.endswith((".exp_avg_sq", "running_var")):
            feeds[name] = np.abs(value)
        elif name.endswith(".accumulation.buffer"):
            feeds[name] = np.zeros_like(value)
    return feeds


# ---- repairs and survey (hand-built graphs) ------------------------------------------------------

def test_repair_adds_the_outputs_gradient_builders_read_and_batchnorm_training_mode():
    m = model([node("LayerNormalization", ["x", "ln.weight", "ln.bias"], ["a"]),
               node("LayerNormalization", ["a", "ln.weight", "ln.bias"], ["b", "b_mean", "b_inv"]),
               node("Dropout", ["b"], ["c"]),
               node("BatchNormalization", ["c4", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"], ["d"]),
               node("Reshape", ["c", "shape4"], ["c4"])],
              [("x", [2, 4])], [("d", [2, 4, 1, 1])],
              {"ln.weight": np.ones(4, np.float32), "ln.bias": np.zeros(4, np.float32),
               "bn.weight": np.ones(4, np.float32), "bn.bias": np.zeros(4, np.float32),
               "bn.running_mean": np.zeros(4, np.float32), "bn.running_var": np.ones(4, np.float32),
               "shape4": np.array([2, 4, 1, 1])})
    fixed = training_graph.repair(m)
    assert fixed == {"LayerNormalization": 1, "Dropout": 1, "BatchNormalization": 1}
    ln, ln_full, drop, bn = (m.graph.node[i] for i in range(4))
    assert list(ln.output) == ["a", "a.mean", "a.inv_std_dev"]
    assert list(ln_full.output) == ["b", "b_mean", "b_inv"]  # already complete: untouched
    assert list(drop.output) == ["c", "c.mask"]
    assert list(bn.output) == ["d", "d.running_mean", "d.running_var"]
    assert helper.get_attribute_value(next(a for a in bn.attribute if a.name == "training_mode")) == 1
    assert training_graph.repair(m) == {}  # idempotent


def survey_graph():
    """x[2,3] -> MatMul fc.weight[3,4] -> Add fc.bias -> MatMul val_7[4,4] (a folded weight) -> Add
    where[2,4] (a mask) -> LayerNormalization twice with the same ln.weight -> BatchNormalization."""
    rng = np.random.default_rng(0)
    mask = np.where(np.eye(2, 4) > 0, 0.0, -np.inf).astype(np.float32)
    return model([node("MatMul", ["x", "fc.weight"], ["h"]), node("Add", ["h", "fc.bias"], ["h1"]),
                  node("MatMul", ["h1", "val_7"], ["h2"]), node("Add", ["h2", "where"], ["h3"]),
                  node("LayerNormalization", ["h3", "ln.weight"], ["h4"]),
                  node("LayerNormalization", ["h4", "ln.weight"], ["h5"]),
                  node("Reshape", ["h5", "shape"], ["h6"]),
                  node("BatchNormalization", ["h6", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"],
                       ["y"])],
                 [("x", [2, 3])], [("y", [2, 4, 1, 1])],
                 {"fc.weight": rng.standard_normal((3, 4)).astype(np.float32),
                  "fc.bias": np.zeros(4, np.float32), "val_7": rng.standard_normal((4, 4)).astype(np.float32),
                  "where": mask, "ln.weight": np.ones(4, np.float32), "bn.weight": np.ones(4, np.float32),
                  "bn.bias": np.zeros(4, np.float32), "bn.running_mean": np.zeros(4, np.float32),
                  "bn.running_var": np.ones(4, np.float32), "shape": np.array([2, 4, 1, 1])})


def test_survey_finds_parameters_by_name_freezes_running_state_and_flags_folding_and_sharing():
    s = training_graph.survey(survey_graph())
    assert s.trainable == ["fc.weight", "fc.bias", "ln.weight", "bn.weight", "bn.bias"]
    assert s.elements == 12 + 4 + 4 + 4 + 4
    assert s.frozen == ["bn.running_mean", "bn.running_var"]
    assert s.found.folded == {"val_7": ""}  # in a MatMul's weight place; the mask feeding Add is a constant
    assert s.constants == ["val_7", "where", "shape"]
    assert s.shared == {"ln.weight": 2}
    warnings = s.warnings()
    assert len(warnings) == 2 and "--trainable val_7 " in warnings[0]
    assert "ln.weight: 2" in warnings[1]


def test_survey_takes_named_parameters_and_frozen_ones():
    s = training_graph.survey(survey_graph(), requires_grad=["fc.weight", "val_7", "x"], frozen=["fc.bias"])
    assert s.trainable == ["fc.weight", "val_7", "x"]  # a graph input may be trained too
    assert s.elements == 12 + 16 + 6
    assert s.frozen == ["fc.bias", "bn.running_mean", "bn.running_var"]
    s = training_graph.survey(survey_graph(), frozen=["ln.weight"])
    assert "ln.weight" not in s.trainable and "ln.weight" in s.frozen


@pytest.mark.parametrize("kwargs, message", [
    (dict(requires_grad=["fc.weight", "encoder.missing.weight"]), "1 named parameters are not in the graph"),
    (dict(frozen=["nope"]), "--frozen .nope. matches no name in the graph"),
    (dict(requires_grad=["shape"]), "is not floating-point"),
])
def test_survey_refuses_names_that_did_not_survive_or_cannot_train(kwargs, message):
    with pytest.raises(RoamError, match=message):
        training_graph.survey(survey_graph(), **kwargs)


def test_survey_refuses_a_graph_with_nothing_named_like_a_parameter():
    m = model([node("MatMul", ["x", "val_1"], ["y"])], [("x", [2, 2])], [("y", [2, 2])],
              {"val_1": np.eye(2, dtype=np.float32)})
    with pytest.raises(RoamError, match="--requires-grad"):
        training_graph.survey(m)


@needs_ort_training
def test_shape_rules_for_batchnorm_and_conv_training_ops_match_onnx_runtime():
    # X[2,3,5,5] -BatchNormInternal-> Y; BatchNormalizationGrad; ConvGrad with W[4,3,3,3], dY[2,4,3,3]
    ms = "com.microsoft"
    m = model([node("BatchNormInternal", ["x", "s", "b", "rm", "rv"], ["y", "rm2", "rv2", "sm", "si"], domain=ms,
                    training_mode=1),
               node("BatchNormalizationGrad", ["y", "x", "s", "sm", "si"], ["dx", "ds", "db"], domain=ms,
                    epsilon=1e-5),
               node("ConvGrad", ["dy", "dx", "w"], ["cx", "cw", "cb"], domain=ms, kernel_shape=[3, 3],
                    pads=[0, 0, 0, 0], strides=[1, 1], dilations=[1, 1], group=1)],
              [("x", [2, 3, 5, 5]), ("s", [3]), ("b", [3]), ("rm", [3]), ("rv", [3]), ("dy", [2, 4, 3, 3]),
               ("w", [4, 3, 3, 3])],
              [(o, None) for o in ("y", "rm2", "rv2", "sm", "si", "ds", "db", "cx", "cw", "cb")])
    for o in m.graph.output:
        o.type.tensor_type.ClearField("shape")
    types = shapes.infer(m, {}, None)
    sess = session(m)
    feeds = synthetic_feeds(sess)
    feeds["rv"] = np.abs(feeds["rv"])
    ran = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    assert {name: types[name] for name in ran} == {name: (TensorProto.FLOAT, v.shape) for name, v in ran.items()}


# ---- the full step from the committed artifacts training graph (no torch) -----------------------

@pytest.fixture(scope="module")
def sample_training():
    return onnx.load(str(SAMPLE))


def test_full_step_replaces_accumulators_with_updates_declared_in_place(sample_training):
    step = full_step(sample_training)
    params = list(gradient_accumulators(sample_training.graph))
    g = step.graph
    assert len(params) == 28
    assert not gradient_accumulators(g) and all(n.domain != "com.microsoft" or n.op_type != "InPlaceAccumulatorV2"
                                                for n in g.node)
    inputs = [i.name for i in g.input]
    assert not any(x.endswith(".accumulation.buffer") or x == "lazy_reset_grad" for x in inputs)
    assert inputs[-2 - 2 * 28:][:2] == ["learning_rate", "step"]
    assert inputs[-2 * 28:] == [f"{p}.{m}" for p in params for m in ("exp_avg", "exp_avg_sq")]
    outputs = [o.name for o in g.output]
    assert outputs[0] == "loss" and len(outputs) == 1 + 1 + 3 * 28
    pairs = json.loads(next(kv.value for kv in step.metadata_props if kv.key == INPLACE_KEY))
    assert pairs == {f"{s}.out": s for s in ["step"] + [x for p in params for x in (p, f"{p}.exp_avg", f"{p}.exp_avg_sq")]}
    assert set(pairs) == set(outputs[1:])
    # each parameter is overwritten after the last node that reads its old value
    index = {o: i for i, n in enumerate(g.node) for o in n.output}
    for p in params:
        readers = [i for i, n in enumerate(g.node) if p in n.input and f"{p}.out" not in n.output]
        assert index[f"{p}.out"] > max(readers + [index[f"{p}_grad"]])
    onnx.checker.check_model(step, full_check=True)


def adamw_reference(p, g, m, v, lr, t, opt: AdamW):
    """ONNX Runtime's AdamWOptimizer, adam_mode 1 with bias correction, in float64; or
    torch.optim.AdamW's step as its documentation writes it."""
    p, g, m, v = (np.asarray(a, np.float64) for a in (p, g, m, v))
    m = opt.beta1 * m + (1 - opt.beta1) * g
    v = opt.beta2 * v + (1 - opt.beta2) * g * g
    if opt.convention == "pytorch":
        p = p * (1 - lr * opt.weight_decay)
        m_hat, v_hat = m / (1 - opt.beta1 ** t), v / (1 - opt.beta2 ** t)
        return p - lr * m_hat / (np.sqrt(v_hat) + opt.eps), m, v
    lr_corrected = lr * np.sqrt(1 - opt.beta2 ** t) / (1 - opt.beta1 ** t)
    p = p - lr_corrected * m / (np.sqrt(v) + opt.eps)
    return p - lr * opt.weight_decay * p, m, v


def run_with_gradients(step_model, params, feeds):
    """One step, with each gradient exposed too (dropout draws fresh masks every run)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(step_model)
    probe.graph.output.extend(helper.make_empty_tensor_value_info(f"{p}_grad") for p in params)
    sess = session(probe)
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


@pytest.mark.parametrize("opt", [AdamW(), AdamW(weight_decay=0.01), AdamW(eps=1e-3, weight_decay=0.01, convention="pytorch")])
def test_one_adamw_step_matches_the_artifacts_optimizer_and_numpy(sample_training, opt):
    step = in_runnable_form(full_step(sample_training, opt))
    params = list(gradient_accumulators(sample_training.graph))
    feeds = step_feeds(session(step))
    feeds["learning_rate"] = np.array([1e-2], np.float32)
    feeds["step"] = np.array([3], np.int64)
    out = run_with_gradients(step, params, feeds)
    assert np.isfinite(out["loss"]) and out["step.out"].tolist() == [4]
    worst = 0.0
    for p in params:
        ref = adamw_reference(feeds[p], out[f"{p}_grad"], feeds[f"{p}.exp_avg"], feeds[f"{p}.exp_avg_sq"], 1e-2, 4, opt)
        for got, want in zip((out[f"{p}.out"], out[f"{p}.exp_avg.out"], out[f"{p}.exp_avg_sq.out"]), ref):
            worst = max(worst, float(np.abs(got - want).max()))
    assert worst < 1e-5
    assert max(float(np.abs(out[f"{p}.out"] - feeds[p]).max()) for p in params) > 1e-3  # the step moved them
    if opt == AdamW() and TRAINING_OPS:  # the artifacts optimizer graph was built with these (its defaults)
        ps, gs = [feeds[p].copy() for p in params], [out[f"{p}_grad"] for p in params]
        ms = [feeds[f"{p}.exp_avg"].copy() for p in params]
        vs = [feeds[f"{p}.exp_avg_sq"].copy() for p in params]
        session(SAMPLE_OPTIMIZER).run(None, {"learning_rate": feeds["learning_rate"], "step": np.array([4]),
                                             "params": ps, "gradients": gs, "first_order_moments": ms,
                                             "second_order_moments": vs})  # updates the arrays in place
        for k, p in enumerate(params):
            assert np.abs(ps[k] - out[f"{p}.out"]).max() < 1e-5
            assert np.abs(ms[k] - out[f"{p}.exp_avg.out"]).max() < 1e-5
            assert np.abs(vs[k] - out[f"{p}.exp_avg_sq.out"]).max() < 1e-5


def test_one_sgd_step_is_w_minus_lr_g(sample_training):
    step = in_runnable_form(full_step(sample_training, SGD()))
    params = list(gradient_accumulators(sample_training.graph))
    assert [i.name for i in step.graph.input if i.name in ("learning_rate", "step")] == ["learning_rate"]
    feeds = step_feeds(session(step))
    feeds["learning_rate"] = np.array([0.5], np.float32)
    out = run_with_gradients(step, params, feeds)
    for p in params:
        np.testing.assert_allclose(out[f"{p}.out"], feeds[p] - 0.5 * out[f"{p}_grad"], atol=1e-6)


def test_cli_full_step_from_a_training_graph_plans_with_states_in_place(tmp_path):
    out = tmp_path / "step.onnx"
    r = roam("make-training-graph", SAMPLE, "-o", out, "--in-graph-optimizer")
    assert r.code == 0, r.err
    assert "wrote" in r.out and "full step" in r.out
    assert roam("optimize", out, "-o", tmp_path / "plan.json").code == 0
    r = roam("verify", out, tmp_path / "plan.json")
    assert r.code == 0, r.err
    plan = json.loads((tmp_path / "plan.json").read_text())
    by_kind = {}
    for t in plan["tensors"]:
        if t["offset"] is None and "alias_of" not in t:
            by_kind[t["kind"]] = by_kind.get(t["kind"], 0) + t["bytes"]
    g = onnx.load(str(SAMPLE)).graph
    shapes_ = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in g.input}
    param_bytes = sum(-(-int(np.prod(shapes_[p])) * 4 // 256) * 256 for p in gradient_accumulators(g))
    assert by_kind["parameter"] == param_bytes
    assert by_kind["optimizer_state"] == 2 * param_bytes + 256  # two moments per parameter, and step
    assert "gradient_buffer" not in by_kind
    persistent = {t["name"] for t in plan["tensors"] if t["offset"] is None and "alias_of" not in t}
    updates = [t for t in plan["tensors"] if t.get("alias_of") in persistent and t["kind"] == "inplace"
               and "written_over" not in t]
    assert len(updates) == 1 + 3 * 28  # every update writes into its state
    # and m * beta1, v * beta2 of each parameter's AdamW are written over its moments
    over_states = [t for t in plan["tensors"] if t.get("alias_of") in persistent and "written_over" in t]
    assert len(over_states) == 2 * 28


def test_cli_refuses_a_training_graph_without_in_graph_optimizer_and_writes_nothing(tmp_path):
    r = roam("make-training-graph", SAMPLE, "-o", tmp_path / "t.onnx", "--loss", "none")
    assert r.code == 2 and "already is a training graph" in r.err and len(r.err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_cli_needs_a_loss_for_an_inference_export(tmp_path):
    path = save(survey_graph(), tmp_path / "m.onnx")
    r = roam("make-training-graph", path, "-o", tmp_path / "t.onnx")
    assert r.code == 2 and "--loss is required" in r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_cli_ort_artifacts_backend_without_torch_says_what_to_install(tmp_path):
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    path = save(survey_graph(), tmp_path / "m.onnx")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(tmp_path / "site")}
    proc = subprocess.run([sys.executable, "-m", "roam_cli", "make-training-graph", path, "-o", tmp_path / "t.onnx",
                           "--loss", "mse", "--backend", "ort-artifacts"], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    if TRAINING_OPS:
        assert proc.stderr.startswith("roam: error: building a training graph needs torch")
        assert "download.pytorch.org/whl/cpu" in proc.stderr
    else:  # onnxruntime-training is the first thing missing
        assert "needs ONNX Runtime's training artifacts: onnxruntime-training and torch" in proc.stderr
    assert not (tmp_path / "t.onnx").exists()


# ---- exports of tiny GPT-2, BERT and ResNet (tests/fixtures; needs torch, skipped otherwise) -----

FIXTURES = ROOT / "tests" / "fixtures"


def needs(*modules):
    for name in modules:
        pytest.importorskip(name, reason=f"{name} is not installed (the train/bench extras)")


def suite_module():
    needs("torch", "transformers", "onnxscript")
    return importlib.import_module("benchmarks.suite")


@pytest.mark.parametrize("name, loss", [("tiny_gpt2", "none"), ("tiny_bert", "none"), ("tiny_resnet", "cross-entropy")])
def test_export_becomes_both_graphs_that_onnx_runtime_runs_with_pytorchs_parameters(tmp_path, name, loss):
    needs("torch")
    forward = FIXTURES / name / "forward.onnx"  # weightless: the data file it points into is absent
    # ORT's artifacts as ORT makes them (fused): their gradient accumulators are ORT's ops
    made = training_graph.make(forward, tmp_path / "t.onnx", loss=loss, optimizer_path=tmp_path / "o.onnx", fused=True)
    full = training_graph.make(forward, tmp_path / "f.onnx", loss=loss, in_graph=True, fused=True)
    suite = suite_module()
    torch_model = suite.build(next(m for m in suite.TINY if m.name == name))[0]
    params = list(torch_model.parameters())
    assert len(made.survey.trainable) == len(params) == len(full.survey.trainable)
    assert made.survey.elements == sum(p.numel() for p in params)
    assert made.survey.warnings() == []
    assert len(gradient_accumulators(onnx.load(str(tmp_path / "t.onnx")).graph)) == len(params)
    assert [w for _, w, _ in made.written] == ["training graph", "optimizer graph"]
    for graph in ("t.onnx", "f.onnx"):
        sess = session(tmp_path / graph)
        loss_value = sess.run(None, step_feeds(sess))[0]
        assert np.asarray(loss_value).shape == () and np.isfinite(loss_value)
        planned = pipeline.run(tmp_path / graph, tmp_path / "plan.json", pipeline.Options(order="original"))
        verify(planned.imported.graph, planned.imported.sha256, planned.plan)  # raises on a violation


def test_export_keeps_every_parameter_and_computes_what_pytorch_computes(tmp_path):
    suite = suite_module()
    import torch

    from roam_cli.frontend import torch_export

    spec = suite.Model("gpt2", "gpt2", dict(vocab_size=64, n_positions=16, n_layer=1, n_embd=16, n_head=2,
                                            bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                                            attn_pdrop=0.0), batch=2, seq=8)
    module, args, inputs, outputs, _ = suite.build(spec, meta=False)
    exported = torch_export.export(module, args, inputs, outputs, prefix="m.")
    names = sorted(n.removeprefix("m.") for n, _ in module.named_parameters())  # tied lm_head: once
    assert sorted(exported.parameters) == names and exported.data_file is None
    assert sorted(training_graph.survey(exported.model).trainable) == names
    with torch.no_grad():
        want = float(module(*args))
    got = session(exported.model).run(None, {k: a.numpy() for k, a in zip(inputs, args)})[0]
    assert abs(float(got) - want) < 1e-5


def test_checkpoint_holds_the_weights_and_a_weightless_export_cannot_have_one(tmp_path):
    needs("torch")
    weights = {"fc.weight": np.full((3, 4), 0.5, np.float32), "fc.bias": np.arange(4, dtype=np.float32)}
    linear = model([node("MatMul", ["x", "fc.weight"], ["h"]), node("Add", ["h", "fc.bias"], ["y"])],
                   [("x", [2, 3])], [("y", [2, 4])], weights)
    path = save(linear, tmp_path / "m.onnx")
    r = roam("make-training-graph", path, "-o", tmp_path / "t.onnx", "--loss", "mse", "--checkpoint", tmp_path / "ckpt")
    assert r.code == 0, r.err
    assert "parameters: 2 trainable (16 elements), 0 frozen" in r.out and "checkpoint" in r.out
    data = (tmp_path / "ckpt").read_bytes()
    assert all(w.tobytes() in data for w in weights.values())  # the values, as ORT's checkpoint stores them
    r = roam("make-training-graph", FIXTURES / "tiny_bert" / "forward.onnx", "-o", tmp_path / "b.onnx",
             "--loss", "none", "--checkpoint", tmp_path / "b.ckpt")
    assert r.code == 2 and "--checkpoint needs the weights" in r.err
    assert not (tmp_path / "b.onnx").exists() and not (tmp_path / "b.ckpt").exists()


def test_onnx_runtime_failures_are_told_by_their_reason_not_their_source_location():
    cpp = RuntimeError("/onnxruntime_src/orttraining/x.cc:621 onnxruntime::f(pybind11::module&) [ONNXRuntimeError] : "
                       "2 : INVALID_ARGUMENT : Cannot compute the partial derivative for 'b' as it's unreachable")
    assert training_graph.ort_reason(cpp) == "Cannot compute the partial derivative for 'b' as it's unreachable"
    check = RuntimeError("/x.cc:29 GetGradientForOp(const A&,\n B&) gradient_builder != nullptr was false. "
                         "The gradient builder has not been registered: CastLike for node n")
    assert training_graph.ort_reason(check) == "The gradient builder has not been registered: CastLike for node n"


def test_a_weightless_bert_keeps_its_buffers_values_and_no_parameter_data(tmp_path):
    """BERT built weightless (benchmarks/suite.py): parameters on "meta", but the token type ids and
    position ids buffers exported with the values BERT's constructor gives them (zeros, 0..n-1),
    so a step run on synthetic weights indexes its embeddings in range."""
    suite = suite_module()
    from onnx import numpy_helper

    from roam_cli.frontend import torch_export

    spec = suite.Model("bert", "bert", dict(vocab_size=64, max_position_embeddings=16, num_hidden_layers=1,
                                            hidden_size=16, num_attention_heads=2, intermediate_size=32),
                       batch=2, seq=8)
    module, args, inputs, outputs, _ = suite.build(spec, meta=True)
    assert all(p.is_meta for p in module.parameters()) and all(b.is_meta for b in module.buffers())
    exported = torch_export.export(module, args, inputs, outputs, prefix="m.")
    embedded = {t.name: numpy_helper.to_array(t) for t in exported.model.graph.initializer if t.data_location == 0}
    assert embedded["bert.embeddings.token_type_ids"].tolist() == [[0] * 16]
    assert embedded["bert.embeddings.position_ids"].tolist() == [list(range(16))]
    assert exported.data_file == "weights.bin"


def test_the_two_adamw_conventions_differ_where_eps_meets_the_bias_correction():
    """One element, g = 1e-3, eps = 1e-3, step 1: ONNX Runtime divides by sqrt((1 - b2) g^2) + eps
    (3.2e-5 + 1e-3), PyTorch by |g| + eps (2e-3): updates 0.0306 lr vs 0.5 lr."""
    ort_way = adamw_reference([0.0], [1e-3], [0.0], [0.0], 1.0, 1, AdamW(eps=1e-3))[0]
    torch_way = adamw_reference([0.0], [1e-3], [0.0], [0.0], 1.0, 1, AdamW(eps=1e-3, convention="pytorch"))[0]
    np.testing.assert_allclose(torch_way, [-0.5])
    np.testing.assert_allclose(ort_way, [-np.sqrt(1e-3) * 1e-4 / 0.1 / (np.sqrt(1e-3) * 1e-3 + 1e-3)])


def test_convention_pytorch_is_torch_optim_adamw_whole_its_defaults_too():
    # torch.optim.AdamW(): eps 1e-8, weight decay 0.01; ONNX Runtime's onnxblock AdamW: 1e-6 and 0
    assert training_graph.in_graph_optimizer("adamw", {"convention": "pytorch"}, True) == \
        AdamW(eps=1e-8, weight_decay=0.01, convention="pytorch")
    assert training_graph.in_graph_optimizer("adamw", {"convention": "pytorch", "weight_decay": "0"}, True) == \
        AdamW(eps=1e-8, weight_decay=0.0, convention="pytorch")
    assert training_graph.in_graph_optimizer("adamw", {}, True) == AdamW(eps=1e-6, weight_decay=0.0)


def test_ort_artifacts_cross_entropy_refuses_logits_with_a_sequence_axis():
    # onnxblock would write a step that loads and fails when run: labels [B, S] against classes read
    # at axis 1. Refused before onnxruntime-training is needed.
    logits = model([node("MatMul", ["x", "w"], ["logits"])], [("x", [2, 3, 4])], [("logits", [2, 3, 5])],
                   initializers={"w": np.ones((4, 5), np.float32)})
    with pytest.raises(RoamError, match=r"needs logits \[N, classes\]; 'logits' has 3 axes"):
        training_graph.build(logits, training_graph.survey(logits, requires_grad=["w"]), "cross-entropy", None)
    loss = model([node("ReduceMean", ["x", "w"], ["out"], keepdims=0)], [("x", [2, 3, 4])], [("out", [])],
                 initializers={"w": np.ones(3, np.int64)})  # an export that computes its loss itself
    with pytest.raises(RoamError, match=r"'out' is a scalar: .* takes --loss none"):
        training_graph.build(loss, training_graph.survey(loss, requires_grad=[]), "cross-entropy", None)
