"""The forward simplified before differentiating: constant expressions folded into initializers
(`rewrite.fold_constants`) and sequence ops lowered to tensor ops (`sequences.lower_sequences`),
as torch.onnx's exports with optimize=False need (RMSNorm's axes, sliced positions, torch.split)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from backward_check import finite_differences, session, weighted_loss
from conftest import roam
from onnx import TensorProto, helper, numpy_helper
from onnx_builder import model, node, save

from roam_cli.backward.engine import static_types
from roam_cli.backward.graph import gradient_model
from roam_cli.backward.rewrite import SMALL_BYTES, fold_constants
from roam_cli.backward.sequences import lower_sequences
from roam_cli.backward.step import as_inputs, training_model
from roam_cli.lower import lower_model

D = TensorProto.DOUBLE


def const(name, value):
    return node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def folded(m: onnx.ModelProto) -> dict[str, np.ndarray]:
    fold_constants(m, static_types(m))
    return {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}


def ops(m: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in m.graph.node]


# ---- constant folding ----------------------------------------------------------------------------

def test_rmsnorm_with_axes_computed_from_constants_differentiates_and_matches_finite_differences():
    """torch.onnx's dynamo export writes RMSNorm's axes as Reshape(Constant, Constant): the rule
    needs them constant. After folding, w's and x's gradients equal central differences."""
    nodes = [const("axes_flat", [-1]), const("axes_shape", [1]), node("Reshape", ["axes_flat", "axes_shape"], ["axes"]),
             node("Mul", ["x", "x"], ["sq"]), node("ReduceMean", ["sq", "axes"], ["ms"], name="mean", keepdims=1),
             node("Add", ["ms", "eps"], ["var"]), node("Sqrt", ["var"], ["rms"]), node("Div", ["x", "rms"], ["n"]),
             node("Mul", ["n", "w"], ["y"])]
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 3, 4)), "w": rng.standard_normal(4)}
    m = weighted_loss(nodes, feeds, {"eps": np.array(1e-6)}, opset=18)
    with pytest.raises(Exception, match="its axes must be a constant"):
        gradient_model(m, ["x", "w"], "loss")
    assert fold_constants(m, static_types(m)) == 3
    grad_model, grads = gradient_model(m, ["x", "w"], "loss")
    got = session(grad_model).run([grads["x"], grads["w"]], feeds)
    for value, name in zip(got, ["x", "w"]):
        expected = finite_differences(m, feeds, name, 1e-6)
        assert np.abs(value - expected).max() < 1e-6 * np.abs(expected).max(), name


def test_a_shape_chain_folds_to_the_shape_it_computes():
    """x [2, 3, 4] viewed as [x.shape[0], -1]: Shape -> Gather -> Unsqueeze -> Concat becomes the
    constant [2, -1], read by the Reshape; the chain's nodes and constants go."""
    m = model([node("Shape", ["x"], ["shape"]), const("zero", np.array(0)),
               node("Gather", ["shape", "zero"], ["batch"]),
               const("axis0", [0]), node("Unsqueeze", ["batch", "axis0"], ["batch1"]), const("rest", [-1]),
               node("Concat", ["batch1", "rest"], ["view"], axis=0), node("Reshape", ["x", "view"], ["y"])],
              [("x", [2, 3, 4])], [("y", [2, 12])])
    kept = folded(m)
    assert ops(m) == ["Reshape"] and list(m.graph.node[0].input) == ["x", "view"]
    assert sorted(kept) == ["view"] and kept["view"].tolist() == [2, -1] and kept["view"].dtype == np.int64


@pytest.mark.parametrize("op, attrs, expected", [("Shape", {}, [2, 3, 4]), ("Shape", {"start": 1}, [3, 4]),
                                                 ("Shape", {"start": -2, "end": -1}, [3]),
                                                 ("Shape", {"start": -9, "end": 9}, [2, 3, 4]), ("Size", {}, 24)])
def test_shape_and_size_of_a_static_tensor_fold_with_start_and_end(op, attrs, expected):
    m = model([node("Mul", ["x", "x"], ["x2"]), node(op, ["x2"], ["s"], **attrs), node("Cast", ["s"], ["f"], to=1),
               node("ReduceSum", ["f"], ["y"], keepdims=0)], [("x", [2, 3, 4])], [("y", [])])
    kept = folded(m)
    assert kept["y"].tolist() == float(np.sum(expected)) and ops(m) == ["Mul"]  # x2's value is not read


