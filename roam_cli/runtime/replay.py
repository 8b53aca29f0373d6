"""Arena replay, the reference plan consumer: run the graph in plan order, node by node, every
tensor at the address the plan gives it.

One buffer of `arena_bytes` holds every transient tensor at `arena + offset` (a plan that
offloads has a second, of `tiers.arena_bytes`, for the tensors of its slow `tier`); a view or an
in-place result lives at its root's address; persistent tensors (inputs, initializers, Constant
outputs) get buffers of their own. Each node runs in a single-node ONNX Runtime session whose
inputs and outputs are bound (IOBinding) to those addresses, so ONNX Runtime allocates nothing the
plan placed. If two tensors live at the same step overlapped, one would overwrite the other and
the results would change: the replay judges a layout by its numbers, not by its bookkeeping."""

import time
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from roam_cli.core.errors import CheckFailed, RoamError
from roam_cli.core.graph import Graph
from roam_cli.core.memory import INPLACE_OPS
from roam_cli.frontend.providers import PROVIDERS

POISON = 0xFF  # the arena starts as all-ones bytes: a float read before it is written is NaN
BINDABLE = {np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
                                  np.uint8, np.uint16, np.uint32, np.uint64, np.bool_)}


@dataclass
class Replayed:
    values: dict[str, np.ndarray]  # final contents of the tensors asked for
    nodes: int
    sessions: int  # single-node sessions built; the other nodes reused one
    seconds: float


def numpy_dtype(graph: Graph, name: str) -> np.dtype:
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(graph.values[name].dtype))
    if dtype not in BINDABLE:
        raise RoamError(f"replay cannot bind tensor {name!r} of type {dtype}: "
                        "ONNX Runtime's Python binding has no such type")
    return dtype


def storage_roots(graph: Graph, plan: dict) -> dict[str, str]:
    """Every tensor -> the tensor owning its storage. Refuses a plan the replay could not follow
    without reading or writing outside the buffers it allocates (overlaps are left to the numbers)."""
    def refuse(why: str):
        raise CheckFailed(f"plan cannot be replayed: {why}")

    names = {n.name for n in graph.nodes}
    seen: set[str] = set()
    for name in plan["order"]:
        if name in seen or name not in names:
            refuse(f"node {name!r} is {'listed twice in' if name in seen else 'not in the model but in'} the order")
        seen.add(name)
    if len(seen) < len(names):
        refuse(f"node {sorted(names - seen)[0]!r} is missing from the order")
    tensors = {t["name"]: t for t in plan["tensors"]}
    roots: dict[str, str] = {}
    for name, value in graph.values.items():
        chain = [name]
        while "alias_of" in tensors.get(chain[-1], {}):
            target = tensors[chain[-1]]["alias_of"]
            if target in chain:
                refuse(f"alias_of chain through {target!r} is a cycle")
            chain.append(target)
        root = chain[-1]
        for x in (name, root):
            if x not in tensors or x not in graph.values:
                where = "model but not the plan" if x in graph.values else "plan but not the model"
                refuse(f"tensor {x!r} is in the {where}")
        if tensors[name]["bytes"] < value.nbytes or value.nbytes > graph.values[root].nbytes:
            refuse(f"tensor {name!r} needs {value.nbytes} bytes, more than the plan gives it")
        offset, tier = tensors[root]["offset"], tensors[root].get("tier")
        size = plan["tiers"]["arena_bytes"] if tier and "tiers" in plan else plan["arena_bytes"]
        if offset is not None and offset + tensors[root]["bytes"] > size:
            refuse(f"tensor {root!r} ends at {offset + tensors[root]['bytes']}, "
                   f"past the {tier or 'device'} arena ({size} bytes)")
        roots[name] = root
    return roots


