"""Inference ONNX export -> training graph: forward, loss and backward, plus its optimizer graph.

Works on the graph's structure alone; no weight byte is ever read (the exporter's constants in
external data are: they are small, and the training graph computes with their values):
1. `repair`: add what exporters leave out and ONNX Runtime's gradient builders need — the
   optional outputs of LayerNormalization (mean, inverse std-dev), Dropout (mask) and
   SoftmaxCrossEntropyLoss (log-probabilities), and BatchNormalization's training mode (exports
   of a model in train mode still carry the inference form, which normalises with the running
   statistics).
2. `survey`: which initializers are trainable parameters, which are frozen state, which are
   constants, and which parameters the exporter folded, merged or left out (`parameters.find`).
3. `build`: the ONNX Runtime training artifacts (`onnxruntime.training.onnxblock`, the library
   behind `artifacts.generate_artifacts`): training graph with gradient accumulation buffers, eval
   graph, optimizer graph. Parameters and every external-data weight become graph inputs
   before ONNX Runtime sees the graph; the onnx checker only tests that external-data files
   exist, so sparse stand-ins in a scratch folder take their place.

`onnxruntime.training` imports torch: it is imported only inside `build`."""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
import math
import os
import re
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from roam_cli.core.errors import RoamError, first_line
from roam_cli.core.fileio import SOURCE_KEY
from roam_cli.frontend.parameters import FLOAT_TYPES, Found, find
from roam_cli.frontend.recover import added_values, recover
from roam_cli.precision import LOW_TYPES, low_type, masters

MAX_IR_VERSION = 10  # onnxruntime 1.19 loads IR <= 10
MAX_OPSET = 21  # ... and ai.onnx opsets <= 21

LOSSES = {"none": None, "cross-entropy": "CrossEntropyLoss", "mse": "MSELoss",
          "bce-with-logits": "BCEWithLogitsLoss", "l1": "L1Loss"}
# Said where --loss cross-entropy meets a scalar first output (an export of a module returning its loss)
LOSS_COMPUTED = "a scalar: an export whose first output already is its loss takes --loss none"
ARTIFACT_OPTIMIZERS = {"adamw": "AdamW", "sgd": "SGD"}  # onnxblock.optim blocks, their default settings

# Optional outputs the ORT gradient builders read, named <output 0>.<suffix> when added.
OPTIONAL_OUTPUTS = {"LayerNormalization": ["mean", "inv_std_dev"], "Dropout": ["mask"],
                    "SoftmaxCrossEntropyLoss": ["log_prob"], "BatchNormalization": ["running_mean", "running_var"]}
# Operands that hold state a training step reads but does not differentiate (running statistics).
STATE_OPERANDS = {("BatchNormalization", 3), ("BatchNormalization", 4)}


def repair(model: onnx.ModelProto) -> Counter:
    """Add the outputs and modes ORT's gradient builders need, in place; count the nodes repaired."""
    fixed: Counter = Counter()
    for n in model.graph.node:
        if n.domain not in ("", "ai.onnx") or n.op_type not in OPTIONAL_OUTPUTS:
            continue
        extra = OPTIONAL_OUTPUTS[n.op_type]
        changed = len(n.output) < 1 + len(extra)
        while len(n.output) < 1 + len(extra):
            n.output.append(f"{n.output[0]}.{extra[len(n.output) - 1]}")
        if n.op_type == "BatchNormalization" and not any(a.name == "training_mode" and a.i for a in n.attribute):
            kept = [a for a in n.attribute if a.name != "training_mode"]
            del n.attribute[:]
            n.attribute.extend(kept + [onnx.helper.make_attribute("training_mode", 1)])
            changed = True
        fixed[n.op_type] += changed
    return +fixed


