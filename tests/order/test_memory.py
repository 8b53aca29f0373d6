"""Each memory-model rule of DESIGN.md on a hand-built graph, with hand-computed expectations."""

import json

import numpy as np
import pytest
from onnx_builder import model, node, save

from roam_cli.core import memory
from roam_cli.core.errors import RoamError
from roam_cli.frontend.onnx_import import import_model
from roam_cli.order import original

KB = 1024


def plan_of(tmp_path, m, alignment=256, **kw):
    path = save(m, tmp_path / "m.onnx")
    graph = import_model(path, kw.pop("dims", None)).graph
    mm = memory.build(graph, alignment, **kw)
    spans = memory.lifetimes(mm, original(mm))
    return graph, mm, {s.root: span for s, span in zip(mm.storages, spans)}


def chain():
    # x[256] -> Relu a -> Relu b -> Add(a, b) c ; c is the output. float32: 1 KiB each.
    return model([node("Relu", ["x"], ["a"]), node("Relu", ["a"], ["b"]), node("Add", ["a", "b"], ["c"])],
                 [("x", [256])], [("c", [256])])


def test_lifetimes_run_from_producer_to_last_reader_and_outputs_to_the_end(tmp_path):
    graph, mm, spans = plan_of(tmp_path, chain())
    assert spans == {"a": (0, 2), "b": (1, 2), "c": (2, 2)}
    assert [s.bytes for s in mm.storages] == [KB, KB, KB]
    assert memory.peak_live(mm, list(spans.values())) == (3 * KB, 2)
    assert mm.persistent == {"x": "data_input"}


def test_sizes_are_exact_then_rounded_up_to_the_alignment(tmp_path):
    m = model([node("Relu", ["x"], ["y"])], [("x", [10])], [("y", [10])])
    assert plan_of(tmp_path, m)[1].tensor_bytes["y"] == 256  # 40 B -> 256
    assert plan_of(tmp_path, m, alignment=64)[1].tensor_bytes["y"] == 64
    assert plan_of(tmp_path, m, alignment=1)[1].tensor_bytes["y"] == 40


def test_zero_size_tensor_takes_no_bytes(tmp_path):
    m = model([node("Relu", ["x"], ["y"])], [("x", [0, 4])], [("y", [0, 4])])
    assert plan_of(tmp_path, m)[1].tensor_bytes["y"] == 0


def test_unread_output_lives_to_the_last_step(tmp_path):
    # ONNX Runtime frees a value nothing reads when the run ends, not at its producer's step.
    m = model([node("Split", ["x"], ["p", "q"], num_outputs=2), node("Relu", ["p"], ["r"])],
              [("x", [512])], [("r", [256])])
    assert plan_of(tmp_path, m)[2]["q"] == (0, 1)


def test_in_place_kernel_writes_into_an_input_it_reads_last(tmp_path):
    # a = Add(x, x); s = Softmax(a), a's only reader; t = Relu(s), s's only reader (a chain);
    # y = Mul(t, x). s and t are written into a's storage: one 1 KiB buffer over steps 0..3.
    m = model([node("Add", ["x", "x"], ["a"]), node("Softmax", ["a"], ["s"]), node("Relu", ["s"], ["t"]),
               node("Mul", ["t", "x"], ["y"])], [("x", [256])], [("y", [256])])
    _, mm, spans = plan_of(tmp_path, m)
    assert mm.storage_of["s"] == mm.storage_of["t"] == "a"
    assert mm.kind["s"] == mm.kind["t"] == "inplace"
    assert spans == {"a": (0, 3), "y": (3, 3)}


def test_in_place_kernel_only_where_onnx_runtime_would(tmp_path):
    # r1 = Relu(a) while Mul still reads a (another reader); r2 = Relu(x) (a graph input);
    # c = Cast(a2 to int64), unread: 8-byte elements from 4-byte ones; o = Relu(b), o a graph
    # output. None of them is in place.
    m = model([node("Add", ["x", "x"], ["a"]), node("Relu", ["a"], ["r1"]), node("Mul", ["a", "r1"], ["m"]),
               node("Relu", ["x"], ["r2"]), node("Add", ["m", "r2"], ["a2"]), node("Cast", ["a2"], ["c"], to=7),
               node("Add", ["m", "x"], ["b"]), node("Relu", ["b"], ["o"])],
              [("x", [256])], [("o", [256])])
    _, mm, _ = plan_of(tmp_path, m)
    assert not {"r1", "r2", "c", "o"} & set(mm.alias)


