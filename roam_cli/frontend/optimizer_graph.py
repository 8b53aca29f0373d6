"""ONNX Runtime artifacts training graph -> one graph for the whole training step, optimizer inside.

The artifacts training graph adds each parameter's gradient into a persistent buffer
(`InPlaceAccumulatorV2`) and leaves the update to a separate optimizer graph. Here the
accumulators, their buffers and `lazy_reset_grad` are dropped, and each parameter's update —
AdamW or SGD in standard ONNX ops — consumes its gradient directly, placed right after the last
node that needs the parameter's old value. Parameters, moments (`<param>.exp_avg`,
`<param>.exp_avg_sq`) and the update counter `step` are graph inputs; their new values are graph
outputs `<state>.out`, declared as in-place updates in metadata `roam.inplace`, so the memory model
writes them into the state's own buffer. BatchNormalization running statistics are updated the
same way.

The maths is ONNX Runtime's: `AdamWOptimizer` with adam_mode 1 and bias correction (the
correction folded into the learning rate, weight decay after the update) and `SGDOptimizerV2`
(w -= lr * g), so one step matches the artifacts optimizer graph. `step` counts the updates
done before this one; the update uses step + 1, which it also writes to `step.out`.

With a `GradScaler` (fp16 mixed precision) the step scales its loss as torch.amp.GradScaler does:
the backward starts from the scale (state `grad_scaler.scale`, made a graph input by the
backward), every update reads its gradient times 1 / scale, and the updates run after the check
that every gradient is finite; a step with a gradient that is not updates no parameter, moment
or step counter, and the scale backs off; after `growth_interval` clean steps in a row it grows."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from roam_cli.core.errors import RoamError
from roam_cli.core.memory import INPLACE_KEY

ACCUMULATORS = {("com.microsoft", "InPlaceAccumulatorV2"), ("com.microsoft", "InPlaceAccumulator")}
# Ops that write new running statistics: output index -> the input holding the old value.
RUNNING_STATS = {("com.microsoft", "BatchNormInternal"): {1: 3, 2: 4}, ("", "BatchNormalization"): {1: 3, 2: 4}}
LEARNING_RATE, STEP = "learning_rate", "step"  # the artifacts optimizer graph's names
LOSS_SCALE, GROWTH_TRACKER = "grad_scaler.scale", "grad_scaler.growth_tracker"  # torch's GradScaler's state
# metadata_props key: {state input: its first value} for the states that do not start at zero
INITIAL_KEY = "roam.initial_state"


@dataclass(frozen=True)
class AdamW:
    """onnxruntime.training.onnxblock.optim.AdamW's defaults. `convention` "pytorch" is
    torch.optim.AdamW's maths instead: eps added after the bias correction (ONNX Runtime adds it to
    the uncorrected sqrt(v), so where |g| is within ~30 eps of zero the two steps differ by up to
    the learning rate) and the weight decay applied before the update."""

    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-6
    weight_decay: float = 0.0
    convention: str = "onnxruntime"

    def __post_init__(self):
        if self.convention not in ("onnxruntime", "pytorch"):
            raise RoamError(f"AdamW convention {self.convention!r}: choose onnxruntime or pytorch")
        # torch.optim.AdamW's checks, NaN and infinity refused too (a step of them trains to NaN)
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1 and 0 <= self.eps < math.inf
                and 0 <= self.weight_decay < math.inf):
            raise RoamError(f"AdamW beta1={self.beta1}, beta2={self.beta2}, eps={self.eps}, weight_decay="
                            f"{self.weight_decay}: the betas must lie in [0, 1), eps and weight_decay be finite and >= 0")


@dataclass(frozen=True)
class SGD:
    pass


OPTIMIZERS = {"adamw": AdamW(), "sgd": SGD()}
# convention=pytorch is torch.optim.AdamW() whole: its maths and its defaults
PYTORCH_ADAMW = AdamW(eps=1e-8, weight_decay=0.01, convention="pytorch")


@dataclass(frozen=True)
class GradScaler:
    """torch.amp.GradScaler's defaults. The non-finite check reads the scaled gradients, GradScaler
    the unscaled ones: the same but where the scale has backed off below 1 and a gradient divided
    by it overflows float32."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True

    def __post_init__(self):
        if not (self.init_scale > 0 and self.growth_factor > 1 and 0 < self.backoff_factor < 1
                and self.growth_interval >= 1):
            raise RoamError("GradScaler: init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and "
                            "growth_interval >= 1, as torch.amp.GradScaler requires")


