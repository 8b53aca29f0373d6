"""`roam shard`: the step of one of N ranks of fully sharded data parallelism (docs/sharding.md).

A hand-made MLP (x [B, 3] @ fc1.weight [3, 5] -> tanh -> @ fc2.weight [5, 2] + fc2.bias [2] ->
mean of squares) trained by roam's full step with AdamW: at N = 4 its parameters split into shards
of 4, 3 and 1 elements (15, 10 and 2 elements padded to 16, 12 and 4). The rank step at N = 1 is
the step itself (its collectives the identity); N ranks, each running its rank step on its rows
of a global batch with the collectives done in numpy between the graph's parts, update the
weights as the full step does on the whole batch. The sample's step plans and verifies at N = 2
and 4, its parameters and moments 1/N of their bytes."""

import json
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import SAMPLE, roam
from onnx import helper, numpy_helper
from onnx_builder import model, node, save
from small_models import functional

from roam_cli import recompute
from roam_cli.backward.step import build as roam_backward
from roam_cli.core import memory
from roam_cli.core.collectives import ALL_GATHER, REDUCE_SCATTER, SHARDING_KEY
from roam_cli.core.errors import RoamError
from roam_cli.frontend import training_graph
from roam_cli.frontend.onnx_import import import_model
from roam_cli.precision import LOW_TYPES, declared_types
from roam_cli.precision.emulate import emulate
from roam_cli.shard import shard
from roam_cli.shard.arithmetic import join, padding, shard_size, split

ROWS = 2  # each rank's batch
SHAPES = {"fc1.weight": (3, 5), "fc2.weight": (5, 2), "fc2.bias": (2,)}


def mlp(rows: int, shape_read: bool = False) -> onnx.ModelProto:
    """`shape_read`: the loss also scaled by k, fc1.weight's dimensions' sum (8)."""
    rng = np.random.default_rng(0)
    inits = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in SHAPES.items()}
    nodes = [node("MatMul", ["x", "fc1.weight"], ["h"]), node("Tanh", ["h"], ["a"]),
             node("MatMul", ["a", "fc2.weight"], ["y0"]), node("Add", ["y0", "fc2.bias"], ["y"]),
             node("Mul", ["y", "y"], ["sq"]), node("ReduceMean", ["sq"], ["loss"], keepdims=0)]
    if shape_read:
        nodes[-1].output[:] = ["mean"]
        nodes += [node("Shape", ["fc1.weight"], ["dims"]), node("Cast", ["dims"], ["dims_f"], to=onnx.TensorProto.FLOAT),
                  node("ReduceSum", ["dims_f"], ["k"], keepdims=0), node("Mul", ["mean", "k"], ["loss"])]
    return model(nodes, [("x", [rows, 3])], [("loss", [])], initializers=inits)


def full_step(folder, rows: int, shape_read: bool = False):
    save(mlp(rows, shape_read), folder / f"forward{rows}.onnx")
    path = folder / f"step{rows}{'_shape' * shape_read}.onnx"
    training_graph.make(folder / f"forward{rows}.onnx", path, loss="none", in_graph=True, backward=roam_backward)
    if shape_read:  # make folds k into a constant: read it from the weight's Shape again, as ORT's
        # artifacts do (an embedding's GatherGrad reads its table's Shape)
        step = onnx.load(path)
        k = next(t for t in step.graph.initializer if t.name == "k")
        step.graph.initializer.remove(k)
        step.graph.node.insert(0, node("ReduceSum", ["dims_f"], ["k"], keepdims=0))
        step.graph.node.insert(0, node("Cast", ["dims"], ["dims_f"], to=onnx.TensorProto.FLOAT))
        step.graph.node.insert(0, node("Shape", ["fc1.weight"], ["dims"]))
        onnx.save(step, path)
    return path


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    """{"roam": full step of ROWS rows, "functional": the same written as other tools write it,
    "global4": the full step of 4 x ROWS rows}, as paths."""
    d = tmp_path_factory.mktemp("mlp")
    made = {"roam": full_step(d, ROWS), "global4": full_step(d, 4 * ROWS), "global2": full_step(d, 2 * ROWS)}
    made["functional"] = d / "functional.onnx"
    save(functional(made["roam"]), made["functional"])
    return made


def initial_state(rng) -> dict[str, np.ndarray]:
    """Weights, and moments as after some steps (positive second moments), for every state input."""
    state = {}
    for name, shape in SHAPES.items():
        state[name] = rng.standard_normal(shape).astype(np.float32)
        state[f"{name}.exp_avg"] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
        state[f"{name}.exp_avg_sq"] = (0.01 * rng.random(shape) + 0.001).astype(np.float32)
    return state | {"learning_rate": np.array([0.01], np.float32), "step": np.array([3], np.int64)}


def run(m: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    """`m`'s outputs on the CPU provider; a 16-bit graph `emulate`d first and run without graph
    optimizations, which would change its roundings (docs/precision.md)."""
    options = ort.SessionOptions()
    if declared_types(m) & set(LOW_TYPES):
        m = onnx.ModelProto.FromString(m.SerializeToString())
        emulate(m)
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})))


def new_value(m: onnx.ModelProto, state: str) -> str:
    """The graph output that replaces `state` (roam's `.out`, or the functional step's renamed one)."""
    pairs = json.loads({p.key: p.value for p in m.metadata_props}[memory.INPLACE_KEY])
    return next(out for out, s in pairs.items() if s == state)


# ---- shard arithmetic ---------------------------------------------------------------------------