def test_in_place_kernel_where_the_file_or_the_order_runs_it_last_among_its_input_s_readers(tmp_path):
    # a = Add(x, x), read by n = Erf(a) and s = Softmax(a); y = Add(n, s). The file has Erf first:
    # Softmax reads a last, and ONNX Runtime writes s into it; the model makes Erf run first in
    # every order (an edge), so a's one buffer lives from step 0 to y at step 3, the peak three
    # buffers at step 3 (a, n, y).
    m = model([node("Add", ["x", "x"], ["a"]), node("Erf", ["a"], ["n"]), node("Softmax", ["a"], ["s"]),
               node("Add", ["n", "s"], ["y"])], [("x", [256])], [("y", [256])])
    graph, mm, spans = plan_of(tmp_path, m)
    assert mm.storage_of["s"] == "a" and mm.kind["s"] == "inplace" and len(mm.storages) == 3
    assert (1, 2) in mm.extra_deps
    assert spans == {"a": (0, 3), "n": (1, 3), "y": (3, 3)}
    assert memory.peak_live(mm, list(spans.values())) == (3 * KB, 3)
    # With Softmax first in the file, Erf (no in-place kernel of ORT's, none of roam's) reads a last:
    # no join, until an order runs Softmax last, as ORT's planner then sees it
    m = model([node("Add", ["x", "x"], ["a"]), node("Softmax", ["a"], ["s"]), node("Erf", ["a"], ["n"]),
               node("Add", ["n", "s"], ["y"])], [("x", [256])], [("y", [256])])
    graph, mm, _ = plan_of(tmp_path, m)
    assert "s" not in mm.alias and len(mm.storages) == 4
    ran = memory.build(graph, 256, order=[0, 2, 1, 3])
    assert ran.storage_of["s"] == "a" and len(ran.storages) == 3
    # what the planner checks before building again for its order: the joins the order adds
    assert memory.kernel_joins(graph, None, [0, 2, 1, 3]) == {"s": "a"}
    assert memory.kernel_joins(graph, None, [0, 1, 2, 3]) == memory.kernel_joins(graph, None, None) == {}


def test_size_lives_from_where_onnx_runtime_runs_it(tmp_path):
    # a = erf(x); b = erf(a); c = erf(b); s = Size(a); f = float(s); y = c * f, written with Size
    # late. ORT runs Size right after a's producer (order [0, 3, 1, 2, 4, 5]): s is 8 bytes (256
    # aligned), f 4 (256). (Erf: no kernel writes over its input here.)
    m = model([node("Erf", ["x"], ["a"]), node("Erf", ["a"], ["b"]), node("Erf", ["b"], ["c"]),
               node("Size", ["a"], ["s"]), node("Cast", ["s"], ["f"], to=1), node("Mul", ["c", "f"], ["y"])],
              [("x", [256])], [("y", [256])])
    graph, mm, spans = plan_of(tmp_path, m)
    assert spans == {"a": (0, 2), "s": (1, 4), "b": (2, 3), "c": (3, 5), "f": (4, 5), "y": (5, 5)}
    # a + s + b at step 2, s + b + c at 3, c + f + y at 5; run late, Size would keep a with b and c (3 KiB)
    assert memory.peak_live(mm, list(spans.values())) == (2 * KB + 256, 2)


def test_views_share_storage_until_the_last_use_of_any_name(tmp_path):
    # a = Relu(x); v = Reshape(a) (a view); b = Relu(x); c = Add(v, b): a's storage lives to step 3.
    shape = np.array([16, 16], dtype=np.int64)
    m = model([node("Relu", ["x"], ["a"]), node("Reshape", ["a", "shape"], ["v"]),
               node("Relu", ["x"], ["b"]), node("Add", ["v", "b"], ["c"])],
              [("x", [256])], [("c", [16, 16])], initializers={"shape": shape}, value_info=[("b", [16, 16])])
    graph, mm, spans = plan_of(tmp_path, m)
    assert mm.storage_of["v"] == "a" and mm.alias["v"] == "view"
    assert "v" not in spans
    assert spans["a"] == (0, 3)
    assert mm.persistent["shape"] == "constant"