def clamp_ir(model: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX Runtime 1.19 refuses IR versions above 10; the graphs need nothing newer."""
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx") and o.version > MAX_OPSET:
            raise RoamError(f"opset {o.version} is newer than ONNX Runtime 1.19 supports ({MAX_OPSET}); "
                            f"re-export with opset_version={MAX_OPSET} or lower")
    return model


@dataclass
class Survey:
    """The parameters as the graph has them (names are initializer names)."""

    trainable: list[str]
    frozen: list[str]  # moved to graph inputs, not trained: running statistics, --frozen, external weights
    elements: int  # trainable elements
    constants: list[str] = field(default_factory=list)  # stay initializers: exporter constants, buffers
    found: Found | None = None  # what the exporter kept, folded, merged and dropped
    shared: dict[str, int] = field(default_factory=dict)  # trainable read by N nodes in the same role
    unreached: list[str] = field(default_factory=list)  # named trainable, but the loss does not depend on them
    unfed: list[str] = field(default_factory=list)  # constants whose external data is absent: graph inputs
    recovered: dict[str, str] = field(default_factory=dict)  # folded constant -> the parameter it is trained as
    rounded: tuple[list[str], str] = ([], "")  # trainable parameters the export held in a low type, and the type

    def warnings(self) -> list[str]:
        out = self.found.warnings() if self.found else []
        if self.unfed:
            out.append(f"{len(self.unfed)} constants are in an absent external data file ({', '.join(self.unfed[:3])}"
                       f"{', ...' if len(self.unfed) > 3 else ''}): they become graph inputs, which roam train fills "
                       "with synthetic data unless --inputs gives their values")
        if self.shared:
            name, n = next(iter(self.shared.items()))
            out.append(f"{len(self.shared)} parameters are each read by several nodes in the same role ({name}: {n}): "
                       "tied weights, or equal initial values the exporter merged into one? if merged, perturb the "
                       "weights before exporting or export with optimize=False")
        names, low = self.rounded
        if names:
            out.append(f"{len(names)} parameters are {low} in the export ({', '.join(names[:3])}"
                       f"{', ...' if len(names) > 3 else ''}): they train as float32 masters that start from the "
                       f"rounded {low} values; export in float32 to start from the full-precision weights")
        if self.unreached:
            out.append(f"{len(self.unreached)} parameters do not affect the loss ({', '.join(self.unreached[:3])}"
                       f"{', ...' if len(self.unreached) > 3 else ''}): they get no gradient and are not updated")
        return out

    def names(self) -> dict:
        """For --json: the trainable, frozen, constant, recovered, folded, merged, missing, tied and
        computed names."""
        f = self.found
        return {"trainable": self.trainable, "frozen": self.frozen, "constants": self.constants,
                "recovered": self.recovered, "folded": dict(f.folded) if f else {},
                "merged": dict(f.merged) if f else {}, "missing": list(f.missing) if f else [],
                "tied": dict(f.tied) if f else {}, "computed": list(f.computed) if f else [], "unfed": self.unfed,
                "exporter": f.exporter if f else "", "rounded": self.rounded[0]}


def matching(patterns: list[str], names: list[str], option: str, what: str) -> list[str]:
    """The names any of the glob `patterns` matches; a pattern matching none is an error."""
    chosen = []
    for pattern in patterns:
        hits = [x for x in names if fnmatch.fnmatchcase(x, pattern)]
        if not hits:
            raise RoamError(f"{option} {pattern!r} matches no {what}")
        chosen += hits
    return list(dict.fromkeys(chosen))


def survey(model: onnx.ModelProto, requires_grad: list[str] | None = None, frozen: list[str] = (),
           trainable: list[str] = (), found: Found | None = None) -> Survey:
    """Choose the trainable parameters: `requires_grad` if given (initializers or graph inputs),
    else the parameters the exporter kept (`parameters.find`) that are not running state; plus
    the floating-point initializers, scalars aside, the globs `trainable` match (folded weights);
    minus the names the globs `frozen` match. `found`: `parameters.find`'s answer, when the
    caller already has it (and has recovered what the exporter folded, `recover.recover`).
    Running state, `frozen` and external-data weights that are not trained are frozen: moved to
    graph inputs, so the training graph never points into weight data. Every other initializer is
    a constant and stays one."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    dtypes = {i.name: i.type.tensor_type.elem_type for i in g.input}
    dtypes.update({x: t.data_type for x, t in inits.items()})
    roles: dict[str, Counter] = {name: Counter() for name in dtypes}
    for n in g.node:
        for k, x in enumerate(n.input):
            if x in roles:
                roles[x][(n.op_type, k)] += 1
    state = {x for x, r in roles.items() if any(role in STATE_OPERANDS for role in r)}
    not_found = [x for x in dict.fromkeys(requires_grad or []) if x not in dtypes]
    if not_found:
        raise RoamError(f"{len(not_found)} named parameters are not in the graph ({', '.join(not_found[:3])}"
                        f"{', ...' if len(not_found) > 3 else ''}): the exporter folded, merged or renamed them; "
                        "export with torch.onnx.export(..., optimize=False) and check the names")
    frozen = matching(list(frozen), list(dtypes), "--frozen", "name in the graph")
    found = found or find(model)
    extra = matching(list(trainable), [x for x, t in inits.items() if t.data_type in FLOAT_TYPES and t.dims],
                     "--trainable", "floating-point initializer (scalars excluded)")
    if requires_grad is None:
        chosen = [x for x in found.parameters if x not in state and x not in frozen]
        chosen += [x for x in extra if x not in chosen and x not in frozen]
        if not chosen:
            raise RoamError("no initializer is named like a parameter (e.g. encoder.layer.0.weight): "
                            "name the trainable ones with --requires-grad or --trainable")
    else:
        chosen = [x for x in dict.fromkeys(list(requires_grad) + extra) if x not in frozen]
        bad = [x for x in chosen if dtypes[x] not in FLOAT_TYPES]
        if bad:
            raise RoamError(f"parameter {bad[0]!r} is not floating-point and cannot be trained")
    weights = set(found.parameters) | set(found.folded)
    frozen_all = [x for x, t in inits.items() if x not in chosen and (x in state or x in frozen or (
        x in weights and t.data_location == TensorProto.EXTERNAL))]
    frozen_all += [x for x in found.parameters if x not in inits and x not in chosen]  # recovered, not trained
    constants = [x for x in inits if x not in chosen and x not in frozen_all]
    elements = sum(int(np.prod(inits[x].dims if x in inits else shape_of(g, x), dtype=np.int64)) for x in chosen)
    found.folded = {x: p for x, p in found.folded.items() if x not in chosen}
    found.fused = [x for x in found.fused if x not in chosen]
    explained = set(found.merged) | {o for others in found.merged.values() for o in others}
    shared = {} if found.exporter else {x: max(roles[x].values()) for x in chosen
                                        if x not in explained and roles[x] and max(roles[x].values()) > 1}
    return Survey(chosen, frozen_all, elements, constants, found, shared)


def shape_of(g: onnx.GraphProto, name: str) -> list[int]:
    for i in g.input:
        if i.name == name:
            dims = i.type.tensor_type.shape.dim
            if all(d.HasField("dim_value") for d in dims):
                return [d.dim_value for d in dims]
            raise RoamError(f"parameter {name!r} has a symbolic shape; parameters must have static shapes")
    raise AssertionError(name)


def embed_constants(model: onnx.ModelProto, names: list[str], base_dir: Path) -> list[str]:
    """Read the values of the constants kept in external data into the graph (position ids, masks,
    rotary tables: small, and the training graph must compute with their values, not with data fed
    at run time). Returns those whose data file is absent: they can only become graph inputs."""
    from onnx.external_data_helper import load_external_data_for_tensor

    absent = []
    wanted = set(names)
    for t in model.graph.initializer:
        if t.name in wanted and t.data_location == TensorProto.EXTERNAL:
            location = base_dir / next((kv.value for kv in t.external_data if kv.key == "location"), "")
            if not location.exists():
                absent.append(t.name)
                continue
            try:
                load_external_data_for_tensor(t, str(base_dir))
                size = math.prod(t.dims) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
                if len(t.raw_data) != size:
                    raise ValueError(f"{len(t.raw_data):,} bytes where its shape needs {size:,}")
            except (OSError, ValueError, onnx.checker.ValidationError) as e:  # there, but not the model's data
                raise RoamError(f"{location}: cannot read the constant {t.name!r} the model keeps there "
                                f"({first_line(e)}): is the file truncated, or another model's?") from None
            t.data_location = TensorProto.DEFAULT
            del t.external_data[:]
    return absent


@dataclass
class Artifacts:
    training: onnx.ModelProto
    eval: onnx.ModelProto
    optimizer: onnx.ModelProto | None
    parameters: tuple  # (trainable, frozen) TensorProtos as onnxblock returns them, for a checkpoint


def training_api():
    """onnxruntime.training.onnxblock, or a one-line error saying what to install."""
    from roam_cli.frontend.providers import RUNTIME, TRAINING_OPS

    if not TRAINING_OPS:
        raise RoamError(f"building the backward of an inference export needs ONNX Runtime's training artifacts: "
                        f"onnxruntime-training and torch, in an environment of their own on Python <= 3.12 (see the "
                        f"README); this one has {RUNTIME}. An artifacts training graph (training_model.onnx) becomes "
                        "a full step here: make-training-graph it with --in-graph-optimizer")
    try:
        from onnxruntime.training import onnxblock
    except ImportError as e:
        missing = getattr(e, "name", None) or "onnxruntime.training"
        raise RoamError(f"building a training graph needs {missing} (onnxruntime.training imports torch): "
                        "pip install torch --index-url https://download.pytorch.org/whl/cpu (its CPU build)") from None
    return onnxblock


@contextlib.contextmanager
def quiet_gradient_builder():
    """onnxblock builds its own SessionOptions, which log every graph transformer at INFO level."""
    import onnxruntime
    from onnxruntime.training.onnxblock import _training_graph_utils as builder

    def options():
        so = onnxruntime.SessionOptions()
        so.log_severity_level = 3
        return so

    builder.SessionOptions = options
    try:
        yield
    finally:
        builder.SessionOptions = onnxruntime.SessionOptions


@contextlib.contextmanager
def external_data_stand_ins(model: onnx.ModelProto):
    """A scratch working folder holding a sparse, unwritten file for every external-data location."""
    ends: dict[str, int] = {}
    for t in model.graph.initializer:
        if t.data_location == TensorProto.EXTERNAL:
            kv = {e.key: e.value for e in t.external_data}
            end = int(kv.get("offset", 0)) + int(kv.get("length", 0))
            ends[kv["location"]] = max(ends.get(kv["location"], 0), end)
    old = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="roam-train-") as scratch:
        for location, end in ends.items():
            path = Path(scratch, location)
            if not path.resolve().is_relative_to(Path(scratch).resolve()):
                raise RoamError(f"external data location {location!r} points outside the model's folder")
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as f:
                f.truncate(end)
        os.chdir(scratch)
        try:
            yield Path(scratch)
        finally:
            os.chdir(old)


