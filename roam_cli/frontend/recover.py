"""The parameters an exporter folded or tied away, put back as the parameters they are.

The dynamo exporter's default optimisation, and TorchScript's constant folding, write each
`nn.Linear` weight W as a constant holding its transpose (`val_122`, `onnx::MatMul_658`), read
by a MatMul. Trained as it is, that constant is a parameter with the wrong name and layout; left
frozen, the model trains without its linear layers; and where W is tied (GPT-2's LM head and its
token embedding), the folded copy unties it. `recover` puts the derivation back into the graph:
the constant becomes `Transpose(W)`, W a parameter under its PyTorch name (a new graph input,
without a weight read) or, where W is tied to a parameter the graph still holds, that parameter,
so the one tensor gets both gradients summed and one update.

What shows the derivation, strongest first: the dynamo exporter's record of the call
(`aten.linear(x, %p_w)`: the constant is W transposed, W named by the signature; where W is also
in the graph, the two are one tensor; a call on what the exporter made of W, Falcon's
`mm(x, %permute)`, is named by the Linear module it ran in); the TorchScript exporter's scope name
(a MatMul's constant in `/bert/encoder/layer.0/query/MatMul` is `bert.encoder.layer.0.query.weight`
transposed); and, where the weight data is present, a comparison of the two tensors, which
confirms a tie the record shows and alone shows a TorchScript tie (BERT's decoder weight equal to
its word embeddings transposed). Only the tensors of such a pair are read, so an export without
its data file still recovers by its record."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from roam_cli.frontend.parameters import LOW_FLOAT_TYPES, Found, fx_call, fx_target, through_identities

LINEAR_SLOTS = {("MatMul", 1), ("Gemm", 1)}  # where a Linear's transposed weight is read
TRANSPOSE = [1, 0]


@dataclass
class Recovered:
    """What `recover` changed; kept in the training graph for `roam train`'s weights in and out."""

    derived: dict[str, tuple[str, list[int]]] = field(default_factory=dict)  # constant -> (parameter, perm)
    added: list[str] = field(default_factory=list)  # parameters made graph inputs (their data is the constant's)
    tied: dict[str, str] = field(default_factory=dict)  # a parameter's other PyTorch name -> the name it trains as

    def record(self) -> dict:
        return {"derived": {c: [p, perm] for c, (p, perm) in self.derived.items()}, "tied": self.tied}


