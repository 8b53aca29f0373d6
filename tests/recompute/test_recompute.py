"""Recomputation (`roam optimize --recompute free|budget`): hand-built training-like graphs whose
best saved set, copies, kept bytes and FLOPs are worked out by hand; Dropout never copied; the CLI
end to end (plan, annotated model, verify with either member, budget refusals); verify catching a
tampered plan or model; ORT computing the same outputs with and without the copies; a training
step with copies matching plain ORT.

Sizes: the default alignment is 256 bytes, and every activation below is a multiple of it, so a
tensor's bytes are its element count x 4 (float32)."""

import json
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import SAMPLE, needs_ort_training, roam
from hypothesis import HealthCheck, given, settings, strategies as st
from onnx import TensorProto
from onnx_builder import model, node, save

from roam_cli import recompute
from roam_cli.core import memory, plan as plan_io
from roam_cli.frontend.onnx_import import import_model
from roam_cli.recompute import flops, ops, rewrite
from roam_cli.verify import Violation, check_recompute

N = 1024  # floats: 4,096 bytes, a multiple of the alignment
B = 4 * N


def load(tmp_path, m, name="m.onnx"):
    imported = import_model(save(m, tmp_path / name))
    return imported, memory.build(imported.graph)


def copied_names(imported, choice) -> list[str]:
    p = choice.problem
    return [imported.graph.nodes[p.nodes[k]].name for k in choice.copied]


# `Choice.saved` may also hold values that cost nothing to keep (a graph output such as the loss
# lives to the end anyway); the tests compare `Choice.kept`, the storages kept at a cost.


def const(name, values, dtype=None):
    return name, np.asarray(values, dtype=dtype)


# --- FLOPs ------------------------------------------------------------------------------------

