"""`roam gradcheck`: a training graph's gradients checked against its forward alone, in float64.

Two questions, answered per parameter (a graph input or initializer `p` whose gradient the graph
computes as `p_grad`, the name ONNX Runtime's gradient builders and roam's backward both give):

- **the rules**: the graph run in float64 (every floating type widened, ORT's fused training ops
  lowered first) against central differences of its loss, the forward alone, along a random unit
  direction `v` of the parameter: |<g64, v> - dL/dv| / |g64|. The differences are taken at six
  steps and neighbours extrapolated (Richardson), the best-agreeing pair kept (`ridders`); how far
  that pair disagrees is the difference's own uncertainty, which widens the tolerance where the
  function is badly conditioned, and is shown.
- **float32**: the graph as it runs (its own types, on the installed ONNX Runtime) against its
  float64 self: |g32 - g64| / |g64|. This is what training on it follows; a gradient fine in
  float64 and far off in float32 is rounding the model amplifies, not a wrong rule.

ONNX Runtime's CPU provider lacks some float64 kernels (Conv, pools, Erf); a float64 graph it
cannot run is run by onnx's reference evaluator instead (slower, exact arithmetic of each op)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from roam_cli.gradcheck import kinks
from roam_cli.core.errors import RoamError, first_line
from roam_cli.frontend.onnx_import import import_model, subgraph_captures
from roam_cli.frontend.synthetic import synthesize
from roam_cli.core.graph import type_name
from roam_cli.lower import lower_model, nonstandard_nodes
from roam_cli.precision import LOW_TYPES, declared_types
from roam_cli.runtime.weights import source_of

RULE_TOLERANCE = 1e-6  # float64 differences are good to ~1e-9 on a well-conditioned loss
FLOAT32_TOLERANCE = 1e-2  # PyTorch's own float32 gradients are within 1e-3 of float64's on 26 architectures
WIDENED = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16}
RANDOM_OPS = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli", "Multinomial"}
STEPS = tuple(1e-3 * 4.0**-k for k in range(6))  # the differences' steps, relative to max(|P|, 1)
FLOOR = 1e-4
UNIT_ROUNDOFF = {TensorProto.BFLOAT16: 2.0**-8, TensorProto.FLOAT16: 2.0**-11}  # the differences' steps, relative to the parameter's norm


@dataclass
class Finding:
    parameter: str
    rule_error: float  # float64 gradient against the differences, relative to the gradient's norm
    uncertainty: float  # the differences' own, on the same scale
    float32_error: float  # the graph as it runs against float64, relative
    kink: str | None = None  # the edge every difference step crossed, the rule not holding across it: unchecked

    def rule_ok(self, tolerance: float) -> bool:
        return self.kink is not None or self.rule_error <= max(tolerance, 10 * self.uncertainty)


@dataclass
class Report:
    loss: str
    loss32: float
    loss64: float
    runner: str  # what ran the float64 graphs
    findings: list[Finding]
    synthesised: list[str]  # inputs the loss reads given no value: drawn at random
    dropouts: int  # Dropouts given one fixed mask for every run
    seconds: float
    tolerance: float = RULE_TOLERANCE
    float32_tolerance: float = FLOAT32_TOLERANCE
    notes: list[str] = field(default_factory=list)
    flips: list[tuple[str, int]] = field(default_factory=list)  # edges the graph as run is across from float64

    @property
    def at_kinks(self) -> list[Finding]:
        return [f for f in self.findings if f.kink is not None]

    @property
    def wrong_rules(self) -> list[Finding]:
        return [f for f in self.findings if not f.rule_ok(self.tolerance)]

    @property
    def float32_off(self) -> list[Finding]:
        return [f for f in self.findings if f.float32_error > self.float32_tolerance]


def check(path: Path, given: dict[str, np.ndarray], seed: int = 0, loss: str | None = None,
          tolerance: float = RULE_TOLERANCE, float32_tolerance: float = FLOAT32_TOLERANCE) -> Report:
    start = time.perf_counter()
    imported = import_model(path)
    graph = imported.graph
    try:
        model = onnx.load(str(path))
    except (OSError, ValueError) as e:
        raise RoamError(f"{path}: cannot read its weights: {first_line(e)}") from None
    standard = lower_model(model) if nonstandard_nodes(model) else model
    rng = np.random.default_rng(seed)
    standard, masks = fixed_dropout(standard, graph, rng)
    loss = loss or graph.outputs[0]
    if loss not in graph.values or graph.values[loss].dtype not in WIDENED | {TensorProto.DOUBLE} \
            or int(np.prod(graph.values[loss].shape)) != 1:
        raise RoamError(f"{loss!r} is not a scalar floating output of the model: name the loss with --loss")
    made = {out for n in standard.graph.node for out in n.output}
    floating = [x for x in [*graph.inputs, *graph.initializers]
                if graph.values[x].dtype in WIDENED | {TensorProto.DOUBLE}]
    grads = {p: f"{p}_grad" for p in floating if f"{p}_grad" in made and f"{p}_grad" in graph.values}
    if not grads:
        raise RoamError("the model computes no gradient of its inputs or initializers (no `<parameter>_grad` "
                        "value): gradcheck reads a training graph or a full step")
    notes = []
    low = sorted(set(LOW_TYPES) & declared_types(model))
    if low:
        # an AMP step widened to float64 was seen 9e-5 from its forward's differences (the README
        # sample's bf16 step), not float64's 1e-8, and as it runs it rounds to its 16-bit type: its
        # rules are held to that type's unit roundoff u, its gradients as run to 10 u
        u = max(UNIT_ROUNDOFF[t] for t in low)
        tolerance, float32_tolerance = max(tolerance, u), max(float32_tolerance, 10 * u)
        notes.append(f"a {'/'.join(type_name(t) for t in low)} step: its rules are held to that type's unit "
                     f"roundoff ({tolerance:.2g}), its gradients as run to {float32_tolerance:.2g}")
    check_given(graph, given)
    values, synthesised = starting_values(graph, model, path, list(grads), given, seed)
    values |= masks
    wide = widened(as_inputs(standard, grads))
    forward_model = sliced(with_outputs(wide, [loss], graph, np.float64), loss)
    # each run also says which side of each edge (kinks.py) of the forward each element took
    forward_nodes = {n.output[0] for n in forward_model.graph.node if n.output}
    as_run_model, sided = kinks.with_sides(with_outputs(as_inputs(standard, grads), [loss, *grads.values()], graph),
                                           TensorProto.FLOAT, forward_nodes)
    as_run = run_once(as_run_model, values)
    wide_values = {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in values.items()}
    wide_run, runner = runner_for(kinks.with_sides(with_outputs(wide, [loss, *grads.values()], graph, np.float64),
                                                   TensorProto.DOUBLE, forward_nodes)[0])
    g64 = wide_run(wide_values)
    flips = kinks.crossed(as_run[1 + len(grads):], g64[1 + len(grads):], sided)
    forward_model, forward_sided = kinks.with_sides(forward_model, TensorProto.DOUBLE)
    forward, _ = runner_for(forward_model)
    center = forward(wide_values)[1:]
    read = {i.name for i in forward_model.graph.input}
    exact = [g.astype(np.float64) for g in g64[1:1 + len(grads)]]
    # a gradient a normalisation cancels is zero, a small one is all rounding in its differences: errors are
    # measured against at least FLOOR of the largest gradient
    floor = FLOOR * max((float(np.linalg.norm(g)) for g in exact), default=0.0) + 1e-300
    findings = []
    for k, p in enumerate(grads):
        direction = rng.standard_normal(exact[k].shape)
        direction /= max(np.linalg.norm(direction), 1e-300)
        sides = Sides(center, forward_sided)
        derivative, uncertainty, kink = ridders(forward, wide_values, p, direction,
                                                max(np.linalg.norm(wide_values[p]), 1.0), sides)
        scale = max(np.linalg.norm(exact[k]), floor)
        error = abs(float(np.vdot(exact[k], direction)) - derivative) / scale
        if kink is not None and error <= tolerance:  # (differences across an edge disagree: their spread
            kink = None  # says nothing of the rule) every one crossed an edge, and the rule held all the same
        findings.append(Finding(p, error, uncertainty / scale,
                                float(np.linalg.norm(as_run[k + 1].astype(np.float64) - exact[k]) / scale), kink))
    return Report(loss, float(np.ravel(as_run[0])[0]), float(np.ravel(g64[0])[0]), runner, findings,
                  [x for x in synthesised if x in read],
                  len(masks) // 2, time.perf_counter() - start, tolerance, float32_tolerance, notes, flips)


def check_given(graph, given: dict[str, np.ndarray]) -> None:
    """Each given array is an input of the model (a parameter initializer too), of its type and shape."""
    for name, array in given.items():
        value = graph.values.get(name)
        if value is None or (name not in graph.inputs and name not in graph.initializers):
            raise RoamError(f"--inputs: {name!r} is not an input or initializer of the model")
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(value.dtype))
        if array.dtype != dtype or tuple(array.shape) != tuple(value.shape):
            raise RoamError(f"--inputs: {name!r} is {array.dtype}{list(array.shape)}, the model takes "
                            f"{dtype}{list(value.shape)}")


def fixed_dropout(model: onnx.ModelProto, graph, rng: np.random.Generator) -> tuple[onnx.ModelProto, dict]:
    """A copy of `model` whose training-mode Dropouts read one mask drawn here, a graph input (and
    the mask scaled by 1 / (1 - ratio), another), so that every run computes the same function;
    and those inputs' values. RoamError for an op that draws at random otherwise."""
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    constants |= {n.output[0]: numpy_helper.to_array(a.t) for n in model.graph.node if n.op_type == "Constant"
                  for a in n.attribute if a.name == "value"}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes, masks = [], {}
    for n in out.graph.node:
        if n.op_type in RANDOM_OPS:
            raise RoamError(f"{n.op_type} node {n.name!r} draws at random on every run: gradcheck needs the same "
                            "function each time (a Dropout it fixes; this op it cannot)")
        mode = bool(constants[n.input[2]]) if n.op_type == "Dropout" and len(n.input) > 2 and n.input[2] else False
        if n.op_type != "Dropout" or not mode:
            nodes.append(n)
            continue
        ratio = float(constants.get(n.input[1], 0.5)) if len(n.input) > 1 and n.input[1] else 0.5
        shape, dtype = graph.values[n.output[0]].shape, graph.values[n.output[0]].dtype
        mask = n.output[1] if len(n.output) > 1 and n.output[1] else f"{n.output[0]}.fixed_mask"
        masks[mask] = rng.random(shape) >= ratio
        masks[f"{mask}.scaled"] = (masks[mask] / (1 - ratio)).astype(helper.tensor_dtype_to_np_dtype(dtype))
        out.graph.input.extend([helper.make_tensor_value_info(mask, TensorProto.BOOL, list(shape)),
                                helper.make_tensor_value_info(f"{mask}.scaled", dtype, list(shape))])
        nodes.append(helper.make_node("Mul", [n.input[0], f"{mask}.scaled"], [n.output[0]], name=n.name))
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out, masks


