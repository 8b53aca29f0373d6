"""Hostile inputs: each one either plans (and the plan verifies) or exits 2 with one line on stderr;
never a traceback, never a partial or stray file. Every fixture is built here, in the test.

Each fixture runs through the CLI's entry point in this process (fast); a sample of them also
runs as a real process, to see the exit code and streams exactly as a user does."""

import contextlib
import io
import json
import os
import random
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from conftest import SAMPLE
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx_builder import model, node
from random_graphs import training_graphs

from roam_cli import pipeline
from roam_cli.cli import main
from roam_cli.core.errors import RoamError
from roam_cli.frontend.onnx_import import import_model
from roam_cli.verify import verify

from benchmarks.order_layout.chain100k import chain, measure

F = TensorProto.FLOAT


def vi(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def raw_model(nodes, inputs, outputs, initializers=()):
    """A model from ready-made value infos (for types onnx_builder does not spell)."""
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(initializers)),
                          opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 10
    return m


def control_flow_if():
    # the branches read `a` from the outer scope: the If consumes it, so `a` lives until the If
    then_g = helper.make_graph([node("Relu", ["a"], ["t"])], "then", [], [vi("t", [4])])
    else_g = helper.make_graph([node("Neg", ["a"], ["e"])], "else", [], [vi("e", [4])])
    return raw_model([node("Relu", ["x"], ["a"]), node("Relu", ["x"], ["b"]),
                      node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g), node("Add", ["y", "b"], ["z"])],
                     [vi("x", [4]), vi("c", [], TensorProto.BOOL)], [vi("z", [4])])


def control_flow_loop():
    body = helper.make_graph(
        [node("Add", ["acc", "x"], ["acc2"]), node("Identity", ["cond_in"], ["cond_out"])], "body",
        [vi("i", [], TensorProto.INT64), vi("cond_in", [], TensorProto.BOOL), vi("acc", [4])],
        [vi("cond_out", [], TensorProto.BOOL), vi("acc2", [4])])
    return raw_model([node("Loop", ["n", "c", "x"], ["y"], body=body), node("Relu", ["y"], ["z"])],
                     [vi("x", [4]), vi("c", [], TensorProto.BOOL), vi("n", [], TensorProto.INT64)], [vi("z", [4])])


def control_flow_scan():
    body = helper.make_graph([node("Add", ["s", "xi"], ["s2"]), node("Identity", ["s2"], ["yi"])], "body",
                             [vi("s", [4]), vi("xi", [4])], [vi("s2", [4]), vi("yi", [4])])
    return raw_model([node("Scan", ["x0", "xs"], ["sf", "ys"], body=body, num_scan_inputs=1),
                      node("Relu", ["ys"], ["z"])],
                     [vi("x0", [4]), vi("xs", [3, 4])], [vi("sf", [4]), vi("z", [3, 4])])


def sequence_inside():
    return raw_model([node("SequenceConstruct", ["x", "x"], ["s"]), node("SequenceAt", ["s", "i"], ["y"])],
                     [vi("x", [4]), vi("i", [], TensorProto.INT64)], [vi("y", [4])])


def sequence_output():
    return raw_model([node("SequenceConstruct", ["x", "x"], ["s"])], [vi("x", [4])],
                     [helper.make_tensor_sequence_value_info("s", F, [4])])


def map_input():
    mp = helper.make_value_info("m", helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(F, [4])))
    return raw_model([node("Relu", ["x"], ["y"])], [vi("x", [4]), mp], [vi("y", [4])])


def optional_inside():
    return raw_model([node("Optional", ["x"], ["o"]), node("OptionalGetElement", ["o"], ["y"])],
                     [vi("x", [4])], [vi("y", [4])])


def unknown_domain(declared: bool):
    m = model([node("Mystery", ["x"], ["y"], domain="com.example"), node("Relu", ["y"], ["z"])],
              [("x", [4])], [("z", [4])], value_info=[("y", [4])] if declared else ())
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    return m


def non_utf8_name():
    data = model([node("Relu", ["x"], ["y"], name="NAME")], [("x", [4])], [("y", [4])]).SerializeToString()
    return data.replace(b"NAME", b"\xff\xfe\xfd\xfc")


def unknown_element_type():
    m = model([node("Relu", ["x"], ["y"])], [("x", [4])], [("y", [4])])
    m.graph.input[0].type.tensor_type.elem_type = 99
    return m


