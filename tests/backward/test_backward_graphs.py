"""roam's backward on whole graphs: random small graphs against finite differences, the sample's
gradients against ONNX Runtime's artifacts training graph, the test fixtures' full steps through
plan, verify and train, and each refusal (one line, exit 2, nothing written)."""

import json
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from backward_check import check
from conftest import ROOT, SAMPLE, TODAYS_ONNXRUNTIME, needs_ort_training, needs_todays_onnxruntime, roam
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx_builder import model, node, save

from roam_cli.backward.graph import gradient_model
from roam_cli.backward.step import training_model
from roam_cli.core.errors import RoamError
from roam_cli.frontend.optimizer_graph import gradient_accumulators
from roam_cli.lower import lower_model

FIXTURES = ROOT / "tests" / "fixtures"

# ---- random small graphs -----------------------------------------------------------------------

UNARY = ["Tanh", "Sigmoid", "Neg", "Relu", "Softmax"]
BINARY = ["Add", "Sub", "Mul", "Max", "MatMul"]


@st.composite
def small_graphs(draw):
    """3 to 7 ops over a[2,3], b[3], c[2,1], w[3,3]; each reads earlier tensors, so tensors fan out
    and broadcast. Div divides by 1.5 + sigmoid (never near 0); MatMul takes a [2, 3] tensor."""
    shapes = {"a": (2, 3), "b": (3,), "c": (2, 1)}
    nodes = []
    for k in range(draw(st.integers(3, 7))):
        op = draw(st.sampled_from(UNARY + BINARY + ["Div"]))
        x = draw(st.sampled_from(sorted(shapes)))
        out = f"t{k}"
        if op in UNARY:
            nodes.append(helper.make_node(op, [x], [out], name=out))
            shapes[out] = shapes[x]
        elif op == "MatMul":
            x = draw(st.sampled_from(sorted(t for t, shape in shapes.items() if shape == (2, 3))))
            nodes.append(helper.make_node("MatMul", [x, "w"], [out], name=out))
            shapes[out] = (2, 3)
        else:
            y = draw(st.sampled_from(sorted(shapes)))
            if op == "Div":
                s = f"{out}.s"
                nodes += [helper.make_node("Sigmoid", [y], [s], name=s),
                          helper.make_node("Add", [s, "k"], [f"{s}1"], name=f"{s}1")]
                y = f"{s}1"
                shapes[y] = shapes[nodes[-2].input[0]]
            nodes.append(helper.make_node(op, [x, y], [out], name=out))
            shapes[out] = np.broadcast_shapes(shapes[x], shapes[y])
    # the result reads every tensor made, broadcast to [2, 3]
    made = [t for t in shapes if t.startswith("t")]
    nodes.append(helper.make_node("Sum", [*made, "a"], ["y"], name="y"))
    return nodes


@settings(max_examples=25, deadline=None)
@given(small_graphs(), st.integers(0, 2**16))
def test_random_graphs_match_finite_differences(nodes, seed):
    rng = np.random.default_rng(seed)
    feeds = {"a": rng.standard_normal((2, 3)), "b": rng.standard_normal(3), "c": rng.standard_normal((2, 1)),
             "w": rng.standard_normal((3, 3))}
    check(nodes, feeds, ["a", "b", "c", "w"], {"k": np.array(1.5)})


# ---- the sample: gradients equal ONNX Runtime's artifacts training graph's ----------------------

def without_dropout(m: onnx.ModelProto) -> onnx.ModelProto:
    """The sample's Dropout ratio (val_112, in both graphs) set to 0."""
    for t in m.graph.initializer:
        if t.name == "val_112":
            t.CopyFrom(numpy_helper.from_array(np.array(0.0, np.float32), "val_112"))
    return m


def gradients(m: onnx.ModelProto, params, feeds) -> dict:
    m.graph.output.extend(helper.make_empty_tensor_value_info(f"{p}_grad") for p in params)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = {i.name for i in s.get_inputs()}
    return dict(zip(params, s.run([f"{p}_grad" for p in params], {k: v for k, v in feeds.items() if k in names})))