def test_node_flops_by_hand(tmp_path):
    nodes = [
        node("MatMul", ["A", "Bm"], ["mm"]),  # [3,5] x [5,7]: 2*3*7*5
        node("Gemm", ["At", "Bm"], ["gemm"], transA=1),  # A stored [5,3] (K, M): the same product
        node("Conv", ["img", "w"], ["conv"], group=2, pads=[1, 1, 1, 1]),  # [1,4,8,8] * [6,2,3,3] -> [1,6,8,8]
        node("Relu", ["mm"], ["relu"]),  # 21 output elements
        node("Add", ["mm", "row"], ["add"]),  # broadcast: one per output element, 21
        node("Reshape", ["mm", "shape"], ["flat"]),  # a view: nothing
        node("MatMul", ["A", "vec"], ["mv"]),  # [3,5] x [5] -> [3]: K = 5, 2*3*5
        node("MatMul", ["A3", "vec"], ["bmv"]),  # [2,3,5] x [5] -> [2,3]: 2*6*5
        node("MatMul", ["u", "A"], ["vm"]),  # [3] x [3,5] -> [5]: K = 3, 2*5*3
    ]
    m = model(nodes, [("A", [3, 5]), ("At", [5, 3]), ("Bm", [5, 7]), ("img", [1, 4, 8, 8]), ("w", [6, 2, 3, 3]),
                      ("row", [7]), ("vec", [5]), ("A3", [2, 3, 5]), ("u", [3])],
              [("gemm", [3, 7]), ("conv", [1, 6, 8, 8]), ("relu", [3, 7]), ("add", [3, 7]), ("flat", [21]),
               ("mv", [3]), ("bmv", [2, 3]), ("vm", [5])],
              initializers=[const("shape", [21], np.int64)])
    imported, _ = load(tmp_path, m)
    g = imported.graph
    by_name = {n.name: flops.node_flops(g, n) for n in g.nodes}
    assert by_name == {"mm_node": 2 * 3 * 7 * 5, "gemm_node": 2 * 3 * 7 * 5,
                       "conv_node": 2 * (6 * 8 * 8) * (4 // 2 * 3 * 3), "relu_node": 21, "add_node": 21,
                       "flat_node": 0, "mv_node": 2 * 3 * 5, "bmv_node": 2 * 6 * 5, "vm_node": 2 * 5 * 3}
    assert flops.graph_flops(g) == sum(by_name.values())


# --- hand graphs: free mode (min-cut) ----------------------------------------------------------

def test_a_big_elementwise_function_of_a_parameter_is_recomputed_and_nothing_kept(tmp_path):
    """e = Exp(W) is read by the backward; W is live anyway, so the copy costs N FLOPs and keeps
    0 bytes (the loss, a graph output, is kept to the end anyway: 0 bytes)."""
    m = model([node("Exp", ["W"], ["e"]), node("Mul", ["e", "x"], ["m"]),
               node("ReduceSum", ["m"], ["loss"], keepdims=0),
               node("Mul", ["e", "loss"], ["W_grad"])],
              [("x", [N]), ("W", [N])], [("loss", []), ("W_grad", [N])])
    imported, mm = load(tmp_path, m)
    choice = recompute.free(imported.graph, mm)
    assert choice.problem.needed == {"e", "loss"}
    assert choice.saved == {"loss"} and choice.kept == set()  # the loss: a graph output, 0 bytes
    assert copied_names(imported, choice) == ["e_node"]
    assert choice.kept_bytes == 0 and choice.flops == N
    assert recompute.keep_all(imported.graph, mm).kept_bytes == B


def matmul_relu(backward_reads, act="Relu"):
    """a = X @ W ([16,64] x [64,64] -> [16,64], 1,024 floats), b = act(a), loss = sum(b); the
    backward multiplies the values it reads."""
    fwd = [node("MatMul", ["X", "W"], ["a"]), node(act, ["a"], ["b"]),
           node("ReduceSum", ["b"], ["loss"], keepdims=0)]
    bwd = [node("Mul", [backward_reads[0], backward_reads[-1]], ["g"])]
    return model(fwd + bwd, [("X", [16, 64]), ("W", [64, 64])], [("loss", []), ("g", [16, 64])])


def test_a_matmul_output_is_kept_and_its_relu_recomputed_from_it(tmp_path):
    """The backward reads a and b = Relu(a): keeping a alone (B bytes) and copying the Relu (N
    FLOPs) beats keeping both (2B); a itself is a MatMul's, which `free` never copies."""
    imported, mm = load(tmp_path, matmul_relu(["a", "b"]))
    choice = recompute.free(imported.graph, mm)
    assert choice.kept == {"a"}
    assert copied_names(imported, choice) == ["b_node"]
    assert choice.kept_bytes == B and choice.flops == N
    assert recompute.keep_all(imported.graph, mm).kept_bytes == 2 * B


def test_the_same_bytes_either_way_copies_nothing(tmp_path):
    """The backward reads only b = Erf(a): keeping b or keeping a (and copying the Erf) both keep
    B bytes; the tie goes to fewer FLOPs: keep b, copy nothing. (Not Relu or Exp: ONNX Runtime
    writes a Relu that is a's only reader into a's storage, and roam an Exp, which leaves one
    storage and no choice.)"""
    imported, mm = load(tmp_path, matmul_relu(["b"], act="Erf"))
    choice = recompute.free(imported.graph, mm)
    assert choice.kept == {"b"} and choice.copied == ()
    assert choice.kept_bytes == B and choice.flops == 0


def test_a_needed_matmul_output_is_kept_in_free_mode_and_recomputed_in_budget_mode(tmp_path):
    m = model([node("MatMul", ["X", "W"], ["a"]), node("ReduceSum", ["a"], ["loss"], keepdims=0),
               node("Transpose", ["X"], ["Xt"], perm=[1, 0]), node("MatMul", ["Xt", "a"], ["W_grad"])],
              [("X", [16, 64]), ("W", [64, 64])], [("loss", []), ("W_grad", [64, 64])])
    imported, mm = load(tmp_path, m)
    free = recompute.free(imported.graph, mm)
    assert free.kept == {"a"} and free.copied == () and free.kept_bytes == B and free.flops == 0
    fewest = recompute.fewest_bytes(imported.graph, mm)
    assert fewest.kept == set() and copied_names(imported, fewest) == ["a_node"]
    assert fewest.kept_bytes == 0 and fewest.flops == 2 * 16 * 64 * 64


def test_two_cheap_functions_of_one_smaller_value_keep_the_smaller_one(tmp_path):
    """s = X @ W is [4,64] (1,024 bytes); the backward reads u = Cast(s, double) and v =
    Concat(s, s), 2,048 bytes each. Keeping s and copying both (256 + 512 FLOPs) keeps 1,024
    bytes instead of 4,096."""
    m = model([node("MatMul", ["X", "W"], ["s"]), node("Cast", ["s"], ["u"], to=TensorProto.DOUBLE),
               node("Concat", ["s", "s"], ["v"], axis=0),
               node("ReduceSum", ["u"], ["lu"], keepdims=0), node("Cast", ["lu"], ["luf"], to=TensorProto.FLOAT),
               node("ReduceSum", ["v"], ["lv"], keepdims=0), node("Add", ["luf", "lv"], ["loss"]),
               node("Mul", ["u", "u"], ["gu"]), node("Mul", ["v", "v"], ["gv"])],
              [("X", [4, 64]), ("W", [64, 64])],
              [("loss", []), ("gu", [4, 64], TensorProto.DOUBLE), ("gv", [8, 64])])
    imported, mm = load(tmp_path, m)
    choice = recompute.free(imported.graph, mm)
    assert choice.problem.needed == {"u", "v"}
    assert choice.kept == {"s"}
    assert sorted(copied_names(imported, choice)) == ["u_node", "v_node"]
    assert choice.kept_bytes == 1024 and choice.flops == 4 * 64 + 8 * 64
    assert recompute.keep_all(imported.graph, mm).kept_bytes == 2048 + 2048


def test_among_cuts_of_the_same_bytes_the_fewest_flops_win(tmp_path):
    """a = X @ W, b = Erf(a), c = Exp(b); the backward reads b and c. Keeping a (copy Erf and
    Exp: 2N FLOPs) and keeping b (copy Exp: N FLOPs) both keep B bytes: b wins. (Not Sigmoid:
    ONNX Runtime writes it into a, its input read last, leaving a and b one storage.)"""
    m = model([node("MatMul", ["X", "W"], ["a"]), node("Erf", ["a"], ["b"]), node("Exp", ["b"], ["c"]),
               node("ReduceSum", ["c"], ["loss"], keepdims=0), node("Mul", ["b", "c"], ["g"])],
              [("X", [16, 64]), ("W", [64, 64])], [("loss", []), ("g", [16, 64])])
    imported, mm = load(tmp_path, m)
    choice = recompute.free(imported.graph, mm)
    assert choice.kept == {"b"}
    assert copied_names(imported, choice) == ["c_node"]
    assert choice.kept_bytes == B and choice.flops == N


# --- budget mode (ILP) -------------------------------------------------------------------------

A1_FLOPS = 2 * 16 * 64 * 64  # a1 = X1 @ W1: [16,64] x [64,64]
A2_FLOPS = 2 * 16 * 64 * 16  # a2 = X2 @ W2: [16,16] x [16,64]
RELU_FLOPS = 16 * 64


def two_matmuls():
    """a1, a2 (B bytes each, the first four times the FLOPs) and b = Relu(a1): all three read by
    the backward."""
    return model([node("MatMul", ["X1", "W1"], ["a1"]), node("MatMul", ["X2", "W2"], ["a2"]),
                  node("Relu", ["a1"], ["b"]), node("Add", ["b", "a2"], ["s"]),
                  node("ReduceSum", ["s"], ["loss"], keepdims=0),
                  node("Mul", ["a1", "a2"], ["g1"]), node("Mul", ["g1", "b"], ["g"])],
                 [("X1", [16, 64]), ("W1", [64, 64]), ("X2", [16, 16]), ("W2", [16, 64])],
                 [("loss", []), ("g", [16, 64])])


@pytest.mark.parametrize("limit, saved, copied, flops_expected", [
    (3 * B, {"a1", "a2", "b"}, [], 0),  # everything fits
    (2 * B, {"a1", "a2"}, ["b_node"], RELU_FLOPS),  # (keep a1, b and copy a2 would cost A2_FLOPS)
    (B, {"a1"}, ["a2_node", "b_node"], A2_FLOPS + RELU_FLOPS),  # (keep a2: A1 + RELU; keep b: A1)
    (B - 1, set(), ["a1_node", "a2_node", "b_node"], A1_FLOPS + A2_FLOPS + RELU_FLOPS),
    (0, set(), ["a1_node", "a2_node", "b_node"], A1_FLOPS + A2_FLOPS + RELU_FLOPS),
])
def test_the_budget_ilp_recomputes_the_fewest_flops_that_fit(tmp_path, limit, saved, copied, flops_expected):
    imported, mm = load(tmp_path, two_matmuls())
    fewest = recompute.fewest_bytes(imported.graph, mm)
    assert fewest.kept_bytes == 0 and fewest.kept == set()
    assert fewest.flops == A1_FLOPS + A2_FLOPS + RELU_FLOPS
    choice = recompute.within(fewest, limit, time.perf_counter() + 30, "cbc")
    assert choice is not None
    assert choice.kept == saved and sorted(copied_names(imported, choice)) == copied
    assert choice.kept_bytes <= limit and choice.flops == flops_expected
    # free mode may copy only the Relu: a1 and a2 kept
    free = recompute.free(imported.graph, mm)
    assert free.kept == {"a1", "a2"} and copied_names(imported, free) == ["b_node"]


# --- Dropout -----------------------------------------------------------------------------------

def dropout_graph(form: str = "standard"):
    """h = Exp(W); d, mask = Dropout(h) in training mode; r = Relu(d); the backward reads h, d,
    mask and r: in standard ONNX, or (`fused`) through ORT's DropoutGrad as ORT's training graphs do."""
    backward = ([node("Cast", ["mask"], ["maskf"], to=TensorProto.FLOAT), node("Mul", ["d", "maskf"], ["g1"])]
                if form == "standard" else
                [node("DropoutGrad", ["d", "mask", "ratio", "training"], ["g1"], domain="com.microsoft")])
    m = model([node("Exp", ["W"], ["h"]), node("Dropout", ["h", "ratio", "training"], ["d", "mask"]),
               node("Relu", ["d"], ["r"]), node("ReduceSum", ["r"], ["loss"], keepdims=0), *backward,
               node("Mul", ["g1", "h"], ["g2"]), node("Mul", ["g2", "r"], ["W_grad"])],
              [("W", [N])], [("loss", []), ("W_grad", [N])],
              initializers=[const("ratio", 0.5, np.float32), const("training", True, np.bool_)])
    if form == "fused":
        m.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    return m


# the replay's nodes in each form, and the one that makes the value with its inputs
REPLAYS = {"fused": ({"DropoutGrad"}, ("h/recompute", "mask", "ratio", "training")),
           "standard": ({"Sub", "Where", "Div"}, ("mask", "d_node/replay/scaled", "d_node/replay/zero"))}


@pytest.mark.parametrize("form", ["standard", "fused"])
@pytest.mark.parametrize("mode", ["free", "budget"])
def test_dropout_is_never_recomputed_its_mask_is_kept_and_its_output_replayed(tmp_path, mode, form):
    imported, mm = load(tmp_path, dropout_graph(form))
    dropout = next(n for n in imported.graph.nodes if n.op_type == "Dropout")
    assert not ops.copyable(dropout, mode) and ops.op_class(dropout) is None
    choice = (recompute.free if mode == "free" else recompute.fewest_bytes)(imported.graph, mm)
    assert choice.problem.needed == {"h", "d", "mask", "r"}
    assert dropout.name not in copied_names(imported, choice)
    # only the mask must be kept: h (Exp of a parameter) and r (Relu of d) are copied, and d is
    # replayed from the recomputed h and the mask (DropoutGrad, or its standard form), N FLOPs
    assert choice.kept == {"mask"}
    assert choice.kept_bytes == N  # N bools
    assert sorted(copied_names(imported, choice)) == ["h_node", "r_node"]
    assert choice.replayed == ("d",)
    assert choice.flops == 3 * N
    rewritten, record = recompute.apply(imported, mm, choice, mode)
    replay_ops, inputs = REPLAYS[form]
    assert {n["op_type"] for n in record["nodes"]} == {"Exp", "Relu"} | replay_ops
    replays = [n for n in record["nodes"] if n["class"] == "dropout replay"]
    assert {n["of"] for n in replays} == {dropout.name} and sum(n["flops"] for n in replays) == N
    replay = next(n for n in replays if n["flops"])
    assert sum(n.op_type == "Dropout" for n in rewritten.graph.nodes) == 1
    node = rewritten.graph.nodes[rewritten.graph.node_index()[replay["node"]]]
    assert node.inputs == inputs and node.outputs == ("d/recompute",)
    assert all(n.domain == "" for n in rewritten.graph.nodes) == (form == "standard")


@pytest.mark.parametrize("form", ["standard", pytest.param("fused", marks=needs_ort_training)])
def test_a_replayed_dropout_output_is_the_forward_s_bit_for_bit(tmp_path, form):
    """ORT's DropoutGrad, or its standard form, on the input and the mask computes what the
    Dropout computed: the rewritten graph's outputs equal the original's exactly (the Dropout
    seeded, so that both sessions draw the same mask)."""
    m = dropout_graph(form)
    next(n for n in m.graph.node if n.op_type == "Dropout").attribute.append(onnx.helper.make_attribute("seed", 7))
    imported, mm = load(tmp_path, m)
    choice = recompute.free(imported.graph, mm)
    assert choice.replayed == ("d",)
    rewritten, _ = recompute.apply(imported, mm, choice, "free")
    feeds = {"W": np.random.default_rng(0).standard_normal(N).astype(np.float32)}
    before, after = ort_outputs(imported.model, feeds), ort_outputs(rewritten.model, feeds)
    for name in before:
        np.testing.assert_array_equal(before[name], after[name])


# --- the CLI end to end ------------------------------------------------------------------------

def three_exps(tmp_path):
    """e_i = Exp(W_i) (B bytes each), loss = sum(max(e1, e2, e3)); the backward reads each e_i
    with the loss: W_i_grad = sum(max(e_i, loss)). As it is, e1, e2 and e3 stay live through the
    whole forward: at m = max(m12, e3) five tensors of B are live. Recomputing each e_i in the
    backward, the forward holds at most three (e1, e2, m12; then m12, e3, m) and the backward
    two. (Max, not Mul: roam would place m over m12 and t_i over e_i, whose other readers run
    before them in every order, and leave fewer storages to count.)"""
    nodes = [node("Exp", [f"W{i}"], [f"e{i}"]) for i in (1, 2, 3)]
    nodes += [node("Max", ["e1", "e2"], ["m12"]), node("Max", ["m12", "e3"], ["m"]),
              node("ReduceSum", ["m"], ["loss"], keepdims=0)]
    for i in (1, 2, 3):
        nodes += [node("Max", [f"e{i}", "loss"], [f"t{i}"]), node("ReduceSum", [f"t{i}"], [f"W{i}_grad"], keepdims=0)]
    m = model(nodes, [(f"W{i}", [N]) for i in (1, 2, 3)], [("loss", [])] + [(f"W{i}_grad", []) for i in (1, 2, 3)])
    return save(m, tmp_path / "three_exps.onnx")


def plan_of(path):
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def planned_free(tmp_path_factory):
    d = tmp_path_factory.mktemp("free")
    src = three_exps(d)
    r = roam("optimize", src, "-o", d / "plan.json", "--recompute", "free", "--reproducible")
    assert r.code == 0, r.err
    r = roam("optimize", src, "-o", d / "off.json", "--recompute", "off", "--reproducible")
    assert r.code == 0, r.err
    return d, src


def test_free_mode_writes_the_plan_and_the_annotated_model_with_the_copies(planned_free):
    d, src = planned_free
    plan = plan_of(d / "plan.json")
    plan_io.validate(plan, "test")
    annotated = d / "plan.annotated.onnx"
    assert annotated.exists()
    rec = plan["recompute"]
    assert rec["mode"] == "free"
    assert sorted((n["node"], n["of"], n["op_type"], n["flops"]) for n in rec["nodes"]) == [
        (f"e{i}_node/recompute", f"e{i}_node", "Exp", N) for i in (1, 2, 3)]
    assert sorted((t["name"], t["of"], t["bytes"], t["readers"]) for t in rec["tensors"]) == [
        (f"e{i}/recompute", f"e{i}", B, [f"t{i}_node"]) for i in (1, 2, 3)]
    assert rec["extra_flops"] == 3 * N
    assert rec["kept_bytes"] == {"before": 3 * B, "after": 0}
    assert rec["by_class"] == {"elementwise": {"flops": 3 * N, "bytes_not_kept": 3 * B}}
    m = onnx.load(str(annotated))
    names = [n.name for n in m.graph.node]
    for i in (1, 2, 3):  # each copy right before its reader, which reads the copy
        assert names.index(f"e{i}_node/recompute") == names.index(f"t{i}_node") - 1
        reader = next(n for n in m.graph.node if n.name == f"t{i}_node")
        assert list(reader.input) == [f"e{i}/recompute", "loss"]
    meta = {kv.key: kv.value for kv in m.metadata_props}
    assert json.loads(meta[memory.RECOMPUTE_KEY]) == {f"e{i}_node/recompute": f"e{i}_node" for i in (1, 2, 3)}
    assert plan["model"]["path"] == "plan.annotated.onnx" and plan["source_model"]["path"] == Path(src).name


def test_verify_accepts_both_members_of_a_recomputing_plan(planned_free):
    d, src = planned_free
    for member in (d / "plan.annotated.onnx", src):
        r = roam("verify", member, d / "plan.json")
        assert r.code == 0 and r.out.startswith("plan OK: 15 nodes"), (member, r.err)


def test_recomputing_lowers_the_peak_by_what_the_copies_free(planned_free):
    d, _ = planned_free
    off, free = plan_of(d / "off.json"), plan_of(d / "plan.json")
    assert "recompute" not in off
    # off: e1, e2, m12, e3, m live at once; free: three of B at most (and a 256-byte scalar or two)
    assert off["peak_live_bytes"] >= 5 * B
    assert 3 * B <= free["peak_live_bytes"] < 3 * B + 3 * 256
    assert free["stats"]["recompute"]["before"]["peak_live_bytes"] == off["peak_live_bytes"]


def test_the_plan_without_recomputing_is_the_same_made_beside_or_first(tmp_path):
    src = three_exps(tmp_path)
    figures = []
    for jobs in ("1", "2"):  # 2: made in a forked process beside the recomputing plan
        r = roam("optimize", src, "-o", tmp_path / f"plan{jobs}.json", "--recompute", "free", "--jobs", jobs)
        assert r.code == 0, r.err
        figures.append(plan_of(tmp_path / f"plan{jobs}.json")["stats"]["recompute"])
    assert figures[0] == figures[1] and figures[0]["before"]["peak_live_bytes"] >= 5 * B


def test_beside_makes_the_value_in_another_process_and_here_when_that_fails():
    import os

    from roam_cli.pipeline import beside
    here = os.getpid()
    with beside(os.getpid, parallel=True) as value:
        assert value() != here
    with beside(os.getpid, parallel=False) as value:
        assert value() == here

    def only_here():
        if os.getpid() != here:
            raise RuntimeError("not in the forked process")
        return "made here"

    with beside(only_here, parallel=True) as value:
        assert value() == "made here"


def test_optimize_prints_what_recomputing_saved_and_costs(tmp_path):
    src = three_exps(tmp_path)
    r = roam("optimize", src, "-o", tmp_path / "plan.json", "--recompute", "free")
    assert r.code == 0, r.err
    # off: e1, e2, m12, e3, m live at once (5B); free: 3B. Three Exp copies of N FLOPs each.
    assert ("recompute (free): 3 nodes added, peak live 20.00 KiB → 12.00 KiB (−40.0%), "
            "kept for the backward 12.00 KiB → 0 B; 3.07 kFLOP more") in r.out


def test_budget_mode_needs_a_budget(tmp_path):
    src = three_exps(tmp_path)
    r = roam("optimize", src, "-o", tmp_path / "plan.json", "--recompute", "budget")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "--budget" in r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["three_exps.onnx"]


def test_a_budget_nothing_can_meet_fails_with_the_size_it_needs_and_writes_nothing(tmp_path):
    src = three_exps(tmp_path)
    r = roam("optimize", src, "-o", tmp_path / "plan.json", "--recompute", "budget", "--budget", "1000")
    assert r.code == 1, r.err
    line = r.err.strip().splitlines()[-1]
    assert "cannot be met" in line and "needs" in line
    # the smallest plan: the three parameters (persistent, 3B) and the free plan's arena (3B + the
    # loss's 256 bytes at most)
    needs = int(line.split("needs ")[1].split(" bytes")[0])
    assert 6 * B <= needs < 6 * B + 3 * 256
    assert sorted(p.name for p in tmp_path.iterdir()) == ["three_exps.onnx"]


def test_a_budget_met_without_recomputing_copies_nothing(tmp_path):
    src = three_exps(tmp_path)
    r = roam("optimize", src, "-o", tmp_path / "plan.json", "--recompute", "budget", "--budget", "1MiB")
    assert r.code == 0, r.err
    plan = plan_of(tmp_path / "plan.json")
    assert plan["recompute"]["nodes"] == [] and plan["recompute"]["tensors"] == []
    assert plan["recompute"]["kept_bytes"] == {"before": 3 * B, "after": 3 * B}
    r = roam("verify", src, tmp_path / "plan.json")
    assert r.code == 0, r.err


def test_a_budget_between_keeps_the_fewest_flops_that_fit(tmp_path):
    """Persistent 3B; the plan as it is needs an arena of 5B, recomputing all three 3B: a budget
    of 7B (arena 4B) needs some recomputation but not all of it."""
    src = three_exps(tmp_path)
    r = roam("optimize", src, "-o", tmp_path / "plan.json", "--recompute", "budget", "--budget", str(7 * B + 512))
    assert r.code == 0, r.err
    plan = plan_of(tmp_path / "plan.json")
    assert plan["persistent_bytes"] + plan["arena_bytes"] <= 7 * B + 512
    assert 1 <= len(plan["recompute"]["nodes"]) <= 3
    assert roam("verify", tmp_path / "plan.annotated.onnx", tmp_path / "plan.json").code == 0


# --- verify catches tampering ------------------------------------------------------------------

def test_verify_refuses_a_reader_ordered_before_its_copy(planned_free, tmp_path):
    d, _ = planned_free
    plan = plan_of(d / "plan.json")
    order = plan["order"]
    order.remove("t1_node")
    order.insert(order.index("e1_node/recompute"), "t1_node")
    assert order.index("loss_node") < order.index("t1_node")  # still after what else it reads
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "plan.annotated.onnx").write_bytes((d / "plan.annotated.onnx").read_bytes())
    r = roam("verify", tmp_path / "plan.annotated.onnx", tmp_path / "plan.json")
    assert r.code == 1 and "plan invalid" in r.err and "e1/recompute" in r.err, r.err