def test_a_parameter_splits_into_ceil_numel_over_n_elements_zero_padded():
    assert (shard_size(15, 4), padding(15, 4)) == (4, 1)  # [3, 5] over 4 ranks: 4 each, 16 in all
    assert (shard_size(10, 4), padding(10, 4)) == (3, 2)
    assert (shard_size(2, 4), padding(2, 4)) == (1, 2)  # fewer elements than ranks: one each, two zeros
    assert (shard_size(16, 4), padding(16, 4)) == (4, 0)
    assert (shard_size(7, 1), padding(7, 1)) == (7, 0)
    value = np.arange(15, dtype=np.float32).reshape(3, 5)
    shards = split(value, 4)
    assert [s.tolist() for s in shards] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 0]]
    assert np.array_equal(join(shards, (3, 5)), value)


# ---- the rank step --------------------------------------------------------------------------------

@pytest.mark.parametrize("form", ["roam", "functional"])
def test_each_parameter_is_gathered_once_and_each_gradient_reduce_scattered(steps, form):
    m, record = shard(steps[form], 4)
    g = m.graph
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in [*g.input, *g.output]}
    for name, shard_elements in {"fc1.weight": 4, "fc2.weight": 3, "fc2.bias": 1}.items():
        for state in (name, f"{name}.exp_avg", f"{name}.exp_avg_sq"):
            assert shapes[state] == [shard_elements]  # the same name, a flat shard
            assert shapes[new_value(m, state)] == [shard_elements]
        gathers = [n for n in g.node if (n.domain, n.op_type) == ALL_GATHER and n.input[0] == name]
        assert len(gathers) == 1
        assert {a.name: helper.get_attribute_value(a) for a in gathers[0].attribute} == {"group_size": 4, "axis": 0}
    assert shapes["x"] == [ROWS, 3] and shapes["step"] == [1]  # the rank's rows; the counter whole
    scatters = [n for n in g.node if (n.domain, n.op_type) == REDUCE_SCATTER]
    assert sorted(n.input[0] for n in scatters) == sorted(f"{p}_grad.padded" for p in SHAPES)  # all three padded
    assert {a.name: helper.get_attribute_value(a) for a in scatters[0].attribute} == {
        "group_size": 4, "axis": 0, "reduction": b"mean"}
    pads = {n.input[0]: onnx.numpy_helper.to_array(next(t for t in g.initializer if t.name == n.input[1])).tolist()
            for n in g.node if n.op_type == "Pad"}
    assert pads == {"fc1.weight_grad.flat": [0, 1], "fc2.weight_grad.flat": [0, 2], "fc2.bias_grad.flat": [0, 2]}
    onnx.checker.check_model(m)
    assert record == json.loads({p.key: p.value for p in m.metadata_props}[SHARDING_KEY])
    assert record["ranks"] == 4
    assert record["parameters"] == {"fc1.weight": {"shape": [3, 5], "numel": 15, "shard": 4},
                                    "fc2.weight": {"shape": [5, 2], "numel": 10, "shard": 3},
                                    "fc2.bias": {"shape": [2], "numel": 2, "shard": 1}}
    assert record["state"] == {f"{p}.{m}": p for p in SHAPES for m in ("exp_avg", "exp_avg_sq")}
    assert sorted(record["replicated"]) == ["learning_rate", "step"]
    assert record["data_inputs"] == ["x"]
    assert record["batch"] == {"rank": ROWS, "global": 4 * ROWS}


def test_the_collectives_are_ordinary_nodes_of_the_memory_model(steps, tmp_path):
    m, _ = shard(steps["roam"], 4)
    save(m, tmp_path / "rank.onnx")
    graph = import_model(tmp_path / "rank.onnx").graph
    # shape rules: [4] gathered from 4 ranks is [16]; [16] reduce-scattered over 4 is [4]
    assert graph.values["fc1.weight.gathered"].shape == (16,)
    assert graph.values["fc1.weight.full"].shape == (3, 5)
    assert graph.values["fc1.weight_grad.shard"].shape == (4,)
    mm = memory.build(graph)
    roots = {s.root: s for s in mm.storages}
    assert roots["fc1.weight.gathered"].kind == "activation"  # made in the forward, planned in the arena
    assert roots["fc1.weight_grad.shard"].kind == "gradient"  # the reduce-scatter is the backward's
    assert mm.storage_of["fc1.weight.full"] == "fc1.weight.unpadded"  # a view of the sliced copy
    assert mm.persistent["fc1.weight"] == "parameter" and mm.persistent["fc1.weight.exp_avg"] == "optimizer_state"
    assert mm.storage_of["fc1.weight.out"] == "fc1.weight"  # updated in place, on the shard


def test_shape_rules_gather_n_blocks_and_scatter_one(tmp_path):
    def collective(size: int, op: tuple[str, str], group: int) -> str:
        m = model([node(op[1], ["a"], ["b"], domain=op[0], group_size=group, axis=0)], [("a", [size])], [("b", None)])
        m.opset_import.append(helper.make_opsetid(op[0], 1))
        return save(m, tmp_path / f"{op[1]}{size}.onnx")

    assert import_model(collective(4, ALL_GATHER, 3)).graph.values["b"].shape == (12,)
    assert import_model(collective(12, REDUCE_SCATTER, 3)).graph.values["b"].shape == (4,)
    with pytest.raises(RoamError, match="cannot determine the size of 1 tensors: b"):
        import_model(collective(10, REDUCE_SCATTER, 3))  # 3 ranks do not split 10 elements


