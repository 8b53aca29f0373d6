"""Parameters the exporter folded or tied, trained as the parameters they are (`frontend.recover`);
BatchNorms folded into convolutions refused; every graph make-training-graph writes loads.

Hand-built graphs that mimic each exporter: dynamo's record (`aten.linear(x, %p_w)` read through
a folded `val_*` constant, a tied LM head), TorchScript's scope names and a tie only the data shows."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import roam
from onnx import TensorProto, helper, numpy_helper
from onnx_builder import model, node, save
from small_models import folded_linear, to_external

from roam_cli.backward import step
from roam_cli.core.errors import RoamBug, RoamError
from roam_cli.core.fileio import SOURCE_KEY
from roam_cli.frontend import parameters, providers, recover, training_graph

FX = parameters.FX_NODE_KEY


def fx(n, target, args):
    n.metadata_props.add(key=FX, value=f"%y = call_function[target=torch.ops.aten.{target}.default](args = {args}, "
                                       "kwargs = {})")


def dynamo_tied_lm():
    """GPT-2 as dynamo's optimizer writes it: the embedding reads `lm_head.weight` (torch.export keeps a
    tied weight once), the head reads `val_9`, that weight transposed at export; `fc` is a Linear whose
    weight exists only as its transpose `val_4`."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((5, 3)).astype(np.float32)
    fc = rng.standard_normal((3, 3)).astype(np.float32)  # PyTorch's [out, in]
    m = model([node("Gather", ["lm_head.weight", "ids"], ["e"], name="node_embedding"),
               node("MatMul", ["e", "val_4"], ["h"], name="node_linear"),
               node("MatMul", ["h", "val_9"], ["logits"], name="node_linear_1")],
              [("ids", [2, 4], TensorProto.INT64)], [("logits", [2, 4, 5])],
              {"lm_head.weight": table, "val_4": np.ascontiguousarray(fc.T), "val_9": np.ascontiguousarray(table.T)})
    record = ("p_wte_weight: PARAMETER target='wte.weight'\np_fc_weight: PARAMETER target='fc.weight'\n"
              "p_lm_head_weight: PARAMETER target='lm_head.weight'\nids: USER_INPUT\n")
    m.graph.metadata_props.add(key=parameters.SIGNATURE_KEY, value=record)
    by_name = {n.name: n for n in m.graph.node}
    fx(by_name["node_embedding"], "embedding", "(%p_lm_head_weight, %ids)")
    by_name["node_embedding"].metadata_props.add(
        key=parameters.NAMESPACE_KEY, value=": Model/wte: torch.nn.modules.sparse.Embedding/embedding: aten.embedding")
    fx(by_name["node_linear"], "linear", "(%e, %p_fc_weight)")
    fx(by_name["node_linear_1"], "linear", "(%h, %p_lm_head_weight)")
    return m, table, fc


def test_dynamo_folded_linear_weights_become_transposes_of_their_parameters_and_a_tied_head_is_one_tensor(tmp_path):
    m, table, fc = dynamo_tied_lm()
    found = parameters.find(m)
    assert found.folded == {"val_4": "fc.weight", "val_9": "lm_head.weight"}
    got = recover.recover(m, found, tmp_path)
    assert got.derived == {"val_4": ("fc.weight", [1, 0]), "val_9": ("lm_head.weight", [1, 0])}
    assert got.added == ["fc.weight"]  # a new parameter, [out, in] as PyTorch has it
    assert got.tied == {"wte.weight": "lm_head.weight"}
    assert found.folded == {} and "fc.weight" in found.parameters
    fc_input = next(i for i in m.graph.input if i.name == "fc.weight")
    assert [d.dim_value for d in fc_input.type.tensor_type.shape.dim] == [3, 3]
    assert {t.name for t in m.graph.initializer} == {"lm_head.weight"}
    # the rewritten forward computes what the export did, from PyTorch's tensors
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.array([[0, 1, 2, 3], [4, 3, 2, 1]])
    (logits,) = s.run(None, {"ids": ids, "fc.weight": fc})
    np.testing.assert_allclose(logits, table[ids] @ fc.T @ table.T, rtol=1e-5)