def random_feeds(graph: onnx.GraphProto, labels: int, scale: float) -> dict:
    """Inputs for both routes' training graphs: ids and labels below `labels`, zero accumulators and
    flags, unit running variances, small normal values elsewhere."""
    rng = np.random.default_rng(0)
    feeds = {}
    for i in graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
        feeds[i.name] = (rng.integers(0, labels, shape).astype(dtype) if dtype == np.int64 else
                         np.zeros(shape, dtype) if dtype == np.bool_ or "accumulation" in i.name else
                         np.ones(shape, dtype) if i.name.endswith("running_var") else
                         (rng.standard_normal(shape) * scale).astype(dtype))
    return feeds


@needs_ort_training
def test_sample_gradients_equal_onnx_runtime_artifacts_within_1e_4():
    theirs = without_dropout(onnx.load(str(SAMPLE)))
    params = list(gradient_accumulators(theirs.graph))
    forward = without_dropout(onnx.load(str(SAMPLE.parent / "eval_model.onnx")))
    ours, unreached = training_model(forward, params, [], "none")
    assert unreached == []
    feeds = random_feeds(theirs.graph, labels=64, scale=0.2)
    a, b = gradients(lower_model(ours), params, feeds), gradients(theirs, params, feeds)
    floor = 1e-3 * max(np.abs(g).max() for g in b.values())
    for p in params:
        assert np.abs(a[p] - b[p]).max() <= 1e-4 * max(np.abs(b[p]).max(), floor), p


# ---- the fixtures: standard-ONNX steps that plan, verify and train -----------------------------

# tiny_resnet's step is slow: test_plan_workspace makes, plans, verifies and trains it in the default run
@pytest.mark.parametrize("name, loss", [("tiny_gpt2", "none"), ("tiny_bert", "none"),
                                        pytest.param("tiny_resnet", "cross-entropy", marks=pytest.mark.slow)])
def test_fixture_full_step_is_standard_onnx_that_plans_verifies_and_trains(tmp_path, name, loss):
    step, plan = tmp_path / "step.onnx", tmp_path / "plan.json"
    r = roam("make-training-graph", FIXTURES / name / "forward.onnx", "-o", step, "--loss", loss, "--in-graph-optimizer")
    assert r.code == 0, r.err
    m = onnx.load(str(step))
    onnx.checker.check_model(m)
    assert {n.domain for n in m.graph.node} == {""}
    assert all(not n.op_type.endswith("Grad") for n in m.graph.node)
    inplace = json.loads({p.key: p.value for p in m.metadata_props}["roam.inplace"])
    params = [i.name for i in m.graph.input if f"{i.name}.out" in inplace and f"{i.name}.exp_avg" in inplace.values()]
    assert params and all(inplace[f"{p}.out"] == p for p in params)
    assert roam("optimize", step, "-o", plan, "--recompute", "off", "--order", "greedy").code == 0
    assert roam("verify", step, plan).code == 0
    r = roam("train", step, "--plan", plan, "--steps", "3")
    assert r.code == 0, r.err
    losses = [float(line.split("loss ")[1].split()[0]) for line in r.out.splitlines() if line.startswith("step ")]
    assert len(losses) == 3 and all(np.isfinite(losses))  # Dropout is on: the loss need not go down each step