def collectives_as_identity(m: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(m)
    for n in out.graph.node:
        if (n.domain, n.op_type) in (ALL_GATHER, REDUCE_SCATTER):
            n.op_type, n.domain = "Identity", ""
            del n.attribute[:]
    return out


@pytest.mark.parametrize("form", ["roam", "functional"])
def test_the_rank_step_of_one_rank_is_the_step(steps, form):
    """At N = 1 a gather and a mean over one rank are the identity: same loss, same new state."""
    m, _ = shard(steps[form], 1)
    state = initial_state(np.random.default_rng(1))
    x = np.random.default_rng(2).standard_normal([ROWS, 3]).astype(np.float32)
    full = run(onnx.load(steps[form]), state | {"x": x})
    rank = run(collectives_as_identity(m), {k: v.reshape(-1) if k not in ("learning_rate", "step") else v
                                            for k, v in state.items()} | {"x": x})
    assert rank["loss"] == full["loss"]
    for name in state:
        if name != "learning_rate":
            out = new_value(m, name)
            assert np.array_equal(rank[out].reshape(full[out].shape), full[out]), name


def parts(m: onnx.ModelProto) -> onnx.ModelProto:
    """The rank step without its collectives: their outputs inputs of the graph, the reduce-scatters'
    inputs and the shards a gather reads that the rank computes (a 16-bit copy) outputs of it (a
    rank's computation between its collectives, run by ONNX Runtime)."""
    out = onnx.ModelProto()
    out.CopyFrom(m)
    g = out.graph
    collectives = [n for n in g.node if (n.domain, n.op_type) in (ALL_GATHER, REDUCE_SCATTER)]
    typed = {vi.name: vi for vi in g.value_info}
    for n in collectives:
        g.node.remove(n)
        g.input.append(typed[n.output[0]])
        if n.op_type == "ReduceScatter" or n.input[0] in typed:
            g.output.append(typed[n.input[0]])
    return out


def zeros(m: onnx.ModelProto, names) -> dict[str, np.ndarray]:
    """Zeros of each named value's declared shape and type."""
    types = {vi.name: vi.type.tensor_type for vi in m.graph.value_info}
    return {x: np.zeros([d.dim_value for d in types[x].shape.dim], helper.tensor_dtype_to_np_dtype(types[x].elem_type))
            for x in names}


def simulate(m: onnx.ModelProto, ranks: int, feeds: list[dict]) -> list[dict]:
    """Every rank's outputs of rank step `m`, the collectives done in numpy: an all-gather
    concatenates the ranks' shards in rank order, a reduce-scatter gives rank r block r of the
    mean over ranks. Gathers read state (or a copy the rank casts from it) only and reduce-scatters
    feed the update only, so each rank runs its computation twice: once for what it reduce-scatters,
    once with the reduced shards (and once before, for the shards it casts, where a gather reads one)."""
    inner = parts(m)
    gathers = [n for n in m.graph.node if (n.domain, n.op_type) == ALL_GATHER]
    scatters = [n for n in m.graph.node if (n.domain, n.op_type) == REDUCE_SCATTER]
    unreduced = zeros(m, [n.output[0] for n in scatters])
    if any(n.input[0] not in feeds[0] for n in gathers):
        feeds = [f | run(inner, f | zeros(m, [n.output[0] for n in gathers]) | unreduced) for f in feeds]
    gathered = {n.output[0]: np.concatenate([f[n.input[0]] for f in feeds]) for n in gathers}
    first = [run(inner, f | gathered | unreduced) for f in feeds]
    reduced = [{n.output[0]: np.split(np.mean([o[n.input[0]] for o in first], axis=0), ranks)[r] for n in scatters}
               for r in range(ranks)]
    return [run(inner, f | gathered | reduced[r]) for r, f in enumerate(feeds)]


@pytest.mark.parametrize("form,ranks", [("roam", 4), ("roam", 2), ("functional", 4)])
def test_n_ranks_update_the_weights_as_the_full_step_on_the_global_batch(steps, form, ranks):
    m, _ = shard(steps[form], ranks)
    state = initial_state(np.random.default_rng(3))
    x = np.random.default_rng(4).standard_normal([ranks * ROWS, 3]).astype(np.float32)
    reference = run(onnx.load(steps[f"global{ranks}"]), state | {"x": x})
    feeds = []
    for r in range(ranks):
        mine = {name: split(v, ranks)[r] for name, v in state.items() if name not in ("learning_rate", "step")}
        feeds.append(mine | {"learning_rate": state["learning_rate"], "step": state["step"],
                             "x": x[r * ROWS:(r + 1) * ROWS]})
    outs = simulate(m, ranks, feeds)
    # the mean of the ranks' losses is the loss of the whole batch (equal rows per rank)
    assert np.mean([o["loss"] for o in outs]) == pytest.approx(float(reference["loss"]), rel=1e-6)
    for name in state:
        if name == "learning_rate":
            continue
        out = new_value(m, name)
        if name == "step":
            assert all(o[out].tolist() == [4] for o in outs)
            continue
        shape = SHAPES[name.split(".exp_avg")[0]]
        joined = join([o[out] for o in outs], shape)
        np.testing.assert_allclose(joined, reference[f"{name}.out"], rtol=1e-5, atol=1e-6, err_msg=name)
        pad = padding(int(np.prod(shape)), ranks)
        assert not np.any(outs[-1][out][len(outs[-1][out]) - pad:])  # the last rank's padding stays zero


def test_a_parameter_s_shape_is_a_constant_not_a_gather(tmp_path):
    # fc1.weight (3 x 5) is read by its MatMul and a Shape: the rank step reads [3, 5] from a
    # constant, so only the MatMul's reads need the gathered weight (a re-gather for a Shape alone
    # would move the whole weight); 2 ranks still update it as the full step on 4 rows
    m, _ = shard(full_step(tmp_path, ROWS, shape_read=True), 2)
    assert not [n for n in m.graph.node if n.op_type == "Shape" and "fc1.weight" in n.input[0]]
    dims = next(t for t in m.graph.initializer if t.name == "dims")
    assert numpy_helper.to_array(dims).tolist() == [3, 5]
    reference = full_step(tmp_path, 2 * ROWS, shape_read=True)
    state = initial_state(np.random.default_rng(3))
    x = np.random.default_rng(4).standard_normal([2 * ROWS, 3]).astype(np.float32)
    expected = run(onnx.load(reference), state | {"x": x})
    feeds = [{name: split(v, 2)[r] for name, v in state.items() if name not in ("learning_rate", "step")}
             | {"learning_rate": state["learning_rate"], "step": state["step"], "x": x[r * ROWS:(r + 1) * ROWS]}
             for r in range(2)]
    outs = simulate(m, 2, feeds)
    joined = join([o[new_value(m, "fc1.weight")] for o in outs], SHAPES["fc1.weight"])
    np.testing.assert_allclose(joined, expected["fc1.weight.out"], rtol=1e-5, atol=1e-6)


def test_free_recompute_gathers_a_matrix_again_but_not_a_table_for_its_rows(tmp_path):
    # tokens [2] -> Gather(embed.weight: a table [64, 4]) -> h [2, 4] -> MatMul(fc.weight, w [4, 4]) -> Tanh
    # -> mean square. The backward reads w (h's gradient is dy . w^T, which the table's needs) and h: `free`
    # gathers w again (its copy brings w back for w's own reader) but keeps h (32 B) rather than
    # gathering the 1 KiB table again to look its rows up a second time.
    rng = np.random.default_rng(0)
    forward = model([node("Gather", ["embed.weight", "tokens"], ["h"]), node("MatMul", ["h", "fc.weight"], ["z"]),
                     node("Tanh", ["z"], ["a"]), node("Mul", ["a", "a"], ["sq"]),
                     node("ReduceMean", ["sq"], ["loss"], keepdims=0)],
                    [("tokens", [2], onnx.TensorProto.INT64)], [("loss", [])],
                    initializers={"embed.weight": rng.standard_normal([64, 4]).astype(np.float32),
                                  "fc.weight": rng.standard_normal([4, 4]).astype(np.float32)})
    save(forward, tmp_path / "forward.onnx")
    training_graph.make(tmp_path / "forward.onnx", tmp_path / "step.onnx", loss="none", in_graph=True,
                        backward=roam_backward)
    rank, _ = shard(tmp_path / "step.onnx", 2)
    onnx.save(rank, tmp_path / "rank.onnx")
    r = roam("optimize", tmp_path / "rank.onnx", "-o", tmp_path / "plan.json", "--recompute", "free")
    assert r.code == 0, r.err
    copies = {n["of"] for n in json.loads((tmp_path / "plan.json").read_text())["recompute"]["nodes"]}
    assert "fc.weight/all_gather" in copies and "embed.weight/all_gather" not in copies


def two_layer_rank(folder):
    """x [4, 8] -> Tanh -> @ fc1.weight [8, 8] -> Tanh -> @ fc2.weight [8, 8] -> mean square: its rank
    step at N = 2, (graph, memory model at alignment 1)."""
    rng = np.random.default_rng(0)
    forward = model([node("Tanh", ["x"], ["a0"]), node("MatMul", ["a0", "fc1.weight"], ["h"]),
                     node("Tanh", ["h"], ["a1"]), node("MatMul", ["a1", "fc2.weight"], ["z"]),
                     node("Mul", ["z", "z"], ["sq"]), node("ReduceMean", ["sq"], ["loss"], keepdims=0)],
                    [("x", [4, 8])], [("loss", [])],
                    initializers={n: rng.standard_normal([8, 8]).astype(np.float32) for n in ("fc1.weight", "fc2.weight")})
    save(forward, folder / "forward.onnx")
    training_graph.make(folder / "forward.onnx", folder / "step.onnx", loss="none", in_graph=True,
                        backward=roam_backward)
    save(shard(folder / "step.onnx", 2)[0], folder / "rank.onnx")
    graph = import_model(folder / "rank.onnx").graph
    return graph, memory.build(graph, 1)


def test_a_budget_pays_for_a_gather_again_in_communication_time_not_zero(tmp_path):
    # x [4, 8] (a rank's rows) -> Tanh -> a0 -> @ fc1.weight [8, 8] -> h -> Tanh (in place) -> @ fc2.weight [8, 8]
    # -> z -> mean square, at N = 2 on nvlink4-gpu. The backward reads a0 and z (128 B each), h and the gathered
    # fc2.weight (256 B each). A gather again costs its ring time at the H100's 494.5 TFLOP/s: 494.5e12 x
    # (1/2 x 256 B / 450 GB/s + 1 hop x 3.4 us) = 140,658 + 1,681,300,000 FLOPs, far above recomputing an
    # activation: one byte under keeping everything (640 B), Tanh(x) is recomputed (32 FLOPs; the
    # in-place Tanh's output is kept, in h's storage); under 512 B, z = a1 @ fc2.weight too (2 x 4 x 8
    # x 8 = 512 FLOPs); only under 384 B is fc2.weight gathered again. Priced at 0 FLOPs, as a gather
    # counts, it went first.
    graph, mm = two_layer_rank(tmp_path)
    price = recompute.gather_price(graph, "nvlink4-gpu")
    assert price.per_byte == pytest.approx(494.5e12 / 2 / 450e9) and price.each == 1_681_300_000
    assert recompute.keep_all(graph, mm, "nvlink4-gpu").kept_bytes == 640
    fewest = recompute.fewest_bytes(graph, mm, "nvlink4-gpu")
    names = {k: graph.nodes[i].name for k, i in enumerate(fewest.problem.nodes)}
    for limit, kept, flops, regathered in ((639, 512, 32, False), (511, 384, 544, False), (383, 256, 32, True)):
        choice = recompute.within(fewest, limit, time.perf_counter() + 60, "cbc")
        copied = {names[k] for k in choice.copied}
        assert (choice.kept_bytes, choice.flops, "fc2.weight/all_gather" in copied) == (kept, flops, regathered)
        assert choice.price == flops + regathered * (round(494.5e12 / 2 / 450e9 * 256) + 1_681_300_000)


def test_without_the_program_a_budget_still_keeps_the_gathers_it_has_room_for(tmp_path):
    # The fewest bytes (0 kept) recompute everything and gather fc1.weight and fc2.weight again (256 B
    # gathered each, each 140,658 + 1,681,300,000 FLOPs as above). With room for one (256 B) the first
    # is kept (equal prices per byte: the graph's order), for both (512 B) neither is gathered again.
    graph, mm = two_layer_rank(tmp_path)
    fewest = recompute.fewest_bytes(graph, mm, "nvlink4-gpu")
    names = {k: graph.nodes[i].name for k, i in enumerate(fewest.problem.nodes)}
    gather = 140_658 + 1_681_300_000
    assert (fewest.kept_bytes, fewest.price) == (0, 1088 + 2 * gather)
    for limit, kept, regathered in ((255, 0, ["fc1.weight/all_gather", "fc2.weight/all_gather"]),
                                    (256, 256, ["fc2.weight/all_gather"]), (512, 512, [])):
        choice = recompute.gathers_kept(fewest, limit)
        assert choice.kept_bytes == kept and choice.price == 1088 + len(regathered) * gather
        assert sorted(names[k] for k in choice.copied if names[k].endswith("all_gather")) == regathered


def test_a_rank_step_s_front_says_what_each_point_sends(steps, tmp_path):
    """The MLP at N = 2: every parameter gathered once and its gradient reduce-scattered, (16 + 10 + 2)
    floats each way, half of them sent by each rank: 112 B at the point that keeps everything.
    --device names the interconnect; on a step that is not a rank step it has nothing to weigh."""
    save(shard(steps["roam"], 2)[0], tmp_path / "rank.onnx")
    done = roam("tradeoff", tmp_path / "rank.onnx", "-o", tmp_path / "front.json", "--points", "3", "--device",
                "infiniband-ndr-gpu", "--json")
    assert done.code == 0, done.err
    keep = json.loads((tmp_path / "front.json").read_text())["points"][0]
    assert (keep["label"], keep["sent_bytes"], keep["price"]) == ("keep all", 112, 0)
    refused = roam("tradeoff", steps["roam"], "-o", tmp_path / "plain.json", "--device", "nvlink4-gpu")
    assert refused.code == 2 and "a rank step's communication" in refused.err
    assert not (tmp_path / "plain.json").exists()


# ---- a mixed-precision step: its 16-bit weight copies gathered -------------------------------------

@pytest.fixture(scope="module")
def fp16_steps(tmp_path_factory):
    """The MLP's fp16 mixed-precision step (float32 masters and AdamW; every weight cast to float16
    for the products; loss scaling off, as its overflow check reads whole gradients) of ROWS, 2 x
    ROWS and 4 x ROWS rows: {rows: path}."""
    d = tmp_path_factory.mktemp("mlp_fp16")
    made = {}
    for rows in (ROWS, 2 * ROWS, 4 * ROWS):
        save(mlp(rows), d / f"forward{rows}.onnx")
        made[rows] = d / f"step{rows}.onnx"
        training_graph.make(d / f"forward{rows}.onnx", made[rows], loss="none", in_graph=True, backward=roam_backward,
                            precision="fp16", scaler_settings={"enabled": "false"})
    return made


def test_a_weight_read_only_through_a_16_bit_cast_is_cast_on_its_shard_and_gathered_in_16_bits(fp16_steps, tmp_path):
    m, _ = shard(fp16_steps[ROWS], 4)
    g = m.graph
    typed = {vi.name: vi.type.tensor_type for vi in g.value_info}
    for name, shard_elements in {"fc1.weight": 4, "fc2.weight": 3, "fc2.bias": 1}.items():
        cast = next(n for n in g.node if n.op_type == "Cast" and list(n.input) == [name])
        assert helper.get_attribute_value(cast.attribute[0]) == onnx.TensorProto.FLOAT16
        assert [d.dim_value for d in typed[f"{name}.cast"].shape.dim] == [shard_elements]
        gather = next(n for n in g.node if (n.domain, n.op_type) == ALL_GATHER and n.input[0] == name + ".cast")
        assert gather.output[0] == f"{name}.gathered"
        assert typed[f"{name}.gathered"].elem_type == onnx.TensorProto.FLOAT16
    assert not any(n.op_type == "Cast" and n.input[0].endswith((".full", ".gathered", ".unpadded")) for n in g.node)
    save(m, tmp_path / "rank.onnx")
    graph = import_model(tmp_path / "rank.onnx").graph
    assert graph.values["fc1.weight.cast"].shape == (4,) and graph.values["fc1.weight.gathered"].shape == (16,)
    assert graph.values["fc1.weight.full"].dtype == onnx.TensorProto.FLOAT16
    assert graph.values["fc1.weight.exp_avg"].dtype == onnx.TensorProto.FLOAT  # the master's state stays float32
    planned = roam("optimize", tmp_path / "rank.onnx", "-o", tmp_path / "plan.json", "--recompute", "off")
    assert planned.code == 0, planned.err
    assert roam("verify", tmp_path / "rank.onnx", tmp_path / "plan.json").code == 0
    c = json.loads((tmp_path / "plan.json").read_text())["sharding"]["communication"]
    # 16, 12 and 4 gathered elements of 2 bytes: half the float32 step's 128 bytes; the gradients
    # are float32 (the Cast's gradient widens them), reduce-scattered as float32
    assert c["all_gather"]["bytes"] == (16 + 12 + 4) * 2
    assert c["reduce_scatter"]["bytes"] == (16 + 12 + 4) * 4
    assert c["sent_bytes"] == (64 + 128) * 3 // 4


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_n_ranks_of_the_fp16_step_gather_the_rounded_weights_and_update_as_the_full_step(fp16_steps, ranks):
    m, _ = shard(fp16_steps[ROWS], ranks)
    state = initial_state(np.random.default_rng(5))
    x = np.random.default_rng(6).standard_normal([ranks * ROWS, 3]).astype(np.float32)
    reference = run(onnx.load(fp16_steps[ranks * ROWS]), state | {"x": x})
    feeds = [{name: split(v, ranks)[r] for name, v in state.items() if name not in ("learning_rate", "step")}
             | {"learning_rate": state["learning_rate"], "step": state["step"], "x": x[r * ROWS:(r + 1) * ROWS]}
             for r in range(ranks)]
    outs = simulate(m, ranks, feeds)
    for name, shape in SHAPES.items():  # every rank computes with its weight rounded to float16 as a whole
        whole = np.concatenate([o[f"{name}.cast"] for o in outs])[:int(np.prod(shape))].reshape(shape)
        assert whole.dtype == np.float16 and np.array_equal(whole, state[name].astype(np.float16)), name
    if ranks == 1:  # one rank: the step itself, bit for bit
        assert outs[0]["loss"] == reference["loss"]
    assert np.mean([o["loss"] for o in outs]) == pytest.approx(float(reference["loss"]), rel=1e-3)
    for name in state:
        if name not in ("learning_rate", "step"):
            out = new_value(m, name)
            joined = join([o[out] for o in outs], SHAPES[name.split(".exp_avg")[0]])
            if ranks == 1:
                assert np.array_equal(joined, reference[f"{name}.out"]), name
            # the ranks' float16 products of 2 rows each, averaged in float32, against the products of
            # the whole batch: float16's rounding (2^-11) apart, not more
            np.testing.assert_allclose(joined, reference[f"{name}.out"], rtol=2e-3, atol=1e-5, err_msg=name)


def test_a_symbolic_batch_stays_symbolic_and_the_plan_binds_it(steps, tmp_path):
    m = onnx.load(steps["functional"])
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"  # x: [batch, 3]
    save(m, tmp_path / "symbolic.onnx")
    made = roam("shard", tmp_path / "symbolic.onnx", "--ranks", "4", "-o", tmp_path / "rank.onnx", "--json")
    assert made.code == 0, made.err
    assert made.json()["batch"] == {"rank": "batch", "global": None}
    rank = onnx.load(tmp_path / "rank.onnx")
    assert rank.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    planned = roam("optimize", tmp_path / "rank.onnx", "-o", tmp_path / "plan.json", "--dim", "batch=2")
    assert planned.code == 0, planned.err
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["dims"] == {"batch": 2} and plan["sharding"]["batch"] == {"rank": "batch", "global": None}
    assert "the rank's batch 2 rows of the global 8" in roam("report", tmp_path / "plan.json").out


# ---- refused: one line, exit 2, nothing written -----------------------------------------------------

def test_a_bad_rank_count_or_a_step_without_parameters_is_refused(steps, tmp_path):
    # a training graph without its optimizer: its gradient accumulation buffers are no parameters
    training_graph.make(steps["roam"].parent / "forward2.onnx", tmp_path / "training.onnx", loss="none",
                        optimizer_path=tmp_path / "optimizer.onnx", backward=roam_backward)
    for args, message in (
        ((steps["roam"], "--ranks", "0"), "--ranks must be at least 1, got 0"),
        ((steps["roam"].parent / "forward2.onnx", "--ranks", "2"), "updates no parameter from a gradient"),
        ((tmp_path / "training.onnx", "--ranks", "2"), "updates no parameter from a gradient"),
    ):
        run_ = roam("shard", *args, "-o", tmp_path / "rank.onnx")
        assert run_.code == 2 and message in run_.err and len(run_.err.strip().splitlines()) == 1, run_.err
        assert not (tmp_path / "rank.onnx").exists()
    save(shard(steps["roam"], 2)[0], tmp_path / "rank2.onnx")
    again = roam("shard", tmp_path / "rank2.onnx", "--ranks", "2", "-o", tmp_path / "again.onnx")
    assert again.code == 2 and "already a rank step" in again.err
    # an fp16 step: GradScaler's scale is no parameter; the check that every gradient is finite
    # reads each whole, which shards cannot
    logits = model([node("MatMul", ["x", "fc.weight"], ["logits"])], [("x", [ROWS, 3])], [("logits", [ROWS, 4])],
                   initializers={"fc.weight": np.ones((3, 4), np.float32)})
    training_graph.make(Path(save(logits, tmp_path / "logits.onnx")), tmp_path / "fp16.onnx", loss="cross-entropy",
                        in_graph=True, precision="fp16", backward=roam_backward)
    fp16 = roam("shard", tmp_path / "fp16.onnx", "--ranks", "2", "-o", tmp_path / "rank.onnx")
    assert fp16.code == 2 and "overflow check" in fp16.err and "grad_scaler" not in fp16.err, fp16.err


def with_extra_input(path, tmp_path, shape, name="scale", summed=False) -> str:
    """The step with one more data input, multiplied into the prediction before the loss (`summed`:
    its sum, for a shape that does not broadcast with the prediction's)."""
    m = onnx.load(path)
    for n in m.graph.node:
        if n.op_type == "Mul" and list(n.input) == ["y", "y"]:
            n.input[:] = ["y.scaled", "y.scaled"]
    m.graph.node.insert(0, node("Mul", ["y", f"{name}.sum" if summed else name], ["y.scaled"]))
    if summed:
        m.graph.node.insert(0, node("ReduceSum", [name], [f"{name}.sum"], keepdims=0))
    m.graph.input.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape))
    out = tmp_path / f"extra_{len(shape)}.onnx"
    onnx.save(m, out)
    return str(out)


