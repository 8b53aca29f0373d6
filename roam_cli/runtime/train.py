"""Training steps on ONNX Runtime as the plan says: its order, its arena, the state updated in place.

`PlannedSession` is the Python API a user's own loop calls; `train` is `roam train`'s loop.

A full-step graph (`roam make-training-graph --in-graph-optimizer`, or any graph that declares
output -> state pairs, see `memory.declared_pairs`) takes its state as graph inputs and returns
the new state as outputs. Each state output is bound to its input's own buffer, so the step
updates the state in place, as the plan assumes, and the next step reads it from there. Every
other input is fed per step; every other output is returned.

Sessions run the nodes in the plan's order (PRIORITY_BASED) with the graph optimisations the plan
allows (`ort_optimize.planned_optimizations`), with random ops seeded (`execute.seed_random_ops`), so that a planned run
and an unplanned one draw the same masks."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from roam_cli import pair, verify
from roam_cli.core import memory
from roam_cli.core.collectives import COLLECTIVES
from roam_cli.core.errors import CheckFailed, RoamError, first_line
from roam_cli.core.fileio import read_arrays
from roam_cli.core.units import format_bytes
from roam_cli.frontend.optimizer_graph import INITIAL_KEY, LEARNING_RATE, gradient_accumulators
from roam_cli.frontend.ort_optimize import planned_optimizations
from roam_cli.frontend.providers import arena_providers, check_device, check_runs, check_started, locate_weights
from roam_cli.frontend.synthetic import synthesize
from roam_cli.recompute import rewrite
from roam_cli.runtime import checkpoints, collectives, data, shards, weights
from roam_cli.runtime.allocator import ALIGNMENT, ArenaAllocator, planned_requests, slow_nodes
from roam_cli.runtime.execute import (
    ARENA_NAMES,
    RTOL,
    difference,
    extended_bytes,
    in_order,
    input_specs,
    kernel_spans,
    random_op,
    seed_random_ops,
)

ALLOCATORS = ("roam", "ort", "ort-same-as-requested")
NOISE_FLOOR = 1e-3  # magnitudes compared absolutely below this (relative tolerance x floor = 1e-8)


@dataclass
class StepResult:
    number: int
    outputs: dict[str, np.ndarray]  # the outputs that are not state (the loss, ...)
    seconds: float
    memory: dict = field(default_factory=dict)  # the allocator's figures for this step


def aligned_copy(value: np.ndarray) -> np.ndarray:
    """A copy of `value` whose data starts at a multiple of the allocator's ALIGNMENT: the plan's
    allocator serves a request in a state's buffer only at an address of the request's alignment."""
    raw = np.empty(value.nbytes + ALIGNMENT, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    out = raw[start:start + value.nbytes].view(value.dtype).reshape(value.shape)
    out[...] = value
    return out


class PlannedSession:
    """One training graph in ONNX Runtime, run step after step with its state updated in place.

    ordered: the plan's order (PRIORITY_BASED), else ORT's default order for the file's nodes.
    recomputing: False runs the graph without the plan's recomputing copies (`recompute`): the
    graph as it was, which `compare` checks the planned run against.
    in_place: each `<state>.out` is written into its state's buffer (the plan's contract, safe in
    the plan's order). False gives the outputs buffers of their own, the state taking them after
    the step: ONNX's own meaning, the reference `compare` needs, because ORT's default order does
    not know a state must be read before its update overwrites it.
    collective: the graph is a rank step whose collective nodes run over MPI (`collectives`: the
    communicator given to `collectives.use` first). threads: ORT's intra-op threads (0: its default).
    allocator: "roam" serves ORT's requests from one arena laid out by roam (after a first,
    recorded step); "ort" is ORT's own arena; "ort-same-as-requested" ORT's arena grown by
    exactly what is asked (CPU: registered process-wide, as ORT allows). ORT's arena bytes come
    from its INFO log, which costs step time: `log_arena=False` leaves them out. `config`: ORT
    session config entries (`SessionOptions.add_session_config_entry`)."""

    def __init__(self, model_path: Path, plan: dict, *, device: str = "cpu", allocator: str = "roam",
                 ordered: bool = True, seed: int = 0, log_arena: bool = True, config: dict[str, str] | None = None,
                 recomputing: bool = True, in_place: bool = True, allow_unplanned: bool = False,
                 collective: bool = False, threads: int = 0):
        if allocator not in ALLOCATORS:
            raise RoamError(f"unknown allocator {allocator!r} (choose from {', '.join(ALLOCATORS)})")
        check_device(device)
        self.device = device
        self.in_place = in_place
        self.allow_unplanned = allow_unplanned
        with pair.planned_graph(model_path, plan) as imported:  # the graph ORT runs, either member given
            if pair.member(plan, imported.sha256) is None:
                raise RoamError(f"{model_path}: {pair.refusal(plan, imported.sha256)}")
            verify.require(imported.graph, imported.sha256, plan)
            if gradient_accumulators(imported.model.graph):
                raise RoamError(f"{model_path} is an ONNX Runtime artifacts training graph (gradients accumulate, "
                                "the optimizer is another graph): roam train runs whole steps; make one with "
                                f"roam make-training-graph {model_path} -o step.onnx --in-graph-optimizer")
            layout = shards.read(imported.graph.metadata, str(model_path))
            check_runs(imported.model, str(model_path), device, planned=True,
                       run_by=COLLECTIVES if collective else frozenset())
            self.graph = imported.graph
            self.sharding = layout  # a rank step's layout (shards.Sharding), else None
            self.source = weights.source_of(imported.model, imported.path.resolve().parent)
            self.inplace = memory.declared_pairs(self.graph, {})  # state output -> state input
            not_fed = sorted(s for s in self.inplace.values() if s not in self.graph.inputs)
            if not_fed:
                raise RoamError(f"state {not_fed[0]!r} is an initializer: roam trains graphs whose state is "
                                "graph inputs (roam make-training-graph --in-graph-optimizer writes such)")
            # the plan's order, whichever member was given (the annotated model has it already)
            model = in_order(imported.model, plan["order"]) if ordered else imported.model
            if not recomputing and "recompute" in plan:
                model = rewrite.undo(model, plan["recompute"])
            if collective:
                model = collectives.runnable(model, {name: v.dtype for name, v in self.graph.values.items()})
            seed_random_ops(model, seed)
            self.random_ops = sum(random_op(n) for n in model.graph.node)
            config = (config or {}) | locate_weights(model, imported.path.resolve().parent)
            planned = planned_requests(self.graph, plan) if ordered and recomputing else None
            self.session = self._session(model, ordered, allocator, log_arena, config, planned, plan, collective,
                                         threads)
        self.planned_storages = sum(t["offset"] is not None for t in plan["tensors"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.input_shapes = {name: tuple(shape) for name, _, shape in input_specs(self.graph)}
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.state: dict[str, ort.OrtValue] = {}
        self.steps = 0

    def _session(self, model: onnx.ModelProto, ordered: bool, allocator: str, log_arena: bool,
                 config: dict[str, str], planned, plan: dict, collective: bool, threads: int) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.log_severity_level = 4  # a failing node's error comes back as the exception roam says, not on stderr too
        options.intra_op_num_threads = threads
        if collective:
            collectives.register(options)
        for key, value in config.items():
            options.add_session_config_entry(key, value)
        if ordered:
            options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
        # The planned and the plain run get the optimisations the plan allows (planned_optimizations):
        # a fused node would run late in the plan's order, and fused kernels round differently, which
        # would compare fusions, not plans.
        level, disabled = planned_optimizations(model)
        options.graph_optimization_level = level
        self.arena = ArenaAllocator(self.device, planned=planned, plan_arena=plan["arena_bytes"],
                                    plan_alignment=plan["alignment"],
                                    slow_arena=plan.get("tiers", {}).get("arena_bytes", 0),
                                    slow_nodes=slow_nodes(plan)) if allocator == "roam" else None
        if self.arena is not None:
            options = self.arena.session_options(options)
            providers = self.arena.providers()
        else:
            providers = arena_providers(self.device, options, same_as_requested=allocator == "ort-same-as-requested")
        self.log_arena = log_arena and self.arena is None
        self.profile_folder = None
        if planned is not None and self.arena is not None:  # step 1's kernels tell whose each request is
            self.profile_folder = tempfile.TemporaryDirectory(prefix="roam-profile-")
            options.enable_profiling = True
            options.profile_file_prefix = str(Path(self.profile_folder.name) / "step1")
        with ort_arena_log(self.device) if self.log_arena else nullcontext({}) as log:  # the constants go there too
            try:
                session = ort.InferenceSession(model.SerializeToString(), options, providers=providers,
                                               disabled_optimizers=disabled)
            except Exception as e:
                if self.arena is not None:
                    self.arena.close()
                raise RoamError(f"ONNX Runtime cannot load the model: {first_line(e)}") from None
        check_started(session, self.device)
        self.ort_arena_bytes = log.get("bytes") or 0
        return session

    @property
    def state_names(self) -> list[str]:
        return [name for name in self.input_names if name in self.inplace.values()]

    def set_state(self, values: dict[str, np.ndarray]) -> None:
        """The state's starting values (copied to the device; the session owns them from here).
        Each state keeps its buffer from the first call on: the plan's allocator serves the outputs
        written over a state there (`ArenaAllocator.place_states`)."""
        missing = [name for name in self.state_names if name not in values]
        if missing:
            raise RoamError(f"no starting value for state {missing[0]!r}")
        for name in self.state_names:
            value = np.ascontiguousarray(values[name])
            held = self.state.get(name)
            if (held is not None and held.shape() == list(value.shape)
                    and held.element_type() == onnx.helper.np_dtype_to_tensor_dtype(value.dtype)):
                held.update_inplace(value)
            else:
                self.state[name] = ort.OrtValue.ortvalue_from_numpy(aligned_copy(value), self.device, 0)
        if self.arena is not None:
            self.arena.place_states({name: v.data_ptr() for name, v in self.state.items()})

    def close(self) -> None:
        """End the session and give its arena back (the state stays readable). Safe after a failed
        step, and twice."""
        self.session = None
        if self.arena is not None:
            self.arena.close()

    def state_arrays(self) -> dict[str, np.ndarray]:
        return {name: v.numpy().copy() for name, v in self.state.items()}

    def step(self, batch: dict[str, np.ndarray]) -> StepResult:
        """One step: `batch` feeds every input that is not state; the state is updated in place."""
        self.steps += 1
        binding = self.session.io_binding()
        keep = []  # the OrtValues of this step's batch must outlive the run
        for name in self.input_names:
            if name in self.state:
                binding.bind_ortvalue_input(name, self.state[name])
            else:
                value = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(batch[name]), self.device, 0)
                keep.append(value)
                binding.bind_ortvalue_input(name, value)
        returned = [name for name in self.output_names if name not in self.inplace]
        for name in self.output_names:
            if name in self.inplace and self.in_place:
                binding.bind_ortvalue_output(name, self.state[self.inplace[name]])
            else:
                binding.bind_output(name, self.device)
        t = time.perf_counter()
        with self._allocator_step() as memory_figures:
            try:
                self.session.run_with_iobinding(binding)
            except Exception as e:
                raise RoamError(f"ONNX Runtime could not run step {self.steps}: {first_line(e)}") from None
            if self.profile_folder is not None:
                self._stop_profiling()
            values = binding.get_outputs()
            outputs = {name: values[self.output_names.index(name)].numpy().copy() for name in returned}
            if not self.in_place:
                self.state.update({state: ort.OrtValue.ortvalue_from_numpy(
                    values[self.output_names.index(name)].numpy().copy(), self.device, 0)
                    for name, state in self.inplace.items()})
            # ORT's outputs go back to the allocator inside the step: the next step may reuse their place
            del values
            binding.clear_binding_outputs()
            del binding
        return StepResult(self.steps, outputs, time.perf_counter() - t, memory_figures)

    def _stop_profiling(self) -> None:
        """Step 1's kernel spans to the allocator, which tells by them which node each request came in."""
        profile = Path(self.session.end_profiling())
        self.arena.spans = kernel_spans(profile, self.session.get_profiling_start_time_ns())
        self.profile_folder.cleanup()
        self.profile_folder = None

    @contextmanager
    def _allocator_step(self):
        figures: dict = {}
        if self.arena is None and not self.log_arena:
            yield figures
            return
        if self.arena is None:  # ORT's arena: what it grew to so far (from the session's start) is what it holds
            with ort_arena_log(self.device) as log:
                yield figures
            self.ort_arena_bytes += log["bytes"] or 0
            figures["bytes"] = self.ort_arena_bytes
            return
        with self.arena.step() as step:
            yield figures
        figures.update(step.stats)
        if step.recorded:
            if step.stats["recorded"] < self.planned_storages / 2:
                why = ("another ONNX Runtime session with a CPU arena was created in this process first, and ORT "
                       "gives every later session that arena. Create the roam session first, or make the others "
                       "with enable_cpu_mem_arena = False") if self.device == "cpu" else \
                    "the CUDA provider did not send its requests to roam's allocator (gpu_external_alloc)"
                raise RoamError(f"ONNX Runtime made {step.stats['recorded']} allocation requests for a step whose "
                                f"plan places {self.planned_storages} tensors: {why}")
            figures.update(self.arena.layout)
            figures["bytes"] = self.arena.layout["peak_live_bytes"]
            return
        figures["bytes"] = figures["bytes_held"] = self.arena.layout["arena_bytes"] + step.stats["unplanned_peak_bytes"]
        if self.arena.layout["pools"]["slow"]["arena_bytes"]:  # a tiered plan: the slow tier's pool besides
            figures["slow_pool_bytes"] = self.arena.layout["pools"]["slow"]["arena_bytes"]
        figures["planned_requests"] = self.arena.layout["planned_requests"]
        figures["workspace_bytes"] = self.arena.layout["workspace_bytes"]
        if step.stats["unplanned"] and not self.allow_unplanned:
            k = step.stats["first_unplanned_request"]
            raise CheckFailed(f"step {step.number}: ORT's {self.arena.request(k)} asked for "
                              f"{step.stats['first_unplanned_size']} bytes, which the plan does not serve there "
                              f"({step.stats['unplanned']} such requests this step); --allow-unplanned serves them "
                              "from the system and counts them")


