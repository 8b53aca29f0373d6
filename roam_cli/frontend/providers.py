"""Which ONNX Runtime is installed and what it runs: its package, whether it has ORT's fused training
ops, its execution providers by `--provider` name, and how a session gets ORT's own arena.

onnxruntime, onnxruntime-gpu and onnxruntime-training(-cpu) all ship the one `onnxruntime` module,
so an environment holds one of them: roam asks the module which package it came from."""

import functools
import importlib.metadata
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.capi import _pybind_state, build_and_package_info

from roam_cli.core.collectives import COLLECTIVES, SHARDING_KEY, sharding
from roam_cli.core.errors import RoamBug, RoamError, first_line
from roam_cli.precision.emulate import emulate, lacking

PACKAGE = getattr(build_and_package_info, "package_name", "onnxruntime")
RUNTIME = f"{PACKAGE} {ort.__version__}"
# onnxruntime-training registers the gradient, accumulator and optimizer kernels (com.microsoft).
TRAINING_OPS = PACKAGE.startswith("onnxruntime-training")
STANDARD_DOMAINS = ("", "ai.onnx")
# The packages that ship the `onnxruntime` module (CPU, GPU, training and vendor builds).
RUNTIME_PACKAGES = {"onnxruntime", "onnxruntime-gpu", "onnxruntime-training", "onnxruntime-training-cpu",
                    "onnxruntime-directml", "onnxruntime-openvino", "onnxruntime-qnn", "onnxruntime-rocm"}
# Where a session built from bytes finds external data: onnxruntime 1.20 on takes the folder as a
# session option and refuses absolute locations; 1.19 has no such option and takes absolute ones.
WEIGHTS_FOLDER = "session.model_external_initializers_file_folder_path"
FINDS_WEIGHTS_BY_FOLDER = tuple(int(x) for x in ort.__version__.split(".")[:2]) >= (1, 20)
FIX = ("`roam lower` rewrites the graph in standard ONNX, or run it with onnxruntime-training "
       "(Python <= 3.12, in an environment of its own: see the README)")

PROVIDERS = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"]}


@functools.cache
def highest_opset() -> int:
    """The highest default-domain opset this ONNX Runtime loads a graph at (onnxruntime-training
    1.19.2: 21, where ONNX defines 22 and on): a graph roam makes must run here."""
    for version in range(onnx.defs.onnx_opset_version(), 17, -1):
        opset = [onnx.helper.make_opsetid("", version)]
        probe = onnx.helper.make_model(onnx.helper.make_graph(
            [onnx.helper.make_node("Identity", ["x"], ["y"])], "probe",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])]), opset_imports=opset)
        probe.ir_version = onnx.helper.find_min_ir_version_for(opset)
        try:
            ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
            return version
        except Exception:  # noqa: BLE001 - ORT raises its own classes: this opset is past it
            continue
    return 17


def check_device(device: str) -> None:
    """Before any work: refuse a provider this ONNX Runtime build does not have."""
    if device == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
        raise RoamError("CUDA is not available: this ONNX Runtime has only "
                        f"{', '.join(ort.get_available_providers())} (on a CUDA machine, install onnxruntime-gpu "
                        "in place of onnxruntime, or onnxruntime-training in place of onnxruntime-training-cpu)")


def check_started(session: ort.InferenceSession, device: str) -> None:
    """A listed provider can still fail to start (no GPU, no driver): ORT then falls back to the CPU."""
    if device == "cuda" and "CUDAExecutionProvider" not in session.get_providers():
        raise RoamError("CUDA is not available: ONNX Runtime could not start CUDAExecutionProvider (no GPU or driver?)")


_same_as_requested_registered = False


def arena_providers(device: str, options: ort.SessionOptions, same_as_requested: bool) -> list:
    """Providers for a session on ORT's own arena, grown to the next power of two (ORT's default) or
    by exactly what is asked (kSameAsRequested). The CPU provider takes that setting only from a
    shared allocator: registered once per process (ORT refuses a second), the session told to use it."""
    global _same_as_requested_registered
    providers: list = list(PROVIDERS[device])
    if same_as_requested and device == "cpu":
        if not _same_as_requested_registered:
            memory = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
            ort.create_and_register_allocator(memory, ort.OrtArenaCfg(0, 1, -1, -1))  # 1 = kSameAsRequested
            _same_as_requested_registered = True
        options.add_session_config_entry("session.use_env_allocators", "1")
    elif device == "cuda":
        providers[0] = (providers[0], {"arena_extend_strategy": "kSameAsRequested" if same_as_requested
                                       else "kNextPowerOfTwo"})
    return providers


def one_runtime() -> None:
    """Refuse an environment where two ONNX Runtime packages were installed over each other."""
    names = ((d.metadata["Name"] or "").lower().replace("_", "-") for d in importlib.metadata.distributions())
    found = sorted({name for name in names if name in RUNTIME_PACKAGES})
    if len(found) > 1:
        raise RoamError(f"{' and '.join(found)} are installed in one environment: they ship the same `onnxruntime` "
                        "module and overwrite each other's files; pip uninstall all of them, then install one")


