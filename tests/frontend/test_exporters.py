"""Parameters through exporters: kept, folded, merged or dropped, and the constants beside them.

Without torch: `parameters.find` and the survey on hand-built graphs that mimic each exporter (a
folded transposed weight, embedded or in external data; int64 constants; parameters merged by
the dynamo exporter's optimizer or by the TorchScript exporter's Identity nodes).
With torch, transformers, onnxscript and optimum-onnx (skipped otherwise): tiny GPT-2, BERT, ViT,
T5, ResNet-50 and LLaMA exported each way (benchmarks/exporters/exporters.py), every PyTorch parameter
either trainable under its name or named in a warning. To run those:

    pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
    pip install 'transformers<4.58' onnxscript optimum-onnx    # optimum-onnx 0.1 needs transformers < 4.58
"""

import importlib.util

import numpy as np
import onnx
import pytest
from conftest import roam
from onnx import TensorProto
from onnx_builder import model, node, save
from small_models import folded_linear, to_external

from roam_cli.core.errors import RoamError
from roam_cli.frontend import parameters, training_graph

I64 = TensorProto.INT64



@pytest.mark.parametrize("external", [False, True])
def test_a_folded_transposed_weight_is_found_from_its_place_and_named_by_its_module(external):
    m = folded_linear()
    if external:  # no value is read: the place it fills tells
        to_external(m, "onnx::MatMul_5")
    found = parameters.find(m)
    assert found.parameters == ["enc.fc.bias"]
    assert found.constants == ["onnx::MatMul_5", "onnx::Reshape_6"]
    assert found.folded == {"onnx::MatMul_5": "enc.fc.weight"}
    assert found.exporter == "torchscript" and not found.merged and not found.missing
    (warning,) = found.warnings()
    assert warning.startswith("1 parameters were folded by the exporter into constants")
    assert "onnx::MatMul_5 (enc.fc.weight)" in warning and "--trainable onnx::MatMul_5 " in warning
    assert "do_constant_folding=False" in warning and "--no-constant-folding" in warning
    s = training_graph.survey(m)
    assert s.trainable == ["enc.fc.bias"]
    assert s.frozen == (["onnx::MatMul_5"] if external else [])  # a weight never points into weight data
    assert s.constants == (["onnx::Reshape_6"] if external else ["onnx::MatMul_5", "onnx::Reshape_6"])


def test_a_batchnorm_folded_into_a_convolution_is_told_and_sequential_scopes_give_module_paths():
    """TorchScript in eval mode: Conv(x, onnx::Conv_9, onnx::Conv_10), the BatchNorm after it folded in;
    the Conv sits in the nn.Sequential `layer` of block `stages.0`."""
    m = model([node("Conv", ["x", "onnx::Conv_9", "onnx::Conv_10"], ["y"], name="/net/stages.0/layer/layer.0/conv/Conv")],
              [("x", [1, 2, 4, 4])], [("y", [1, 3, 4, 4])],
              {"onnx::Conv_9": np.ones((3, 2, 1, 1), np.float32), "onnx::Conv_10": np.zeros(3, np.float32)})
    m.producer_name = "pytorch"
    found = parameters.find(m)
    assert found.folded == {"onnx::Conv_9": "net.stages.0.layer.0.conv.weight", "onnx::Conv_10": ""}
    assert found.fused == ["onnx::Conv_10"]
    assert "(1 are convolution biases made by folding a BatchNormalization" in found.warnings()[0]


def test_a_fused_node_keeps_another_calls_record_which_names_none_of_its_parameters():
    """The dynamo optimizer removed a BatchNorm after a Conv; the Conv kept the BatchNorm's FX call,
    which read bn.weight: that is no merge of bn.weight into conv.weight."""
    m = model([node("Conv", ["x", "conv.weight"], ["y"], name="node_conv")], [("x", [1, 2, 4, 4])],
              [("y", [1, 3, 4, 4])], {"conv.weight": np.ones((3, 2, 1, 1), np.float32)})
    m.graph.metadata_props.add(key=parameters.SIGNATURE_KEY, value="p_conv_weight: PARAMETER target='conv.weight'\n"
                                                                   "p_bn_weight: PARAMETER target='bn.weight'\n")
    m.graph.node[0].metadata_props.add(key=parameters.FX_NODE_KEY, value="%getitem = call_function[target=torch.ops."
                                       "aten._native_batch_norm_legit_functional.default](args = (%conv2d, %p_bn_weight))")
    found = parameters.find(m)
    assert found.merged == {} and found.missing == ["bn.weight"]


def test_trainable_patterns_make_folded_constants_trainable_and_must_match():
    s = training_graph.survey(folded_linear(), trainable=["onnx::MatMul_*"])
    assert s.trainable == ["enc.fc.bias", "onnx::MatMul_5"] and s.elements == 4 + 12
    assert s.found.folded == {} and s.warnings() == []
    with pytest.raises(RoamError, match="--trainable 'onnx::Reshape_\\*' matches no floating-point initializer"):
        training_graph.survey(folded_linear(), trainable=["onnx::Reshape_*"])  # int64: never trainable
    scaled = folded_linear()
    scaled.graph.initializer.append(onnx.numpy_helper.from_array(np.array(0.5, np.float32), "onnx::Mul_7"))
    with pytest.raises(RoamError, match="scalars excluded"):
        training_graph.survey(scaled, trainable=["onnx::Mul_*"])  # a scale, not a weight