@needs_todays_onnxruntime
def test_fixture_full_steps_run_on_todays_onnxruntime(tmp_path):
    """The three full steps, built here, run two steps in today's onnxruntime (no training build, no
    roam): finite losses, and the parameters moved."""
    paths = []
    for name, loss in [("tiny_gpt2", "none"), ("tiny_bert", "none"), ("tiny_resnet", "cross-entropy")]:
        step = tmp_path / f"{name}.onnx"
        assert roam("make-training-graph", FIXTURES / name / "forward.onnx", "-o", step, "--loss", loss,
                    "--in-graph-optimizer").code == 0
        paths.append(str(step))
    script = """
import json, sys, numpy as np, onnx, onnxruntime as ort
for path in sys.argv[1:]:
    m = onnx.load(path)
    pairs = json.loads({p.key: p.value for p in m.metadata_props}["roam.inplace"])
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    types = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(bool)": np.bool_}
    feeds = {}
    for i in s.get_inputs():
        t = types[i.type]
        feeds[i.name] = (np.abs(rng.standard_normal(i.shape)).astype(t) * 0.1 if t == np.float32 else
                         np.full(i.shape, 0.001 if i.name == "learning_rate" else 0, t))
    names = [o.name for o in s.get_outputs()]
    losses, before = [], {state: feeds[state].copy() for state in pairs.values()}
    for _ in range(2):
        out = dict(zip(names, s.run(None, feeds)))
        losses.append(float(out[names[0]]))
        feeds.update({state: out[new] for new, state in pairs.items()})
    moved = sum(not np.array_equal(before[state], feeds[state]) for state in before)
    print(losses[0], losses[1], moved, len(before))
"""
    proc = subprocess.run([TODAYS_ONNXRUNTIME, "-c", script, *paths], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for line in proc.stdout.split("\n")[:3]:
        first, second, moved, states = map(float, line.split())
        assert np.isfinite(first) and np.isfinite(second) and moved == states


def test_fixture_training_graph_has_artifacts_names_and_no_optimizer_graph(tmp_path):
    out = tmp_path / "train.onnx"
    r = roam("make-training-graph", FIXTURES / "tiny_resnet" / "forward.onnx", "-o", out, "--loss", "cross-entropy")
    assert r.code == 0, r.err
    m = onnx.load(str(out))
    inputs = [i.name for i in m.graph.input]
    assert "labels" in inputs and "lazy_reset_grad" in inputs
    buffers = [x for x in inputs if x.endswith("_grad.accumulation.buffer")]
    assert len(buffers) == 20
    inplace = json.loads({p.key: p.value for p in m.metadata_props}["roam.inplace"])
    assert sorted(inplace.values()) == sorted(buffers)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.onnx"]


# ---- refusals ----------------------------------------------------------------------------------

def refused(tmp_path, m, *args):
    path = save(m, tmp_path / "m.onnx")
    r = roam("make-training-graph", path, "-o", tmp_path / "t.onnx", "--in-graph-optimizer", *args)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
    return r.err


def test_an_op_without_a_rule_is_refused_naming_op_and_node(tmp_path):
    m = model([node("MatMul", ["x", "fc.weight"], ["h"]), node("Selu", ["h"], ["y"], name="act")],
              [("x", [2, 3])], [("y", [2, 4])], {"fc.weight": np.ones((3, 4), np.float32)})
    err = refused(tmp_path, m, "--loss", "mse")
    assert "Selu node 'act'" in err and "no gradient rule" in err


def test_an_integer_path_that_needs_a_gradient_is_refused(tmp_path):
    m = model([node("Cast", ["fc.weight"], ["w_int"], name="to_int", to=TensorProto.INT64),
               node("Cast", ["w_int"], ["w"], name="to_float", to=TensorProto.FLOAT),
               node("MatMul", ["x", "w"], ["y"])],
              [("x", [2, 3])], [("y", [2, 4])], {"fc.weight": np.ones((3, 4), np.float32)})
    err = refused(tmp_path, m, "--loss", "mse")
    assert "Cast node 'to_int'" in err and "integer type" in err


def test_a_data_dependent_shape_is_refused(tmp_path):
    m = model([node("NonZero", ["mask"], ["where"]), node("Squeeze", ["where", "zero"], ["rows"]),
               node("Gather", ["fc.weight", "rows"], ["picked"]),
               node("ReduceSum", ["picked", "zero"], ["y"], name="total", keepdims=1)],
              [("mask", [4], TensorProto.BOOL)], [("y", [1, 3])],
              {"fc.weight": np.ones((4, 3), np.float32), "zero": np.array([0])})
    err = refused(tmp_path, m, "--loss", "mse")
    assert "ReduceSum node 'total'" in err and "not static" in err


def test_a_symbolic_dimension_is_refused(tmp_path):
    m = model([node("MatMul", ["x", "fc.weight"], ["y"])], [("x", ["batch", 3])], [("y", ["batch", 4])],
              {"fc.weight": np.ones((3, 4), np.float32)})
    err = refused(tmp_path, m, "--loss", "mse")
    assert "static shapes" in err and "'batch'" in err and "--dim batch=N" in err


def test_dim_binds_a_symbolic_dimension_before_differentiating(tmp_path):
    m = model([node("MatMul", ["x", "fc.weight"], ["y"])], [("x", ["batch", 3])], [("y", ["batch", 4])],
              {"fc.weight": np.ones((3, 4), np.float32)})
    out = tmp_path / "t.onnx"
    r = roam("make-training-graph", save(m, tmp_path / "m.onnx"), "-o", out, "--loss", "mse", "--dim", "batch=5")
    assert r.code == 0, r.err
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in onnx.load(str(out)).graph.input}
    assert shapes["x"] == [5, 3] and shapes["target"] == [5, 4]


