"""Which initializers of an inference export are the model's parameters, from the graph alone.

Exporters keep a parameter as an initializer named by its PyTorch path, but they also
- fold one into a constant (`val_39`, `onnx::MatMul_658`): a Linear weight transposed, scaled or
  cast once at export, a BatchNorm folded into its convolution;
- merge parameters whose values are equal (a fresh model's LayerNorm weights are all ones): the
  dynamo exporter points every reader at one initializer, the TorchScript exporter (and optimum,
  which runs it) reads the others through Identity nodes that keep their names;
- drop a parameter whose use they can precompute (a position embedding read at constant
  positions, a zero bias);
- fold one into an expression's value (Gemma's RMSNorm reads `1 + weight`: TorchScript folds it
  into `onnx::Mul_577`, a constant no weight place explains);
and they add constants of their own (shapes, masks, position ids, rotary tables, module buffers).

The evidence, strongest first: the dynamo exporter records the ExportedProgram's signature (every
parameter and buffer), marks each initializer PARAMETER or BUFFER (roam's route does too), and
keeps each node's FX call, which names the parameters the node read (and shows ties: a module
reading another module's parameter); the TorchScript exporter names nodes by module scope
(`/bert/encoder/layer.0/attention/self/query/MatMul`); else only the place a constant fills tells
(a MatMul's or a Conv's weight). No weight byte is read."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import onnx
from onnx import TensorProto

FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
LOW_FLOAT_TYPES = {TensorProto.FLOAT16, TensorProto.BFLOAT16}
SIGNATURE_KEY = "pkg.torch.export.ExportedProgram.graph_signature"
FX_NODE_KEY = "pkg.torch.onnx.fx_node"
NAMESPACE_KEY = "namespace"  # `: Model/transformer: GPT2Model/transformer.wte: Embedding/embedding: aten.embedding`
KIND_KEY = "pkg.torch.export.graph_signature.InputSpec.kind"
# (op, operand) where a parameter goes -> the ranks it has there: a floating-point constant in
# such a place is a weight the exporter folded.
WEIGHT_SLOTS = {("MatMul", 1): {2}, ("Gemm", 1): {2}, ("Gemm", 2): {1}, ("Conv", 1): {3, 4, 5}, ("Conv", 2): {1},
                ("ConvTranspose", 1): {3, 4, 5}, ("ConvTranspose", 2): {1}, ("Gather", 0): {2},
                ("LayerNormalization", 1): {1}, ("LayerNormalization", 2): {1},
                ("BatchNormalization", 1): {1}, ("BatchNormalization", 2): {1}}
# An ONNX op -> the ATen calls it can come from. The optimizer fuses nodes and a fused node keeps
# the record of one of them (a Conv carrying its BatchNorm's call): only an agreeing record names
# the node's parameters.
ATEN_CALLS = {"Conv": ("conv",), "ConvTranspose": ("conv",), "LayerNormalization": ("layer_norm",),
              "BatchNormalization": ("batch_norm",), "Gather": ("embedding", "index", "gather"),
              "Gemm": ("addmm", "linear", "mm"), "MatMul": ("matmul", "linear", "mm")}
# What to change in each exporter's call so that nothing is folded or merged.
FIXES = {"dynamo": "torch.onnx.export(..., dynamo=True, optimize=False)",
         "torchscript": "torch.onnx.export(..., dynamo=False, do_constant_folding=False), or optimum-cli export "
                        "onnx --no-constant-folding",
         "": "export without constant folding"}
ROAM_ROUTE = "roam_cli.frontend.torch_export.export (keeps every parameter)"
# Module buffers an exporter without a record keeps under their PyTorch names, like parameters:
# running statistics, rotary frequencies, position tables, masks. Not trained.
BUFFER_LEAVES = {"running_mean", "running_var", "num_batches_tracked", "inv_freq", "original_inv_freq",
                 "position_ids", "token_type_ids", "masked_bias", "cos_cached", "sin_cached"}
# Elementwise ops where a module's own parameter is read as a per-feature vector (a norm's or scale's
# weight, a bias) -> the parameter's usual name: a float vector TorchScript folded, read there inside a
# module that holds no parameter of that name, is that parameter inside an expression (Gemma's `1 + w`).
EXPRESSION_SLOTS = {"Mul": "weight", "Div": "weight", "Add": "bias", "Sub": "bias"}
# What keeps a BatchNormalization in the export (eval-mode exports fold it into the convolution).
KEEP_NORMS = {"dynamo": "re-export with torch.onnx.export(..., dynamo=True, optimize=False)",
              "torchscript": "re-export with torch.onnx.export(..., dynamo=False, do_constant_folding=False)",
              "": "re-export without constant folding"}


@dataclass
class Found:
    """Initializer names sorted by what they are (in file order)."""

    parameters: list[str]  # the model's parameters as the exporter kept them
    constants: list[str]  # every other initializer: exporter constants, module buffers, folded weights
    folded: dict[str, str]  # constant in a weight's place -> the parameter it was made from ("" unknown)
    merged: dict[str, list[str]]  # parameter -> the other parameters the exporter merged into it
    missing: list[str]  # parameters the exporter's record lists that the graph holds nowhere
    exporter: str  # "dynamo", "torchscript" or "" (unknown)
    tied: dict[str, str] = field(default_factory=dict)  # a tied parameter's other name -> the one kept
    fused: list[str] = field(default_factory=list)  # folded Conv biases: a BatchNorm folded into its Conv
    folded_norms: list[str] = field(default_factory=list)  # the BatchNorms folded into convolutions (their
    # modules from the dynamo record; else the convolutions' modules)
    computed: list[str] = field(default_factory=list)  # TorchScript's folded tensors no weight place explains,
    # each with the modules reading it
    expressions: list[str] = field(default_factory=list)  # folded constants (also in `folded`) holding an
    # expression of their parameter (Gemma's RMSNorm `1 + weight`), not the parameter itself

    def folded_norms_refusal(self) -> str:
        """The one line that refuses an export whose BatchNorms were folded away: a different function."""
        return (f"the exporter folded {len(self.folded_norms)} BatchNormalization layers into their convolutions "
                f"({', '.join(self.folded_norms[:3])}{', ...' if len(self.folded_norms) > 3 else ''}): the graph "
                f"computes the eval-mode function, which trains differently; {KEEP_NORMS[self.exporter]}, or train "
                "it as it is with --allow-folded-batchnorm")

    def warnings(self) -> list[str]:
        """One line per kind of loss, each naming the parameters and the fix."""
        fix = FIXES[self.exporter]
        out = []
        weights = {c: p for c, p in self.folded.items() if c not in self.expressions}
        if weights:
            shown = ", ".join(f"{c} ({p})" if p else c for c, p in weights.items())
            norms = (f" ({len(self.fused)} are convolution biases made by folding a BatchNormalization into its "
                     "convolution: its weight and bias are gone)") if self.fused else ""
            out.append(f"{len(weights)} parameters were folded by the exporter into constants and will not be "
                       f"trained{norms}: {shown}; train them as they are with "
                       f"--trainable {','.join(weights)} or re-export with {fix}")
        expressions = {c: p for c, p in self.folded.items() if c in self.expressions}
        if expressions:
            shown = ", ".join(f"{c} ({p})" for c, p in expressions.items())
            out.append(f"{len(expressions)} parameters were folded by the exporter into the value of an expression "
                       f"(as Gemma's RMSNorm `1 + weight`) and will not be trained: {shown}; train the constants as "
                       f"they are with --trainable {','.join(expressions)} (each then trains as the expression's "
                       f"value, and --save-weights writes it under the constant's name) or re-export with {fix}")
        if self.merged:
            pairs = [f"{o} -> {p}" for p, others in self.merged.items() for o in others]
            out.append(f"{len(pairs)} parameters were merged by the exporter into another with equal values, and "
                       f"would train as one: {', '.join(pairs[:4])}{', ...' if len(pairs) > 4 else ''}; perturb "
                       f"the weights before exporting (as after training), or export with {ROAM_ROUTE}")
        if self.missing:
            out.append(f"{len(self.missing)} of the exporter's parameters are read by no node of the graph and will "
                       f"not be trained under these names (lost for good where the exporter precomputed them: a lookup "
                       f"at constant positions, a zero bias; or a tied parameter's second name, trained under the "
                       f"other): "
                       f"{', '.join(self.missing)}; re-export with "
                       f"{fix}" + ("" if self.exporter == "dynamo" else f", or with {ROAM_ROUTE}"))
        if self.computed:
            out.append(f"{len(self.computed)} tensors the exporter computed at export may hold parameters it "
                       f"precomputed (a table read at constant positions), which are then not trained: "
                       f"{', '.join(self.computed)}; re-export with {fix} to keep them")
        return out


def looks_like_parameter(name: str) -> bool:
    """A framework parameter path (`encoder.layer.0.query.weight`), not an exporter-made constant
    (`val_42`, `onnx::MatMul_7`, `/layer/Constant_output_0`)."""
    return "." in name and not name.startswith(("onnx::", "/")) and name.rsplit(".", 1)[-1] not in BUFFER_LEAVES


def signature(model: onnx.ModelProto) -> dict[str, tuple[str, str]]:
    """The dynamo exporter's record: placeholder (`p_fc_weight`) -> (kind, PyTorch name)."""
    text = next((p.value for p in model.graph.metadata_props if p.key == SIGNATURE_KEY), "")
    return {m[1]: (m[2], m[3]) for m in re.finditer(r"^(\w+): (\w+) target='([^']*)'", text, re.MULTILINE)}