def test_data_inputs_whose_batch_cannot_be_split_are_refused(steps, tmp_path):
    # (the added node is out of topological place; import sorts it)
    with pytest.raises(RoamError, match=r"data inputs 'x' and 'scale' disagree on the batch \(2 and 1 rows\)"):
        shard(with_extra_input(steps["roam"], tmp_path, [1, 2]), 2)


def test_an_input_flattened_over_the_batch_and_the_next_axis_splits_with_it(steps, tmp_path):
    # x is [2, 3] per rank; a 1-d input of 2 * 3 = 6 rows is x's rows flattened (labels [B*S]
    # beside input_ids [B, S]): rank r's 6 are the global 12's [6r, 6r + 6), its own sequences
    m, record = shard(with_extra_input(steps["roam"], tmp_path, [ROWS * 3], summed=True), 2)
    assert record["data_inputs"] == ["x", "scale"] and record["batch"] == {"rank": ROWS, "global": 2 * ROWS}
    # any other length is not a batch roam can split
    with pytest.raises(RoamError, match=r"data inputs 'x' and 'scale' disagree on the batch \(2 and 5 rows\)"):
        shard(with_extra_input(steps["roam"], tmp_path, [5], summed=True), 2)


def test_a_scalar_the_forward_reads_is_replicated(steps, tmp_path):
    """A 0-d input (GPT-2's attention mask value, lifted into an input by the exporter) has no rows."""
    m, record = shard(with_extra_input(steps["roam"], tmp_path, []), 2)
    assert record["data_inputs"] == ["x"] and sorted(record["replicated"]) == ["learning_rate", "scale", "step"]
    assert record["batch"] == {"rank": ROWS, "global": 2 * ROWS}
    assert next(vi for vi in m.graph.input if vi.name == "scale").type.tensor_type.shape.dim == []