def build(model: onnx.ModelProto, chosen: Survey, loss: str, optimizer: str | None) -> Artifacts:
    """Training, eval and optimizer graphs for `model` (repaired) as ONNX Runtime artifacts build them."""
    if loss not in LOSSES:
        raise RoamError(f"unknown loss {loss!r}; choose one of {', '.join(LOSSES)}")
    logits = model.graph.output[0]
    axes = len(logits.type.tensor_type.shape.dim) if logits.type.tensor_type.HasField("shape") else None
    if loss == "cross-entropy" and axes is not None and axes < 2:
        raise RoamError(f"--loss cross-entropy needs logits [N, classes]; {logits.name!r} is "
                        + (LOSS_COMPUTED if axes == 0 else "of 1 axis"))
    if loss == "cross-entropy" and axes is not None and axes > 2:
        # onnxblock's CrossEntropyLoss gives the labels the logits' shape less its last axis, while
        # SoftmaxCrossEntropyLoss reads the classes at axis 1: a step that loads and fails when run
        raise RoamError(f"--backend ort-artifacts --loss cross-entropy needs logits [N, classes]; {logits.name!r} has "
                        f"{axes} axes: flatten them to [batch*sequence, vocab] in the export, or use roam's backward "
                        "(the default --backend), which does")
    onnxblock = training_api()
    loss_block = onnxblock.blocks.PassThrough() if LOSSES[loss] is None else getattr(onnxblock.loss, LOSSES[loss])()

    class Training(onnxblock.TrainingBlock):
        def build(self, *outputs):
            return loss_block(*outputs)  # the gradient starts from the first of what this returns

    block = Training()
    for name in chosen.trainable:
        block.requires_grad(name)
    for name in chosen.frozen:
        block.requires_grad(name, False)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    try:
        with external_data_stand_ins(model), quiet_gradient_builder(), onnxblock.base(model):
            outputs = [o.name for o in model.graph.output]
            block(*(outputs if LOSSES[loss] is None else outputs[:1]))  # a loss block reads the first output
            training, eval_model = block.to_model_proto()
        optim = None
        if optimizer is not None:
            with onnxblock.empty_base(opset_version=opset):
                optimizer_block = getattr(onnxblock.optim, ARTIFACT_OPTIMIZERS[optimizer])()
                optimizer_block(block.parameters())
                optim = optimizer_block.to_model_proto()
    except (RuntimeError, onnx.checker.ValidationError) as e:  # ORT and onnx report failures this way
        raise RoamError(f"ONNX Runtime could not build the training graph: {ort_reason(e)}") from None
    return Artifacts(clamp_ir(training), clamp_ir(eval_model), optim and clamp_ir(optim), block.parameters())