def recover(model: onnx.ModelProto, found: Found, base_dir: Path) -> Recovered:
    """Rewrite `model` in place: every folded Linear weight becomes Transpose(parameter). `found`
    is updated: the recovered constants leave `folded`, new parameters join `parameters`, ties
    join `tied`."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    inputs = {i.name for i in g.input}
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for n in g.node:
        for k, x in enumerate(n.input):
            readers.setdefault(x, []).append((n, k))
    out = Recovered(tied=dict(found.tied))
    data = Weights(inits, base_dir)
    # the dynamo record names a tied weight by the one parameter it keeps: data is compared only without it
    shapes = {tuple(reversed(inits[c].dims)) for c in found.folded}
    held = [p for p in found.parameters if p in inits and tuple(inits[p].dims) in shapes]
    twins = TransposedTwins([] if found.exporter == "dynamo" else held, data)
    added: list[str] = []  # the constants rewritten
    for const, meant in list(found.folded.items()):
        perm = derivation(inits[const], through_identities(const, readers))
        if const in found.fused or perm is None:
            continue
        param = out.tied.get(meant, meant)
        if param in inits or param in inputs:  # the exporter also kept the weight itself: one tensor
            if data.readable(const) and data.readable(param) and not np.array_equal(
                    data[const], np.transpose(data[param], perm).astype(data[const].dtype)):
                continue  # not made from it after all: left folded, and said so
        else:
            twin = twins.of(const)  # a tie only the data shows
            if twin is not None:
                if meant:
                    out.tied[meant] = twin
                param = twin
            elif not meant:
                continue  # whose weight it is, nothing says
            elif param not in out.added:
                shape = [inits[const].dims[k] for k in np.argsort(perm)]
                g.input.append(helper.make_tensor_value_info(param, inits[const].data_type, shape))
                out.added.append(param)
        out.derived[const] = (param, perm)
        added.append(const)
    if not added:
        return out
    made = set(added)
    kept = [t for t in g.initializer if t.name not in made]
    del g.initializer[:]
    g.initializer.extend(kept)
    derivations = [helper.make_node("Transpose", [param], [c], name=f"{c}/recovered", perm=perm) if perm == TRANSPOSE
                   else helper.make_node("Identity", [param], [c], name=f"{c}/recovered")
                   for c, (param, perm) in ((c, out.derived[c]) for c in added)]
    nodes = derivations + list(g.node)
    del g.node[:]
    g.node.extend(nodes)
    for c in added:
        del found.folded[c]
    found.parameters += [p for p in out.added if p not in found.parameters]
    found.tied = out.tied
    found.missing = [p for p in found.missing if p not in out.tied and p not in out.added]
    return out


def underived(value: np.ndarray, perm: list[int]) -> np.ndarray:
    """The parameter a constant `Transpose(parameter, perm)` was made from."""
    return np.ascontiguousarray(np.transpose(value, np.argsort(perm)))


def added_values(recovered: Recovered, constants: dict[str, onnx.TensorProto], base_dir: Path
                 ) -> list[onnx.TensorProto]:
    """The parameters `recover` made graph inputs, with their values: the constants they were
    derived from (copies taken before `recover`) read and transposed back. For the one output
    that carries weights, the ONNX Runtime checkpoint."""
    out = []
    for const, (param, perm) in recovered.derived.items():
        if param in recovered.added and param not in {t.name for t in out}:
            value = numpy_helper.to_array(constants[const], base_dir=str(base_dir))
            out.append(numpy_helper.from_array(underived(value, perm), param))
    return out


def derivation(t: onnx.TensorProto, reads: list[tuple[onnx.NodeProto, int]]) -> list[int] | None:
    """How a folded constant was made from its parameter, as a permutation of its axes: a Linear's
    weight read by MatMuls, transposed; a low-precision constant (a cast torch.autocast made, which
    the exporter folded), as it is, but where a Linear's call transposed it too. None: not known."""
    if t.data_type in LOW_FLOAT_TYPES:
        linear = is_linear_weight(t, reads) and all("linear" in fx_target(fx_call(n)[0]) for n, _ in reads)
        return TRANSPOSE if linear else list(range(len(t.dims)))
    return TRANSPOSE if is_linear_weight(t, reads) else None


def is_linear_weight(t: onnx.TensorProto, reads: list[tuple[onnx.NodeProto, int]]) -> bool:
    """A 2-D constant read only as the weight of MatMuls (or Gemms without transB), as a folded
    `x @ W.T` is."""
    def plain(n: onnx.NodeProto) -> bool:
        return n.op_type != "Gemm" or not any(a.name == "transB" and a.i for a in n.attribute)

    return len(t.dims) == 2 and bool(reads) and all((n.op_type, k) in LINEAR_SLOTS and plain(n) for n, k in reads)


class Weights:
    """Initializer values, read on demand (external data from `base_dir`); None where absent."""

    def __init__(self, inits: dict[str, onnx.TensorProto], base_dir: Path):
        self.inits, self.base_dir, self.cache = inits, base_dir, {}

    def __getitem__(self, name: str) -> np.ndarray | None:
        if name not in self.cache:
            self.cache[name] = self.load(name)
        return self.cache[name]

    def readable(self, name: str) -> bool:
        return name in self.inits and self[name] is not None

    def load(self, name: str) -> np.ndarray | None:
        try:
            return numpy_helper.to_array(self.inits[name], base_dir=str(self.base_dir))
        except (OSError, ValueError, onnx.checker.ValidationError):
            return None


class TransposedTwins:
    """The kept parameter a folded constant equals the transpose of, by hashing `params` (those
    whose transposed shape some folded constant has: no other weight is read)."""

    def __init__(self, params: list[str], data: Weights):
        self.params, self.data, self.index = params, data, None

    def of(self, const: str) -> str | None:
        value = self.data[const] if const in self.data.inits else None
        if value is None:
            return None
        if self.index is None:
            self.index = {}
            for p in self.params:
                if self.data[p] is not None:
                    self.index.setdefault(digest(np.ascontiguousarray(self.data[p].T)), p)
        return self.index.get(digest(value))


def digest(a: np.ndarray) -> tuple:
    return a.dtype.str, a.shape, hashlib.sha1(np.ascontiguousarray(a).tobytes()).hexdigest()