def scope_of(node: onnx.NodeProto) -> str:
    """The module path a TorchScript-exported node came from (`/bert/encoder/layer.0/x/MatMul` ->
    `bert.encoder.layer.0.x`), or ""."""
    parts = node.name.split("/")[1:-1] if node.name.startswith("/") else []
    # a called nn.Sequential `layer` has a scope of its own, and its children `layer.0`, `layer.1`
    return ".".join(x for x, after in zip(parts, parts[1:] + [""]) if not after.startswith(x + "."))


def fx_call(node: onnx.NodeProto) -> tuple[str, bool]:
    """(the node's record of its FX call, whether that is the record of another op's call)."""
    fx = next((p.value for p in node.metadata_props if p.key == FX_NODE_KEY), "")
    target = fx_target(fx)
    fused = node.op_type in ATEN_CALLS and target != "" and not any(a in target for a in ATEN_CALLS[node.op_type])
    return ("", True) if fused else (fx, False)


def fx_target(fx: str) -> str:
    """The ATen op of a record of an FX call (`torch.ops.aten.linear.default`), or ""."""
    call = re.search(r"target=([\w.]+)", fx)
    return call[1] if call else ""


def fx_parameters(node: onnx.NodeProto, params: dict[str, str]) -> list[str]:
    """The parameters the node's FX call read (dynamo: `args = (%x, %p_fc_weight)`)."""
    return list(dict.fromkeys(params[x] for x in re.findall(r"%(\w+)", fx_call(node)[0]) if x in params))