def test_an_update_that_needs_the_whole_gradient_is_refused(steps, tmp_path):
    """Gradient clipping by a norm: the update reads a scalar made from all of fc1.weight's gradient."""
    m = onnx.load(steps["roam"])
    g = m.graph
    first = next(n for n in g.node if "fc1.weight_grad" in n.input and n.op_type == "Mul")
    first.input[list(first.input).index("fc1.weight_grad")] = "clipped"
    at = list(g.node).index(first)
    g.node.insert(at, node("Mul", ["fc1.weight_grad", "norm"], ["clipped"]))
    g.node.insert(at, node("ReduceL2", ["fc1.weight_grad"], ["norm"], keepdims=0))
    save(m, tmp_path / "clipped.onnx")
    with pytest.raises(RoamError, match="gradient 'fc1.weight_grad' is read by update node 'norm_node' "
                                        r"\(ReduceL2\), which needs all of it"):
        shard(tmp_path / "clipped.onnx", 2)


# ---- planned: the sample's step ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def sample_plans(tmp_path_factory):
    """The sample's full step sharded over 2 and 4 ranks and planned: the folder."""
    d = tmp_path_factory.mktemp("sample_shard")
    made = roam("make-training-graph", SAMPLE, "-o", d / "step.onnx", "--in-graph-optimizer")
    assert made.code == 0, made.err
    for n in (2, 4):
        for command in (("shard", d / "step.onnx", "--ranks", n, "-o", d / f"rank{n}.onnx"),
                        ("optimize", d / f"rank{n}.onnx", "-o", d / f"plan{n}.json")):
            done = roam(*command)
            assert done.code == 0, done.err
    return d


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_sample_s_rank_steps_plan_and_verify(sample_plans, ranks):
    d = sample_plans
    assert roam("verify", d / f"rank{ranks}.onnx", d / f"plan{ranks}.json").code == 0
    plan = json.loads((d / f"plan{ranks}.json").read_text())
    sharding = plan["sharding"]
    assert (sharding["ranks"], sharding["parameters"], sharding["sharded_state"]) == (ranks, 28, 56)
    assert sharding["batch"] == {"rank": 2, "global": 2 * ranks}
    c = sharding["communication"]
    assert c["all_gather"]["count"] == c["reduce_scatter"]["count"] == 28 and c["all_gather"]["regathered"] == 0
    # the sample's 136,960 parameter elements, none padded at 2 or 4 ranks, gathered once and reduced once
    assert c["all_gather"]["bytes"] == c["reduce_scatter"]["bytes"] == 136_960 * 4
    assert c["sent_bytes"] == 2 * 136_960 * 4 * (ranks - 1) // ranks
    tensors = {t["name"]: t for t in plan["tensors"]}
    # wte [512, 64] and its two moments: 1/N of 128 KiB each, on every rank
    for name in ("transformer.wte.weight", "transformer.wte.weight.exp_avg", "transformer.wte.weight.exp_avg_sq"):
        assert tensors[name]["bytes"] == 512 * 64 * 4 // ranks and tensors[name]["offset"] is None
    assert tensors["transformer.wte.weight.gathered"]["bytes"] == 512 * 64 * 4  # gathered in the arena
    assert tensors["transformer.wte.weight.gathered"]["offset"] is not None