def corrupt_initializer():
    shape = numpy_helper.from_array(np.array([2, 2], np.int64), "shape")
    shape.raw_data = shape.raw_data[:11]  # 11 of the 16 bytes two int64 need
    return raw_model([node("Reshape", ["x", "shape"], ["y"])], [vi("x", [4])], [vi("y", [2, 2])], [shape])


def state_read_after_update():
    # v is a view of state s; s.out overwrites s in place, then a node reads v (the old s) and
    # s.out (the new s) together: no order can give it both
    return model([node("Identity", ["s"], ["v"]), node("Add", ["s", "x"], ["s.out"]), node("Add", ["v", "s.out"], ["z"])],
                 [("s", [64]), ("x", [64])], [("s.out", [64]), ("z", [64])])


# name -> (what to write: a ModelProto or raw bytes, extra optimize arguments, expected outcome:
#          "plan", or a phrase the one-line error must contain)
HOSTILE = {
    "random_bytes": (random.Random(7).randbytes(4096), (), "not a valid ONNX model"),
    "empty_file": (b"", (), "not an ONNX model"),
    "truncated_by_one_byte": (SAMPLE.read_bytes()[:-1], (), "not a valid ONNX model"),
    "truncated_to_10_bytes": (SAMPLE.read_bytes()[:10], (), "not a valid ONNX model"),
    "protobuf_tensor_not_model": (numpy_helper.from_array(np.ones(4, np.float32)).SerializeToString(), (),
                                  "not an ONNX model"),
    "protobuf_graph_not_model": (helper.make_graph([node("Relu", ["x"], ["y"])], "g", [vi("x", [4])],
                                                   [vi("y", [4])]).SerializeToString(), (), "not an ONNX model"),
    "no_nodes": (raw_model([], [vi("x", [4])], [vi("x", [4])]), (), "has no nodes"),
    "cycle": (model([node("Relu", ["x"], ["a"]), node("Add", ["a", "c"], ["b"]), node("Relu", ["b"], ["c"])],
                    [("x", [4])], [("c", [4])]), (), "cycle"),
    "node_reads_own_output": (model([node("Add", ["x", "y"], ["y"])], [("x", [4])], [("y", [4])]), (), "cycle"),
    "duplicate_producer": (model([node("Relu", ["x"], ["y"]), node("Neg", ["x"], ["y"], name="again")],
                                 [("x", [4])], [("y", [4])]), (), "produced twice"),
    "node_overwrites_graph_input": (model([node("Relu", ["x"], ["x"])], [("x", [4])], [("x", [4])]), (),
                                    "produced twice"),
    "dangling_input": (model([node("Add", ["x", "ghost"], ["y"])], [("x", [4])], [("y", [4])]), (),
                       "'ghost', which no node, input or initializer defines"),
    "dangling_graph_output": (model([node("Relu", ["x"], ["y"])], [("x", [4])], [("y", [4]), ("ghost", [4])]), (),
                              "'ghost' is not produced by any node"),
    "newline_in_a_name": (model([node("Add", ["x", "two\nlines"], ["y"])], [("x", [4])], [("y", [4])]), (),
                          "'two\\nlines'"),
    "if_with_outer_scope_capture": (control_flow_if(), (), "plan"),
    "loop_carried_shape_unknown": (control_flow_loop(), (), "cannot determine the size of 1 tensors: y"),
    "loop_with_shapes_from_run": (control_flow_loop(), ("--shapes-from-run",), "plan"),
    "scan": (control_flow_scan(), (), "plan"),
    "sequence_inside": (sequence_inside(), (), "'s' is of sequence type"),
    "sequence_output": (sequence_output(), (), "'s' is of sequence type"),
    "sequence_inside_with_shapes_from_run": (sequence_inside(), ("--shapes-from-run",), "'s' is of sequence type"),
    "map_input": (map_input(), (), "'m' is of map type"),
    "optional_inside": (optional_inside(), (), "'o' is of optional type"),
    "ort_optimizer_model_sequences": (SAMPLE.with_name("optimizer_model.onnx").read_bytes(), (), "of sequence type"),
    "string_tensor": (model([node("Identity", ["s"], ["t"])], [("s", [4], TensorProto.STRING)],
                            [("t", [4], TensorProto.STRING)]), (), "string tensors have no static size"),
    "string_initializer": (model([node("Identity", ["s"], ["t"])], [], [("t", [2], TensorProto.STRING)],
                                 initializers={"s": np.array(["a", "b"], dtype=object)}), (),
                           "string tensors have no static size"),
    "bytes_overflow_int64": (model([node("Relu", ["x"], ["y"])], [("x", [2**40, 2**40])], [("y", [2**40, 2**40])]),
                             (), "overflows int64"),
    "total_bytes_overflow_int64": (model([node("Relu", ["x"], ["y"]), node("Relu", ["y"], ["z"])],
                                         [("x", [2**60])], [("z", [2**60])]), (), "more than a 64-bit size can hold"),
    "negative_dim": (model([node("Relu", ["x"], ["y"])], [("x", [-3, 4])], [("y", [-3, 4])]), (),
                     "negative dimension"),
    "input_without_shape": (raw_model([node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", F, None)],
                                      [vi("y", [4])]), (), "cannot determine the size of 1 tensors: x"),
    "unknown_element_type": (unknown_element_type(), (), "element type 99, which ONNX does not define"),
    "name_not_utf8": (non_utf8_name(), (), "is not UTF-8 text"),
    "corrupt_initializer": (corrupt_initializer(), (), "initializer 'shape' is corrupt"),
    "unknown_domain_unknown_shape": (unknown_domain(declared=False), (), "cannot determine the size of 1 tensors: y"),
    "unknown_domain_declared_shape": (unknown_domain(declared=True), (), "plan"),
    "zero_size_tensors": (model([node("Relu", ["x"], ["a"]), node("Add", ["a", "a"], ["y"])], [("x", [0, 4])],
                                [("y", [0, 4])]), (), "plan"),
    "state_read_after_in_place_update": (state_read_after_update(), (), "in-place updates cannot be honoured"),
}


def write_case(root: Path, name: str) -> tuple[Path, list[str]]:
    """The fixture's file in a folder of its own, and the optimize arguments for it."""
    content, args, _ = HOSTILE[name]
    d = root / name
    d.mkdir()
    path = d / "model.onnx"
    path.write_bytes(content if isinstance(content, bytes) else content.SerializeToString())
    return path, ["optimize", str(path), "-o", str(d / "plan.json"), *args]


def main_in_process(argv: list[str]) -> tuple[int, str]:
    """`roam ARGV` through the CLI's entry point: (exit code, stderr). An exception escaping
    main() is what a user would see as a traceback: it fails the test."""
    err = io.StringIO()
    with mock.patch.object(sys, "argv", ["roam", *argv]), contextlib.redirect_stderr(err), \
            contextlib.redirect_stdout(io.StringIO()):
        try:
            main()
        except SystemExit as e:
            return e.code, err.getvalue()
    raise AssertionError("main() returned without an exit code")


def check_outcome(name: str, path: Path, args: list[str], code: int, stderr: str) -> None:
    expected = HOSTILE[name][2]
    left = sorted(p.name for p in path.parent.iterdir())
    if expected == "plan":
        assert code == 0, stderr
        assert left == ["model.onnx", "plan.json"]
        imported = import_model(path, {}, "--shapes-from-run" in args)
        verify(imported.graph, imported.sha256, json.loads((path.parent / "plan.json").read_text()))
    else:
        assert code == 2, (code, stderr)
        assert stderr.startswith("roam: error: ") and stderr.count("\n") == 1, stderr
        assert expected in stderr, stderr
        assert left == ["model.onnx"]  # no plan, no temporary file


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_input_plans_or_exits_2_with_one_line(tmp_path, name):
    path, argv = write_case(tmp_path, name)
    code, stderr = main_in_process(argv)
    check_outcome(name, path, argv, code, stderr)


REAL_PROCESS = ["random_bytes", "cycle", "sequence_output", "name_not_utf8", "if_with_outer_scope_capture"]


def test_hostile_inputs_in_real_processes(tmp_path):
    cases = {name: write_case(tmp_path, name) for name in REAL_PROCESS}
    with ThreadPoolExecutor(max_workers=len(cases)) as pool:
        procs = dict(zip(cases, pool.map(
            lambda c: subprocess.run([sys.executable, "-m", "roam_cli", *c[1]], capture_output=True, text=True,
                                     env={**os.environ, "COLUMNS": "200"}), cases.values())))
    for name, proc in procs.items():
        assert "Traceback" not in proc.stderr, proc.stderr
        check_outcome(name, cases[name][0], cases[name][1], proc.returncode, proc.stderr)


def test_if_branches_keep_outer_tensors_alive(tmp_path):
    path, argv = write_case(tmp_path, "if_with_outer_scope_capture")
    assert main_in_process(argv)[0] == 0
    plan = json.loads((path.parent / "plan.json").read_text())
    step = {name: s for s, name in enumerate(plan["order"])}
    a = next(t for t in plan["tensors"] if t["name"] == "a")
    assert a["last_step"] >= step["y_node"] > a["first_step"]  # read inside the branches, by the If


def check_corrupted(data: bytes) -> str:
    """Plan a file through the CLI: either exit 0 with a plan that verifies against the model it
    names, or exit 2 with one line. Returns which ("planned" or "refused")."""
    with tempfile.TemporaryDirectory() as d:
        path, plan_path = Path(d) / "m.onnx", Path(d) / "plan.json"
        path.write_bytes(data)
        code, stderr = main_in_process(["optimize", str(path), "-o", str(plan_path)])
        if code == 2:
            assert stderr.startswith("roam: error: ") and stderr.count("\n") == 1, stderr
            assert not plan_path.exists()
            return "refused"
        assert code == 0, stderr
        plan = json.loads(plan_path.read_text())
        imported = import_model(plan_path.parent / plan["model"]["path"])
        verify(imported.graph, imported.sha256, plan)
        return "planned"


@settings(max_examples=150, deadline=None)
@given(training_graphs(max_nodes=8), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1,
                                                max_size=4))