def test_the_tied_head_gets_both_gradients_summed(tmp_path):
    """d loss / d table = (embedding's scatter) + (head's part): the hand-computed sum."""
    m, table, fc = dynamo_tied_lm()
    save(m, tmp_path / "lm.onnx")
    made = training_graph.make(tmp_path / "lm.onnx", tmp_path / "t.onnx", loss="none", backward=step.build,
                               optimizer_path=tmp_path / "o.onnx")
    assert sorted(made.survey.trainable) == ["fc.weight", "lm_head.weight"]
    t = onnx.load(str(tmp_path / "t.onnx"))
    meta = json.loads(next(p.value for p in t.metadata_props if p.key == SOURCE_KEY))
    assert meta["model"] == "lm.onnx" and meta["tied"] == {"wte.weight": "lm_head.weight"}
    # loss = sum(logits): d/dtable = onehot^T (1 ... ) through the gather plus h^T 1 through the head
    ids = np.array([[0, 1, 2, 3], [4, 3, 2, 1]])
    e = table[ids]
    h = e @ fc.T
    ones = np.ones((2, 4, 5), np.float32)
    head = np.einsum("bsk,bsv->vk", h, ones)  # d/dW of h @ W.T, W = table
    de = ones @ table @ fc  # back through the head and fc
    embed = np.zeros_like(table)
    np.add.at(embed, ids, de)
    t.graph.output.append(helper.make_empty_tensor_value_info("lm_head.weight_grad"))  # read the gradient itself
    feeds = {"ids": ids, "fc.weight": fc, "lm_head.weight": table, "lazy_reset_grad": np.array([True]),
             "fc.weight_grad.accumulation.buffer": np.zeros_like(fc),
             "lm_head.weight_grad.accumulation.buffer": np.zeros_like(table)}
    s = ort.InferenceSession(t.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = s.run(["lm_head.weight_grad"], feeds)
    np.testing.assert_allclose(got, embed + head, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("external", [False, True])
def test_torchscript_folded_weight_is_recovered_by_its_scope_with_or_without_its_data(tmp_path, external):
    m = folded_linear()
    w = numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == "onnx::MatMul_5"))
    if external:
        to_external(m, "onnx::MatMul_5")  # the data file is absent: the scope alone names it
    found = parameters.find(m)
    got = recover.recover(m, found, tmp_path)
    assert got.derived == {"onnx::MatMul_5": ("enc.fc.weight", [1, 0])} and got.added == ["enc.fc.weight"]
    s = training_graph.survey(m, found=found)
    assert s.trainable == ["enc.fc.bias", "enc.fc.weight"] and s.elements == 4 + 12
    assert s.warnings() == []
    if not external:
        x = np.ones((2, 3), np.float32)
        (y,) = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"x": x, "enc.fc.weight": np.ascontiguousarray(w.T)})
        np.testing.assert_allclose(y, (x @ w).ravel())


def test_a_tie_only_the_data_shows_is_found_by_comparing_the_tensors(tmp_path):
    """TorchScript's BERT head: MatMul by onnx::MatMul_7, equal to the word embeddings transposed."""
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    m = model([node("Gather", ["emb.word.weight", "ids"], ["e"], name="/emb/word/Gather"),
               node("MatMul", ["e", "onnx::MatMul_7"], ["y"], name="/cls/decoder/MatMul")],
              [("ids", [2], TensorProto.INT64)], [("y", [2, 4])],
              {"emb.word.weight": table, "onnx::MatMul_7": np.ascontiguousarray(table.T)})
    m.producer_name = "pytorch"
    found = parameters.find(m)
    got = recover.recover(m, found, tmp_path)
    assert got.derived == {"onnx::MatMul_7": ("emb.word.weight", [1, 0])}
    assert got.added == [] and got.tied == {"cls.decoder.weight": "emb.word.weight"}
    # a constant that is not the transpose of any parameter is a parameter of its own
    m2 = model([node("Gather", ["emb.word.weight", "ids"], ["e"], name="/emb/word/Gather"),
                node("MatMul", ["e", "onnx::MatMul_7"], ["y"], name="/cls/decoder/MatMul")],
               [("ids", [2], TensorProto.INT64)], [("y", [2, 4])],
               {"emb.word.weight": table, "onnx::MatMul_7": np.ascontiguousarray(table.T) + 1})
    m2.producer_name = "pytorch"
    got = recover.recover(m2, parameters.find(m2), tmp_path)
    assert got.added == ["cls.decoder.weight"] and got.tied == {}