def test_check_recompute_refuses_a_copy_that_reads_another_tensor(planned_free, tmp_path):
    d, _ = planned_free
    plan = plan_of(d / "plan.json")
    m = onnx.load(str(d / "plan.annotated.onnx"))
    imported = import_model(save(m, tmp_path / "same.onnx"))
    step = {name: k for k, name in enumerate(plan["order"])}
    check_recompute(imported.graph, plan["recompute"], step)  # as written: fine
    copy = next(n for n in m.graph.node if n.name == "e1_node/recompute")
    copy.input[0] = "W2"  # Exp(W2): the same op, another value
    imported = import_model(save(m, tmp_path / "tampered.onnx"))
    with pytest.raises(Violation, match="reads 'W2' where 'e1_node' reads 'W1'"):
        check_recompute(imported.graph, plan["recompute"], step)


def test_check_recompute_refuses_a_copy_of_another_op(planned_free, tmp_path):
    d, _ = planned_free
    plan = plan_of(d / "plan.json")
    m = onnx.load(str(d / "plan.annotated.onnx"))
    next(n for n in m.graph.node if n.name == "e2_node/recompute").op_type = "Relu"
    imported = import_model(save(m, tmp_path / "tampered.onnx"))
    step = {name: k for k, name in enumerate(plan["order"])}
    with pytest.raises(Violation, match="is not a copy of 'e2_node'"):
        check_recompute(imported.graph, plan["recompute"], step)