def dynamo_graph():
    """What torch.onnx.export(dynamo=True) writes for two LayerNorms with fresh (equal) weights and a
    position-id buffer: the optimizer merged b.ln.weight into a.ln.weight and dropped c.bias."""
    m = model([node("Gather", ["pos", "ids"], ["p"], name="node_gather"),
               node("Gather", ["head.weight", "ids"], ["e"], name="node_embedding"),
               node("LayerNormalization", ["x", "a.ln.weight"], ["h"], name="node_layer_norm"),
               node("LayerNormalization", ["h", "a.ln.weight"], ["y0"], name="node_layer_norm_1"),
               node("Add", ["y0", "p"], ["y1"], name="node_add"), node("Add", ["y1", "e"], ["y"], name="node_add_1")],
              [("x", [2, 4])], [("y", [2, 4])],
              {"a.ln.weight": np.ones(4, np.float32), "head.weight": np.eye(4, dtype=np.float32),
               "pos": np.eye(4, dtype=np.float32), "ids": np.array([0, 1]), "rotary.inv_freq": np.ones(2, np.float32)})
    record = ("\n# inputs\np_emb_weight: PARAMETER target='emb.weight'\np_a_ln_weight: PARAMETER target='a.ln.weight'"
              "\np_b_ln_weight: PARAMETER target='b.ln.weight'\np_c_bias: PARAMETER target='c.bias'\n"
              "p_head_weight: PARAMETER target='head.weight'\nb_rotary_inv_freq: BUFFER "
              "target='rotary.inv_freq' persistent=False\nx: USER_INPUT\n")
    m.graph.metadata_props.add(key=parameters.SIGNATURE_KEY, value=record)
    calls = {"node_layer_norm": ("layer_norm", "(%x, [4], %p_a_ln_weight, None, 1e-05)"),
             "node_layer_norm_1": ("layer_norm", "(%layer_norm, [4], %p_b_ln_weight, None, 1e-05)"),
             "node_embedding": ("embedding", "(%p_head_weight, %ids)")}  # emb's Embedding reads head's weight
    for n in m.graph.node:
        if n.name in calls:
            target, args = calls[n.name]
            n.metadata_props.add(key=parameters.FX_NODE_KEY, value=f"%x = call_function[target=torch.ops.aten."
                                                                    f"{target}.default](args = {args}, kwargs = {{}})")
        if n.name == "node_embedding":
            n.metadata_props.add(key=parameters.NAMESPACE_KEY,
                                 value=": M/emb: torch.nn.modules.sparse.Embedding/embedding: aten.embedding.default")
    kinds = {"a.ln.weight": "PARAMETER", "head.weight": "PARAMETER", "rotary.inv_freq": "BUFFER"}
    for t in m.graph.initializer:
        if t.name in kinds:
            t.metadata_props.add(key=parameters.KIND_KEY, value=kinds[t.name])
    return m


def test_dynamo_records_tell_merged_and_missing_parameters_and_buffers():
    found = parameters.find(dynamo_graph())
    assert found.exporter == "dynamo"
    assert found.parameters == ["a.ln.weight", "head.weight"]
    assert found.constants == ["pos", "ids", "rotary.inv_freq"]  # a buffer named like a parameter stays constant
    assert found.merged == {"a.ln.weight": ["b.ln.weight"]}
    assert found.folded == {}  # the Gather's float table is no parameter's: no FX call read one
    assert found.tied == {"emb.weight": "head.weight"}
    assert found.missing == ["c.bias"]
    merged, missing = found.warnings()
    assert "1 parameters were merged" in merged and "b.ln.weight -> a.ln.weight" in merged
    assert "perturb the weights before exporting" in merged and "torch_export" in merged
    assert "c.bias" in missing and "optimize=False" in missing
    unmarked = dynamo_graph()  # optimize=False: no marks on the initializers, the record still says
    for t in unmarked.graph.initializer:
        del t.metadata_props[:]
    assert parameters.find(unmarked).constants == ["pos", "ids", "rotary.inv_freq"]
    s = training_graph.survey(dynamo_graph())
    assert s.trainable == ["a.ln.weight", "head.weight"] and s.shared == {}  # the merge is told once, by name
    assert s.names()["merged"] == {"a.ln.weight": ["b.ln.weight"]} and s.names()["missing"] == ["c.bias"]