def test_a_constant_read_elsewhere_than_a_linear_weight_is_left_folded(tmp_path):
    m = folded_linear()
    m.graph.node.append(node("Add", ["onnx::MatMul_5", "onnx::MatMul_5"], ["z"], name="/enc/other/Add"))
    m.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [3, 4]))
    found = parameters.find(m)
    assert recover.recover(m, found, tmp_path).derived == {}
    assert "onnx::MatMul_5" in found.folded  # still named in the folded warning


def test_buffers_named_like_parameters_are_not_trained():
    m = folded_linear()
    m.graph.initializer.append(numpy_helper.from_array(np.ones(2, np.float32), "rotary.inv_freq"))
    m.graph.node.append(node("Mul", ["h1", "rotary.inv_freq"], ["r"], name="/rotary/Mul"))
    assert "rotary.inv_freq" not in parameters.find(m).parameters


def test_frozen_takes_globs(tmp_path):
    m = folded_linear()
    found = parameters.find(m)
    recover.recover(m, found, tmp_path)
    s = training_graph.survey(m, frozen=["enc.fc.w*"], found=found)
    assert s.trainable == ["enc.fc.bias"] and s.frozen == ["enc.fc.weight"]  # a recovered input, fed, not trained
    with pytest.raises(RoamError, match="--frozen 'zz.*' matches no name in the graph"):
        training_graph.survey(m, frozen=["zz.*"], found=found)


def folded_norm_export(weight="onnx::Conv_2", bias="onnx::Conv_3"):
    """TorchScript's eval-mode export of Conv -> BatchNorm: one Conv whose weight and bias (`onnx::Conv_3`,
    a bias the Conv never had) hold the BatchNorm folded in."""
    m = model([node("Conv", ["x", weight, bias], ["y"], name="/block/conv/Conv")],
              [("x", [1, 1, 3, 3])], [("y", [1, 2, 3, 3])],
              {weight: np.ones((2, 1, 1, 1), np.float32), bias: np.zeros(2, np.float32)})
    m.producer_name = "pytorch"
    return m