def test_corrupted_files_plan_or_exit_2(graph, flips):
    """Bytes overwritten anywhere in a valid model."""
    data = bytearray(graph.SerializeToString())
    for position, value in flips:
        data[position % len(data)] = value
    check_corrupted(bytes(data))


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """A small model and its plan: (model path, plan)."""
    d = tmp_path_factory.mktemp("planned")
    path = d / "m.onnx"
    path.write_bytes(model([node("Relu", ["x"], ["a"]), node("Reshape", ["a", "shape"], ["v"]),
                            node("Add", ["a", "v"], ["b"]), node("Mul", ["b", "x"], ["y"])],
                           [("x", [64])], [("y", [64])], initializers={"shape": np.array([64], np.int64)},
                           ).SerializeToString())
    assert main_in_process(["optimize", str(path), "-o", str(d / "plan.json")])[0] == 0
    return path, json.loads((d / "plan.json").read_text())


JUNK = (0, -1, 255, 10**20, 1.5, None, "", "a", [], {}, True)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_verify_on_a_corrupted_plan_exits_0_1_or_2_with_one_line(planned, tmp_path_factory, data):
    """A plan file edited anywhere (a value replaced, a key deleted, a list item repeated): verify
    accepts it, finds a violation (1) or refuses the file (2), in one line; never crashes."""
    path, plan = planned
    names = tuple(t["name"] for t in plan["tensors"])
    plan = json.loads(json.dumps(plan))
    for _ in range(data.draw(st.integers(1, 3))):
        places = []

        def walk(value, parent, key):
            if parent is not None:
                places.append((parent, key))
            for k, v in (value.items() if isinstance(value, dict) else enumerate(value)
                         if isinstance(value, list) else ()):
                if k != "stats":  # what verify checks, not the solvers' statistics
                    walk(v, value, k)

        walk(plan, None, None)
        parent, key = data.draw(st.sampled_from(places))
        edit = data.draw(st.sampled_from(["delete", "junk", "nudge", "repeat"]))
        if edit == "delete":
            del parent[key]
        elif edit == "junk":
            parent[key] = data.draw(st.sampled_from(JUNK + names))
        elif edit == "nudge" and isinstance(parent[key], int) and not isinstance(parent[key], bool):
            parent[key] += data.draw(st.sampled_from([-256, -1, 1, 256, 10**6]))
        elif edit == "repeat" and isinstance(parent, list):
            parent.append(parent[key])
    plan_path = tmp_path_factory.mktemp("edited") / "plan.json"
    plan_path.write_text(json.dumps(plan))
    code, stderr = main_in_process(["verify", str(path), str(plan_path)])
    assert code in (0, 1, 2) and stderr.count("\n") == (code != 0), (code, stderr)


