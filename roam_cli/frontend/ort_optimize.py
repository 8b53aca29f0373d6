"""ONNX Runtime's graph optimisations: applied before planning (`optimize --ort-optimized`), so
that roam plans the graph ORT runs; and the ones a session must run a planned model with, so
that it follows the plan's order."""

from pathlib import Path
from typing import NamedTuple

import onnx
import onnxruntime as ort

from roam_cli.core.annotate import set_meta
from roam_cli.core.errors import RoamError, first_line
from roam_cli.core.fileio import external_data_files
from roam_cli.frontend.onnx_import import load_model
from roam_cli.frontend.providers import PROVIDERS, check_device, check_runs, check_started

LEVELS = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
          "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED}
# The model's metadata key saying ORT's optimisations are already applied: "<level>/<provider>".
METADATA_KEY = "roam.ort_optimized"
# Initializers at least this large stay in the external data file; smaller ones (the shapes
# Reshape reads) inline, where ORT's shape inference can read them when it loads the model.
EXTERNAL_MIN_BYTES = 1024

# A model planned as it was written runs with ORT's optimizations that only remove nodes (constant
# folding, identity and other eliminations, common subexpressions) and without those that make new
# nodes (fusions, the transpose optimizer): PRIORITY_BASED breaks ties by node index, a new node's
# is the last, so it and everything waiting on it run late. Without any optimization, Shape nodes
# (which ORT always runs first) would be out of order instead of folded away. Names ORT does not
# know are ignored.
FUSIONS = ["GemmSumFusion", "GemmTransposeFusion", "MatMulAddFusion", "MatmulBNFusion", "DivMulFusion",
           "NotWhereFusion", "PadFusion", "ReshapeFusion", "GeluFusion", "LayerNormFusion", "FuseReluClip",
           "ConvAddFusion", "ConvMulFusion", "ConvBNFusion", "TransposeOptimizer"]
# ORT's optimizer that merges nodes computing the same thing: the merged node runs where the first
# one stood, out of the plan's order (a lowered loss and its gradient both unsqueeze the labels), and
# it would undo recomputation.
MERGES_COPIES = "CommonSubexpressionElimination"
# ORT's rule that drops a Cast to the type its input has: the Cast's output is then its input, which
# lives on to the output's last reader, past the input's planned life (an exporter's float32 ->
# float32 cast of the attention probabilities, read again by the backward: roam's allocator had to
# move the scores it wrote over). The plan counts the copy; the session makes it.
KEEPS_COPIES = "CastElimination"


class SessionOptimizations(NamedTuple):
    level: ort.GraphOptimizationLevel
    disabled_optimizers: list[str]


def planned_optimizations(model: onnx.ModelProto) -> SessionOptimizations:
    """The graph optimisations a session (with PRIORITY_BASED order) must run `model`, an annotated
    model, with so that it follows the plan. A model planned after ORT's optimisations (METADATA_KEY
    in its metadata) gets none: they are done, and another pass would fold or fuse nodes behind the
    plan's back. Any other model gets the basic level without the ones that make nodes (FUSIONS)
    and the ones that merge nodes (common subexpressions, MERGES_COPIES) or drop a copy the plan
    counts (a Cast to its input's type, KEEPS_COPIES)."""
    keys = {kv.key for kv in model.metadata_props}
    if METADATA_KEY in keys:
        return SessionOptimizations(ort.GraphOptimizationLevel.ORT_DISABLE_ALL, [])
    return SessionOptimizations(ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, FUSIONS + [MERGES_COPIES, KEEPS_COPIES])


def record(level: str, provider: str) -> dict:
    """The plan's `ort_optimized`: what made its graph from the source model."""
    return {"level": level, "provider": provider, "onnxruntime": ort.__version__}


def weights_path(model_path: Path) -> Path:
    """The external data file of an optimised graph written to model_path: `<model name>.data`."""
    return model_path.with_name(model_path.name + ".data")


def optimize(model_path: Path, level: str, provider: str, out: Path) -> Path | None:
    """Write ORT's optimisation of `model_path` at `level` for `provider` to `out`, marked with
    METADATA_KEY. A model with external data keeps its initializers external, in weights_path(out),
    which is returned (None for a model with its weights inline). ORT loads the weights to
    optimise (it folds constants), so a model whose external data file is absent is refused."""
    check_device(provider)
    model, _ = load_model(model_path)
    check_runs(model, str(model_path), provider)
    external = external_data_files(model)
    absent = sorted(f for f in external if not (model_path.parent / f).is_file())
    if absent:
        raise RoamError(f"--ort-optimized needs the weights: ONNX Runtime loads them to optimise the graph, "
                        f"and external data file {absent[0]} is absent")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = LEVELS[level]
    options.optimized_model_filepath = str(out)
    # The first session of a process decides the CPU allocator of every later one (ONNX Runtime
    # 1.19's Python module shares it): an arena made here would hide roam train's requests.
    options.enable_cpu_mem_arena = False
    if external:
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                         weights_path(out).name)
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                         str(EXTERNAL_MIN_BYTES))
    try:
        session = ort.InferenceSession(str(model_path), options, providers=PROVIDERS[provider])
    except Exception as e:
        raise RoamError(f"ONNX Runtime cannot optimise {model_path}: {first_line(e)}") from None
    check_started(session, provider)
    optimized = onnx.load(str(out), load_external_data=False)
    set_meta(optimized, METADATA_KEY, f"{level}/{provider}")
    out.write_bytes(optimized.SerializeToString())
    return weights_path(out) if external else None


def reproduce(model_path: Path, recorded: dict, out: Path) -> None:
    """optimize() as a plan's `ort_optimized` records it, to get the plan's graph from its source.
    Another ONNX Runtime version may optimise otherwise, so it is refused."""
    made_with = recorded.get("onnxruntime", ort.__version__)
    if made_with != ort.__version__:
        raise RoamError(f"{model_path}: the plan is for ONNX Runtime {made_with}'s optimisation of this model, and "
                        f"this is ONNX Runtime {ort.__version__}, which may optimise otherwise: give the annotated model")
    optimize(model_path, recorded["level"], recorded["provider"], out)