@pytest.mark.parametrize("tamper, message", [
    (lambda n: n.input.__setitem__(0, "W") if n.op_type == "Div" else None, "reads other tensors"),
    (lambda n: n.input.__setitem__(1, "d_node/replay/one") if n.op_type == "Div" else None, "is not a Where"),
    (lambda n: setattr(n, "op_type", "Mul") if n.op_type == "Div" else None, "is not a copy of 'd_node'"),
])
def test_check_recompute_refuses_a_standard_replay_that_computes_something_else(tmp_path, tamper, message):
    imported, mm = load(tmp_path, dropout_graph("standard"))
    rewritten, record = recompute.apply(imported, mm, recompute.free(imported.graph, mm), "free")
    step = {n.name: k for k, n in enumerate(rewritten.graph.nodes)}
    check_recompute(rewritten.graph, record, step)  # as written: fine
    m = rewritten.model
    for n in m.graph.node:
        if n.name.startswith("d_node/replay"):
            tamper(n)
    tampered = import_model(save(m, tmp_path / "tampered.onnx"))
    with pytest.raises(Violation, match=message):
        check_recompute(tampered.graph, record, step)


# --- ORT computes the same outputs with the copies (property) ----------------------------------

UNARY = ("Relu", "Sigmoid", "Tanh", "Neg", "Abs")