def starting_values(graph, model: onnx.ModelProto, path: Path, parameters: list[str], given: dict[str, np.ndarray],
                    seed: int) -> tuple[dict[str, np.ndarray], list[str]]:
    """A value for every graph input and every parameter: `given`, else the model's own initializer,
    else the export the step was made from (a step of roam's), else drawn at random (small normal
    floats, zero integers: a valid index and label; ones for an integer mask). Returns (values, the
    names drawn)."""
    inits = {t.name: t for t in model.graph.initializer}
    values = {p: numpy_helper.to_array(inits[p]) for p in parameters if p in inits} | dict(given)
    wanted = [x for x in graph.inputs if x not in values]
    source = source_of(model, path.parent)
    if source is not None and wanted:
        try:
            values |= source.starting_values(set(wanted))
        except RoamError:
            pass  # a weightless export: the parameters are drawn, and the report says which
    specs = [(x, helper.tensor_dtype_to_np_dtype(graph.values[x].dtype), graph.values[x].shape) for x in graph.inputs]
    for name, dtype, _ in specs:
        if name in values and values[name].dtype != dtype:
            values[name] = values[name].astype(dtype)
    drawn = [(name, dtype, shape) for name, dtype, shape in specs if name not in values]
    return values | synthesize(drawn, seed), [name for name, _, _ in drawn]