def module_of(node: onnx.NodeProto) -> str:
    """The module a dynamo-exported node ran in (`transformer.wte`), from its namespace, or ""."""
    scopes = next((p.value for p in node.metadata_props if p.key == NAMESPACE_KEY), "").split("/")
    return scopes[-2].split(":")[0] if len(scopes) > 2 else ""


def parameter_in(node: onnx.NodeProto, slot: int, params: dict[str, str], cast: bool = False) -> str:
    """The PyTorch parameter that belongs in `node`'s operand `slot`, or "". `params`: the dynamo
    placeholders -> names; without them, the node's module scope and the slot's usual name.
    `cast`: the operand is a low-precision constant, a cast of a parameter the exporter folded
    (autocast's `_to_copy`, read by GPT-2's Conv1D `addmm` as by a Linear)."""
    suffix = "bias" if slot >= 2 or node.op_type == "Add" else "weight"
    if params:
        read = fx_parameters(node, params)
        if len(read) == 1:
            return read[0]
        fitting = [p for p in read if p.rsplit(".", 1)[-1] == suffix]
        if not read:  # a call on what the exporter made of the parameter (Falcon: mm(x, %permute)): its Linear's
            module = linear_module_of(node) or (module_of(node) if cast else "")
            return f"{module}.{suffix}" if module and f"{module}.{suffix}" in params.values() else ""
        return fitting[0] if len(fitting) == 1 else ""
    scope = scope_of(node)
    return f"{scope}.{suffix}" if scope else ""