@st.composite
def training_like(draw):
    """A forward of ORT-runnable ops over [R, C] float tensors (MatMul, Transpose, elementwise,
    Concat, Reshape, Cast, Split) ending in a scalar loss, and a backward-ish tail that reads forward
    values and the loss."""
    r, c = draw(st.sampled_from([(2, 2), (3, 3), (4, 4)]))
    nodes, inits = [], {}
    pool = ["x0", "x1"]
    shapes = {"x0": (r, c), "x1": (r, c)}
    count = 0

    def fresh():
        nonlocal count
        count += 1
        return f"v{count}"

    for _ in range(draw(st.integers(2, 10))):
        op = draw(st.sampled_from(("unary", "Add", "Mul", "MatMul", "Transpose", "Concat", "Reshape", "Cast",
                                   "Split")))
        x = draw(st.sampled_from(pool))
        same = [t for t in pool if shapes[t] == shapes[x]]
        out = fresh()
        if op == "unary":
            nodes.append(node(draw(st.sampled_from(UNARY)), [x], [out]))
            shapes[out] = shapes[x]
        elif op in ("Add", "Mul"):
            nodes.append(node(op, [x, draw(st.sampled_from(same))], [out]))
            shapes[out] = shapes[x]
        elif op == "MatMul":
            if shapes[x][1] != r:
                continue
            y = draw(st.sampled_from([t for t in pool if shapes[t][0] == shapes[x][1]]))
            nodes.append(node("MatMul", [x, y], [out]))
            shapes[out] = (shapes[x][0], shapes[y][1])
        elif op == "Transpose":
            nodes.append(node("Transpose", [x], [out], perm=[1, 0]))
            shapes[out] = shapes[x][::-1]
        elif op == "Concat":
            nodes.append(node("Concat", [x, x], [out], axis=1))
            shapes[out] = (shapes[x][0], 2 * shapes[x][1])
        elif op == "Reshape":
            shape_name = f"shape{count}"
            inits[shape_name] = np.array(shapes[x][::-1], dtype=np.int64)
            nodes.append(node("Reshape", [x, shape_name], [out]))
            shapes[out] = shapes[x][::-1]
        elif op == "Split":  # two outputs: a copy may be needed for one while the other is kept
            if shapes[x][0] < 2:
                continue
            sizes = f"sizes{count}"
            inits[sizes] = np.array([1, shapes[x][0] - 1], dtype=np.int64)
            other = fresh()
            nodes.append(node("Split", [x, sizes], [out, other], axis=0))
            shapes[out], shapes[other] = (1, shapes[x][1]), (shapes[x][0] - 1, shapes[x][1])
            pool.append(other)
        else:  # a round trip through double: the same float values
            wide = fresh()
            nodes.append(node("Cast", [x], [wide], to=TensorProto.DOUBLE))
            nodes.append(node("Cast", [wide], [out], to=TensorProto.FLOAT))
            shapes[out] = shapes[x]
        pool.append(out)
    forward = [t for t in pool if t not in ("x0", "x1")]
    sums = []
    for t in forward:
        nodes.append(node("ReduceSum", [t], [f"{t}_sum"], keepdims=0))
        sums.append(f"{t}_sum")
    nodes.append(node("Sum", sums, ["loss"]))
    outputs = [("loss", [])]
    read = draw(st.lists(st.sampled_from(forward), min_size=1, max_size=4, unique=True))
    for k, t in enumerate(read):
        nodes.append(node("Mul", [t, "loss"], [f"g{k}"]))
        nodes.append(node("Tanh", [f"g{k}"], [f"h{k}"]))
        outputs.append((f"h{k}", list(shapes[t])))
    return model(nodes, [("x0", [r, c]), ("x1", [r, c])], outputs, initializers=inits)