def test_a_10000_node_chain_plans_and_verifies(tmp_path):
    path = tmp_path / "chain.onnx"
    path.write_bytes(chain(10_000).SerializeToString())
    result = pipeline.run(path, tmp_path / "plan.json", pipeline.Options(order="original", layout="first-fit"))
    verify(result.imported.graph, result.imported.sha256, result.plan)
    assert result.plan["arena_bytes"] == 2 * 256  # a Relu's input and output, 64 floats each


@pytest.mark.slow  # 30 s
def test_a_100000_node_chain_plans_in_bounded_memory(tmp_path):
    """benchmarks/order_layout/chain100k.py has the figures; this holds the bound the docs state."""
    path = tmp_path / "chain.onnx"
    path.write_bytes(chain(100_000).SerializeToString())
    code, _, rss, stderr = measure([sys.executable, "-m", "roam_cli", "-q", "optimize", str(path), "-o",
                                    str(tmp_path / "plan.json"), "--order", "original", "--layout", "first-fit"])
    assert code == 0, stderr
    assert rss < 2 * 2**30
    imported = import_model(path)
    verify(imported.graph, imported.sha256, json.loads((tmp_path / "plan.json").read_text()))


def test_a_plan_file_nested_too_deep_is_refused_in_one_line(planned, tmp_path):
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    for argv in (["report", str(tmp_path / "deep.json")], ["verify", str(planned[0]), str(tmp_path / "deep.json")]):
        code, stderr = main_in_process(argv)
        assert code == 2 and "not a JSON plan" in stderr and stderr.count("\n") == 1, stderr