def test_an_export_with_its_batchnorm_folded_is_refused_in_one_line_naming_the_option(tmp_path):
    path = save(folded_norm_export(), tmp_path / "m.onnx")
    r = roam("make-training-graph", path, "-o", tmp_path / "t.onnx", "--loss", "none")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1
    assert "folded 1 BatchNormalization" in r.err and "do_constant_folding=False" in r.err
    assert not (tmp_path / "t.onnx").exists()
    r = roam("make-training-graph", path, "-o", tmp_path / "t.onnx", "--loss", "none", "--allow-folded-batchnorm",
             "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["trainable"] == ["onnx::Conv_2", "onnx::Conv_3"]  # the folded convolution, as it is


def test_a_dynamo_export_missing_its_batchnorm_parameters_is_refused():
    m = folded_norm_export("block.conv.weight", "block.conv.weight_bias")  # as dynamo's optimizer names them
    record = ("p_block_conv_weight: PARAMETER target='block.conv.weight'\np_block_bn_weight: PARAMETER "
              "target='block.bn.weight'\np_block_bn_bias: PARAMETER target='block.bn.bias'\n"
              "b_block_bn_running_mean: BUFFER target='block.bn.running_mean' persistent=True\nx: USER_INPUT\n")
    m.graph.metadata_props.add(key=parameters.SIGNATURE_KEY, value=record)
    assert parameters.find(m).folded_norms == ["block.bn"]
    assert "optimize=False" in parameters.find(m).folded_norms_refusal()


def test_a_graph_the_checker_or_the_runtime_refuses_is_roams_bug(tmp_path):
    negative = model([node("ConvTranspose", ["x", "w"], ["y"], name="negative", output_padding=[-1, -1])],
                     [("x", [1, 1, 2, 2])], [("y", [1, 1, 3, 3])], {"w": np.ones((1, 1, 2, 2), np.float32)})
    with pytest.raises(RoamBug, match="fails the onnx checker .*output_padding must not contain negative values"):
        providers.check_loads(negative, "the training graph roam made", tmp_path)
    no_kernel = model([node("Max", ["x", "x"], ["y"], name="max")], [("x", [2], TensorProto.INT16)],
                      [("y", [2], TensorProto.INT16)], {})  # valid ONNX this ONNX Runtime has no kernel for
    with pytest.raises(RoamBug, match="refused by onnxruntime.*Max"):
        providers.check_loads(no_kernel, "the training graph roam made", tmp_path)
    good = model([node("Relu", ["x"], ["y"], name="r")], [("x", [2])], [("y", [2])], {})
    providers.check_loads(good, "the training graph roam made", tmp_path)


def test_roams_bug_exits_3_in_one_line(tmp_path, monkeypatch, capsys):
    from roam_cli import cli

    def refuse(*a, **k):
        raise RoamBug("the training graph roam made is refused by onnxruntime: node 'n'; nothing was written")

    monkeypatch.setattr(training_graph, "make", refuse)
    monkeypatch.setattr("sys.argv", ["roam", "make-training-graph", "m.onnx", "-o", str(tmp_path / "t.onnx"),
                                     "--loss", "none"])
    with pytest.raises(SystemExit) as stop:
        cli.main()
    assert stop.value.code == 3
    assert capsys.readouterr().err.startswith("roam: internal error: the training graph roam made is refused")


def test_added_parameters_get_their_values_from_the_constants_they_were_derived_from(tmp_path):
    """For the ONNX Runtime checkpoint, the one output carrying weights: the weight, not its transpose."""
    m = folded_linear()
    w = next(t for t in m.graph.initializer if t.name == "onnx::MatMul_5")
    copies = {w.name: numpy_helper.from_array(numpy_helper.to_array(w), w.name)}
    got = recover.recover(m, parameters.find(m), tmp_path)
    (t,) = recover.added_values(got, copies, tmp_path)
    assert t.name == "enc.fc.weight"
    np.testing.assert_array_equal(numpy_helper.to_array(t), numpy_helper.to_array(copies[w.name]).T)


def test_a_weight_shared_through_identities_and_a_scope_missing_its_root_are_recovered(tmp_path):
    """ALBERT's TorchScript export reads one layer's weights in every layer through Identity nodes;
    OPT's names scopes from `decoder` while its parameters are `model.decoder...`."""
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    m = model([node("Identity", ["onnx::MatMul_9"], ["onnx::MatMul_10"], name="Identity_1"),
               node("MatMul", ["x", "onnx::MatMul_9"], ["h"], name="/decoder/layers.0/q/MatMul"),
               node("Add", ["h", "model.decoder.layers.0.q.bias"], ["h1"], name="/decoder/layers.0/q/Add"),
               node("MatMul", ["x", "onnx::MatMul_10"], ["y"], name="/decoder/layers.1/q/MatMul")],
              [("x", [1, 2])], [("y", [1, 3])],
              {"onnx::MatMul_9": w, "model.decoder.layers.0.q.bias": np.zeros(3, np.float32)})
    m.producer_name = "pytorch"
    found = parameters.find(m)
    got = recover.recover(m, found, tmp_path)
    assert got.derived == {"onnx::MatMul_9": ("model.decoder.layers.0.q.weight", [1, 0])}
    x = np.ones((1, 2), np.float32)
    (y,) = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "model.decoder.layers.0.q.weight": np.ascontiguousarray(w.T)})
    np.testing.assert_allclose(y, x @ w)