def ort_outputs(m: onnx.ModelProto, feeds: dict) -> dict:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"],
                                   disabled_optimizers=["CommonSubexpressionElimination"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


@settings(max_examples=30, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(m=training_like(), mode=st.sampled_from(["free", "budget"]), seed=st.integers(0, 2**16))
def test_the_rewritten_model_computes_the_same_outputs_in_ort(tmp_path, m, mode, seed):
    imported, mm = load(tmp_path, m)
    choice = (recompute.free if mode == "free" else recompute.fewest_bytes)(imported.graph, mm)
    rewritten, record = recompute.apply(imported, mm, choice, mode)
    assert len(record["nodes"]) == len(choice.copied)
    onnx.checker.check_model(rewritten.model)
    assert sum(1 for _ in rewritten.model.graph.node) == len(m.graph.node) + len(choice.copied)
    # the source model rewritten again from the plan's record (pair.planned_graph) is the same graph
    again = recompute.reapply(imported, record)
    assert again.graph.nodes == rewritten.graph.nodes
    assert [n.SerializeToString() for n in again.model.graph.node] == \
        [n.SerializeToString() for n in rewritten.model.graph.node]
    # and without the copies (train --compare's reference) it is the source graph again
    undone = rewrite.undo(rewritten.model, record)
    assert [n.SerializeToString() for n in undone.graph.node] == [n.SerializeToString() for n in m.graph.node]
    rng = np.random.default_rng(seed)
    feeds = {x.name: rng.standard_normal([d.dim_value for d in x.type.tensor_type.shape.dim]).astype(np.float32) * 0.5
             for x in m.graph.input}
    expected, got = ort_outputs(m, feeds), ort_outputs(rewritten.model, feeds)
    assert expected.keys() == got.keys()
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=0, err_msg=name)


def test_fewest_bytes_on_a_generated_graph_copies_the_matmuls_too(tmp_path):
    """One example the property runs, pinned: a budget copy of a MatMul computes the same."""
    nodes = [node("MatMul", ["x0", "x1"], ["a"]), node("Tanh", ["a"], ["b"]),
             node("ReduceSum", ["b"], ["loss"], keepdims=0), node("Mul", ["a", "loss"], ["g0"]),
             node("Mul", ["b", "g0"], ["h0"])]
    m = model(nodes, [("x0", [4, 4]), ("x1", [4, 4])], [("loss", []), ("h0", [4, 4])])
    imported, mm = load(tmp_path, m)
    choice = recompute.fewest_bytes(imported.graph, mm)
    assert sorted(copied_names(imported, choice)) == ["a_node", "b_node"]
    rewritten, _ = recompute.apply(imported, mm, choice, "budget")
    feeds = {"x0": np.arange(16, dtype=np.float32).reshape(4, 4) / 16, "x1": np.eye(4, dtype=np.float32)}
    expected, got = ort_outputs(m, feeds), ort_outputs(rewritten.model, feeds)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name])