@contextmanager
def ort_arena_log(device: str):
    """ORT's arena growth while the block runs, from its INFO log: fd 2 goes to a file meanwhile.
    Yields a dict that gets `bytes` (None when ORT logged no arena)."""
    figures: dict = {}
    log = tempfile.TemporaryFile()
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)
    ort.set_default_logger_severity(1)
    try:
        yield figures
    finally:
        ort.set_default_logger_severity(3)
        os.dup2(saved, 2)
        os.close(saved)
        log.seek(0)
        figures["bytes"] = extended_bytes(log.read().decode(errors="replace"), ARENA_NAMES[device])
        log.close()


def starting_values(session: PlannedSession, given: dict[str, np.ndarray], seed: int,
                    learning_rate: float, kinds: dict[str, str],
                    specs: list | None = None) -> tuple[dict[str, np.ndarray], list[str]]:
    """Every input's first value: `given` (a weight the export holds in a low-precision type widened
    to the step's float32 master), else the step's recorded first value (INITIAL_KEY: fp16's loss
    scale), else optimizer state zero (Adam's moments and step start there), `learning_rate` the
    option's, and the rest synthetic. Returns (values, the names synthesised). `specs`: the inputs'
    (name, dtype, shape) the values are made for (a rank step's: the whole step's), in input order."""
    specs = specs or input_specs(session.graph)
    initial = json.loads(session.graph.metadata.get(INITIAL_KEY, "{}"))
    values, synthesised = {}, []
    for name, dtype, shape in specs:
        if name in given:  # data read a batch at a time starts as its first batch
            value = given[name].batch(1) if isinstance(given[name], data.Batches) else given[name]
            values[name] = widened(value, np.dtype(dtype))
        elif name in initial:
            values[name] = np.full(shape, initial[name], dtype=dtype)
        elif kinds.get(name) == "optimizer_state":
            values[name] = np.zeros(shape, dtype=dtype)
        elif name == LEARNING_RATE:
            values[name] = np.full(shape, learning_rate, dtype=dtype)
        else:
            synthesised.append(name)
    values |= synthesize([(name, np.dtype(dtype), shape) for name, dtype, shape in specs if name in synthesised], seed)
    return values, synthesised