def test_in_place_accumulator_writes_the_gradient_buffer_and_adds_no_bytes(tmp_path):
    # w (parameter) -> y = Mul(x, w); w_grad = Mul(x, x) stands in for the gradient;
    # InPlaceAccumulatorV2(w_grad.accumulation.buffer, w_grad) updates the buffer, flag is a bool[1].
    m = model([node("Mul", ["x", "w"], ["y"]), node("Mul", ["x", "x"], ["w_grad"]),
               node("InPlaceAccumulatorV2", ["buf", "w_grad"], ["flag"], domain="com.microsoft")],
              [("x", [256]), ("w", [256]), ("buf", [256])], [("y", [256]), ("flag", [1], 9)])
    graph, mm, spans = plan_of(tmp_path, m)
    assert mm.persistent == {"x": "data_input", "w": "parameter", "buf": "gradient_buffer"}
    assert spans == {"y": (0, 2), "w_grad": (1, 2), "flag": (2, 2)}
    assert mm.node_class[2] == "accumulate"


def test_in_place_write_runs_after_every_reader_of_the_old_value(tmp_path):
    # buf is read by Relu (node 1) and overwritten by the accumulator (node 0 in the file):
    # the memory model adds the edge reader -> writer, so the original order moves the reader first.
    m = model([node("InPlaceAccumulatorV2", ["buf", "g"], ["flag"], domain="com.microsoft", name="acc"),
               node("Relu", ["buf"], ["r"], name="reader")],
              [("buf", [64]), ("g", [64])], [("flag", [1], 9), ("r", [64])])
    graph, mm, _ = plan_of(tmp_path, m)
    assert mm.extra_deps == [(1, 0)]
    assert original(mm) == [1, 0]


def test_declared_update_chain_writes_state_in_place(tmp_path):
    # SGD with momentum, as a full-step graph would write it:
    #   m.out = Add(Mul(m, 0.9), g)      (Mul, m's last reader: written over m, whose new value
    #                                     the Add writes there anyway)
    #   w.out = Sub(w, Mul(m.out, lr))   (written into w)
    m = model([node("Mul", ["x", "w"], ["y"]), node("Mul", ["x", "y"], ["w_grad"]),
               node("Mul", ["m", "beta"], ["mb"]), node("Add", ["mb", "w_grad"], ["m.out"]),
               node("Mul", ["m.out", "lr"], ["step"]), node("Sub", ["w", "step"], ["w.out"])],
              [("x", [256]), ("w", [256]), ("m", [256])],
              [("y", [256]), ("m.out", [256]), ("w.out", [256])],
              initializers={"beta": np.float32(0.9), "lr": np.float32(0.1)})
    graph, mm, spans = plan_of(tmp_path, m)
    assert mm.persistent["w"] == "parameter" and mm.persistent["m"] == "optimizer_state"
    assert mm.storage_of["m.out"] == "m" and mm.storage_of["w.out"] == "w"
    assert set(spans) == {"y", "w_grad", "step"}  # no transient bytes for the updated state
    assert mm.storage_of["mb"] == "m" and mm.written_over == {"mb": "m"}
    assert mm.kind["mb"] == "inplace" and mm.kind["step"] == "update_temp"
    # the forward Mul reads w's old value: it must run before Sub overwrites w
    assert (0, 5) in mm.extra_deps


def adamw_moments():
    # g = x * x stands in for a gradient; each moment updated as AdamW writes it:
    #   a = m * b1, b = g * c1, m.out = a + b;  gg = g * g, d = gg * c2, e = v * b2, v.out = e + d
    return model([node("Mul", ["x", "x"], ["g"]), node("Mul", ["m", "b1"], ["a"]), node("Mul", ["g", "c1"], ["b"]),
                  node("Add", ["a", "b"], ["m.out"]), node("Mul", ["g", "g"], ["gg"]), node("Mul", ["gg", "c2"], ["d"]),
                  node("Mul", ["v", "b2"], ["e"]), node("Add", ["e", "d"], ["v.out"])],
                 [("x", [256]), ("m", [256]), ("v", [256])], [("m.out", [256]), ("v.out", [256])],
                 initializers={k: np.float32(0.5) for k in ("b1", "c1", "c2", "b2")})