def test_a_value_depending_on_a_parameter_is_never_folded():
    """p.w is an initializer until `as_inputs` makes it a graph input: then Add(p.w, 1) stays, while
    the Shape of p.w (static: its value is not read) still folds."""
    m = model([node("Add", ["p.w", "one"], ["h"]), node("Shape", ["p.w"], ["s"]), node("Reshape", ["h", "s"], ["y"])],
              [], [("y", [2, 2])], {"p.w": np.ones((2, 2), np.float32), "one": np.array(1.0, np.float32)})
    as_inputs(m.graph, ["p.w"])
    kept = folded(m)
    assert ops(m) == ["Add", "Reshape"] and sorted(kept) == ["one", "s"] and kept["s"].tolist() == [2, 2]


def test_a_large_constant_is_left_to_run_when_materialising_it_would_grow_what_is_kept():
    """ConstantOfShape [64, 64] (16 KiB from a 16-byte shape) added to data: kept as the node, not
    as an initializer. Sliced to [2, 2] instead, the slice is kept and the big value is not."""
    shape = np.array([64, 64])
    assert 64 * 64 * 4 > SMALL_BYTES
    added = model([const("shape", shape), node("ConstantOfShape", ["shape"], ["mask"], value=numpy_helper.from_array(
        np.ones(1, np.float32))), node("Add", ["x", "mask"], ["y"])], [("x", [64, 64])], [("y", [64, 64])])
    kept = folded(added)
    assert ops(added) == ["ConstantOfShape", "Add"] and sorted(kept) == ["shape"]
    sliced = model([const("shape", shape), node("ConstantOfShape", ["shape"], ["mask"], value=numpy_helper.from_array(
        np.full(1, 3.0, np.float32))), const("zeros", [0, 0]), const("twos", [2, 2]),
        node("Slice", ["mask", "zeros", "twos"], ["corner"]), node("Add", ["x", "corner"], ["y"])],
        [("x", [2, 2])], [("y", [2, 2])])
    kept = folded(sliced)
    assert ops(sliced) == ["Add"] and sorted(kept) == ["corner"] and kept["corner"].tolist() == [[3.0, 3.0]] * 2


def test_random_ops_are_never_folded():
    m = model([const("shape", [2]), node("RandomUniformLike", ["shape"], ["r"], dtype=1),
               node("Add", ["x", "r"], ["y"])],
              [("x", [2])], [("y", [2])])
    folded(m)
    assert ops(m) == ["RandomUniformLike", "Add"]


# ---- sequence lowering ---------------------------------------------------------------------------