def as_inputs(model: onnx.ModelProto, parameters) -> onnx.ModelProto:
    """A copy of `model` whose initializers among `parameters` are graph inputs, to be fed."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    moved = [t for t in out.graph.initializer if t.name in parameters]
    kept = [t for t in out.graph.initializer if t.name not in parameters]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    out.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in moved)
    return out


def with_outputs(model: onnx.ModelProto, names: list[str], graph, dtype=None) -> onnx.ModelProto:
    """A copy of `model` computing only `names` (typed as `graph` has them; floats as `dtype` when
    given), a bfloat16 one cast to float32 (numpy has no bfloat16; the cast is exact)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.output[:]
    for name in names:
        elem = graph.values[name].dtype
        if dtype is not None and elem in WIDENED:
            elem = TensorProto.DOUBLE
        shape = list(graph.values[name].shape)
        if elem == TensorProto.BFLOAT16:
            out.graph.node.append(helper.make_node("Cast", [name], [f"{name}.float32"], to=TensorProto.FLOAT))
            name, elem = f"{name}.float32", TensorProto.FLOAT
        out.graph.output.append(helper.make_tensor_value_info(name, elem, shape))
    return out


def widened(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` computing in float64: every float, float16 and bfloat16 tensor, value,
    cast and constant made float64."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    widen_graph(out.graph)
    return out


def widen_graph(g: onnx.GraphProto) -> None:
    for t in g.initializer:
        widen_tensor(t)
    for vi in (*g.input, *g.output, *g.value_info):
        if vi.type.tensor_type.elem_type in WIDENED:
            vi.type.tensor_type.elem_type = TensorProto.DOUBLE
    for n in g.node:
        for k, a in enumerate(n.attribute):
            if a.type == onnx.AttributeProto.TENSOR:
                widen_tensor(a.t)
            elif a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT and a.i in WIDENED:
                a.i = TensorProto.DOUBLE
            elif n.op_type == "Constant" and a.name in ("value_float", "value_floats"):
                values = [a.f] if a.name == "value_float" else list(a.floats)
                shape = [] if a.name == "value_float" else [len(values)]
                n.attribute[k].CopyFrom(helper.make_attribute("value", numpy_helper.from_array(
                    np.array(values, np.float64).reshape(shape))))
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                widen_graph(sub)


def widen_tensor(t: onnx.TensorProto) -> None:
    if t.data_type in WIDENED:
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))


def sliced(model: onnx.ModelProto, output: str) -> onnx.ModelProto:
    """The nodes of `model` that `output` depends on: the forward alone, for the loss."""
    needed, keep = {output}, []
    for n in reversed(model.graph.node):
        if needed & set(n.output):
            keep.append(n)
            needed.update(x for x in n.input if x)
            needed.update(subgraph_captures(n))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(reversed(keep))
    inputs = [i for i in out.graph.input if i.name in needed]
    inits = [t for t in out.graph.initializer if t.name in needed]
    del out.graph.input[:], out.graph.initializer[:]
    out.graph.input.extend(inputs)
    out.graph.initializer.extend(inits)
    return out


def session(model: onnx.ModelProto):
    """A function of the feeds returning the model's outputs on ONNX Runtime's CPU provider."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # not the outputs left unread (the update's), which it prunes
    s = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = {i.name for i in s.get_inputs()}
    return lambda feeds: s.run(None, {k: v for k, v in feeds.items() if k in names})


def run_once(model: onnx.ModelProto, values: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model's outputs as the installed ONNX Runtime computes them, in the model's own types."""
    try:
        return session(model)(values)
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own classes for a kernel it lacks
        raise RoamError(f"the installed ONNX Runtime cannot run the model as it is: {first_line(e)} (a bf16 step: "
                        "check the graph `roam emulate` writes)") from None


def runner_for(model: onnx.ModelProto):
    """(a function of the feeds returning the outputs, what runs it): ONNX Runtime where it has
    every kernel in float64, else onnx's reference evaluator."""
    try:
        return session(model), "onnxruntime"
    except Exception:  # noqa: BLE001 - a float64 kernel the CPU provider lacks (NOT_IMPLEMENTED)
        from onnx.reference import ReferenceEvaluator

        evaluator = ReferenceEvaluator(model, new_ops=reference_ops())
        names = set(evaluator.input_names)
        return (lambda feeds: evaluator.run(None, {k: v for k, v in feeds.items() if k in names})), \
            "onnx's reference evaluator (ONNX Runtime lacks a float64 kernel)"


def reference_ops() -> list:
    """The reference evaluator's kernels that the float64 run replaces: onnx's own Erf (and Gelu,
    through it) rounds every value to float32 (the differences then carry float32's noise: the
    models with GELU failed the check),
    and its GatherElements wants indices as long as the data on the other axes, where ONNX (and
    torch.gather, DeBERTa's relative attention) lets them be shorter; negative indices count from
    the end."""
    from onnx.reference.op_run import OpRun

    def erf(x):
        return np.vectorize(math.erf, otypes=[x.dtype])(x)

    class Erf(OpRun):
        def _run(self, x):
            return (erf(x),)

    class Gelu(OpRun):  # (onnx's is its function body, whose Erf is onnx's own)
        def _run(self, x, approximate="none"):
            if approximate == "tanh":
                return (0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),)
            return (0.5 * x * (1 + erf(x / math.sqrt(2))),)

    class GatherElements(OpRun):
        def _run(self, data, indices, axis=None):
            axis = (axis or 0) % data.ndim
            window = tuple(slice(None) if d == axis else slice(0, n) for d, n in enumerate(indices.shape))
            indices = np.where(indices < 0, indices + data.shape[axis], indices)
            return (np.take_along_axis(data[window], indices, axis),)

    return [Erf, Gelu, GatherElements]


@dataclass
class Sides:
    """The side of every edge each element takes at the point checked (kinks.with_sides)."""
    at: list[np.ndarray]
    nodes: list[str]


def ridders(forward, values: dict[str, np.ndarray], parameter: str, direction: np.ndarray,
            size: float, sides: Sides) -> tuple[float, float, str | None]:
    """The loss's derivative along `direction` at `parameter`, its uncertainty, and the edge that kept
    it from being measured (None: it was): central differences at each of STEPS (times `size`), each
    pair of neighbours extrapolated (Richardson, h and h/4), and the extrapolation that agrees best
    with the one before it kept. Large steps suit a parameter whose effect is small (rounding
    dominates), small ones a badly conditioned loss (truncation dominates). A difference across an
    edge (a kink: Relu's zero, Clip's bounds, ...) measures a jump: only pairs that cross none are
    used; where every pair crosses one, all are, and the edge is returned with the estimate."""
    plain = [difference(forward, values, parameter, direction, step * size, sides) for step in STEPS]
    smooth = [k for k in range(len(STEPS) - 1) if not plain[k][1] and not plain[k + 1][1]]
    if smooth:
        return *extrapolate(plain, smooth), None
    # every pair crosses an edge: the estimate of them all, and the edge (the caller tells whether it held)
    node, count = plain[-1][1][0] if plain[-1][1] else next(c for _, c in plain if c)[0]
    return *extrapolate(plain, list(range(len(STEPS) - 1))), f"{node} ({count} element{'s' if count > 1 else ''})"


def extrapolate(plain: list[tuple[float, list]], pairs: list[int]) -> tuple[float, float]:
    """Richardson over the neighbouring `pairs` of differences: the extrapolation agreeing best with
    the one before it, and how far they disagree (one alone: as far as its two differences do)."""
    extrapolated = {k: (16 * plain[k + 1][0] - plain[k][0]) / 15 for k in pairs}
    compared = [k for k in pairs if k - 1 in extrapolated]
    if compared:
        best = min(compared, key=lambda k: abs(extrapolated[k] - extrapolated[k - 1]))
        return extrapolated[best], abs(extrapolated[best] - extrapolated[best - 1])
    k = pairs[-1]
    return extrapolated[k], abs(plain[k + 1][0] - plain[k][0])


def difference(forward, values: dict[str, np.ndarray], parameter: str, direction: np.ndarray, step: float,
               sides: Sides) -> tuple[float, list[tuple[str, int]]]:
    """The loss's central difference along `direction` (a unit vector) at `parameter`, and the edges
    either end lies across from the point checked."""
    at = values[parameter]
    plus = forward({**values, parameter: at + step * direction})
    minus = forward({**values, parameter: at - step * direction})
    across = kinks.crossed(plus[1:], sides.at, sides.nodes) or kinks.crossed(minus[1:], sides.at, sides.nodes)
    return float(np.sum(plus[0]) - np.sum(minus[0])) / (2 * step), across


def verdict(report: Report) -> str | None:
    """Why the check fails (exit 1), or None."""
    wrong, off = report.wrong_rules, report.float32_off
    if wrong:
        worst = max(wrong, key=lambda f: f.rule_error)
        return (f"{len(wrong)} of {len(report.findings)} gradients differ from their forward's differences in float64 "
                f"(worst {worst.parameter!r}: {worst.rule_error:.2g}, tolerance {report.tolerance:g}): a backward rule "
                "is wrong")
    if off:
        worst = max(off, key=lambda f: f.float32_error)
        why = "the model amplifies rounding on this input"
        if report.flips:
            why = (f"as it runs, the graph lies on the other side of an edge than float64 at {flipped(report)}: "
                   "it follows the other branch's gradient there")
        return (f"{len(off)} of {len(report.findings)} gradients as the graph runs differ from float64 by more than "
                f"{report.float32_tolerance:g} (worst {worst.parameter!r}: {worst.float32_error:.2g}); in float64 every "
                f"rule holds: {why}")
    return None


def flipped(report: Report) -> str:
    """The edges the graph as run lies across from float64, in words."""
    elements = sum(count for _, count in report.flips)
    first = ", ".join(f"{node} ({count})" for node, count in report.flips[:3])
    more = f" and {len(report.flips) - 3} more" if len(report.flips) > 3 else ""
    return f"{elements} element{'s' if elements > 1 else ''} of {len(report.flips)} node{'s' if len(report.flips) > 1 else ''}: {first}{more}"


def unchecked(report: Report) -> str | None:
    """The gradients the differences could not check (every step crossed an edge), in words."""
    if not report.at_kinks:
        return None
    first = report.at_kinks[0]
    return (f"{len(report.at_kinks)} of {len(report.findings)} gradients not checked: every difference step crossed an "
            f"edge (for {first.parameter!r}: {first.kink}); the point lies at a kink of the loss (another --seed, or "
            "other --inputs, checks them)")


def as_json(report: Report) -> dict:
    return {"loss": report.loss, "loss_as_run": report.loss32, "loss_float64": report.loss64, "runner": report.runner,
            "tolerance": report.tolerance, "float32_tolerance": report.float32_tolerance,
            "synthesised": report.synthesised, "dropouts_fixed": report.dropouts, "seconds": round(report.seconds, 3),
            "notes": report.notes,
            "parameters": [{"name": f.parameter, "rule_error": None if f.kink else f.rule_error,
                            "uncertainty": None if f.kink else f.uncertainty, "float32_error": f.float32_error,
                            "kink": f.kink} for f in report.findings],
            "across_from_float64": [{"node": node, "elements": count} for node, count in report.flips],
            "passed": verdict(report) is None}


def render(report: Report, console, rows: int = 8) -> None:
    from rich.table import Table

    table = Table(title=f"the worst of {len(report.findings)} parameters", title_justify="left")
    table.add_column("parameter")
    table.add_column("float64 vs differences", justify="right")
    table.add_column("their uncertainty", justify="right")
    table.add_column("as run vs float64", justify="right")
    badness = lambda f: max(0 if f.kink else f.rule_error / max(report.tolerance, 10 * f.uncertainty),  # noqa: E731
                            f.float32_error / report.float32_tolerance)
    for f in sorted(report.findings, key=badness, reverse=True)[:rows]:
        table.add_row(f.parameter, "at a kink" if f.kink else f"{f.rule_error:.1e}",
                      "" if f.kink else f"{f.uncertainty:.1e}", f"{f.float32_error:.1e}")
    console.print(table)
    drawn = f"; drawn at random: {len(report.synthesised)} inputs" if report.synthesised else ""
    fixed = f"; {report.dropouts} Dropout masks held fixed" if report.dropouts else ""
    console.print(f"loss {report.loss!r}: {report.loss32:.7g} as run, {report.loss64:.7g} in float64; float64 run "
                  f"by {report.runner}{fixed}{drawn}; {report.seconds:.1f} s", highlight=False, soft_wrap=True)
    checked = [f for f in report.findings if f.kink is None] or report.findings
    worst_rule = max(checked, key=lambda f: f.rule_error)
    worst32 = max(report.findings, key=lambda f: f.float32_error)
    for note in [*report.notes, unchecked(report)]:
        if note:
            console.print(note, highlight=False, soft_wrap=True)
    if report.flips:
        console.print(f"as run, on the other side of an edge than float64: {flipped(report)}", highlight=False,
                      soft_wrap=True)
    console.print(f"rules: worst {worst_rule.rule_error:.1e} (tolerance {report.tolerance:g}, or 10x the differences' "
                  f"uncertainty); float32: worst {worst32.float32_error:.1e} (tolerance {report.float32_tolerance:g})",
                  highlight=False, soft_wrap=True)
