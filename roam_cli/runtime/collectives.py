"""A rank step's collectives (DESIGN.md, "Sharded steps") run by ONNX Runtime over MPI.

The nodes are `AllGather` (com.microsoft, ONNX Runtime's own schema: its builds with NCCL run it on
GPUs) and `ReduceScatter` (ai.roam.collective), each with `group_size` and `axis`, ReduceScatter
with `reduction` "sum" or "mean". ONNX Runtime's CPU build has kernels for neither, and no C API
header to build a custom-op library against is at hand, so they run as Python custom ops of
onnxruntime-extensions' library (`register` adds it to a session), which call MPI through mpi4py:
MPI does the communication and the reduction, nothing of roam's own. ORT allocates each op's output
itself (the library asks the kernel context for it), so roam's allocator serves it at the output's
plan offset like any tensor's; the Python result is copied in.

The library's Python ops live in its own domain with fixed element types: `runnable` rewrites each
collective node to the op of its element type there, its name (what the plan calls it), inputs,
outputs and attributes kept.

`progress` counts the collectives this process entered and left: a rank that waits in one while
another rank does not reach it tells the launcher which rank hangs (`ranks.py`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from roam_cli.core.collectives import COLLECTIVES, REDUCE_SCATTER
from roam_cli.core.errors import RoamError

REDUCTIONS = ("sum", "mean")
ELEMENT_TYPES = {onnx.TensorProto.FLOAT: "float", onnx.TensorProto.DOUBLE: "double"}
INSTALL = "pip install mpich mpi4py onnxruntime-extensions (or, in roam's clone, its extra: pip install '.[mpi]')"


@dataclass
class Progress:
    """How many collectives this process entered and left (plain ints: read by a heartbeat thread)."""

    entered: int = 0
    left: int = 0


progress = Progress()
_comm = None  # the communicator the ops run on (`use`)


def missing() -> str | None:
    """What is not installed for running collectives, in words, or None."""
    for module, package in (("mpi4py", "mpi4py"), ("onnxruntime_extensions", "onnxruntime-extensions")):
        try:
            __import__(module)
        except ImportError:
            return f"{package} is not installed"
    return None


def use(comm) -> None:
    """Run the collectives of every session of this process on `comm` (an mpi4py communicator),
    registering the ops with onnxruntime-extensions the first time."""
    global _comm
    if _comm is None:
        _define_ops()
    _comm = comm


def register(options) -> None:
    """`options` (ort.SessionOptions) with the library that runs the ops."""
    from onnxruntime_extensions import get_library_path

    options.register_custom_ops_library(get_library_path())


def runnable(model: onnx.ModelProto, dtypes: dict[str, int]) -> onnx.ModelProto:
    """`model` with each collective node as the library's op for its element type (`dtypes`: value
    name -> ONNX element type); RoamError for an element type, reduction or group the ops do not run."""
    from onnxruntime_extensions import default_opset_domain

    domain = default_opset_domain()
    used = False
    for n in model.graph.node:
        key = (n.domain or "", n.op_type)
        if key not in COLLECTIVES:
            continue
        dtype = dtypes.get(n.input[0])
        if dtype not in ELEMENT_TYPES:
            name = onnx.TensorProto.DataType.Name(dtype) if dtype is not None else "unknown"
            raise RoamError(f"node {n.name!r} ({n.op_type}) is over {name} values; roam's MPI collectives run "
                            f"{' and '.join(onnx.TensorProto.DataType.Name(t) for t in ELEMENT_TYPES)}")
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        reduction = attrs.get("reduction", b"sum").decode()  # ONNX string attributes are bytes
        if key == REDUCE_SCATTER and reduction not in REDUCTIONS:
            raise RoamError(f"node {n.name!r} (ReduceScatter) has reduction {reduction!r}; roam runs sum and mean")
        if _comm is not None and attrs.get("group_size") != _comm.size:
            raise RoamError(f"node {n.name!r} ({n.op_type}) has group_size {attrs.get('group_size')}; "
                            f"this run has {_comm.size} ranks")
        n.domain, n.op_type = domain, f"Roam{n.op_type}_{ELEMENT_TYPES[dtype]}"
        defaults = {"axis": 0} | ({"reduction": "sum"} if key == REDUCE_SCATTER else {})
        n.attribute.extend(onnx.helper.make_attribute(k, v) for k, v in defaults.items() if k not in attrs)
        used = True
    if used and not any(o.domain == domain for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(domain, 1))
    return model


def all_gather(x: np.ndarray, group_size: int, axis: int) -> np.ndarray:
    """The ranks' x concatenated along `axis`, in rank order (MPI_Allgather)."""
    front = np.ascontiguousarray(np.moveaxis(x, axis, 0))
    out = np.empty((group_size * front.shape[0],) + front.shape[1:], x.dtype)
    _collective(lambda: _comm.Allgather(front, out))
    return np.ascontiguousarray(np.moveaxis(out, 0, axis))


def reduce_scatter(x: np.ndarray, group_size: int, axis: int, reduction: str) -> np.ndarray:
    """This rank's block along `axis` of the element-wise sum over ranks (MPI_Reduce_scatter_block),
    divided by the ranks for "mean" (as FSDP averages gradients)."""
    from mpi4py import MPI

    front = np.ascontiguousarray(np.moveaxis(x, axis, 0))
    if front.shape[0] % group_size:
        raise ValueError(f"ReduceScatter: axis {axis} has {front.shape[0]} elements, not a multiple of {group_size}")
    out = np.empty((front.shape[0] // group_size,) + front.shape[1:], x.dtype)
    _collective(lambda: _comm.Reduce_scatter_block(front, out, op=MPI.SUM))
    if reduction == "mean":
        np.divide(out, x.dtype.type(group_size), out=out)
    return np.ascontiguousarray(np.moveaxis(out, 0, axis))


def _collective(call) -> None:
    progress.entered += 1
    call()
    progress.left += 1


def _define_ops() -> None:
    """The Python ops, one per element type, and the hook that hands their results to the library
    as arrays (its own turns them into Python lists first: 25 times slower on 4 M floats)."""
    from onnxruntime_extensions import PyCustomOpDef, onnx_op
    from onnxruntime_extensions import _ocos

    types = {"float": PyCustomOpDef.dt_float, "double": PyCustomOpDef.dt_double}
    ints = {"group_size": PyCustomOpDef.dt_int64, "axis": PyCustomOpDef.dt_int64}
    for name, t in types.items():
        onnx_op(op_type=f"RoamAllGather_{name}", inputs=[t], outputs=[t], attrs=ints)(
            lambda x, group_size, axis: all_gather(x, _checked(group_size), axis))
        onnx_op(op_type=f"RoamReduceScatter_{name}", inputs=[t], outputs=[t],
                attrs=ints | {"reduction": PyCustomOpDef.dt_string})(
            lambda x, group_size, axis, reduction: reduce_scatter(x, _checked(group_size), axis, reduction))

    def invoke(k_id, feed, attributes):
        op = _ocos.Opdef._odlist[k_id]
        result = op.body(*feed, **op.cast_attributes(attributes))
        return (k_id, result.shape, result.reshape(-1))

    _ocos.PyCustomOpDef.install_hooker(invoke)


def _checked(group_size: int) -> int:
    if group_size != _comm.size:
        raise ValueError(f"group_size {group_size} in a run of {_comm.size} ranks")
    return group_size