def linear_module_of(node: onnx.NodeProto) -> str:
    """The linear module (`nn.Linear`, or a class of a model's own named so, as Falcon's
    `FalconLinear(nn.Linear)`) a dynamo-exported node ran in, from its namespace, or ""."""
    scopes = next((p.value for p in node.metadata_props if p.key == NAMESPACE_KEY), "").split("/")
    path, _, kind = scopes[-2].partition(": ") if len(scopes) > 2 else ("", "", "")
    return path if kind.endswith("Linear") else ""


def anchored(name: str, kept: list[str], nested: bool = False) -> str:
    """A scope-derived parameter name rooted where the kept parameters are: TorchScript names a
    scope by the modules whose forward ran, so a model calling a grandchild directly (OPT's
    `self.model.decoder(...)`) loses the `model.` its parameters' names have. The prefix comes
    from a kept parameter of the same module (`model.decoder.layers.0.q_proj.bias`); `nested`:
    where the module keeps none (its one parameter is the one sought), from a kept parameter
    inside its nearest ancestor that holds one (`model.decoder.layers.0.fc1.weight` roots
    `decoder.layers.0.norm`)."""
    module = name.rsplit(".", 1)[0]
    if any(k.rsplit(".", 1)[0] == module for k in kept):
        return name
    prefixes = {k.rsplit(".", 1)[0][: -len(module)] for k in kept if k.rsplit(".", 1)[0].endswith("." + module)}
    while nested and not prefixes and "." in module:
        module = module.rsplit(".", 1)[0]
        inside = [k for k in kept if k.startswith(module + ".") or f".{module}." in k]
        prefixes = {"" if k.startswith(module + ".") else k[: k.index(f".{module}.") + 1] for k in inside}
    return next(iter(prefixes)) + name if len(prefixes) == 1 else name