def test_dim_naming_no_input_dimension_is_refused(tmp_path):
    m = model([node("MatMul", ["x", "fc.weight"], ["y"])], [("x", ["batch", 3])], [("y", ["batch", 4])],
              {"fc.weight": np.ones((3, 4), np.float32)})
    err = refused(tmp_path, m, "--loss", "mse", "--dim", "btach=5")
    assert "--dim btach" in err and "batch" in err


def test_cross_entropy_refuses_labels_that_do_not_fit_the_logits(tmp_path):
    m = model([node("MatMul", ["x", "fc.weight"], ["y"])], [("x", [2, 3, 4]), ("labels", [3], TensorProto.INT64)],
              [("y", [2, 3, 5])], {"fc.weight": np.ones((4, 5), np.float32)})
    err = refused(tmp_path, m, "--loss", "cross-entropy")
    assert "labels [3] do not fit" in err


def test_cross_entropy_on_an_export_that_computes_its_loss_is_refused_saying_loss_none(tmp_path):
    """A causal LM exported with its labels (the tiny LLaMA of roam's torch exporter: token ids and
    labels in, the scalar loss out): cross-entropy has no logits to read, so it is refused in one line
    instead of crashing on the scalar's missing batch axis; --loss none builds the step."""
    m = model([node("Gather", ["embed.weight", "x"], ["h"]), node("MatMul", ["h", "lm_head.weight"], ["logits"]),
               node("Reshape", ["logits", "flat"], ["scores"]), node("Reshape", ["labels", "rows"], ["targets"]),
               node("SoftmaxCrossEntropyLoss", ["scores", "targets"], ["out"], reduction="mean")],
              [("x", [2, 8], TensorProto.INT64), ("labels", [2, 8], TensorProto.INT64)], [("out", [])],
              {"embed.weight": np.ones((16, 4), np.float32), "lm_head.weight": np.ones((4, 16), np.float32),
               "flat": np.array([-1, 16], np.int64), "rows": np.array([-1], np.int64)})
    err = refused(tmp_path, m, "--loss", "cross-entropy")
    assert "the first output 'out' is a scalar" in err and "takes --loss none" in err, err
    r = roam("make-training-graph", tmp_path / "m.onnx", "-o", tmp_path / "step.onnx", "--loss", "none",
             "--in-graph-optimizer")
    assert r.code == 0, r.err