# --- a training step with the copies, against plain ORT -------------------------------------

@pytest.fixture(scope="module")
def sample_step_recomputed(tmp_path_factory):
    d = tmp_path_factory.mktemp("step_rc")
    r = roam("make-training-graph", SAMPLE, "-o", d / "step.onnx", "--in-graph-optimizer")
    assert r.code == 0, r.err
    # the order's search is cut at a few seconds: what trains is the copies, whatever the order
    r = roam("optimize", d / "step.onnx", "-o", d / "plan.json", "--recompute", "free", "--time-limit", "5")
    assert r.code == 0, r.err
    return d


def test_the_sample_trains_with_its_copies_as_plain_ort_does(sample_step_recomputed):
    d = sample_step_recomputed
    plan = plan_of(d / "plan.json")
    assert plan["recompute"]["nodes"], "free mode recomputes something in the sample's step"
    assert plan["recompute"]["kept_bytes"]["after"] < plan["recompute"]["kept_bytes"]["before"]
    for member in (d / "plan.annotated.onnx", d / "step.onnx"):
        r = roam("verify", member, d / "plan.json")
        assert r.code == 0, (member, r.err)
    r = roam("train", d / "plan.annotated.onnx", "--plan", d / "plan.json", "--steps", "3", "--compare", "--json")
    assert r.code == 0, r.err
    result = r.json()
    assert result["compare"]["outputs_max_rel"] <= 1e-5 and result["compare"]["state_max_rel"] <= 1e-5


