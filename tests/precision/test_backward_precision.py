"""roam's backward in bfloat16 and float16: every gradient rule of tests/backward/test_backward.py's CASES
(and Resize's, from its LINEAR_CASES) in each low type L where it applies, against float64 central
finite differences at the same point; and the mixed-type forms autocast writes.

How a case is checked in L:
- The point. Every floating feed, and every floating initializer bound to the type parameter of
  its op's data input (Clip's min and max, Pad's constant value, a loss's weights), is rounded to
  L; the other floating initializers (a fixed or independent type parameter: Resize's scales,
  Dropout's ratio, Pow's exponent, CastLike's target, BatchNormalization's statistics) stay
  float32. x64 is that point in float64, so both sides differentiate one function at one point.
  Where an op has a kink (Max, Min, MaxPool, Clip, Relu, Abs, HardSwish) and rounding makes two of
  the case's values equal (or one 0), they are spread by rank instead (`kept_apart`): a tie would
  send roam's gradient to one element and finite differences' half to each.
- The reference: central differences (step 1e-6) of sum(y * r) in float64, every float type of the
  graph float64 (a Cast to a float type casts to float64), r a fixed random tensor rounded to L.
  ONNX Runtime runs it, or, where its CPU provider has no float64 kernel (Conv, ConvTranspose, the
  average pools, Resize, Erf, Gelu), ONNX's reference evaluator (with float64 Erf and Gelu and a
  grouped ConvTranspose: its own round or lay out wrongly), checked first against ONNX Runtime in
  float32 at the same point. Its error (the step squared, float64 rounding over the step) is below
  1e-9 of the gradient.
- roam: the graph in L, y cast to float32 and the loss sum(y * r) computed in float32, as
  autocast writes it (losses and sums are on torch.autocast's float32 list). dy then arrives in L
  as the Cast's gradient of r: exact (r is in L), so what is measured is the rule's arithmetic in L
  and nothing of the loss's. `gradient_model`, lowered where `nonstandard_nodes` says, type-checked
  against ONNX's schemas (full_check: a rule writing an op in a type its schema refuses fails
  here), `emulate`d (each node without a 16-bit kernel on the CPU provider computes in float32 and
  rounds its result once, as a GPU kernel does), run in ONNX Runtime without graph optimizations,
  as it is: the emulated graph must run on the CPU provider.
- The comparison: max |g_L - g64| / max(max |g64|, 1e-3) < 8 u, u L's unit roundoff (2^-8 for
  bfloat16, 8 significant bits; 2^-11 for float16, 11).

Why 8 u. Both sides start from the same numbers, so the difference is roam's rounding alone. Each
node computing in L rounds its result once (float32 inside the kernel, or `emulate`'s Casts), a
relative error of at most u; data movement (Reshape, Transpose, Slice, Gather, Pad, a scatter's
placement) is exact. A gradient element passes through k such roundings, the forward values the
rule reads and then the rule's own nodes: 1 to 5 for most rules, about 10 on LayerNormalization's
longest path (x - mean, xhat, dy * scale, two means, the products, the subtractions, / sigma).
To first order its error is a sum of k terms, each at most u of the value it rounds, whose signs
vary from element to element: it grows like sqrt(k) u, about 3 u for k = 10, not k u.
Cancellation (1 - y^2, dy - sum(dy * y), x - mean) amplifies the relative error of the small
elements it makes, but the error is measured against the largest element. 8 u is 2.5 times that
largest expectation; the worst measured is 2.5 u (float16: Pow with a tensor exponent, Gelu, a
Tanh read three times), and no case needs a factor of its own. A wrong formula is off by O(1); a
rule that loses three bits (computing in L what must be widened, a formula that cancels) fails.
The mixed cases where roam computes in float32 are held tighter: a gradient made in float32 and
returned in L is rounded once, so within u (plus float32's 1e-5); one returned in float32
(BatchNormalization's d scale and d bias beside a low X) within 1e-5, as float32 computes it.

"Where it applies": every op of the case allows L for its data input in ONNX's schema at opset 20
(`onnx.defs.get_schema(op, 20).type_constraints`); each rule computes in the type of the tensor it
differentiates (a gradient has its tensor's type), or in float32 where the lowering widens a low
input beside float32 parameters (BatchNormalization), which the schema allows too. A case that
does not apply is skipped, naming the op, its schema version and the types it allows."""