def ort_reason(e: Exception) -> str:
    """What ONNX Runtime says went wrong, without the source location and C++ signature before it."""
    text = " ".join(str(e).split())
    for marker in ("[ONNXRuntimeError] : ", " was false. "):
        text = text.rsplit(marker, 1)[-1]
    return re.sub(r"^\d+ : \w+ : ", "", text) or first_line(e)


@dataclass
class Made:
    """What `make` did, for the CLI to print."""

    survey: Survey | None  # None when the input already was a training graph
    repaired: Counter
    written: list[tuple[Path, str, int]]  # (path, what, nodes)
    precision: dict = field(default_factory=dict)  # a mixed-precision step's: type, weight copies, loss scaling


def make(infer_path: Path, out_path: Path, *, loss: str | None, requires_grad: list[str] | None = None,
         frozen: list[str] = (), trainable: list[str] = (), optimizer: str = "adamw", in_graph: bool = False,
         optimizer_path: Path | None = None, checkpoint_path: Path | None = None, dims: dict[str, int] | None = None,
         backward=build, fused: bool = False, allow_folded_batchnorm: bool = False,
         optimizer_settings: dict[str, str] | None = None, precision: str | None = None,
         scaler_settings: dict[str, str] | None = None) -> Made:
    """`roam make-training-graph`: the training graph (and its optimizer graph), or the full step,
    in standard ONNX (every graph lowered before any is written), or with `fused` as ORT makes them.

    `backward` builds the training graph: `build` (ONNX Runtime's artifacts) or roam's own
    (`roam_cli.backward.step.build`: standard ONNX, no optimizer graph). An input that already is
    an artifacts training graph can only become a full step; that path needs neither torch nor
    onnxruntime.training. `dims` binds symbolic input dimensions (`--dim`) before anything else.

    Linear weights the exporter folded into transposed constants are trained as the parameters
    they are (`recover`); an export whose BatchNorms were folded into its convolutions computes
    another function and is refused unless `allow_folded_batchnorm`. Every graph is checked by
    the onnx checker and an ONNX Runtime session before it is written (`providers.check_loads`),
    and records where its parameters came from (`SOURCE_KEY`) for `roam train`'s weights.

    `precision` (fp32, bf16, fp16; default: what the export computes in) makes the mixed-precision
    step: float32 masters, the forward in the low type where the policy says (`roam_cli.precision`),
    fp16's loss scaled inside the step (`scaler_settings` over GradScaler's defaults). An export
    already in low precision is brought back to float32 first (`precision.masters`)."""
    from roam_cli.core.fileio import check_outputs, external_data_files, write_atomic
    from roam_cli.frontend.onnx_import import load_model
    from roam_cli.frontend.optimizer_graph import LOSS_SCALE, full_step, gradient_accumulators
    from roam_cli.frontend.providers import check_loads
    from roam_cli.lower import lower_model

    step_optimizer = in_graph_optimizer(optimizer, optimizer_settings or {}, in_graph)
    outputs = [out_path] + ([] if in_graph else [optimizer_path]) + ([checkpoint_path] if checkpoint_path else [])
    check_outputs(outputs, [infer_path])
    model, _ = load_model(infer_path)
    if dims:
        from roam_cli.frontend.shapes import bind_dims

        bind_dims(model, dims)
    written: list[tuple[Path, str, int]] = []

    def write(*graphs: tuple[Path, str, onnx.ModelProto]) -> None:
        final = [(path, what, proto if fused else lower_model(proto)) for path, what, proto in graphs]
        for path, what, proto in final:
            check_loads(proto, f"the {what} roam made", infer_path.parent)
        for path, what, proto in final:
            write_atomic(path, proto.SerializeToString())
            written.append((path, what, len(proto.graph.node)))

    exported_low = masters.low_type_of(model)
    low = exported_low if precision is None else low_type(precision)
    scaler = grad_scaler(scaler_settings or {}, low, in_graph)
    if gradient_accumulators(model.graph):
        if precision is not None or scaler_settings:
            raise RoamError("--precision and --grad-scaler apply to inference exports: this training graph's backward "
                            "is already built in its types")
        if not in_graph:
            raise RoamError(f"{infer_path} already is a training graph; add --in-graph-optimizer to turn it into "
                            "one graph for the whole training step")
        if loss is not None or requires_grad is not None or frozen or trainable or checkpoint_path:
            raise RoamError("--loss, --requires-grad, --trainable, --frozen and --checkpoint apply to inference "
                            "exports; a training graph has its loss, and its parameters are those with gradient "
                            "accumulators")
        write((out_path, "full step", full_step(model, step_optimizer)))
        return Made(None, Counter(), written)
    if loss is None:
        raise RoamError("--loss is required for an inference export (none: its first output already is the loss)")
    if backward is build:
        if low is not None:
            raise RoamError(f"--precision {LOW_TYPES[low]}: mixed precision is built by roam's backward (the default "
                            "--backend); ONNX Runtime's artifacts differentiate the graph as it is")
        training_api()  # before any work: what to install, if the backward cannot be built here
    elif fused:
        raise RoamError("--fused keeps the fused ops of ONNX Runtime's backward: give --backend ort-artifacts too")
    absent = sorted(f for f in external_data_files(model) if not (infer_path.parent / f).is_file())
    if checkpoint_path and absent:  # refused before any work: the checkpoint is the one output needing weights
        raise RoamError(f"--checkpoint needs the weights, but external data file {absent[0]} is absent")
    if checkpoint_path and exported_low is not None:
        raise RoamError(f"--checkpoint: the export's weights are {LOW_TYPES[exported_low]}; the step's float32 masters "
                        "are made from them by roam train, which reads the export")
    repaired = repair(model)
    clamp_ir(model)
    found = find(model)
    if found.folded_norms and not allow_folded_batchnorm:
        raise RoamError(found.folded_norms_refusal())
    if found.folded_norms:  # trained as it is: the convolutions' folded weights and biases are its parameters
        convolved = {x for n in model.graph.node if n.op_type == "Conv" for x in n.input}
        trainable = [*trainable, *(x for x in found.folded if x in convolved)]
    folded = {t.name: copy_of(t) for t in model.graph.initializer if checkpoint_path and t.name in found.folded}
    recovered = recover(model, found, infer_path.parent)
    chosen = survey(model, requires_grad, frozen, trainable, found)
    chosen.recovered = {const: param for const, (param, _) in recovered.derived.items()}
    chosen.unfed = embed_constants(model, chosen.constants, infer_path.parent)
    chosen.frozen += chosen.unfed
    chosen.constants = [x for x in chosen.constants if x not in chosen.unfed]
    if exported_low is not None:
        rounded = set(masters.to_float32(model, exported_low, [*chosen.trainable, *chosen.frozen]))
        chosen.rounded = ([x for x in chosen.trainable if x in rounded], LOW_TYPES[exported_low])
    mixed = {} if low is None else {"low": low, "loss_scale": LOSS_SCALE if scaler else None}
    built = backward(model, chosen, loss, None if in_graph else optimizer, **mixed)
    graph = full_step(built.training, step_optimizer, scaler) if in_graph else built.training
    source = {"model": os.path.relpath(infer_path.resolve(), out_path.resolve().parent), **recovered.record()}
    graph.metadata_props.add(key=SOURCE_KEY, value=json.dumps(source))
    if checkpoint_path:  # first: reading the weights may still fail
        for t in added_values(recovered, folded, infer_path.parent):  # ORT's block knows initializers only
            built.parameters[0 if t.name in chosen.trainable else 1].append(t)
        write_checkpoint(built.parameters, infer_path.parent, checkpoint_path)
        written.append((checkpoint_path, "checkpoint", 0))
    if in_graph or built.optimizer is None:
        write((out_path, "full step" if in_graph else "training graph", graph))
    else:
        write((out_path, "training graph", graph), (optimizer_path, "optimizer graph", built.optimizer))
    return Made(chosen, repaired, written, mixed_precision(graph, low, chosen.trainable, scaler))