def check_runs(model: onnx.ModelProto, what: str, device: str = "cpu", planned: bool = False,
               run_by: frozenset[tuple[str, str]] = frozenset()) -> None:
    """Before a session: refuse a node whose op this ONNX Runtime has no kernel for, naming the op and
    the node (ORT would say it in a traceback). onnxruntime-training runs every op roam meets; no
    build runs bfloat16 arithmetic on the CPU provider. `planned`: the session serves a plan of this
    graph, which must be the graph that runs: the CPU provider runs a float16 node it has no kernel
    for between float32 casts it inserts, which only a plan of its optimised graph holds. `run_by`:
    the (domain, op) a custom-op library registered with the session runs (a rank step's collectives)."""
    one_runtime()
    check_rank_step(model, what, run_by)
    if device == "cpu" and (missing := lacking(model)):
        raise RoamError(f"{what}: {nodes_of(missing)} compute in bfloat16, which ONNX Runtime's CPU provider has no "
                        "kernels for: run it with --provider cuda, or emulate them in float32 on the CPU with "
                        "`roam emulate MODEL -o EMULATED` and plan that graph")
    registry = hasattr(_pybind_state, "get_all_opkernel_def")  # without it, which float16 kernels ORT lacks is unknown
    if device == "cpu" and planned and registry and (missing := lacking(model, dtypes=(onnx.TensorProto.FLOAT16,))):
        raise RoamError(f"{what}: ONNX Runtime's CPU provider runs {nodes_of(missing)} in float32 between casts it "
                        "inserts, which this plan does not hold: plan the graph it runs with `roam optimize MODEL "
                        "--ort-optimized`, or emulate float16 as a GPU rounds it with `roam emulate MODEL -o "
                        "EMULATED` and plan that graph")
    if TRAINING_OPS or not registry:
        return
    kernels = {(k.domain, k.op_name) for k in _pybind_state.get_all_opkernel_def()}
    local = {(f.domain, f.name) for f in model.functions}
    for n in model.graph.node:
        key = (n.domain, n.op_type)
        if n.domain not in STANDARD_DOMAINS and key not in kernels and key not in local and key not in run_by:
            raise RoamError(f"{what}: node {n.name!r} is {n.domain}:{n.op_type}, one of ORT's fused training ops, which "
                            f"{RUNTIME} does not run; {FIX}")


def check_rank_step(model: onnx.ModelProto, what: str, run_by: frozenset[tuple[str, str]]) -> None:
    """A rank step (`roam shard`) communicates with the other ranks in its collectives, which run
    only where the session is given them (`run_by`: roam train --ranks, over MPI), in any build."""
    if COLLECTIVES <= run_by:
        return
    record = sharding({p.key: p.value for p in model.metadata_props})
    if record is not None:
        n = record["ranks"]
        raise RoamError(f"{what} is a rank step of {n} ranks (roam shard): its collectives run under `roam train "
                        f"--ranks {n}`, over MPI; one process cannot run them")
    node = next((n for n in model.graph.node if (n.domain, n.op_type) in COLLECTIVES), None)
    if node is not None:
        raise RoamError(f"{what}: node {node.name!r} is {node.domain}:{node.op_type}, a collective, which runs across "
                        f"processes: roam runs the collectives of a rank step (metadata {SHARDING_KEY!r}, what roam "
                        "shard writes) under roam train --ranks N")


def nodes_of(nodes: list[onnx.NodeProto]) -> str:
    """`12 nodes (MatMul, Add; first 'node_addmm')`."""
    ops = ", ".join(dict.fromkeys(n.op_type for n in nodes))
    return f"{len(nodes)} nodes ({ops}; first {nodes[0].name!r})"


@functools.cache
def average_pool_divides_by_the_whole_kernel(opset: int) -> bool:
    """Whether this ONNX Runtime's AveragePool of `opset` with count_include_pad divides a window
    that ceil_mode runs past the end pad by the whole kernel (onnxruntime 1.19; 1.23 up to opset 18),
    not by its cells inside the padded input (1.32, and 1.23 from opset 19, as PyTorch does). The
    backward divides as the forward it runs with does: a kernel of 3 over one cell of value 1
    gives 1/3 or 1."""
    node = onnx.helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3], strides=[3], ceil_mode=1,
                                 count_include_pad=1)
    graph = onnx.helper.make_graph([node], "probe", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                                                        [1, 1, 1])],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)], ir_version=8)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": np.ones((1, 1, 1), np.float32)})
    return bool(y.ravel()[0] < 0.5)


def check_loads(model: onnx.ModelProto, what: str, folder: Path) -> None:
    """Before a graph roam made is written: the onnx checker's full check (of a graph of ONNX's
    own ops: ORT's fused training ops are not in its schemas), and a session of this ONNX Runtime
    created on it (where it has the graph's ops: the fused ones need onnxruntime-training). A
    refusal is roam's bug: RoamBug, naming what was refused."""
    fused = any(not onnx.defs.has(n.op_type, n.domain) for n in model.graph.node)
    try:
        if not fused and model.ByteSize() < onnx.checker.MAXIMUM_PROTOBUF:
            onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise RoamBug(f"{what} fails the onnx checker ({first_line(e)}); nothing was written") from None
    if fused and not TRAINING_OPS:
        return
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    emulate(probe)  # bfloat16 arithmetic, which the CPU provider has no kernels for, checked as it is emulated
    for key, value in locate_weights(probe, folder).items():
        options.add_session_config_entry(key, value)
    try:
        ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001  (ORT raises its own exception types, one per status)
        reason = " ".join(str(e).split()).rsplit("[ONNXRuntimeError] : ", 1)[-1]
        raise RoamBug(f"{what} is refused by {RUNTIME}: {reason[:300]}; nothing was written") from None


def locate_weights(model: onnx.ModelProto, folder: Path) -> dict[str, str]:
    """Sessions are built from bytes, which name no folder: let this ONNX Runtime find `model`'s
    external data in `folder`. Returns the session config entries to set (none where the locations
    were made absolute, as 1.19 needs)."""
    located = [kv for t in model.graph.initializer for kv in t.external_data if kv.key == "location"]
    if located and FINDS_WEIGHTS_BY_FOLDER:
        return {WEIGHTS_FOLDER: str(folder.resolve())}
    for kv in located:
        kv.value = str((folder / kv.value).resolve())
    return {}