import functools
import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun
from onnx.reference.ops.op_conv_transpose import ConvTranspose as OnnxConvTranspose
from onnx.reference.ops.op_erf import Erf as OnnxErf
from onnxruntime.capi.onnxruntime_pybind11_state import NotImplemented as OrtNotImplemented

from backward_check import finite_differences, forward_model, session
from onnx_builder import fed_in_float32
from roam_cli.backward.graph import gradient_model
from roam_cli.lower import lower_model, nonstandard_nodes
from roam_cli.precision.emulate import emulate
from backward_cases import CASES, LINEAR_CASES, n

OPSET = 20
LOW = {"bf16": TensorProto.BFLOAT16, "fp16": TensorProto.FLOAT16}
UNIT = {TensorProto.BFLOAT16: 2.0**-8, TensorProto.FLOAT16: 2.0**-11}  # unit roundoff: half an ulp at 1
FACTOR = 8  # roundings on a gradient's longest path, with room (the module's docstring)
FLOAT32_RELATIVE = 1e-5  # a gradient roam computes in float32 (the mixed cases)
STEP = 1e-6
FLOATS = (TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE)
KINKED = {"Abs", "Relu", "Max", "Min", "Clip", "MaxPool", "HardSwish"}
R = np.random.default_rng(11)  # the mixed cases' (test_backward's generator is its own)


def type_str(t: int) -> str:
    return f"tensor({helper.tensor_dtype_to_string(t).removeprefix('TensorProto.').lower()})"


# --- where a case applies -------------------------------------------------------------------------

def schema(node: onnx.NodeProto):
    return onnx.defs.get_schema(node.op_type, OPSET, node.domain)


def data_input(s):
    """The schema's data input: its first that may be floating-point (Where's X, not its condition),
    and its type parameter's allowed types."""
    allowed = {c.type_param_str: list(c.allowed_type_strs) for c in s.type_constraints}
    return next((f, allowed[f.type_str]) for f in s.inputs if "tensor(float)" in allowed.get(f.type_str, ()))


def not_applicable(nodes, low: int) -> str | None:
    """Why the case does not apply in `low`: an op whose schema refuses it for its data input."""
    for node in nodes:
        s = schema(node)
        f, allowed = data_input(s)
        if type_str(low) not in allowed:
            floats = ", ".join(t[7:-1] for t in allowed if t in map(type_str, FLOATS))
            return (f"{node.op_type} at opset {OPSET} ({node.op_type}-{s.since_version}) allows {floats} for its "
                    f"{f.name} ({f.type_str}), not {type_str(low)[7:-1]}")
    return None


def init_roles(nodes, inits: dict) -> dict[str, str]:
    """Each floating initializer's role: 'data' when bound to its node's data type parameter, 'fixed'
    for a fixed float type (Resize's scales: float32 on both sides), else 'other' (float32 in L)."""
    roles = {}
    for node in nodes:
        s = schema(node)
        data, _ = data_input(s)
        for k, x in enumerate(node.input):
            if x in inits and np.asarray(inits[x]).dtype.kind == "f":
                t = s.inputs[min(k, len(s.inputs) - 1)].type_str
                role = "data" if t == data.type_str else "fixed" if t.startswith("tensor(") else "other"
                roles[x] = "data" if roles.get(x) == "data" else role
    return roles


# --- the two models -------------------------------------------------------------------------------

def rounded(v, low: int) -> np.ndarray:
    """v rounded to `low`, in float64."""
    return np.asarray(v, np.float64).astype(helper.tensor_dtype_to_np_dtype(low)).astype(np.float64)


def kept_apart(nodes, values: dict, low: int) -> dict:
    """The case's data rounded to `low`; for an op with a kink, when rounding makes two of its
    distinct values equal (or one 0), its values ranked instead, 1/8 apart (exact in both low
    types, 0 kept at 0): the same order, so the same max in every window, the same side of every
    bound, and no tie that finite differences would split."""
    out = {k: rounded(v, low) for k, v in values.items()}
    if not KINKED & {x.op_type for x in nodes}:
        return out
    before = np.concatenate([np.asarray(v, np.float64).ravel() for v in values.values()] + [[0.0]])
    after = np.concatenate([v.ravel() for v in out.values()] + [[0.0]])
    if len(np.unique(after)) == len(np.unique(before)):
        return out
    _, rank = np.unique(before, return_inverse=True)
    spread = (rank - rank[-1]) / 8.0
    parts = np.split(spread[:-1], np.cumsum([np.size(v) for v in values.values()])[:-1])
    return {k: rounded(p.reshape(np.shape(v)), low) for (k, v), p in zip(values.items(), parts)}