def mixed_precision(step: onnx.ModelProto, low: int | None, trainable: list[str], scaler) -> dict:
    """What the CLI says of a mixed-precision step: its low type, the weight copies cast from the
    float32 masters, and the loss scaling (fp16)."""
    if low is None:
        return {}
    masters = set(trainable)
    copies = sum(n.op_type == "Cast" and n.input[0] in masters for n in step.graph.node)
    return {"precision": LOW_TYPES[low], "weight_copies": copies,
            "grad_scaler": dataclasses.asdict(scaler) if scaler else None}


def grad_scaler(settings: dict[str, str], low: int | None, in_graph: bool):
    """fp16's loss scaling (GradScaler's defaults, `settings` over them; `enabled=false` turns it
    off), None for other precisions; refused where the step has no update to skip."""
    from roam_cli.frontend.optimizer_graph import GradScaler

    if settings and low != TensorProto.FLOAT16:
        raise RoamError("--grad-scaler applies to fp16 steps (--precision fp16): bf16 and fp32 need no loss scaling")
    scaler = typed_settings(GradScaler(), settings, "--grad-scaler", "GradScaler")
    if low != TensorProto.FLOAT16 or not scaler.enabled:
        return None
    if not in_graph:
        raise RoamError("--precision fp16 scales the loss inside the step, whose update a step with an overflow skips: "
                        "add --in-graph-optimizer (or --grad-scaler enabled=false)")
    return scaler