class Kernels:
    """Single-node sessions, one per signature (op, attributes, input/output types and shapes):
    the twelve layers of a transformer share theirs. A node with a `seed` attribute owns a random
    generator that advances on every run, so its session is never shared."""

    def __init__(self, model: onnx.ModelProto, graph: Graph, device: str):
        self.model, self.graph, self.device = model, graph, device
        self.options = ort.SessionOptions()
        self.options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        self.options.log_severity_level = 4  # a failing node's error comes back as the exception, not on stderr too
        self.cache: dict[tuple, ort.InferenceSession] = {}

    def signature(self, node: onnx.NodeProto) -> tuple[list, list]:
        """(inputs, outputs) as (name in the single-node model, tensor whose address and type it takes).

        An in-place op's result the node leaves unnamed is bound anyway, onto the buffer it
        overwrites: whatever the kernel does with its input, that buffer then holds the new value."""
        canon: dict[str, str] = {}
        for x in node.input:
            if x and x not in canon:
                canon[x] = f"i{len(canon)}"
        inputs = [(canon.get(x, ""), x) for x in node.input]
        outputs = [(f"o{k}", x) if x else ("", "") for k, x in enumerate(node.output)]
        for out_i, in_i in INPLACE_OPS.get((node.domain if node.domain != "ai.onnx" else "", node.op_type), []):
            if in_i < len(node.input) and node.input[in_i] and (out_i >= len(node.output) or not node.output[out_i]):
                outputs += [("", "")] * (out_i + 1 - len(outputs))
                outputs[out_i] = (f"o{out_i}", node.input[in_i])
        return inputs, outputs

    def session(self, node: onnx.NodeProto, inputs: list, outputs: list) -> tuple[ort.InferenceSession, bool]:
        def typed(pairs):
            return tuple((c, self.graph.values[x].dtype, self.graph.values[x].shape) if c else "" for c, x in pairs)

        key = (node.domain, node.op_type, tuple(a.SerializeToString() for a in node.attribute),
               typed(inputs), typed(outputs))
        if any(a.name == "seed" for a in node.attribute):
            key += (node.name,)
        if key in self.cache:
            return self.cache[key], False
        single = helper.make_node(node.op_type, [c for c, _ in inputs], [c for c, _ in outputs], domain=node.domain)
        single.attribute.extend(node.attribute)
        distinct = {c: x for c, x in inputs + outputs if c}

        def info(pairs):
            values = {c: self.graph.values[distinct[c]] for c, _ in pairs if c}
            return [helper.make_tensor_value_info(c, v.dtype, v.shape) for c, v in values.items()]

        model = helper.make_model(helper.make_graph([single], node.name or node.op_type, info(inputs), info(outputs)),
                                  opset_imports=self.model.opset_import)
        model.ir_version = self.model.ir_version
        model.functions.extend(self.model.functions)
        session = ort.InferenceSession(model.SerializeToString(), self.options, providers=PROVIDERS[self.device])
        self.cache[key] = session
        return session, True


def replay(model: onnx.ModelProto, graph: Graph, plan: dict, sources: dict[str, np.ndarray], device: str,
           wanted: list[str]) -> Replayed:
    """Run `model`'s nodes in plan order inside the plan's arena; return the final contents of `wanted`.

    `sources` holds the initial value of every graph input and initializer (written at its
    address before the first node); nothing else is initialised."""
    start = time.perf_counter()
    roots = storage_roots(graph, plan)
    tensors = {t["name"]: t for t in plan["tensors"]}
    arenas_np = {None: np.full(max(plan["arena_bytes"], 1), POISON, np.uint8)}  # by tier: None, the device
    if "tiers" in plan:
        arenas_np[plan["tiers"]["slow"]] = np.full(max(plan["tiers"]["arena_bytes"], 1), POISON, np.uint8)
    own: dict[str, ort.OrtValue] = {}
    for root in dict.fromkeys(roots.values()):
        if tensors[root]["offset"] is not None:
            continue
        value = graph.values[root]
        if root in sources:
            own[root] = ort.OrtValue.ortvalue_from_numpy(np.array(sources[root], numpy_dtype(graph, root), copy=True),
                                                         device, 0)
        else:
            own[root] = ort.OrtValue.ortvalue_from_shape_and_type(list(value.shape), numpy_dtype(graph, root),
                                                                  device, 0)
    for name, array in sources.items():
        root = roots[name]
        if root not in own:  # the plan put an input in the arena: it starts there
            offset = tensors[root]["offset"]
            arena_np = arenas_np[tensors[root].get("tier")]
            arena_np[offset: offset + array.nbytes] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    arenas = {tier: ort.OrtValue.ortvalue_from_numpy(a, device, 0) for tier, a in arenas_np.items()}
    base = {root: v.data_ptr() for root, v in own.items()}
    address = {name: base[r] if r in base else arenas[tensors[r].get("tier")].data_ptr() + tensors[r]["offset"]
               for name, r in roots.items()}

    kernels = Kernels(model, graph, device)
    protos = {n.name: n for n in model.graph.node}
    built = 0
    for step, name in enumerate(plan["order"]):
        node = protos[name]
        inputs, outputs = kernels.signature(node)
        try:
            session, new = kernels.session(node, inputs, outputs)
            built += new
            binding = session.io_binding()
            for c, x in dict.fromkeys(p for p in inputs if p[0]):
                binding.bind_input(c, device, 0, numpy_dtype(graph, x), list(graph.values[x].shape), address[x])
            for c, x in outputs:
                if c:
                    binding.bind_output(c, device, 0, numpy_dtype(graph, x), list(graph.values[x].shape), address[x])
            session.run_with_iobinding(binding)
        except RoamError:
            raise
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CheckFailed(f"replay failed at step {step} (node {name!r}, {node.op_type}): {first[:300]}") from None

    final_arenas = {tier: a.numpy() for tier, a in arenas.items()}
    final_own = {root: v.numpy().reshape(-1).view(np.uint8) for root, v in own.items()}
    values = {}
    for name in wanted:
        root, value = roots[name], graph.values[name]
        raw = final_own[root] if root in final_own else final_arenas[tensors[root].get("tier")][tensors[root]["offset"]:]
        values[name] = raw[: value.nbytes].view(numpy_dtype(graph, name)).reshape(value.shape).copy()
    return Replayed(values, len(plan["order"]), built, time.perf_counter() - start)