def exported_values(session: PlannedSession, arrays: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], str | None]:
    """The first values the step's inference export holds for the inputs `arrays` does not give, and
    why none were read, or None: a weightless export (planning only) leaves them synthesised, and said so."""
    if session.source is None:
        return {}, None
    try:
        return session.source.starting_values(set(session.input_names) - set(arrays)), None
    except RoamError as e:
        return {}, str(e)


def widened(value: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A low-precision float value as the float32 master it starts (an export's bf16 or fp16 weight);
    any other value as it is (read_batches refuses a batch of the wrong type)."""
    low = value.dtype.itemsize == 2 and value.dtype.kind in "fV" and dtype == np.float32
    return value.astype(dtype) if low else value


def read_batches(path: Path | None, session: PlannedSession, specs: list | None = None, shuffle: bool = False,
                 seed: int = 0) -> dict[str, np.ndarray | data.Batches]:
    """The .npz's arrays by input name, of the shapes `specs` gives (default: the inputs'). A data
    input's array may hold one batch per step along an extra first axis (cycled when there are fewer
    batches than steps). A folder of arrays or a token file is read a batch at a time (`data`)."""
    if path is None:
        return {}
    specs = {name: (np.dtype(dtype), tuple(shape)) for name, dtype, shape in specs or input_specs(session.graph)}
    if not path.is_file() or path.suffix == data.TOKEN_FILE:
        data_inputs = {name for name, (_, shape) in specs.items() if name not in session.state_names and shape}
        return data.read(path, specs, data_inputs, shuffle, seed)
    arrays = read_arrays(path, "--inputs")
    for name, array in arrays.items():
        if name not in specs:
            raise RoamError(f"--inputs: {name!r} is not an input of the model")
        dtype, shape = specs[name]
        per_step = name not in session.state_names and array.shape[1:] == shape and array.ndim == len(shape) + 1
        if array.dtype != dtype or not (array.shape == shape or per_step):
            raise RoamError(f"--inputs: {name!r} is {array.dtype}{list(array.shape)}, the model takes "
                            f"{dtype}{list(shape)}" + ("" if name in session.state_names else " (or [steps, ...])"))
    return arrays


def batch_for(step: int, values: dict[str, np.ndarray], arrays: dict[str, np.ndarray],
              session: PlannedSession, shapes: dict[str, tuple] | None = None) -> dict[str, np.ndarray]:
    """Step `step`'s value of every input that is not state; `shapes`: of one batch (default the inputs')."""
    shapes = shapes or session.input_shapes
    batch = {}
    for name in session.input_names:
        if name in session.state_names:
            continue
        array = arrays.get(name, values[name])
        if isinstance(array, data.Batches):
            batch[name] = array.batch(step)
        else:
            batch[name] = array if array.shape == shapes[name] else array[(step - 1) % array.shape[0]]
    return batch


def train(model_path: Path, plan: dict, steps: int, *, device: str = "cpu", inputs_path: Path | None = None,
          seed: int = 0, learning_rate: float = 1e-3, allocator: str = "roam", compare: bool = False,
          log_arena: bool = True, allow_unplanned: bool = False, on_step=None, save_weights: Path | None = None,
          save_model: Path | None = None, checkpointing: checkpoints.Options | None = None, say=None,
          shuffle: bool = False) -> dict:
    """`roam train`: `steps` steps as the plan says; with `compare`, the same steps again on a plain
    ORT session (ORT's order and arena) and the differences. Plain values out. The weights start
    from the inference export the step was made from (`weights.Source`), where it can be read;
    `save_weights` and `save_model` write the trained parameters (`weights.save_trained`);
    `checkpointing` writes checkpoints as the run goes and resumes from the newest (`checkpoints`),
    `say` is told of a resume in one line."""
    report = on_step or (lambda result: None)
    if steps < 1:
        raise RoamError(f"--steps must be at least 1, got {steps}")
    if save_weights is not None:
        weights.check_weights_path(save_weights)
    planned = PlannedSession(model_path, plan, device=device, allocator=allocator, seed=seed, log_arena=log_arena,
                             allow_unplanned=allow_unplanned)
    try:
        if save_model is not None and planned.source is None:
            raise RoamError(f"--save-model: {model_path} does not record the inference export it was made from "
                            "(roam make-training-graph records it)")
        if save_model is not None and not planned.source.path.is_file():
            raise RoamError(f"--save-model: the inference export {planned.source.path} the step was made from is "
                            "not there")
        arrays = read_batches(inputs_path, planned, shuffle=shuffle, seed=seed)
        exported, unread = exported_values(planned, arrays)
        run = checkpoints.Run(pair.source(plan)["sha256"], 1, seed,
                              data.identity(inputs_path) if inputs_path else None)
        figures = run_steps(planned, model_path, plan, steps, device, {**exported, **arrays}, seed, learning_rate,
                            allocator, compare, report, checkpointing and checkpoints.Checkpointing(checkpointing, run, say))
        figures["weights_from"] = str(planned.source.path) if exported else None
        figures["weights_unread"] = unread
        figures["non_finite_inputs"] = sorted(name for name, a in arrays.items()  # (not of data read from disk)
                                              if isinstance(a, np.ndarray) and a.dtype.kind == "f"
                                              and not np.isfinite(a).all())
        # what training changed that the model holds: its parameters and running statistics, not the moments
        kinds = {t["name"]: t["kind"] for t in plan["tensors"]}
        trained = {name: value for name, value in planned.state_arrays().items()
                   if kinds.get(name) == "parameter" or name in exported}
        return figures | weights.save_trained(save_weights, save_model, planned.source, trained)
    finally:
        planned.close()


def run_steps(planned, model_path, plan, steps, device, arrays, seed, learning_rate, allocator, compare,
              report, checkpointing: checkpoints.Checkpointing | None = None) -> dict:
    kinds = {t["name"]: t["kind"] for t in plan["tensors"]}
    start, synthesised = starting_values(planned, arrays, seed, learning_rate, kinds)
    if checkpointing:
        checkpointing.inputs = {name: [dtype, list(shape)] for name, dtype, shape in input_specs(planned.graph)}
    start, first, resumed = checkpointing.resume(start, planned.random_ops) if checkpointing else (start, 1, None)
    planned.set_state(start)
    planned.steps = first - 1  # the run's step numbers: a resumed run goes on from its checkpoint's
    rows = []
    for k in range(first, steps + 1):
        result = planned.step(batch_for(k, start, arrays, planned))
        rows.append(result)
        report(result)
        if checkpointing:
            checkpointing.after(k, steps, planned.state_arrays)
    figures = {
        "model": str(model_path), "provider": device, "allocator": allocator, "steps": steps, "seed": seed,
        "synthesised_inputs": synthesised,
        "plan": {"arena_bytes": plan["arena_bytes"], "peak_live_bytes": plan["peak_live_bytes"],
                 "persistent_bytes": plan["persistent_bytes"]} | ({"tiers": {key: plan["tiers"][key] for key in ("slow", "arena_bytes", "persistent_bytes")}}
                    if "tiers" in plan else {}),
        "resumed": resumed,
        "per_step": [{"step": r.number, "outputs": {n: v.tolist() for n, v in r.outputs.items() if v.size == 1},
                      "seconds": r.seconds, "memory": r.memory} for r in rows],
        "arena": planned.arena.layout if planned.arena else None,
    }
    if compare and rows:
        figures["compare"] = compare_with_plain(model_path, plan, start, lambda k, s: batch_for(k, start, arrays, s),
                                                rows, planned, device, seed)
    return figures


def compare_with_plain(model_path, plan, start, batch_of, rows, planned, device, seed, collective=False, threads=0,
                       on_step=None) -> dict:
    """The same steps on a plain session of the same file: ORT's default order and arena, the graph
    without the plan's recomputing copies, and new state in buffers of its own (`in_place=False`):
    the ONNX meaning of the step, which the plan must not change. `batch_of(k, session)`: step k's
    batch. The largest difference in the returned outputs per step and in the final state,
    each relative to the reference's largest magnitude (`execute.difference`), and whether every
    output and the final state are equal bit for bit."""
    plain = PlannedSession(model_path, plan, device=device, allocator="ort", ordered=False, seed=seed, log_arena=False,
                           recomputing=False, in_place=False, collective=collective, threads=threads)
    try:
        plain.set_state(start)
        per_step, seconds, equal = [], [], True
        for r in rows:
            ref = plain.step(batch_of(r.number, plain))
            per_step.append(max((relative_difference(ref.outputs[n], r.outputs[n]) for n in ref.outputs), default=0.0))
            equal &= all(same_bits(ref.outputs[n], r.outputs[n]) for n in ref.outputs)
            seconds.append(ref.seconds)
            if on_step is not None:
                on_step(ref)
        got, ref_state = planned.state_arrays(), plain.state_arrays()
    finally:
        plain.close()
    return {"outputs_max_rel": max(per_step), "outputs_max_rel_per_step": per_step,
            "state_max_rel": max((relative_difference(ref_state[n], got[n]) for n in ref_state), default=0.0),
            "state_tensors": len(ref_state), "plain_seconds": seconds,
            "bit_equal": equal and all(same_bits(ref_state[n], got[n]) for n in ref_state)}


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def relative_difference(ref: np.ndarray, got: np.ndarray) -> float:
    """max |got - ref| relative to the reference's largest magnitude, or to NOISE_FLOOR when it holds
    nothing larger: such a tensor is rounding noise, whose relative difference means nothing (BERT's
    attention key biases have a zero gradient in exact arithmetic, softmax ignores them; after a few
    AdamW steps they and their moments hold 1e-10 to 1e-25 of either sign, run to run). Non-finite
    values both runs hold at the same places are equal (a loss both runs overflow to NaN)."""
    max_abs = difference(ref, got)[0]
    largest = float(np.abs(ref[np.isfinite(ref)]).max(initial=0.0))
    return max_abs / max(largest, NOISE_FLOOR) if np.isfinite(max_abs) else max_abs


def render_step(r: StepResult, steps: int, plan: dict) -> str:
    scalars = "  ".join(f"{name} {float(v):.6g}" for name, v in r.outputs.items() if v.size == 1)
    m = r.memory
    held = f"ORT held {format_bytes(m['bytes'])}" if m.get("bytes") is not None else "ORT held (not logged)"
    if "slow_pool_bytes" in m:
        held += f" + {format_bytes(m['slow_pool_bytes'])} in the {plan['tiers']['slow']} pool"
    how = ("recorded" if "recorded" in m else f"unplanned {m['unplanned']}") if "served" in m or "recorded" in m else ""
    return (f"step {r.number:>{len(str(steps))}}/{steps}  {scalars}  {held} (plan arena "
            f"{format_bytes(plan['arena_bytes'])})  {how}  {r.seconds * 1e3:.1f} ms").rstrip()


def pool_line(tier: str, pool: dict, later: list[dict], plan: dict) -> str:
    """One pool of a tiered plan's run in words: its bytes against its plan arena's, and how many of
    its requests were at their plan offsets (the least over the steps after the first)."""
    at_plan = min(r["memory"]["pools"]["device" if tier == "device" else "slow"]["served_at_plan_offset"]
                  for r in later)
    planned = plan["arena_bytes"] if tier == "device" else plan["tiers"]["arena_bytes"]
    return (f"{tier} pool {format_bytes(pool['arena_bytes'])} (plan's {tier} arena {format_bytes(planned)}), "
            f"{at_plan} of its {pool['planned_requests']} planned requests at their plan offset")


def render_weights(result: dict, console, saved_weights: str) -> None:
    """Where a run's first weights came from and what it wrote (`saved_weights`: the weights file in words)."""
    if result.get("weights_from"):
        console.print(f"weights from {result['weights_from']}", highlight=False, soft_wrap=True)
    if result.get("weights_unread"):
        console.print(f"warning: {result['weights_unread']}: the parameters --inputs does not give were synthesised",
                      highlight=False, soft_wrap=True)
    if result.get("non_finite_inputs"):
        console.print(f"warning: --inputs holds NaN or infinity in {', '.join(map(repr, result['non_finite_inputs']))}",
                      highlight=False, soft_wrap=True)
    for key, what in (("saved_weights", saved_weights), ("saved_model", "the export with the trained weights")):
        if key in result:
            console.print(f"wrote {result[key]}: {what}", highlight=False, soft_wrap=True)


def render_summary(result: dict, console) -> None:
    rows = result["per_step"]
    if not rows:  # resumed after the last step: what is left is to give the weights back
        console.print(f"the {result['steps']} steps were done before (resumed after step {result['resumed']['step']}): "
                      "nothing left to run", highlight=False, soft_wrap=True)
        render_weights(result, console, "trained weights")
        return
    later = rows[1:] or rows
    unplanned = sum(r["memory"].get("unplanned", 0) for r in later)
    line = (f"{result['steps']} steps on {result['provider']} with the {result['allocator']} allocator; "
            f"median step {statistics.median(r['seconds'] for r in later) * 1e3:.1f} ms")
    if result["arena"]:
        a = result["arena"]
        at_plan = min((r["memory"].get("served_at_plan_offset", 0) for r in later), default=0)
        line += (f"; arena {format_bytes(a['arena_bytes'])} for {a['requests']} requests per step "
                 f"(plan arena {format_bytes(result['plan']['arena_bytes'])}); "
                 + (f"{at_plan} of {a['planned_requests']} planned requests at their plan offset; "
                    if "planned_requests" in a and rows[1:] else "")
                 + f"{unplanned} unplanned requests after step 1")
        if "tiers" in result["plan"] and rows[1:]:
            line += "; " + "; ".join(pool_line(tier, a["pools"][pool], later, result["plan"])
                                     for pool, tier in (("device", "device"), ("slow", result["plan"]["tiers"]["slow"])))
    console.print(line, highlight=False, soft_wrap=True)
    a = result["arena"]
    if a and a.get("workspace_requests") and a["arena_bytes"] > result["plan"]["arena_bytes"]:
        console.print(f"warning: ONNX Runtime's kernels asked for {a['workspace_requests']} scratch buffers the plan does "
                      f"not have, and the arena grew {format_bytes(a['arena_bytes'] - result['plan']['arena_bytes'])} "
                      "past the plan's: `roam optimize --workspace calibrate` plans them", highlight=False, soft_wrap=True)
    render_weights(result, console, "trained weights")
    if "compare" in result:
        c = result["compare"]
        ok = max(c["outputs_max_rel"], c["state_max_rel"]) <= RTOL
        console.print(f"{'[bold green]OK[/bold green]' if ok else '[bold red]DIFFERS[/bold red]'}: against a plain "
                      f"ORT run, outputs differ by at most {c['outputs_max_rel']:.3g} and the final state "
                      f"({c['state_tensors']} tensors) by {c['state_max_rel']:.3g} relative (tolerance {RTOL:g}); "
                      f"plain median step {statistics.median(c['plain_seconds'][1:] or c['plain_seconds']) * 1e3:.1f} ms",
                      soft_wrap=True)