def test_recompute_gathers_a_parameter_again_in_the_backward(steps, tmp_path):
    """The MLP's backward reads fc2.weight alone (fc1's input gradient is not needed): kept from
    the forward without recompute, gathered again with it."""
    save(shard(steps["roam"], 2)[0], tmp_path / "rank.onnx")
    for mode, regathered in (("off", 0), ("free", 1)):
        run_ = roam("optimize", tmp_path / "rank.onnx", "-o", tmp_path / f"{mode}.json", "--recompute", mode)
        assert run_.code == 0, run_.err
        plan = json.loads((tmp_path / f"{mode}.json").read_text())
        assert plan["sharding"]["communication"]["all_gather"]["regathered"] == regathered
        assert roam("verify", tmp_path / plan["model"]["path"], tmp_path / f"{mode}.json").code == 0
    copies = [n for n in plan["recompute"]["nodes"] if n["op_type"] == "AllGather"]
    assert [(n["of"], n["class"], n["flops"]) for n in copies] == [("fc2.weight/all_gather", "collective", 0)]


def test_the_communication_is_estimated_on_the_profile_s_interconnect(steps, tmp_path):
    save(shard(steps["roam"], 4)[0], tmp_path / "rank.onnx")
    run_ = roam("optimize", tmp_path / "rank.onnx", "-o", tmp_path / "ib.json", "--device", "infiniband-ndr-gpu")
    assert run_.code == 0, run_.err
    c = json.loads((tmp_path / "ib.json").read_text())["sharding"]["communication"]
    # 3 gathers and 3 reduce-scatters of 16, 12 and 4 floats: rings over 4 ranks at 50 GB/s, 9.6 us a hop
    assert c["all_gather"]["bytes"] == c["reduce_scatter"]["bytes"] == (16 + 12 + 4) * 4
    assert c["seconds"] == pytest.approx(3 / 4 * 2 * 128 / 50e9 + 6 * 3 * 9.6e-6)
    assert c["sent_bytes"] == 2 * 128 * 3 // 4 and c["profile"] == "infiniband-ndr-gpu"
    assert 0 < c["exposed_seconds"] <= c["seconds"]
    refused = roam("optimize", tmp_path / "rank.onnx", "-o", tmp_path / "pcie.json", "--device", "pcie-gen4-gpu")
    assert refused.code == 2 and "'pcie-gen4-gpu' has no interconnect for a rank step's collectives" in refused.err
    assert not (tmp_path / "pcie.json").exists()