def find(model: onnx.ModelProto) -> Found:
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    record = signature(model)
    params = {x: name for x, (kind, name) in record.items() if kind == "PARAMETER"}
    if not set(params.values()) & (set(inits) | {i.name for i in g.input}):
        record, params = {}, {}  # the names were changed after export (roam's route strips a prefix)
    kinds = {t.name: next((p.value for p in t.metadata_props if p.key == KIND_KEY), "") for t in g.initializer}
    marked = any(kinds.values())  # dynamo marks its parameters: an unmarked one its optimizer made
    buffers = {name for kind, name in record.values() if kind != "PARAMETER"}  # also when unmarked
    parameters = [x for x, t in inits.items() if t.data_type in FLOAT_TYPES and x not in buffers
                  and (kinds[x] == "PARAMETER" if marked else looks_like_parameter(x))]
    is_parameter = set(parameters)
    constants = [x for x in inits if x not in is_parameter]
    folded: dict[str, str] = {}
    fused_norms: list[str] = []
    merged: dict[str, list[str]] = {}
    for n in g.node:
        if n.op_type == "Identity" and n.input and n.input[0] in is_parameter and looks_like_parameter(n.output[0]):
            merged.setdefault(n.input[0], []).append(n.output[0])  # TorchScript's deduplicated initializer
            continue
        for slot, x in enumerate(n.input):
            weight_slot = len(inits[x].dims) in WEIGHT_SLOTS.get((n.op_type, slot), ()) if x in inits else False
            if x not in inits or not weight_slot and not (params and x in is_parameter):
                continue
            meant = parameter_in(n, slot, params, inits[x].data_type in LOW_FLOAT_TYPES)
            if x in is_parameter:
                if params and meant and meant != x and meant not in merged.get(x, []):
                    merged.setdefault(x, []).append(meant)  # dynamo: the node read another parameter
            elif inits[x].data_type in FLOAT_TYPES and weight_slot and (meant or not params or fx_call(n)[1]):
                fused = n.op_type == "Conv" and slot == 2 and (not params or fx_call(n)[1])
                folded.setdefault(x, "" if fused else meant)
                fused_norms += [x] if fused else []
    expressions: list[str] = []
    if not params:
        folded = {x: anchored(meant, parameters) if meant else meant for x, meant in folded.items()}
        expressions = in_expressions(g, inits, parameters, folded, merged)
    tied = ties(g, params)
    accounted = set(parameters) | set(folded.values()) | set(tied) | {o for others in merged.values() for o in others}
    missing = [name for name in params.values() if name not in accounted]
    exporter = "dynamo" if record else "torchscript" if model.producer_name == "pytorch" else ""
    computed = [] if record else [computed_in(x, g) for x in constants if x.startswith("onnx::") and x not in folded
                                  and inits[x].data_type in FLOAT_TYPES and len(inits[x].dims) >= 2]
    return Found(parameters, constants, folded, merged, missing, exporter, tied, fused_norms,
                 norms_folded(g, record, missing, fused_norms), computed, expressions)


def in_expressions(g: onnx.GraphProto, inits: dict[str, onnx.TensorProto], parameters: list[str],
                   folded: dict[str, str], merged: dict[str, list[str]]) -> list[str]:
    """TorchScript's constants that hold a parameter inside an expression (Gemma's RMSNorm computes
    `x * (1 + weight)`: constant folding leaves `onnx::Mul_577` = 1 + weight, and the weight is gone).
    Without a record of the module's parameters, the graph's evidence: a float vector (one axis longer
    than 1, as long as a dimension of some weight of the model) read only as an elementwise operand
    (`EXPRESSION_SLOTS`) by nodes in leaf module scopes (`/model/layers.0/input_layernorm/Mul_1`), none
    of which holds a parameter of the name that place implies (`model.layers.0.input_layernorm.weight`)
    under any name the graph has (kept, folded, merged). Each such constant joins `folded` under that
    name; one read in several modules (TorchScript reads a constant equal to another through Identity
    nodes: a fresh model's norms) stands for them all, the others `merged` into the first. Returns the
    constants, in file order."""
    scopes: set[str] = set()
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    order = {n.name: i for i, n in enumerate(g.node)}
    for n in g.node:
        scopes.add(scope_of(n))
        for k, x in enumerate(n.input):
            readers.setdefault(x, []).append((n, k))
    not_leaves = {s.rsplit(".", i)[0] for s in scopes if s for i in range(1, s.count(".") + 1)} | {""}
    weights = set(parameters) | set(folded)
    widths = {d for x in weights if x in inits for d in inits[x].dims}
    held = set(parameters) | set(folded.values()) | {o for others in merged.values() for o in others}
    out = []
    for x, t in inits.items():
        if x in weights or t.data_type not in FLOAT_TYPES or looks_like_parameter(x):
            continue
        long = [d for d in t.dims if d > 1]
        if len(long) != 1 or long[0] not in widths:
            continue
        reads = sorted(through_identities(x, readers), key=lambda r: order.get(r[0].name, 0))  # graph order
        meant = [f"{scope_of(n)}.{EXPRESSION_SLOTS[n.op_type]}" for n, _ in reads if n.op_type in EXPRESSION_SLOTS]
        if not reads or len(meant) != len(reads) or any(m.rsplit(".", 1)[0] in not_leaves for m in meant):
            continue  # read elsewhere too, or in no module, or in a module with children (not a leaf)
        meant = list(dict.fromkeys(anchored(m, sorted(held - {""}), nested=True) for m in meant))
        if any(m in held for m in meant):
            continue
        folded[x] = meant[0]
        if meant[1:]:
            merged[meant[0]] = meant[1:]
        held.update(meant)
        out.append(x)
    return out