def output_type(m: onnx.ModelProto, y: str) -> tuple[int, list[int]]:
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True).graph
    t = next(vi for vi in (*inferred.output, *inferred.value_info) if vi.name == y).type.tensor_type
    return t.elem_type, [d.dim_value for d in t.shape.dim]


def in_type(node: onnx.NodeProto, dtype: int) -> onnx.NodeProto:
    """A copy of the node, a Cast to a float type casting to `dtype` instead."""
    out = onnx.NodeProto()
    out.CopyFrom(node)
    for a in out.attribute:
        if out.op_type == "Cast" and a.name == "to" and a.i in FLOATS:
            a.i = dtype
    return out


def loss_nodes(y: str) -> list[onnx.NodeProto]:
    return [helper.make_node("Mul", [y, "loss.r"], ["loss.yr"], name="loss_mul"),
            helper.make_node("ReduceSum", ["loss.yr"], ["loss"], keepdims=0, name="loss_sum")]


def models(nodes, feeds: dict, inits: dict, low: int, declared: dict):
    """(reference in float64, the same in float32, the model in `low`, feeds64, feeds32). Every
    floating feed holds values rounded to `low`, declared `low` unless `declared` says otherwise."""
    y = nodes[-1].output[0]
    roles = init_roles(nodes, inits)
    data = {k: v for k, v in inits.items() if roles.get(k) == "data"}
    values = kept_apart(nodes, {**feeds, **data}, low)
    rest = {k: np.asarray(v, np.float32) if np.asarray(v).dtype.kind == "f" else np.asarray(v)
            for k, v in inits.items() if k not in data}
    low_feeds = {k: values[k].astype(helper.tensor_dtype_to_np_dtype(declared.get(k, low))) for k in feeds}
    low_inits = {**{k: values[k].astype(helper.tensor_dtype_to_np_dtype(low)) for k in data}, **rest}
    probe = forward_model(nodes, low_feeds, low_inits, [helper.make_empty_tensor_value_info(y)], OPSET)
    y_type, shape = output_type(probe, y)
    r = rounded(np.random.default_rng(0).standard_normal(shape), low)
    # the loss in float32 on y cast up (the module's docstring): dy = r reaches the rule in L, exact
    cast = [] if y_type == TensorProto.FLOAT else [
        helper.make_node("Cast", [y], ["y.fp32"], to=TensorProto.FLOAT, name="loss_cast")]
    low_model = forward_model([*nodes, *cast, *loss_nodes(cast[0].output[0] if cast else y)], low_feeds,
                              {**low_inits, "loss.r": r.astype(np.float32)},
                              [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], OPSET)

    def reference(dtype: int) -> onnx.ModelProto:
        wide = helper.tensor_dtype_to_np_dtype(dtype)
        kept = {k: v.astype(wide) if v.dtype.kind == "f" and roles.get(k) != "fixed" else v for k, v in rest.items()}
        return forward_model([*(in_type(x, dtype) for x in nodes), *loss_nodes(y)],
                             {k: values[k].astype(wide) for k in feeds},
                             {**kept, **{k: values[k].astype(wide) for k in data}, "loss.r": r.astype(wide)},
                             [helper.make_tensor_value_info("loss", dtype, [])], OPSET)

    feeds64 = {k: values[k] for k in feeds}
    return (reference(TensorProto.DOUBLE), reference(TensorProto.FLOAT), low_model, feeds64,
            {k: v.astype(np.float32) for k, v in feeds64.items()})


# --- the float64 reference ------------------------------------------------------------------------

class Erf(OnnxErf):
    """ONNX's reference Erf rounds to float32 (np.vectorize(erf, otypes="f")): here in x's type."""

    op_domain = ""

    def _run(self, x):
        return (np.vectorize(math.erf, otypes=[x.dtype])(x),)


