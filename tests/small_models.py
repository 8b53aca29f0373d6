"""Small models several test folders build: hand-sized graphs whose figures the tests compute by
hand, and the synthetic transformer step of the scale tests (no torch)."""

import json

import numpy as np
import onnx
from onnx import TensorProto
from onnx_builder import model, node, save

from roam_cli.core import memory
from roam_cli.frontend.onnx_import import import_model

W_BYTES = 64 * 64 * 4  # the one initializer


def chain_model(path):
    """x[batch, 64] -> a = x @ w -> b = erf(a) -> y = b @ w (a graph output). (Erf, not Relu or
    Neg: ONNX Runtime writes a Relu into its input when it reads it last, and roam places a Neg
    over its input when nothing reads it afterwards: either would make a and b one.)

    Every activation is batch * 256 bytes. In the one order there is, a lives at steps 0..1,
    b at 1..2, y at 2 (to the end): a at 0, b above it, y at 0 again, so the arena is
    512 * batch, and the persistent bytes are x (256 * batch) plus w (16 KiB): the plan needs
    16384 + 768 * batch."""
    m = model([node("MatMul", ["x", "w"], ["a"]), node("Erf", ["a"], ["b"]), node("MatMul", ["b", "w"], ["y"])],
              [("x", ["batch", 64])], [("y", ["batch", 64])], initializers={"w": np.ones((64, 64), np.float32)})
    return save(m, path)


def small_training_step():
    """Forward, backward-like and an in-place update, with views: every strategy has choices."""
    return model([node("MatMul", ["x", "w"], ["h"]), node("Relu", ["h"], ["a"]), node("Reshape", ["a", "flat"], ["v"]),
                  node("Mul", ["v", "v"], ["sq"]), node("ReduceSum", ["sq"], ["loss"], keepdims=0),
                  node("Mul", ["a", "x"], ["g1"]), node("Add", ["g1", "h"], ["g2"]), node("Relu", ["g2"], ["w_grad"]),
                  node("Sub", ["w", "w_grad"], ["w.out"]), node("Relu", ["x"], ["side"])],
                 [("x", [64, 64]), ("w", [64, 64])], [("loss", []), ("w.out", [64, 64]), ("side", [64, 64])],
                 initializers={"flat": np.array([-1], np.int64)})


SEQ, HIDDEN, MLP = 64, 8, 16


def transformer(layers: int) -> "onnx.ModelProto":  # noqa: F821
    rng = np.random.default_rng(0)
    inits = {"ln_scale": np.ones(HIDDEN, np.float32), "ln_bias": np.zeros(HIDDEN, np.float32)}  # constants

    def weight(name, shape):
        inits[name] = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        return name

    nodes, x = [], "x"
    for layer in range(layers):
        p = f"layers.{layer}."
        nodes += [node("LayerNormalization", [x, "ln_scale", "ln_bias"], [p + "ln"], axis=-1),
                  node("MatMul", [p + "ln", weight(p + "q.weight", [HIDDEN, HIDDEN])], [p + "q"]),
                  node("MatMul", [p + "ln", weight(p + "k.weight", [HIDDEN, HIDDEN])], [p + "k"]),
                  node("Transpose", [p + "k"], [p + "kt"], perm=[1, 0]),
                  node("MatMul", [p + "q", p + "kt"], [p + "scores"]),
                  node("Softmax", [p + "scores"], [p + "attn"], axis=-1),
                  node("MatMul", [p + "attn", p + "ln"], [p + "mixed"]),
                  node("Add", [x, p + "mixed"], [p + "r"]),
                  node("MatMul", [p + "r", weight(p + "up.weight", [HIDDEN, MLP])], [p + "u"]),
                  node("Relu", [p + "u"], [p + "g"]),
                  node("MatMul", [p + "g", weight(p + "down.weight", [MLP, HIDDEN])], [p + "d"]),
                  node("Add", [p + "r", p + "d"], [p + "out"])]
        x = p + "out"
    nodes += [node("Mul", [x, x], ["square"]), node("ReduceMean", ["square"], ["loss"], keepdims=0)]
    return model(nodes, [("x", [SEQ, HIDDEN])], [("loss", [])], initializers=inits)


def functional(path) -> onnx.ModelProto:
    """roam's full step at `path` rewritten: update nodes last, each `<state>.out` renamed
    `new_state_<k>`, the pairs declared in metadata roam.inplace."""
    step = onnx.load(path)
    mm = memory.build(import_model(path).graph)
    updates = [n for i, n in enumerate(step.graph.node) if mm.node_class[i] == "update"]
    rest = [n for n in step.graph.node if n not in updates]
    renamed = {o.name: f"new_state_{k}" for k, o in enumerate(step.graph.output) if o.name.endswith(".out")}
    for n in updates:
        n.output[:] = [renamed.get(x, x) for x in n.output]
        n.input[:] = [renamed.get(x, x) for x in n.input]
    for n in rest:
        n.input[:] = [renamed.get(x, x) for x in n.input]
    del step.graph.node[:]
    step.graph.node.extend(rest + updates)
    for o in step.graph.output:
        o.name = renamed.get(o.name, o.name)
    kept = [p for p in step.metadata_props if p.key != memory.INPLACE_KEY]  # roam's pairs, by its names
    del step.metadata_props[:]
    step.metadata_props.extend(kept)
    step.metadata_props.add(key=memory.INPLACE_KEY, value=json.dumps({new: old[:-4] for old, new in renamed.items()}))
    return step


def folded_linear(producer="pytorch"):
    """TorchScript's Linear: x[2,3] @ onnx::MatMul_5[3,4] (the weight, transposed at export) + enc.fc.bias,
    Reshape by an int64 constant."""
    m = model([node("MatMul", ["x", "onnx::MatMul_5"], ["h"], name="/enc/fc/MatMul"),
               node("Add", ["h", "enc.fc.bias"], ["h1"], name="/enc/fc/Add"),
               node("Reshape", ["h1", "onnx::Reshape_6"], ["y"], name="/Reshape")],
              [("x", [2, 3])], [("y", [8])],
              {"onnx::MatMul_5": np.arange(12, dtype=np.float32).reshape(3, 4), "enc.fc.bias": np.zeros(4, np.float32),
               "onnx::Reshape_6": np.array([8])})
    m.producer_name = producer
    return m


def to_external(m, name, location="model.onnx.data"):
    """Point initializer `name` at external data, as torch.onnx.export writes big tensors (bytes not kept)."""
    t = next(t for t in m.graph.initializer if t.name == name)
    size = len(t.raw_data) or np.prod(t.dims) * 4
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", str(size))):
        t.external_data.add(key=k, value=v)
    return m