def test_a_chain_of_copies_thousands_deep_is_rewritten(tmp_path):
    # x -> Neg x 3000 -> v2999, read after the forward by the output node y = Abs(v2999); every Neg
    # copied: each copy reads the copy before it, 3,000 deep (a GPT2-XL-class step's least-memory
    # recomputation chains that deep), each right after the one it reads
    n = 3000
    chain = [node("Neg", ["x" if k == 0 else f"v{k - 1}"], [f"v{k}"], name=f"neg{k}") for k in range(n)]
    m = model(chain + [node("Abs", [f"v{n - 1}"], ["y"], name="abs")], [("x", [4])], [("y", [4])])
    imported = import_model(save(m, tmp_path / "chain.onnx"), {}, False)
    rewritten, added, renamed = rewrite.rewrite(imported, set(range(n)), list(range(n)), set(), set())
    copies = [x.name for x in rewritten.graph.nodes[n:]]
    assert copies == [added_name for added_name in copies if added_name in added] + ["abs"]
    assert [added[c] for c in copies[:-1]] == [f"neg{k}" for k in range(n)]
    assert rewritten.graph.nodes[-1].inputs == (renamed[f"v{n - 1}"],)


def test_a_plan_stopped_at_the_budget_that_does_not_fit_is_made_again_searched_to_its_end():
    from dataclasses import replace as dc_replace
    from types import SimpleNamespace

    from roam_cli import pipeline

    made = []

    def make(options):  # persistent 100 B; the stopped search's arena 60 B (fragmented past its peak), else 40 B
        made.append(options.stop_at_budget)
        stopped = options.stop_at_budget
        return SimpleNamespace(plan={"persistent_bytes": 100, "arena_bytes": 60 if stopped else 40,
                                     "stats": {"order": {"stopped_at_target": stopped}}})

    options = dc_replace(pipeline.Options(), budget=150, stop_at_budget=True)
    assert pipeline.plan_to_fit(make, options).plan["arena_bytes"] == 40 and made == [True, False]
    made.clear()
    assert pipeline.plan_to_fit(make, dc_replace(options, budget=160)).plan["arena_bytes"] == 60 and made == [True]