def test_torchscript_identity_nodes_are_merged_parameters():
    m = model([node("Identity", ["a.ln.weight"], ["b.ln.weight"], name="Identity_7"),
               node("LayerNormalization", ["x", "a.ln.weight"], ["h"], name="/a/ln/LayerNormalization"),
               node("LayerNormalization", ["h", "b.ln.weight"], ["y"], name="/b/ln/LayerNormalization")],
              [("x", [2, 4])], [("y", [2, 4])], {"a.ln.weight": np.ones(4, np.float32)})
    m.producer_name = "pytorch"
    found = parameters.find(m)
    assert found.parameters == ["a.ln.weight"] and found.merged == {"a.ln.weight": ["b.ln.weight"]}
    assert found.folded == {} and found.missing == []
    assert "1 parameters were merged by the exporter" in found.warnings()[0]


def test_exporter_constants_in_external_data_are_read_into_the_graph_or_reported_absent(tmp_path):
    m = model([node("Reshape", ["x", "shape"], ["y"])], [("x", [2, 3])], [("y", [6])], {"shape": np.array([6])})
    onnx.save(m, str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    loaded = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    assert loaded.graph.initializer[0].data_location == TensorProto.EXTERNAL
    assert training_graph.embed_constants(loaded, ["shape"], tmp_path) == []
    t = loaded.graph.initializer[0]
    assert t.data_location == TensorProto.DEFAULT and onnx.numpy_helper.to_array(t).tolist() == [6]
    again = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    assert training_graph.embed_constants(again, ["shape"], tmp_path / "elsewhere") == ["shape"]


def test_cli_trainable_pattern_matching_nothing_is_one_line_and_writes_nothing(tmp_path):
    path = save(folded_linear(), tmp_path / "m.onnx")
    r = roam("make-training-graph", path, "-o", tmp_path / "t.onnx", "--loss", "mse", "--trainable", "nothing_*")
    assert r.code == 2 and "--trainable 'nothing_*' matches no floating-point initializer" in r.err
    assert len(r.err.strip().splitlines()) == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


# ---- real exporters on tiny models (needs torch, transformers, onnxscript, optimum-onnx) --------

def bench():
    for name in ("torch", "transformers", "onnxscript"):
        pytest.importorskip(name, reason=f"{name} is not installed (see benchmarks/exporters/exporters.py)")
    return importlib.import_module("benchmarks.exporters.exporters")


MODELS = ("gpt2", "bert", "vit", "t5", "resnet50", "llama")


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript", "optimum", "roam"])
@pytest.mark.parametrize("name", MODELS)
def test_every_pytorch_parameter_is_trainable_or_named_in_a_warning(tmp_path, name, exporter):
    b = bench()
    if exporter == "optimum":
        pytest.importorskip("optimum.exporters.onnx", reason="optimum-onnx is not installed (needs transformers<4.58)")
    try:
        path = b.export(exporter, name, tmp_path)
    except Exception as e:  # noqa: BLE001 - the exporter's own failure is not what this test checks
        pytest.skip(f"{exporter} cannot export {name}: {type(e).__name__}")
    want = b.pytorch_parameters(b.build(name)[0])
    s = training_graph.survey(onnx.load(str(path), load_external_data=False))
    trainable = set(s.trainable)
    f = s.found
    named = set(f.folded.values()) | {o for others in f.merged.values() for o in others} | set(f.missing)
    unexplained = [min(a) for a in want if not a & trainable and not a & named]
    if name == "resnet50" and exporter in ("torchscript", "optimum"):  # eval mode: BatchNorms folded into the
        assert f.fused and all(".normalization." in x for x in unexplained)  # convs, their names gone
        unexplained = []
    assert unexplained == [], f"not trainable and named in no warning: {unexplained}"
    if exporter == "roam":  # roam's route keeps every parameter under its name
        assert all(a & trainable for a in want) and s.warnings() == [] and len(s.trainable) == len(want)
    assert not trainable & set(s.constants)
    ints = [t.name for t in onnx.load(str(path), load_external_data=False).graph.initializer
            if t.data_type not in parameters.FLOAT_TYPES]
    assert set(ints) <= set(s.constants)  # position ids, shapes, masks: constants, never trained or fed


def test_dynamo_constants_in_external_data_become_constants_of_the_step_with_their_values(tmp_path):
    b = bench()
    path = b.export("dynamo", "gpt2", tmp_path)
    exported = onnx.load(str(path), load_external_data=False)
    external = [t.name for t in exported.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    made = training_graph.make(path, tmp_path / "step.onnx", loss="none", in_graph=True)
    constants = set(made.survey.constants)
    assert made.survey.unfed == [] and constants & set(external)  # the causal mask, the position lookup
    step = onnx.load(str(tmp_path / "step.onnx"), load_external_data=False)
    inits = {t.name: t for t in step.graph.initializer}
    assert not constants & {i.name for i in step.graph.input}  # roam train feeds inputs only
    assert all(inits[x].data_location == TensorProto.DEFAULT for x in constants & set(external))
    values = {t.name: onnx.numpy_helper.to_array(t, base_dir=str(tmp_path)) for t in exported.graph.initializer
              if t.name in constants & set(external)}
    for name, value in values.items():
        assert np.array_equal(onnx.numpy_helper.to_array(inits[name]), value)
