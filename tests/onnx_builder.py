"""Hand-built ONNX graphs for tests: small enough to compute every expectation by hand."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


def node(op, inputs, outputs, name=None, domain="", **attrs):
    return helper.make_node(op, inputs, outputs, name=name if name is not None else outputs[0] + "_node",
                            domain=domain, **attrs)


def model(nodes, inputs, outputs, initializers=(), value_info=(), metadata=None, ir_version=10):
    """inputs/outputs: (name, shape) or (name, shape, elem type); initializers: name -> array."""
    def vi(spec):
        name, shape, *dtype = spec
        return helper.make_tensor_value_info(name, dtype[0] if dtype else F, shape)

    graph = helper.make_graph(nodes, "g", [vi(i) for i in inputs], [vi(o) for o in outputs],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(initializers).items()],
                              value_info=[vi(v) for v in value_info])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = ir_version
    for k, v in (metadata or {}).items():
        m.metadata_props.add(key=k, value=v)
    return m


def save(m: onnx.ModelProto, path) -> str:
    onnx.save(m, str(path))
    return str(path)


def fed_in_float32(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its low-precision inputs and outputs as float32 ones, cast where they enter
    and leave (ONNX Runtime's Python API takes no bfloat16 array). A node reading a low output (a
    gradient the next one copies) reads the low value."""
    g = model.graph
    low = (TensorProto.FLOAT16, TensorProto.BFLOAT16)
    for vi in g.input:
        if vi.type.tensor_type.elem_type in low:
            to = vi.type.tensor_type.elem_type
            vi.type.tensor_type.elem_type = TensorProto.FLOAT
            for n in g.node:
                n.input[:] = [f"{vi.name}.low" if x == vi.name else x for x in n.input]
            g.node.insert(0, helper.make_node("Cast", [vi.name], [f"{vi.name}.low"], to=to))
    for vi in g.output:
        if vi.type.tensor_type.elem_type in low:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT
            for n in g.node:
                n.output[:] = [f"{vi.name}.low" if x == vi.name else x for x in n.output]
                n.input[:] = [f"{vi.name}.low" if x == vi.name else x for x in n.input]
            g.node.append(helper.make_node("Cast", [f"{vi.name}.low"], [vi.name], to=TensorProto.FLOAT))
    return model