def copy_of(t: onnx.TensorProto) -> onnx.TensorProto:
    out = onnx.TensorProto()
    out.CopyFrom(t)
    return out


def in_graph_optimizer(name: str, settings: dict[str, str], in_graph: bool):
    """The in-graph optimizer `name` with `settings` (`--optimizer-setting eps=1e-8`, each of its
    field's type) over its defaults: ONNX Runtime's, torch.optim.AdamW()'s with convention=pytorch."""
    from roam_cli.frontend.optimizer_graph import OPTIMIZERS, PYTORCH_ADAMW

    if settings and not in_graph:
        raise RoamError("--optimizer-setting applies to the in-graph optimizer: add --in-graph-optimizer")
    default = PYTORCH_ADAMW if name == "adamw" and settings.get("convention") == "pytorch" else OPTIMIZERS[name]
    return typed_settings(default, settings, "--optimizer-setting", name)


def typed_settings(default, settings: dict[str, str], option: str, what: str):
    """The dataclass `default` with `settings` (each in its field's type) over it."""
    known = set(dataclasses.asdict(default))
    for key, value in settings.items():
        if key not in known:
            raise RoamError(f"{option} {key}: {what} has {', '.join(sorted(known)) or 'no settings'}")
    typed = {}
    for key, value in settings.items():
        kind = type(getattr(default, key))
        try:
            typed[key] = parse_bool(value) if kind is bool else kind(value)
        except ValueError:
            raise RoamError(f"{option} {key}: {value!r} is not a {kind.__name__}") from None
    try:
        return dataclasses.replace(default, **typed)
    except RoamError as e:
        raise RoamError(f"{option}: {e}") from None


def parse_bool(value: str) -> bool:
    if value.lower() not in ("true", "false", "1", "0"):
        raise ValueError(value)
    return value.lower() in ("true", "1")


def write_checkpoint(parameters: tuple, base_dir: Path, path: Path) -> None:
    """The ORT training checkpoint: the one step that reads the weights."""
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    from roam_cli.core.fileio import write_atomic

    for t in [*parameters[0], *parameters[1]]:
        if uses_external_data(t):
            try:
                load_external_data_for_tensor(t, str(base_dir))
            except (OSError, ValueError, onnx.checker.ValidationError) as e:
                raise RoamError(f"--checkpoint needs the weights of {t.name!r}: {first_line(e)}") from None
            t.data_location = TensorProto.DEFAULT
            del t.external_data[:]
    onnxblock = training_api()
    with tempfile.TemporaryDirectory(dir=path.resolve().parent, prefix=".roam-checkpoint-") as scratch:
        onnxblock.save_checkpoint(parameters, Path(scratch, "checkpoint"))
        write_atomic(path, Path(scratch, "checkpoint").read_bytes())