@pytest.mark.parametrize("labels, expected_axis", [([2, 3], "last"), ([2, 5], "1")])
def test_cross_entropy_finds_the_class_axis(labels, expected_axis):
    """Logits [2, 5, 3] with labels [2, 5]: classes last (language model); with labels [2, 3]
    the class axis is 1. The loss equals numpy's mean negative log-likelihood either way."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, 5, 3)).astype(np.float32)
    shape = [2, 5] if expected_axis == "last" else [2, 3]
    classes = 3 if expected_axis == "last" else 5
    label_values = rng.integers(0, classes, shape)
    m = model([node("Identity", ["x"], ["y"])], [("x", [2, 5, 3]), ("labels", shape, TensorProto.INT64)],
              [("y", [2, 5, 3])])
    step, _ = training_model(m, ["x"], [], "cross-entropy")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(lower_model(step).SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = {"x": logits, "labels": label_values, "x_grad.accumulation.buffer": np.zeros_like(logits),
             "lazy_reset_grad": np.array([True])}
    loss = s.run(["loss"], feeds)[0]
    z = logits if expected_axis == "last" else np.moveaxis(logits, 1, -1)
    log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))
    expected = -np.take_along_axis(log_p, label_values[..., None], -1).mean()
    assert abs(float(loss) - expected) < 1e-5


def test_gradient_model_names_gradients_after_their_parameters():
    m = model([node("Mul", ["x", "p.w"], ["h"]), node("Mul", ["h", "p.w"], ["y"]), node("ReduceSum", ["y"], ["loss"], keepdims=0)],
              [("x", [3]), ("p.w", [3])], [("loss", [])])
    g, grads = gradient_model(m, ["p.w", "x"], "loss")
    assert grads == {"p.w": "p.w_grad", "x": "x_grad"}
    assert [n.op_type for n in g.graph.node if n.output[0] == "p.w_grad"] == ["Sum"]  # two readers' parts summed
    with pytest.raises(RoamError, match="not a floating-point"):
        gradient_model(model([node("Shape", ["x"], ["s"])], [("x", [3])], [("s", [1], TensorProto.INT64)]), ["x"], "s")


# ---- the patterns of LLaMA-architecture exports ------------------------------------------------

def llama_block():
    """One decoder block as PyTorch exports it, batch 1, seq 3, 4 query heads and 2 key/value heads
    of size 2 (hidden 8): RMSNorm (Pow, ReduceMean, Add, Sqrt, Reciprocal), rotary embeddings (Slice,
    Neg, Concat, Mul by cos/sin tables), grouped-query attention (Unsqueeze, Expand, Reshape of the
    key/value heads; causal mask by Where), SiLU MLP (Sigmoid * x)."""
    rng = np.random.default_rng(3)
    s, h, kv, d, hidden = 3, 4, 2, 2, 8
    ang = np.arange(s)[:, None] * np.array([0.7])[None]  # one frequency: head size 2
    consts = {"two": np.array(2.0), "eps": np.array(1e-6), "ln.w": rng.standard_normal(hidden),
              "cos": np.cos(np.concatenate([ang, ang], -1)), "sin": np.sin(np.concatenate([ang, ang], -1)),
              "q_shape": np.array([1, s, h, d]), "kv_shape": np.array([1, s, kv, d]), "kv_ex": np.array([1, kv, 2, s, d]),
              "kv_heads": np.array([1, h, s, d]), "out_shape": np.array([1, s, hidden]), "ax_last": np.array([-1]),
              "ax2": np.array([2]), "half0": np.array([0]), "half1": np.array([1]), "half2": np.array([2]),
              "scale": np.array(1 / np.sqrt(d)), "causal": np.tril(np.ones((s, s), bool)), "neg_inf": np.array(-1e9)}
    N = []

    def op(kind, ins, out, **a):
        N.append(helper.make_node(kind, ins, [out], name=out, **a))
        return out

    sq = op("Pow", ["x", "two"], "sq")
    var = op("ReduceMean", [sq, "ax_last"], "var", keepdims=1)
    inv = op("Reciprocal", [op("Sqrt", [op("Add", [var, "eps"], "var_eps")], "rms")], "inv")
    normed = op("Mul", [op("Mul", ["x", inv], "xn"), "ln.w"], "normed")

    def rope(t, name):
        x1 = op("Slice", [t, "half0", "half1", "ax_last"], f"{name}.x1")
        x2 = op("Slice", [t, "half1", "half2", "ax_last"], f"{name}.x2")
        rotated = op("Concat", [op("Neg", [x2], f"{name}n"), x1], f"{name}rot", axis=-1)
        return op("Add", [op("Mul", [t, "cos"], f"{name}c"), op("Mul", [rotated, "sin"], f"{name}s")], f"{name}rope")

    q = op("Transpose", [op("Reshape", [op("MatMul", [normed, "wq"], "q0"), "q_shape"], "q1")], "q", perm=[0, 2, 1, 3])
    k = op("Transpose", [op("Reshape", [op("MatMul", [normed, "wk"], "k0"), "kv_shape"], "k1")], "k", perm=[0, 2, 1, 3])
    v = op("Transpose", [op("Reshape", [op("MatMul", [normed, "wv"], "v0"), "kv_shape"], "v1")], "v", perm=[0, 2, 1, 3])
    q, k = rope(q, "q"), rope(k, "k")

    def repeat(t, name):  # [1, kv, s, d] -> [1, h, s, d]
        ex = op("Expand", [op("Unsqueeze", [t, "ax2"], f"{name}u"), "kv_ex"], f"{name}e")
        return op("Reshape", [ex, "kv_heads"], f"{name}r")

    k, v = repeat(k, "k"), repeat(v, "v")
    scores = op("Mul", [op("MatMul", [q, op("Transpose", [k], "kt", perm=[0, 1, 3, 2])], "qk"), "scale"], "scores")
    probs = op("Softmax", [op("Where", ["causal", scores, "neg_inf"], "masked")], "probs", axis=-1)
    attn = op("Reshape", [op("Transpose", [op("MatMul", [probs, v], "pv")], "pvt", perm=[0, 2, 1, 3])], "attn_in")
    N[-1].input.append("out_shape")
    h1 = op("Add", ["x", op("MatMul", [attn, "wo"], "o")], "h1")
    gate = op("MatMul", [h1, "wg"], "gate")
    silu = op("Mul", [gate, op("Sigmoid", [gate], "sig")], "silu")
    op("Add", [h1, op("MatMul", [op("Mul", [silu, op("MatMul", [h1, "wu"], "up")], "act"), "wd"], "down")], "y")
    feeds = {"x": rng.standard_normal((1, s, hidden)), "wq": rng.standard_normal((hidden, h * d)) * 0.5,
             "wk": rng.standard_normal((hidden, kv * d)) * 0.5, "wv": rng.standard_normal((hidden, kv * d)) * 0.5,
             "wo": rng.standard_normal((h * d, hidden)) * 0.5, "wg": rng.standard_normal((hidden, 6)) * 0.5,
             "wu": rng.standard_normal((hidden, 6)) * 0.5, "wd": rng.standard_normal((6, hidden)) * 0.5}
    return N, feeds, consts


def test_llama_block_rmsnorm_rope_gqa_silu_matches_finite_differences():
    nodes, feeds, consts = llama_block()
    check(nodes, feeds, list(feeds), consts)


# ---- the fixtures' gradients against ONNX Runtime's artifacts route (needs torch) ---------------

@needs_ort_training
@pytest.mark.parametrize("name, loss", [("tiny_gpt2", "none"), ("tiny_bert", "none"), ("tiny_resnet", "cross-entropy")])
def test_fixture_gradients_equal_the_artifacts_routes_within_1e_4(name, loss):
    pytest.importorskip("torch", reason="the artifacts route imports torch")
    from roam_cli.frontend import training_graph
    from roam_cli.frontend.onnx_import import load_model

    forward, _ = load_model(FIXTURES / name / "forward.onnx")
    forward.graph.initializer.append(numpy_helper.from_array(np.array(0.0, np.float32), "no_dropout"))
    for n in forward.graph.node:
        if n.op_type == "Dropout":
            n.input[1] = "no_dropout"
    training_graph.repair(forward)
    chosen = training_graph.survey(forward)
    theirs = training_graph.build(forward, chosen, loss, None).training
    ours, unreached = training_model(forward, chosen.trainable, chosen.frozen, loss)
    assert unreached == []
    feeds = random_feeds(theirs.graph, labels=10, scale=0.1)
    a, b = gradients(lower_model(ours), chosen.trainable, feeds), gradients(theirs, chosen.trainable, feeds)
    floor = 1e-3 * max(np.abs(g).max() for g in b.values())  # a gradient zero in exact arithmetic is noise
    for p in chosen.trainable:
        assert np.abs(a[p] - b[p]).max() <= 1e-4 * max(np.abs(b[p]).max(), floor), p


def test_a_parameter_reaching_the_loss_only_through_a_shape_needs_no_rule():
    """Selu has no rule, but its result reaches the loss only through Shape: nothing to differentiate."""
    m = model([node("Selu", ["p.w"], ["s"]), node("Shape", ["s"], ["shape"]), node("Reshape", ["x", "shape"], ["r"]),
               node("Mul", ["r", "p.w"], ["y"]), node("ReduceSum", ["y"], ["loss"], keepdims=0)],
              [("x", [2, 3]), ("p.w", [2, 3])], [("loss", [])])
    _, grads = gradient_model(m, ["p.w"], "loss")
    assert grads == {"p.w": "p.w_grad"}


def test_a_constant_mask_sliced_to_the_sequence_is_kept_as_the_slice():
    """GPT-2's causal mask: a [4, 4] bool buffer sliced to [2, 2] before a Where. The step keeps the
    slice (folded), not the buffer, and the gradient is still dy where the mask holds, 0 elsewhere."""
    mask = np.tril(np.ones((4, 4), bool))
    m = model([node("Slice", ["causal", "zeros", "twos"], ["visible"]),
               node("Where", ["visible", "x", "zero"], ["h"]), node("Mul", ["h", "fc.weight"], ["y"])],
              [("x", [2, 2])], [("y", [2, 2])],
              {"causal": mask, "zeros": np.array([0, 0]), "twos": np.array([2, 2]),
               "zero": np.array(0.0, np.float32), "fc.weight": np.full((2, 2), 3.0, np.float32)})
    step, _ = training_model(m, ["fc.weight", "x"], [], "none")
    kept = {t.name: numpy_helper.to_array(t) for t in step.graph.initializer}
    assert "causal" not in kept and kept["visible"].tolist() == [[True, False], [True, True]]
    assert not any(n.op_type == "Slice" for n in step.graph.node)
    x = np.arange(1.0, 5.0, dtype=np.float32).reshape(2, 2)
    step.graph.output.extend(helper.make_empty_tensor_value_info(g) for g in ("x_grad", "fc.weight_grad"))
    s = ort.InferenceSession(lower_model(step).SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"x": x, "fc.weight": np.full((2, 2), 3.0, np.float32), "lazy_reset_grad": np.ones(1, bool),
             "x_grad.accumulation.buffer": np.zeros((2, 2), np.float32),
             "fc.weight_grad.accumulation.buffer": np.zeros((2, 2), np.float32)}
    wanted = {i.name for i in s.get_inputs()}
    dx, dw = s.run(["x_grad", "fc.weight_grad"], {k: v for k, v in feeds.items() if k in wanted})
    assert dx.tolist() == [[3.0, 0.0], [3.0, 3.0]] and dw.tolist() == [[1.0, 0.0], [3.0, 4.0]]


def test_every_backward_node_feeds_a_gradient():
    """h = x * W + m with m a broadcast [2, 1] input that needs no gradient: Add's rule may make a
    part for m (a ReduceSum over dy), which nothing would read and ONNX Runtime would hold to the
    step's end. The backward keeps only nodes some gradient depends on."""
    m = model([node("Mul", ["x", "W"], ["h"]), node("Add", ["h", "m"], ["s"]), node("ReduceSum", ["s"], ["loss"], keepdims=0)],
              [("x", [2, 3]), ("W", [2, 3]), ("m", [2, 1])], [("loss", [])])
    g, grads = gradient_model(m, ["W"], "loss")
    read = {x for n in g.graph.node for x in n.input} | {o.name for o in g.graph.output}
    assert grads == {"W": "W_grad"}
    assert [n.name for n in g.graph.node if not read & set(n.output)] == []