class Gelu(OpRun):
    """ONNX's reference runs Gelu's function body, with its float32 Erf."""

    op_domain = ""

    def _run(self, x, approximate="none"):
        if approximate == "tanh":
            return (0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),)
        return (0.5 * x * (1 + np.vectorize(math.erf, otypes=[x.dtype])(x / math.sqrt(2))),)


class ConvTranspose(OnnxConvTranspose):
    """ONNX's reference ConvTranspose lays W out wrongly for group > 1: here one group at a time."""

    op_domain = ""

    def _run(self, X, W, B=None, group=None, **attrs):
        g = group or 1
        parts = zip(np.split(X, g, axis=1), np.split(W, g, axis=0), np.split(B, g) if B is not None else [None] * g)
        ys = [OnnxConvTranspose._run(self, x, w, b, group=1, **attrs)[0] for x, w, b in parts]
        return (np.concatenate(ys, axis=1),)


def float64_run(ref64, ref32, feeds64, feeds32):
    """`run(outputs, feeds)` of the float64 reference: ONNX Runtime's, or where its CPU provider has
    no float64 kernel ONNX's reference evaluator's, once its loss at the point agrees with ONNX
    Runtime's in float32 (it differs from ONNX Runtime's Resize in some align_corners and
    pytorch_half_pixel forms, which roam follows)."""
    try:
        return session(ref64).run
    except OrtNotImplemented:
        pass
    run = ReferenceEvaluator(lower_model(ref64) if nonstandard_nodes(ref64) else ref64,
                             new_ops=[Erf, Gelu, ConvTranspose]).run
    got, want = float(run(["loss"], feeds64)[0]), float(session(ref32).run(["loss"], feeds32)[0])
    assert abs(got - want) <= 1e-4 * max(1.0, abs(want)), f"ONNX's reference evaluator: loss {got}, ONNX Runtime {want}"
    return run


# --- roam's gradient in the low type --------------------------------------------------------------

@functools.cache
def cpu_kernels() -> dict[tuple[str, str, str], list[tuple[int, int]]]:
    """(domain, op, element type) -> the opset ranges ONNX Runtime's CPU provider has a kernel for."""
    from onnxruntime.capi import _pybind_state

    found = {}
    for k in _pybind_state.get_all_opkernel_def():
        if k.provider == "CPUExecutionProvider":
            for t in {t for types in k.type_constraints.values() for t in types}:
                found.setdefault(("" if k.domain == "ai.onnx" else k.domain, k.op_name, t), []).append(k.version_range)
    return found


def emulated_gradient(low_model: onnx.ModelProto, wrt: list[str]) -> tuple[onnx.ModelProto, dict]:
    """roam's gradient model, lowered, type-checked against ONNX's schemas, emulated."""
    g, grads = gradient_model(low_model, wrt, "loss")
    g = lower_model(g) if nonstandard_nodes(g) else g
    onnx.checker.check_model(g, full_check=True)  # a rule writing an op in a type its schema refuses fails here
    emulate(g)
    return g, grads


def relative_errors(nodes, feeds, wrt, inits, low, declared=None) -> dict[str, float]:
    """max |g_low - g64| / max(max |g64|, 1e-3) for each name in `wrt`."""
    ref64, ref32, low_model, feeds64, feeds32 = models(nodes, feeds, inits, low, declared or {})
    g, grads = emulated_gradient(low_model, wrt)
    g = fed_in_float32(g)
    reached = [p for p in wrt if p in grads]
    got = dict(zip(reached, session(g).run([grads[p] for p in reached], feeds32)))
    run = float64_run(ref64, ref32, feeds64, feeds32)
    errors = {}
    for p in wrt:
        expected = finite_differences(ref64, feeds64, p, STEP, run)
        value = got.get(p, np.zeros_like(expected))  # the loss does not depend on p
        assert value.shape == expected.shape, p
        errors[p] = float(np.abs(value - expected).max() / max(np.abs(expected).max(), 1e-3))
    return errors


# --- the cases ------------------------------------------------------------------------------------