def test_sequence_seen_only_by_onnx_runtime_is_refused(tmp_path):
    """--shapes-from-run refuses a value ONNX Runtime returns as a list rather than an array."""
    from roam_cli.frontend.shapes import shapes_from_run

    m = sequence_output()
    with pytest.raises(RoamError, match="'s' is not a tensor"):
        shapes_from_run(m, tmp_path / "m.onnx", ["s"])


def test_inputs_that_are_not_an_npz_of_plain_arrays_are_refused_naming_why(tmp_path):
    from roam_cli.core.fileio import read_arrays

    (tmp_path / "text.npz").write_text("x = 1\n")  # numpy takes a file of no known magic for a pickle
    np.save(tmp_path / "one.npy", np.zeros(3))
    np.savez(tmp_path / "objects.npz", x=np.array([{"a": 1}], dtype=object))
    import zipfile
    with zipfile.ZipFile(tmp_path / "member.npz", "w") as z:  # a member that is not an .npy file
        z.writestr("notes.txt", b"hello")
    np.savez(tmp_path / "good.npz", x=np.arange(3))
    for name, said in (("text.npz", "not an .npz file (a zip archive"), ("one.npy", "not an .npz file (a zip archive"),
                       ("objects.npz", "Python objects"), ("member.npz", "member 'notes.txt' is not an array"),
                       ("missing.npz", "no such file")):
        with pytest.raises(RoamError) as refused:
            read_arrays(tmp_path / name, "--inputs")
        assert str(refused.value).startswith(f"--inputs {tmp_path / name}: ") and said in str(refused.value)
    assert read_arrays(tmp_path / "good.npz", "--inputs")["x"].tolist() == [0, 1, 2]


def test_a_name_that_is_not_utf8_is_refused_by_every_command_reading_a_model(tmp_path):
    """protobuf hands such a name back as bytes: every loader refuses it, not only optimize's import
    (make-training-graph compared it with a str: an internal error)."""
    (tmp_path / "m.onnx").write_bytes(non_utf8_name())
    for argv in (["make-training-graph", "m.onnx", "-o", "t.onnx", "--loss", "none"],
                 ["shard", "m.onnx", "-o", "r.onnx", "--ranks", "2"],
                 ["emulate", "m.onnx", "-o", "e.onnx"], ["lower", "m.onnx", "-o", "l.onnx"]):
        code, stderr = main_in_process([*argv[:1], str(tmp_path / argv[1]), *argv[2:3], str(tmp_path / argv[3]),
                                        *argv[4:]])
        assert code == 2 and "is not UTF-8 text" in stderr and stderr.count("\n") == 1, (argv, stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