def through_identities(name: str, readers: dict[str, list[tuple[onnx.NodeProto, int]]]
                            ) -> list[tuple[onnx.NodeProto, int]]:
    """The reads of `name`, an Identity's reads standing for its own (TorchScript reads a constant
    equal to another, or a weight shared by several modules, ALBERT's layers, through Identity nodes)."""
    out = []
    for n, k in readers.get(name, []):
        out += through_identities(n.output[0], readers) if n.op_type == "Identity" else [(n, k)]
    return out


def computed_in(x: str, g: onnx.GraphProto) -> str:
    """`x (read in module.path)`: the constant and where TorchScript's scopes say it is read."""
    scopes = sorted({scope_of(n) for n in g.node if x in n.input} - {""})
    return f"{x} (read in {', '.join(scopes)})" if scopes else x


def norms_folded(g: onnx.GraphProto, record: dict[str, tuple[str, str]], missing: list[str],
                 fused: list[str]) -> list[str]:
    """The BatchNorms an eval-mode export folded into its convolutions: the record's modules with
    running statistics whose scale or shift the graph lost (a train-mode export writes BatchNorm
    as the ops it is made of, reading both), or, without a record, the convolution biases
    folding made."""
    if record:
        norms = dict.fromkeys(name.removesuffix(".running_mean") for _, name in record.values()
                              if name.endswith(".running_mean"))
        return [m for m in norms if f"{m}.weight" in missing or f"{m}.bias" in missing]
    convolutions = {x: scope_of(n) for n in g.node if n.op_type == "Conv" for x in n.input[2:]}
    return [convolutions.get(x) or x for x in fused]  # named by the convolution holding each


def ties(g: onnx.GraphProto, params: dict[str, str]) -> dict[str, str]:
    """Tied parameters, from the dynamo record: torch.export gives a tied weight one placeholder, so
    a module that reads another module's parameter (GPT-2's `transformer.wte` reading
    `lm_head.weight`) holds that parameter under its own name too. And a parameter no node reads
    whose child module holds one of the same name (`cls.predictions.bias` beside
    `cls.predictions.decoder.bias`: the models' `self.decoder.bias = self.bias`) is that one."""
    listed = set(params.values())
    out = {}
    read = set()
    for n in g.node:
        module = module_of(n)
        got = fx_parameters(n, params)
        read.update(got)
        for p in got if module else []:
            own = f"{module}.{p.rsplit('.', 1)[-1]}"
            # (a module reading its own weight and another's tensor as data, DeBERTa's LayerNorm of the
            # relative embeddings, ties nothing)
            if own != p and own in listed and own not in got and not p.startswith(module + "."):
                out[own] = p
    held = read | {t.name for t in g.initializer}
    for p in listed - held - set(out):
        module, _, leaf = p.rpartition(".")
        children = [q for q in held & listed if q.startswith(f"{module}.") and q.endswith(f".{leaf}")
                    and q.count(".") == p.count(".") + 1]
        if len(children) == 1:
            out[p] = children[0]
    return out