def test_a_mask_combined_from_constants_is_kept_as_its_one_result():
    """GPT-2 medium's causal mask: And of two constant [4, 4] comparisons, reshaped, before a Where.
    The step keeps the result (16 bools), not the three constants it was computed from."""
    rows, cols = np.indices((4, 4))
    m = model([node("And", ["lower", "ones"], ["both"]), node("Reshape", ["both", "shape"], ["visible"]),
               node("Where", ["visible", "x", "zero"], ["h"]), node("Mul", ["h", "fc.weight"], ["y"])],
              [("x", [2, 8])], [("y", [2, 8])],
              {"lower": cols <= rows, "ones": np.ones((4, 4), bool), "shape": np.array([2, 8]),
               "zero": np.array(0.0, np.float32), "fc.weight": np.full((2, 8), 3.0, np.float32)})
    step, _ = training_model(m, ["fc.weight"], [], "none")
    kept = {t.name: numpy_helper.to_array(t) for t in step.graph.initializer}
    assert not {"lower", "ones", "shape", "both"} & set(kept)
    assert kept["visible"].dtype == bool and kept["visible"].tolist() == (cols <= rows).reshape(2, 8).tolist()
    assert [n.op_type for n in step.graph.node if n.op_type in ("And", "Reshape")] == []