@pytest.mark.slow  # (planning the sample's rank step with recompute: 5 s)
def test_a_regathered_parameter_is_read_before_its_update_overwrites_it(sample_plans, tmp_path):
    """With --recompute free the sample's 2-rank step gathers ln_f's parameters again in the
    backward; moving that gather later (to free the ring for the ones needed first) once put it
    after the update that writes over the shard it reads: optimize wrote a plan verify refused."""
    d = sample_plans
    done = roam("optimize", d / "rank2.onnx", "-o", tmp_path / "free.json", "--recompute", "free")
    assert done.code == 0, done.err
    plan = json.loads((tmp_path / "free.json").read_text())
    assert plan["sharding"]["communication"]["all_gather"]["regathered"] > 0
    checked = roam("verify", tmp_path / plan["model"]["path"], tmp_path / "free.json")
    assert checked.code == 0, checked.err


def test_verify_refuses_a_plan_for_another_rank_layout(sample_plans, tmp_path):
    d = sample_plans
    plan = json.loads((d / "plan2.json").read_text())
    plan["sharding"]["ranks"] = 4
    (tmp_path / "other.json").write_text(json.dumps(plan))
    (tmp_path / "rank2.onnx").write_bytes((d / "rank2.onnx").read_bytes())
    checked = roam("verify", tmp_path / "rank2.onnx", tmp_path / "other.json")
    assert checked.code == 1 and "is for 4 ranks, but the model is the step of one of 2 ranks" in checked.err
    del plan["sharding"]
    (tmp_path / "none.json").write_text(json.dumps(plan))
    checked = roam("verify", tmp_path / "rank2.onnx", tmp_path / "none.json")
    assert checked.code == 1 and "records no sharding" in checked.err


def test_the_report_shows_the_rank_and_its_communication(sample_plans):
    d = sample_plans
    shown = roam("report", d / "plan4.json")
    assert shown.code == 0, shown.err
    assert "one rank of 4 (fully sharded): 28 parameters and 56 optimizer state tensors held 1/4 each" in shown.out
    assert "the rank's batch 2 rows of the global 8" in shown.out
    assert "28 all-gathers of 535.00 KiB" in shown.out and "28 reduce-scatters of 535.00 KiB" in shown.out
    assert "estimated on nvlink4-gpu" in shown.out and "exposed" in shown.out
    assert "total (persistent + arena) per rank" in shown.out