# Resize's rule, the one CASES lacks: nearest and linear, scales and sizes, ranks 3 to 5 (a rank-5
# resize contracts an axis before the last two). Chosen where ONNX's reference evaluator computes
# what ONNX Runtime does (`float64_run`).
RESIZE = ["Resize-nearest-half_pixel-round_prefer_floor-1x2x4x5-to-1x1x2x1.5",
          "Resize-nearest-asymmetric-floor-1x1x6x7-to-1x1x4x3",
          "Resize-linear-half_pixel-round_prefer_floor-1x1x3x4-to-1x1x0.6x2.5",
          "Resize-linear-half_pixel-round_prefer_floor-2x3x7-to-1x1x3",
          "Resize-nearest-asymmetric-floor-1x1x2x3x4-to-1x1x3x6x2"]
PRECISION_CASES = CASES + [c for c in LINEAR_CASES if c[0] in RESIZE]
TYPES = pytest.mark.parametrize("low", LOW.values(), ids=LOW.keys())


@TYPES
@pytest.mark.parametrize("nodes,feeds,wrt,inits", [c[1:] for c in PRECISION_CASES], ids=[c[0] for c in PRECISION_CASES])
def test_rule_in_low_precision_matches_float64_finite_differences(nodes, feeds, wrt, inits, low):
    reason = not_applicable(nodes, low)
    if reason:
        pytest.skip(reason)
    errors = relative_errors(nodes, feeds, list(wrt), inits, low)
    assert max(errors.values()) < FACTOR * UNIT[low], {p: f"{e / UNIT[low]:.2f} u" for p, e in errors.items()}


def f32(*shape):
    return R.standard_normal(shape).astype(np.float32)


# the mixed cases' values, drawn once
MIXED_DATA = {"cast": {"a": f32(2, 3)}, "matmul": {"a": f32(2, 3), "w": f32(3, 4)},
              "batchnorm": {"x": f32(3, 2, 2, 2), "s": f32(2), "b": f32(2)}}


def mixed_cases(low: int) -> list:
    """(id, nodes, feeds, wrt, initializers, the feeds' declared types where not `low`, tolerances).
    Tolerances: `exact` for a gradient that is dy cast, `once` for one made in float32 and rounded
    once to `low`, FLOAT32_RELATIVE for one made and returned in float32."""
    exact, once = 1e-8, UNIT[low] + FLOAT32_RELATIVE
    fp32 = TensorProto.FLOAT
    return [
        # Cast's gradient is dy cast back to the input's type: r, exactly
        ("Cast-float32-to-low-and-back", [n("Cast", "a", ["t"], to=low), n("Cast", "t", to=fp32)],
         MIXED_DATA["cast"], "a", {}, {"a": fp32}, {"a": exact}),
        # autocast's pattern: a float32 master cast to the low type for the product; each operand's
        # gradient one low Gemm (float32 accumulation, one rounding), cast back to float32
        ("MatMul-low-of-float32-casts", [n("Cast", "a", ["al"], to=low), n("Cast", "w", ["wl"], to=low),
                                         n("MatMul", ["al", "wl"])],
         MIXED_DATA["matmul"], "aw", {}, {"a": fp32, "w": fp32}, {"a": once, "w": once}),
        # ONNX's T (X), T1 (scale, B), T2 (statistics) apart: roam's lowering computes in float32
        # (lower/norms.py); dX is rounded once to X's type, d scale and d bias stay float32
        ("BatchNormalization-low-X-float32-scale-bias-statistics",
         [n("BatchNormalization", ["x", "s", "b", "m", "v"], ("y", "rm", "rv"), training_mode=1)],
         MIXED_DATA["batchnorm"], "xsb",
         {"m": np.zeros(2, np.float32), "v": np.ones(2, np.float32)}, {"s": fp32, "b": fp32},
         {"x": once, "s": FLOAT32_RELATIVE, "b": FLOAT32_RELATIVE}),
    ]


MIXED = {k: case[0] for k, case in enumerate(mixed_cases(TensorProto.BFLOAT16))}


@TYPES
@pytest.mark.parametrize("k", MIXED, ids=MIXED.values())
def test_a_mixed_type_form_matches_float64_finite_differences(k, low):
    _, nodes, feeds, wrt, inits, declared, tolerances = mixed_cases(low)[k]
    errors = relative_errors(nodes, feeds, list(wrt), inits, low, declared)
    assert all(e < tolerances[p] for p, e in errors.items()), {p: f"{e:.3g} (< {tolerances[p]:.3g})" for p, e in
                                                               errors.items()}