@pytest.mark.parametrize("shape, labels", [([2, 4, 5], [2, 4]), ([2, 3, 4, 4], [2, 4, 4]), ([2, 3], [2])])
def test_cross_entropy_labels_leave_out_the_class_axis_last_for_sequences_else_axis_1(shape, labels):
    """[batch, seq, vocab] language-model logits: classes last; [batch, classes, h, w] segmentation
    logits (SegFormer): classes on axis 1, ONNX's layout; [batch, classes]: axis 1."""
    from roam_cli.backward.loss import add_loss

    m = model([node("Relu", ["x"], ["y"], name="r")], [("x", shape)], [("y", shape)], {})
    loss_name = add_loss(m, "cross-entropy", {"y": (TensorProto.FLOAT, shape)})
    m.graph.output.append(helper.make_tensor_value_info(loss_name, TensorProto.FLOAT, []))
    given = next(i for i in m.graph.input if i.name == "labels")
    assert [d.dim_value for d in given.type.tensor_type.shape.dim] == labels
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    y = np.zeros(labels, np.int64)
    (loss,) = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        [loss_name], {"x": x, "labels": y})
    relu = np.maximum(x, 0)
    axis = -1 if len(shape) == 3 else 1
    logp = relu - np.log(np.exp(relu).sum(axis=axis, keepdims=True))
    np.testing.assert_allclose(loss, -np.take(logp, 0, axis=axis).mean(), rtol=1e-5)