def gradient_accumulators(g: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    """parameter -> its accumulator node (inputs: buffer, <parameter>_grad, lazy_reset_grad)."""
    found = {}
    for n in g.node:
        if (n.domain, n.op_type) in ACCUMULATORS and len(n.input) >= 2 and n.input[1].endswith("_grad"):
            found[n.input[1][: -len("_grad")]] = n
    return found


def full_step(training: onnx.ModelProto, optimizer: str | AdamW | SGD = "adamw",
              scaler: GradScaler | None = None) -> onnx.ModelProto:
    """The whole training step of an artifacts training graph, as a new model; with `scaler`, its
    loss scaled (the training graph's backward starts from LOSS_SCALE)."""
    opt = OPTIMIZERS[optimizer] if isinstance(optimizer, str) else optimizer
    g = training.graph
    accumulators = gradient_accumulators(g)
    if not accumulators:
        raise RoamError("not an ONNX Runtime artifacts training graph: no InPlaceAccumulatorV2 gradient accumulators")
    states = {vi.name: (vi.type.tensor_type.elem_type, [d.dim_value for d in vi.type.tensor_type.shape.dim])
              for vi in g.input}
    states.update({t.name: (t.data_type, list(t.dims)) for t in g.initializer})
    for p in accumulators:
        if p not in states:
            raise RoamError(f"gradient {p}_grad has no parameter {p!r} among the graph's inputs and initializers")
        if states[p][0] != TensorProto.FLOAT:
            raise RoamError(f"parameter {p!r} is not float32; the in-graph optimizer updates float32 parameters")
    dropped = {id(n) for n in accumulators.values()}
    kept = [n for n in g.node if id(n) not in dropped]
    still_read = {x for n in kept for x in n.input}
    dropped_inputs = {x for n in accumulators.values() for k, x in enumerate(n.input) if k != 1} - still_read
    dropped_outputs = {x for n in accumulators.values() for x in n.output}
    taken = (still_read | {x for n in kept for x in n.output} | {n.name for n in kept}
             | (set(states) - dropped_inputs))

    if scaler is not None and LOSS_SCALE not in states:
        raise RoamError(f"fp16 loss scaling needs a backward that starts from the loss scale ({LOSS_SCALE!r}); this "
                        "training graph's does not: make it from the inference export with --precision fp16")
    w = Writer(taken)
    new_inputs = [w.input(LEARNING_RATE, TensorProto.FLOAT, [1])]
    lr = LEARNING_RATE
    new: dict[str, str] = {}  # state -> its new value
    if isinstance(opt, AdamW):
        new_inputs.append(w.input(STEP, TensorProto.INT64, [1]))
        new[STEP] = w.op("Add", STEP, w.const(1, np.int64), out=None if scaler else f"{STEP}.out")
        t = w.op("Cast", new[STEP], to=TensorProto.FLOAT)
        one = w.const(1.0)
        bias1 = w.op("Sub", one, w.op("Pow", w.const(opt.beta1), t))
        bias2 = w.op("Sub", one, w.op("Pow", w.const(opt.beta2), t))
        lr_corrected = w.op("Div", w.op("Mul", lr, w.op("Sqrt", bias2)), bias1)
        lr_decay = w.op("Mul", lr, w.const(opt.weight_decay)) if opt.weight_decay else None
        torch_maths = opt.convention == "pytorch"
        # PyTorch: lr / bias1 * m / (sqrt(v) / sqrt(bias2) + eps) = lr_corrected * m / (sqrt(v) + eps sqrt(bias2))
        eps = w.op("Mul", w.const(opt.eps), w.op("Sqrt", bias2)) if torch_maths else w.const(opt.eps)
    head, w.nodes = w.nodes, []

    # Each update runs right after the last node that reads the parameter's old value or makes its
    # gradient; with loss scaling, after the check that reads every gradient.
    last_use = {}
    for i, n in enumerate(kept):
        for x in list(n.input) + [o[: -len("_grad")] for o in n.output if o.endswith("_grad")]:
            if x in accumulators:
                last_use[x] = i
    chains: dict[int, list[onnx.NodeProto]] = {}
    tail: list[onnx.NodeProto] = []
    if scaler is not None:
        w.nodes = tail
        inverse = w.op("Reciprocal", LOSS_SCALE)
        found = non_finite(w, [f"{p}_grad" for p in accumulators])

    def out(state: str) -> str | None:
        """The name an update writes: the state's `.out`, or a fresh one the skip chooses from."""
        return None if scaler else f"{state}.out"

    for p in accumulators:
        w.nodes = tail if scaler else chains.setdefault(last_use[p], [])
        grad = w.op("Mul", f"{p}_grad", inverse) if scaler else f"{p}_grad"
        if isinstance(opt, AdamW):
            m, v = f"{p}.exp_avg", f"{p}.exp_avg_sq"
            new_inputs += [w.input(m, TensorProto.FLOAT, states[p][1]), w.input(v, TensorProto.FLOAT, states[p][1])]
            new[m] = w.op("Add", w.op("Mul", m, w.const(opt.beta1)), w.op("Mul", grad, w.const(1.0 - opt.beta1)),
                          out=out(m))
            new[v] = w.op("Add", w.op("Mul", v, w.const(opt.beta2)),
                          w.op("Mul", w.op("Mul", grad, grad), w.const(1.0 - opt.beta2)), out=out(v))
            denom = w.op("Add", w.op("Sqrt", new[v]), eps)
            update = w.op("Mul", w.op("Div", new[m], denom), lr_corrected)
            if lr_decay is None:
                new[p] = w.op("Sub", p, update, out=out(p))
            elif torch_maths:  # decay, then the update
                new[p] = w.op("Sub", w.op("Sub", p, w.op("Mul", p, lr_decay)), update, out=out(p))
            else:  # the update, then decay
                moved = w.op("Sub", p, update)
                new[p] = w.op("Sub", moved, w.op("Mul", moved, lr_decay), out=out(p))
        else:
            new[p] = w.op("Sub", p, w.op("Mul", grad, lr), out=out(p))
    if scaler is not None:  # a step whose gradients are not all finite keeps every state as it was
        w.nodes = tail
        new = {state: w.op("Where", found, state, value, out=f"{state}.out") for state, value in new.items()}
        new_inputs.append(w.input(GROWTH_TRACKER, TensorProto.INT64, states[LOSS_SCALE][1]))
        new.update(scale_update(w, scaler, found, states[LOSS_SCALE][1]))
    pairs = {value: state for state, value in new.items()}  # new value -> state it replaces

    nodes = list(head)
    for i, n in enumerate(kept):
        nodes.append(n)
        nodes.extend(chains.get(i, []))
    nodes.extend(tail)
    pairs.update(running_stat_outputs(nodes, states, w))
    states.update({vi.name: (vi.type.tensor_type.elem_type, [d.dim_value for d in vi.type.tensor_type.shape.dim])
                   for vi in new_inputs})

    out = onnx.ModelProto()
    out.CopyFrom(training)
    graph = out.graph
    del graph.node[:]
    graph.node.extend(nodes)
    inputs = [i for i in g.input if i.name not in dropped_inputs] + new_inputs
    del graph.input[:]
    graph.input.extend(inputs)
    outputs = [o for o in g.output if o.name not in dropped_outputs]
    outputs += [helper.make_tensor_value_info(o, *states[s]) for o, s in pairs.items()]
    del graph.output[:]
    graph.output.extend(outputs)
    graph.initializer.extend(w.initializers)
    kept_info = [vi for vi in graph.value_info if vi.name not in dropped_outputs]
    del graph.value_info[:]
    graph.value_info.extend(kept_info)
    out.metadata_props.add(key=INPLACE_KEY, value=json.dumps(pairs))
    if scaler is not None:
        out.metadata_props.add(key=INITIAL_KEY, value=json.dumps({LOSS_SCALE: scaler.init_scale}))
    return out


def non_finite(w: "Writer", grads: list[str]) -> str:
    """Whether any element of `grads` is infinite or NaN: the sum of their L1 norms is then
    infinite or NaN (a sum of finite float32 values overflows only past 3.4e38). One scalar per
    gradient, no copy of any."""
    norms = [w.op("ReduceL1", x, keepdims=0) for x in grads]
    total = w.op("Sum", *norms) if len(norms) > 1 else norms[0]
    return w.op("Or", w.op("IsInf", total), w.op("IsNaN", total))


def scale_update(w: "Writer", s: GradScaler, found: str, shape: list[int]) -> dict[str, str]:
    """torch.amp.GradScaler.update: backed off and the count restarted after a step with a
    non-finite gradient; else the count of clean steps grows, and at `growth_interval` the scale
    grows (where the grown scale is finite) and the count restarts."""
    counted = w.op("Add", GROWTH_TRACKER, w.const(1, np.int64, shape))
    due = w.op("Equal", counted, w.const(s.growth_interval, np.int64, shape))
    grown = w.op("Mul", LOSS_SCALE, w.const(s.growth_factor, np.float32, shape))
    grows = w.op("And", due, w.op("Not", w.op("IsInf", grown)))
    clean = w.op("Where", grows, grown, LOSS_SCALE)
    scale = w.op("Where", found, w.op("Mul", LOSS_SCALE, w.const(s.backoff_factor, np.float32, shape)), clean,
                 out=f"{LOSS_SCALE}.out")
    zero = w.const(0, np.int64, shape)
    tracker = w.op("Where", found, zero, w.op("Where", due, zero, counted), out=f"{GROWTH_TRACKER}.out")
    return {LOSS_SCALE: scale, GROWTH_TRACKER: tracker}


def running_stat_outputs(nodes: list[onnx.NodeProto], states: dict, w: "Writer") -> dict[str, str]:
    """Name the new running statistics of BatchNormalization `<statistic>.out`: graph outputs
    that replace the statistics in place."""
    read = {x for n in nodes for x in n.input}
    pairs = {}
    for n in nodes:
        for out_i, in_i in RUNNING_STATS.get((n.domain, n.op_type), {}).items():
            if out_i < len(n.output) and n.output[out_i] and n.output[out_i] not in read and n.input[in_i] in states:
                n.output[out_i] = w.claim(f"{n.input[in_i]}.out")
                pairs[n.output[out_i]] = n.input[in_i]
    return pairs


class Writer:
    """Appends nodes whose outputs and names are fresh; collects the scalar constants."""

    def __init__(self, taken: set[str]):
        self.taken = set(taken)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.constants: dict[tuple, str] = {}
        self.count = 0

    def claim(self, name: str) -> str:
        if name in self.taken:
            raise RoamError(f"the training graph already has a tensor named {name!r}; the in-graph optimizer needs it")
        self.taken.add(name)
        return name

    def fresh(self, hint: str) -> str:
        self.count += 1
        name = f"optimizer/{hint}_{self.count}"
        return self.claim(name) if name not in self.taken else self.fresh(hint)

    def input(self, name: str, dtype: int, shape: list[int]) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(self.claim(name), dtype, shape)

    def const(self, value, dtype=np.float32, shape=(1,)) -> str:
        """A one-element initializer (shape [1], like learning_rate and step, unless `shape`)."""
        key = (float(value), np.dtype(dtype).name, tuple(shape))
        if key not in self.constants:
            self.constants[key] = name = self.fresh("const")
            self.initializers.append(numpy_helper.from_array(np.full(shape, value, dtype=dtype), name))
        return self.constants[key]

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs) -> str:
        output = self.claim(out) if out else self.fresh(op_type)
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], name=output, **attrs))
        return output
