"""PyTorch module -> ONNX forward graph in which every parameter survives as its own initializer.

`torch.onnx.export(dynamo=True)` with its default `optimize=True` constant-folds parameters
(a Linear weight transposed once becomes an anonymous constant; `wpe` gathered at constant
positions is folded away) and merges initializers that happen to be equal. Here the export
runs with `optimize=False`, every parameter and buffer is lifted to a graph input, the
exporter's optimizer runs (it cannot fold or merge inputs), and the parameters and buffers are
put back as initializers under their PyTorch names, each marked PARAMETER or BUFFER as the
dynamo exporter marks them (`roam_cli.frontend.parameters`).

A module built under `torch.device("meta")` exports without weights: no parameter data ever
exists, and each parameter becomes an external-data initializer pointing into a file that is
never written (planning and gradient building never read it). Its buffers (position ids,
BatchNorm statistics) are small; `weightless` builds a module so and keeps their values, else
they are materialised with the model's own initialiser.
Constants the forward itself creates on the meta device (GPT-2's attention mask value) have no
value either: they are kept as unfolded external-data buffers like the parameters.

Needs torch, onnxscript and onnx_ir (the `bench` extra); imported only by the suite generator
and `sample_models/make_gpt2_tiny.py`."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from roam_cli.frontend.parameters import KIND_KEY, SIGNATURE_KEY

OPSET = 18
PAGE = 4096  # external-data offsets are page aligned so a data file could be memory-mapped


@dataclass
class Exported:
    model: onnx.ModelProto  # forward graph; parameters and buffers are initializers
    parameters: list[str]  # trainable parameter initializers, in export order (tied: first name)
    data_file: str | None  # the external-data file the parameters point into (meta device), never written
    seconds: float  # torch.onnx.export time


def canonical_names(module, prefix: str = "") -> tuple[dict[str, str], dict[str, str]]:
    """(parameters, buffers): exported name -> name without `prefix`; tied tensors -> first name."""
    def names(pairs):
        first: dict[int, str] = {}
        out = {}
        for name, t in pairs:
            out[name] = first.setdefault(id(t), name.removeprefix(prefix))
        return out

    return (names(module.named_parameters(remove_duplicate=False)),
            names(module.named_buffers(remove_duplicate=False)))


BUFFER_VALUES = "_roam_buffer_values"  # module attribute: id(meta buffer) -> its value (`weightless`)


def weightless(factory):
    """`factory()`'s module with every parameter on the meta device and every buffer's value kept.
    The module is made on the CPU, each parameter moved to "meta" as it is registered (so at most
    one is ever real, and the initialisers that follow write nothing); then each buffer (position
    ids, token type ids, BatchNorm statistics) goes to "meta" too, its value as the constructor made
    it recorded for `export`. Under `torch.device("meta")` those values are lost, and a model's
    `_init_weights` restores some only (BERT's token_type_ids came out of torch.empty)."""
    import torch

    register = torch.nn.Module.register_parameter

    def on_meta(self, name, param):
        if param is not None and not param.is_meta:
            param = torch.nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
        register(self, name, param)

    torch.nn.Module.register_parameter = on_meta
    try:
        module = factory()
    finally:
        torch.nn.Module.register_parameter = register
    values = {}
    for sub in module.modules():
        for key, buf in sub._buffers.items():
            if buf is not None and not buf.is_meta:
                sub._buffers[key] = buf.to("meta")
                values[id(sub._buffers[key])] = buf.numpy().copy()
    setattr(module, BUFFER_VALUES, values)
    return module


def materialised_buffers(module) -> dict[int, np.ndarray]:
    """id(meta buffer) -> its value: as `weightless` recorded it, else from the model's own
    weight initialiser (buffers only)."""
    import torch

    for sub in module.modules():
        if hasattr(sub, BUFFER_VALUES):
            return getattr(sub, BUFFER_VALUES)
    swapped = []
    for sub in module.modules():
        for key, buf in sub._buffers.items():
            if buf is not None and buf.is_meta:
                swapped.append((sub, key, buf))
                sub._buffers[key] = torch.empty_like(buf, device="cpu")
    values = {}
    try:
        for sub in module.modules():
            if hasattr(sub, "_init_weights"):  # Hugging Face: initialises buffers too
                sub.apply(sub._init_weights)
                break
        else:
            raise ValueError("the module has buffers on the meta device and no _init_weights to fill them")
        for sub, key, buf in swapped:
            values[id(buf)] = sub._buffers[key].numpy().copy()
    finally:
        for sub, key, buf in swapped:
            sub._buffers[key] = buf
    return values


def export(module, args: tuple, input_names: list[str], output_names: list[str], *, prefix: str = "",
           data_file: str = "weights.bin", opset: int = OPSET, dynamic_shapes=None, log=lambda *a: None) -> Exported:
    """Export `module(*args)` (train mode as set by the caller). Parameters on the meta device are
    written as external data into `data_file` (not created); otherwise their values are embedded.
    `dynamic_shapes`: torch.onnx.export's (a symbolic batch)."""
    import torch
    from onnx_ir import to_proto

    t = time.time()
    prog = torch.onnx.export(module, args, dynamo=True, opset_version=opset, optimize=False,
                             input_names=input_names, output_names=output_names, verbose=False,
                             dynamic_shapes=dynamic_shapes)
    seconds = time.time() - t
    log(f"export: {seconds:.1f}s")

    param_names, buffer_names = canonical_names(module, prefix)
    g = prog.model.graph
    lifted = []  # lifted to graph inputs so the exporter's optimizer can neither fold nor merge them
    unknown = set()  # constants the forward made on the meta device (GPT-2's mask value): no value exists
    for name in list(g.initializers.keys()):
        final = param_names.get(name) or buffer_names.get(name)
        if final is None:
            if getattr(getattr(g.initializers[name].const_value, "raw", None), "is_meta", False):
                unknown.add(name)
                final = name
            else:
                continue
        v = g.initializers.pop(name)
        v.const_value = None
        v.name = final
        g.inputs.append(v)
        lifted.append(final)
    params = [n for n in lifted if n in set(param_names.values())]
    missing = sorted(set(param_names.values()) - set(params))
    if missing:
        raise ValueError(f"parameters not found among the exported initializers: {missing}")
    prog.optimize()

    mp = to_proto(prog.model)
    inputs = {i.name: i for i in mp.graph.input}
    specs = []
    for name in lifted:
        tt = inputs[name].type.tensor_type
        specs.append((name, [d.dim_value for d in tt.shape.dim], tt.elem_type))
    keep = [i for i in mp.graph.input if i.name not in set(lifted)]
    del mp.graph.input[:]
    mp.graph.input.extend(keep)

    tensors = {param_names[name]: t for name, t in module.named_parameters(remove_duplicate=False)}
    buffer_tensors = {buffer_names[name]: b for name, b in module.named_buffers(remove_duplicate=False)}
    meta_values = materialised_buffers(module) if any(b.is_meta for b in buffer_tensors.values()) else {}
    offset = 0
    weightless = False
    inits = []
    for name, dims, dtype in specs:
        source = tensors.get(name, buffer_tensors.get(name))
        if name in unknown or (name in tensors and source.is_meta):
            inits.append(external_tensor(name, dims, dtype, data_file, offset))
            offset += -(-external_bytes(dims, dtype) // PAGE) * PAGE
            weightless = True
            continue
        arr = meta_values[id(source)] if source.is_meta else source.detach().cpu().numpy()
        assert list(arr.shape) == dims, (name, arr.shape, dims)
        inits.append(numpy_helper.from_array(arr, name))
    for t in inits:  # as the dynamo exporter marks them: a buffer (rotary inv_freq) is never trained
        t.metadata_props.add(key=KIND_KEY, value="PARAMETER" if t.name in tensors else "BUFFER")
    mp.graph.initializer.extend(inits)
    strip_metadata(mp)
    return Exported(mp, params, data_file if weightless else None, seconds)


def external_bytes(dims: list[int], dtype: int) -> int:
    return int(np.prod(dims, dtype=np.int64)) * helper.tensor_dtype_to_np_dtype(dtype).itemsize


def external_tensor(name: str, dims: list[int], dtype: int, location: str, offset: int) -> TensorProto:
    t = TensorProto(name=name, data_type=dtype, dims=dims)
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(external_bytes(dims, dtype)))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


def strip_metadata(mp: onnx.ModelProto) -> None:
    """Drop per-node exporter metadata except the module namespace (stack traces hold local paths),
    and the exporter's record of the module's inputs, whose names this export changed."""
    keep = [(p.key, p.value) for p in mp.graph.metadata_props if p.key != SIGNATURE_KEY]
    del mp.graph.metadata_props[:]
    for k, v in keep:
        mp.graph.metadata_props.add(key=k, value=v)
    for n in mp.graph.node:
        keep = [(p.key, p.value) for p in n.metadata_props if p.key == "namespace"]
        del n.metadata_props[:]
        for k, v in keep:
            n.metadata_props.add(key=k, value=v)
        n.doc_string = ""