def test_a_torchscript_export_names_the_tensors_it_computed_that_may_be_parameters():
    """Swin's relative position bias, gathered at constant positions and folded by TorchScript."""
    m = model([node("Add", ["x", "onnx::Add_737"], ["y"], name="/swin/attention/self/Add")],
              [("x", [1, 1, 2, 2])], [("y", [1, 1, 2, 2])], {"onnx::Add_737": np.ones((1, 1, 2, 2), np.float32)})
    m.producer_name = "pytorch"
    found = parameters.find(m)
    assert found.computed == ["onnx::Add_737 (read in swin.attention.self)"]
    assert any("onnx::Add_737" in w and "do_constant_folding=False" in w for w in found.warnings())


def namespace(n, module, cls="torch.nn.modules.linear.Linear"):
    n.metadata_props.add(key=parameters.NAMESPACE_KEY, value=f": Model/{module}: {cls}/call: aten.call")


def test_ties_a_parameter_no_node_reads_to_its_childs_namesake_and_not_a_module_reading_data():
    """BERT's `cls.predictions.bias` is `cls.predictions.decoder.bias` (`self.decoder.bias = self.bias`);
    DeBERTa's encoder LayerNorm reads the relative embeddings as its data, its own weight as weight."""
    m = model([node("Add", ["x", "cls.predictions.decoder.bias"], ["h"], name="node_add"),
               node("LayerNormalization", ["enc.rel.weight", "enc.LayerNorm.weight"], ["r"], name="node_layer_norm"),
               node("Add", ["h", "r"], ["y"], name="node_add_1")],
              [("x", [2])], [("y", [2])],
              {"cls.predictions.decoder.bias": np.ones(2, np.float32), "enc.rel.weight": np.ones(2, np.float32),
               "enc.LayerNorm.weight": np.ones(2, np.float32)})
    record = ("p_cls_predictions_bias: PARAMETER target='cls.predictions.bias'\n"
              "p_cls_predictions_decoder_bias: PARAMETER target='cls.predictions.decoder.bias'\n"
              "p_enc_rel_weight: PARAMETER target='enc.rel.weight'\n"
              "p_enc_layernorm_weight: PARAMETER target='enc.LayerNorm.weight'\nx: USER_INPUT\n")
    m.graph.metadata_props.add(key=parameters.SIGNATURE_KEY, value=record)
    add, norm, _ = m.graph.node
    fx(add, "add", "(%x, %p_cls_predictions_decoder_bias)")
    namespace(add, "cls.predictions.decoder")
    fx(norm, "layer_norm", "(%p_enc_rel_weight, [2], %p_enc_layernorm_weight)")
    namespace(norm, "enc.LayerNorm", "torch.nn.modules.normalization.LayerNorm")
    found = parameters.find(m)
    assert found.tied == {"cls.predictions.bias": "cls.predictions.decoder.bias"} and found.missing == []


def test_a_linear_reading_what_the_exporter_made_of_its_weight_is_recovered_from_its_module(tmp_path):
    """Falcon's `hidden @ self.weight.T` exported as mm(x, %permute): the call names no parameter; the
    module it ran in, a Linear, and the record's weight of that module do."""
    w = np.arange(6, dtype=np.float32).reshape(3, 2)  # [out, in]
    m = model([node("MatMul", ["x", "permute"], ["h"], name="node_matmul"),
               node("Add", ["h", "h.qkv.bias"], ["y"], name="node_add")], [("x", [1, 2])], [("y", [1, 3])],
              {"permute": np.ascontiguousarray(w.T), "h.qkv.bias": np.zeros(3, np.float32)})
    m.graph.metadata_props.add(key=parameters.SIGNATURE_KEY,
                               value="p_h_qkv_weight: PARAMETER target='h.qkv.weight'\n"
                                     "p_h_qkv_bias: PARAMETER target='h.qkv.bias'\nx: USER_INPUT\n")
    fx(m.graph.node[1], "add", "(%matmul, %p_h_qkv_bias)")
    fx(m.graph.node[0], "matmul", "(%x, %permute)")
    namespace(m.graph.node[0], "h.qkv", "transformers.models.falcon.modeling_falcon.FalconLinear")
    found = parameters.find(m)
    got = recover.recover(m, found, tmp_path)
    assert got.derived == {"permute": ("h.qkv.weight", [1, 0])} and found.missing == []