def test_an_elementwise_output_is_written_over_an_input_nothing_reads_afterwards(tmp_path):
    # a over m and e over v (their only readers, and the step writes the moments' new values there
    # anyway), d over gg (its only reader). g has two readers, b and gg, neither the other's
    # ancestor: gg, the later in the file, is written over g, and b must now run before it (an edge
    # the model adds). So two transient storages of 1 KiB where there were six: g with gg and d
    # (0..7), b (2..3).
    graph, mm, spans = plan_of(tmp_path, adamw_moments())
    assert mm.written_over == {"a": "m", "gg": "g", "d": "gg", "e": "v"}
    assert mm.storage_of["a"] == "m" and mm.storage_of["e"] == "v" and mm.storage_of["d"] == "g"
    assert (2, 4) in mm.extra_deps and 2 in mm.preds[4]
    assert spans == {"g": (0, 7), "b": (2, 3)}
    assert memory.peak_live(mm, list(spans.values())) == (2 * KB, 2)
    # no order changes them: the order search counts the storages of the plan it makes
    assert memory.kernel_joins(graph, None, [0, 1, 2, 3, 4, 5, 6, 7]) == mm.kernel_joins


def test_an_input_read_broadcast_or_later_or_of_another_size_keeps_its_storage(tmp_path):
    # s = Sqrt(x) [4, 256]; r = ReduceMean(s) [4, 1]; y = s / r: over s (r, s's other reader, is
    # y's ancestor), not over r (another shape). h = Cast(y) to float16 (an output): another element
    # size. q = y * y: over y, the Cast before it in the file. z = w + q: not over w, a graph input,
    # but over q. o = -z: an output keeps a storage of its own.
    m = model([node("Sqrt", ["x"], ["s"]), node("ReduceMean", ["s"], ["r"], axes=[1], keepdims=1),
               node("Div", ["s", "r"], ["y"]), node("Cast", ["y"], ["h"], to=10), node("Mul", ["y", "y"], ["q"]),
               node("Add", ["w", "q"], ["z"]), node("Neg", ["z"], ["o"])],
              [("x", [4, 256]), ("w", [4, 256])], [("h", [4, 256], 10), ("o", [4, 256])])
    _, mm, _ = plan_of(tmp_path, m)
    assert mm.written_over == {"y": "s", "q": "y", "z": "q"}


def test_pairs_from_metadata(tmp_path):
    m = model([node("Add", ["s", "x"], ["next_s"])], [("s", [64]), ("x", [64])], [("next_s", [64])],
              metadata={"roam.inplace": json.dumps({"next_s": "s"})})
    graph, mm, spans = plan_of(tmp_path, m)
    assert mm.storage_of["next_s"] == "s" and spans == {}


def test_unknown_size_is_an_error_naming_the_tensor(tmp_path):
    m = model([node("Mystery", ["x"], ["y"], domain="com.example")], [("x", [4])], [("y", [4])])
    m.graph.output[0].type.tensor_type.ClearField("shape")
    m.opset_import.add(domain="com.example", version=1)
    with pytest.raises(RoamError) as refused:
        plan_of(tmp_path, m)
    assert str(refused.value) == "cannot determine the size of 1 tensors: y; try --shapes-from-run"


def test_symbolic_dims_are_bound(tmp_path):
    m = model([node("Relu", ["x"], ["y"])], [("x", ["batch", 64])], [("y", ["batch", 64])])
    graph, mm, _ = plan_of(tmp_path, m, dims={"batch": 8})
    assert mm.tensor_bytes["y"] == 8 * 64 * 4
    with pytest.raises(RoamError, match="--dim batch=N"):
        plan_of(tmp_path, m)


def test_an_integer_value_is_an_index_whichever_nodes_made_it(tmp_path):
    # forward: a = relu(x), loss = sum(a); backward: s = Shape(a) (int64), g = Expand(one, s), y = g * a
    m = model([node("Relu", ["x"], ["a"]), node("ReduceSum", ["a"], ["loss"], keepdims=0),
               node("Shape", ["a"], ["s"]), node("Expand", ["one", "s"], ["g"]), node("Mul", ["g", "a"], ["y"])],
              [("x", [2, 3])], [("loss", []), ("y", [2, 3])], initializers={"one": np.ones([1], np.float32)})
    mm = memory.build(import_model(save(m, tmp_path / "m.onnx")).graph)
    assert mm.node_class == ["forward", "forward", "backward", "backward", "backward"]
    assert (mm.kind["a"], mm.kind["s"], mm.kind["g"], mm.kind["y"]) == ("activation", "index", "gradient", "gradient")