def sequence_model(nodes, out_shapes, x_shape=(2, 6, 4)):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", D, list(x_shape))],
                              [helper.make_tensor_value_info(name, D, shape) for name, shape in out_shapes.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 10
    return m


def split_at(split, keepdims, positions, shapes):
    inputs = ["x", "split"] if split is not None else ["x"]
    nodes = ([const("split", split)] if split is not None else []) + [
        node("SplitToSequence", inputs, ["seq"], axis=1, keepdims=keepdims)]
    for k, at in enumerate(positions):
        nodes += [const(f"at{k}", np.array(at)), node("SequenceAt", ["seq", f"at{k}"], [f"y{k}"])]
    return sequence_model(nodes, {f"y{k}": s for k, s in enumerate(shapes)})


CASES = {  # name: (the model, the tensor ops its sequence ops become)
    "chunk size, last smaller": (lambda: split_at(np.array(4), 1, [0, 1, -1], [[2, 4, 4], [2, 2, 4], [2, 2, 4]]),
                                 ["Split", "Identity", "Identity"]),  # element 1, read twice, keeps its name
    "sizes": (lambda: split_at(np.array([1, 2, 3]), 0, [2, -3], [[2, 3, 4], [2, 1, 4]]), ["Split"]),
    "one per index, squeezed": (lambda: split_at(None, 0, [5, 0], [[2, 4], [2, 4]]), ["Split", "Squeeze", "Squeeze"]),
    "one per index, kept": (lambda: split_at(None, 1, [3], [[2, 1, 4]]), ["Split"]),
    "concat of a split": (lambda: sequence_model([const("split", np.array([2, 2, 2])),
                                                  node("SplitToSequence", ["x", "split"], ["seq"], axis=1),
                                                  node("ConcatFromSequence", ["seq"], ["y"], axis=2)],
                                                 {"y": [2, 2, 12]}), ["Split", "Concat"]),
    "stack of a construct": (lambda: sequence_model([node("Neg", ["x"], ["n"]),
                                                     node("SequenceConstruct", ["x", "n", "x"], ["seq"]),
                                                     node("ConcatFromSequence", ["seq"], ["y"], axis=-1, new_axis=1)],
                                                    {"y": [2, 6, 4, 3]}), ["Neg"] + ["Unsqueeze"] * 3 + ["Concat"]),
    "insert into empty, at, length": (lambda: sequence_model([
        node("SequenceEmpty", [], ["e"], dtype=D), node("Neg", ["x"], ["n"]),
        node("SequenceInsert", ["e", "x"], ["s1"]), const("front", np.array(-1)),
        node("SequenceInsert", ["s1", "n", "front"], ["s2"]), const("first", np.array(0)),
        node("SequenceAt", ["s2", "first"], ["y"]), node("SequenceLength", ["s2"], ["count"]),
        node("Cast", ["count"], ["c"], to=D), node("Mul", ["y", "c"], ["z"])],
        {"y": [2, 6, 4], "z": [2, 6, 4]}), ["Neg", "Identity", "Constant", "Cast", "Mul"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_sequence_ops_lower_to_tensor_ops_with_onnx_runtimes_results(name):
    build, expected_ops = CASES[name]
    m = build()
    onnx.checker.check_model(m, full_check=True)
    x = np.random.default_rng(0).standard_normal([d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim])
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    lower_sequences(m)
    onnx.checker.check_model(m, full_check=True)
    assert ops(m) == expected_ops and not any(vi.type.HasField("sequence_type") for vi in m.graph.value_info)
    got = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for a, b in zip(got, want):
        assert a.shape == b.shape and np.array_equal(a, b)
    static_types(m)  # shape inference sees tensors only


def test_a_split_element_is_written_by_the_split_under_the_sequence_ats_name():
    m = CASES["sizes"][0]()
    lower_sequences(m)
    (split,) = m.graph.node
    assert split.output[0] == "y1" and split.output[2] == "y0"


def test_gradients_through_a_lowered_split_match_finite_differences():
    """q, k = torch.split(x @ W, 3, dim=-1); loss = sum(q * k * r)."""
    nodes = [node("MatMul", ["x", "w"], ["h"]), const("three", np.array(3)),
             node("SplitToSequence", ["h", "three"], ["seq"], axis=-1), const("first", np.array(0)),
             const("last", np.array(-1)), node("SequenceAt", ["seq", "first"], ["q"]),
             node("SequenceAt", ["seq", "last"], ["k"]), node("Mul", ["q", "k"], ["y"])]
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((2, 4)), "w": rng.standard_normal((4, 6))}
    m = weighted_loss(nodes, feeds, {}, opset=18)
    lower_sequences(m)
    grad_model, grads = gradient_model(m, ["w"], "loss")
    got = session(lower_model(grad_model)).run([grads["w"]], feeds)[0]
    expected = finite_differences(m, feeds, "w", 1e-6)
    assert np.abs(got - expected).max() < 1e-6 * np.abs(expected).max()


def test_a_training_graph_is_built_from_an_export_with_split_and_computed_axes():
    """The two together through `training_model`: no sequence op and no axes computation left."""
    m = model([node("MatMul", ["x", "fc.weight"], ["h"]), const("two", np.array(2)),
               node("SplitToSequence", ["h", "two"], ["seq"], axis=1), const("at", np.array(1)),
               node("SequenceAt", ["seq", "at"], ["half"]), const("flat", [1]), const("one", [1]),
               node("Reshape", ["flat", "one"], ["axes"]), node("ReduceMean", ["half", "axes"], ["y"], keepdims=1)],
              [("x", [2, 3])], [("y", [2, 1])], {"fc.weight": np.ones((3, 4), np.float32)})
    step, unreached = training_model(m, ["fc.weight"], [], "mse")
    assert unreached == [] and not any("Sequence" in op for op in ops(step))
    assert numpy_helper.to_array(next(t for t in step.graph.initializer if t.name == "axes")).tolist() == [1]


def test_a_sequence_that_cannot_be_lowered_is_refused_in_one_line(tmp_path):
    """SequenceAt at a position computed at run time: the sequence stays, and today's refusal too."""
    m = model([node("MatMul", ["x", "fc.weight"], ["h"]), const("two", np.array(2)),
               node("SplitToSequence", ["h", "two"], ["seq"], axis=1),
               node("SequenceAt", ["seq", "where"], ["y"])],
              [("x", [2, 3]), ("where", [], TensorProto.INT64)], [("y", [2, 2])],
              {"fc.weight": np.ones((3, 4), np.float32)})
    r = roam("make-training-graph", save(m, tmp_path / "m.onnx"), "-o", tmp_path / "t.onnx", "--loss", "mse")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    assert "'seq' is of sequence type: roam plans tensors only" in r.err
