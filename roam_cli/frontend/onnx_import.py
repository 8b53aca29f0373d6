"""ONNX file -> Graph, without reading a single weight byte.

Steps: parse the protobuf (external data left on disk), give every node a unique stable name,
bind symbolic dimensions, infer every tensor's static shape (`roam_cli.frontend.shapes`), and check the
graph is a DAG whose every input is defined."""

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from roam_cli.core.annotate import name_nodes
from roam_cli.core.errors import RoamError
from roam_cli.core.fileio import external_data_files
from roam_cli.core.graph import Graph, Node, Value, element_size, smallest_first_order
from roam_cli.frontend import shapes


@dataclass
class Imported:
    graph: Graph
    model: onnx.ModelProto  # node names assigned; no weight bytes loaded
    path: Path
    sha256: str
    renamed: int  # how many nodes got generated names
    notes: list[str] = field(default_factory=list)  # one-line facts worth telling the user


def load_model(path: str | os.PathLike) -> tuple[onnx.ModelProto, str]:
    """Parse an ONNX file (weights stay on disk). Returns the proto and the file's sha256."""
    path = Path(path)
    if not path.exists():
        raise RoamError(f"{path}: no such file")
    if path.is_dir():
        raise RoamError(f"{path}: is a directory, not an ONNX file")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise RoamError(f"{path}: cannot read: {e.strerror}") from None
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else "protobuf parse failed"
        if "utf-8" in reason and "in field: " in reason:  # protobuf 7 refuses such a name as it parses
            reason = f"a {reason.rsplit('in field: ', 1)[1].rstrip(')')} is not UTF-8 text"
        raise RoamError(f"{path}: not a valid ONNX model ({reason})") from None
    if not model.HasField("graph") or model.ir_version <= 0:
        raise RoamError(f"{path}: not an ONNX model (no graph or no IR version)")
    if not model.graph.node:
        raise RoamError(f"{path}: the ONNX graph has no nodes")
    g = model.graph
    names = [s for n in g.node for s in (n.name, n.op_type, n.domain, *n.input, *n.output)]
    names += [v.name for v in (*g.input, *g.output, *g.initializer, *g.value_info)]
    bad = next((s for s in names if not isinstance(s, str)), None)
    if bad is not None:  # protobuf hands back a string field that is not valid UTF-8 as bytes
        raise RoamError(f"{path}: not a valid ONNX model (name {bad[:40]!r} is not UTF-8 text)")
    return model, hashlib.sha256(data).hexdigest()


def check_dims(path: str | os.PathLike, names, option: str) -> None:
    """Refuse a dimension name given with `option` that no input of the model at `path` has."""
    available = shapes.symbolic_dims(load_model(path)[0])
    unknown = next((name for name in names if name not in available), None)
    if unknown is not None:
        raise shapes.unknown_dim(option, unknown, available)


def subgraph_captures(node: onnx.NodeProto) -> list[str]:
    """Outer-scope tensors a control-flow node's subgraphs read: the node consumes them too."""
    captured: list[str] = []
    for attr in node.attribute:
        for g in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            defined = {i.name for i in g.input} | {t.name for t in g.initializer}
            for n in g.node:
                for name in list(n.input) + subgraph_captures(n):
                    if name and name not in defined and name not in captured:
                        captured.append(name)
                defined.update(n.output)
    return captured


def topological_order(nodes: list[Node], defined_outside: set[str]) -> list[int]:
    """File order when it is already topological; otherwise a stable topological sort.

    Raises RoamError naming a node on a cycle, or an input nothing defines."""
    producer: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for out in n.outputs:
            if out in producer or out in defined_outside:
                raise RoamError(f"tensor {out!r} is produced twice (by node {n.name!r} and another)")
            producer[out] = i
    for n in nodes:
        for inp in n.inputs:
            if inp not in producer and inp not in defined_outside:
                raise RoamError(f"node {n.name!r} reads tensor {inp!r}, which no node, input or initializer defines")
    indegree = [0] * len(nodes)
    users: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        for p in {producer[x] for x in n.inputs if x in producer}:
            if p == i:
                raise RoamError(f"graph has a cycle: node {n.name!r} reads its own output")
            indegree[i] += 1
            users[p].append(i)
    order = smallest_first_order(indegree, users)
    if len(order) < len(nodes):
        stuck = next(nodes[i].name for i, d in enumerate(indegree) if d > 0)
        raise RoamError(f"graph has a cycle through node {stuck!r}")
    return order


def import_model(path: str | os.PathLike, dims: dict[str, int] | None = None, shapes_from_run: bool = False) -> Imported:
    path = Path(path)
    model, sha = load_model(path)
    renamed = name_nodes(model.graph)
    g = model.graph
    notes = []
    if renamed:
        notes.append(f"{renamed} nodes had no unique name and were given generated names")
    external = external_data_files(model)
    missing = sorted(f for f in external if not (path.parent / f).exists())
    if missing:
        notes.append(f"external data file {missing[0]} is absent: planning reads no weights, so that is fine")

    init_names = [t.name for t in g.initializer]
    init_set = set(init_names)
    inputs = [i.name for i in g.input if i.name not in init_set]
    nodes = [
        Node(
            name=n.name,
            op_type=n.op_type,
            domain=n.domain if n.domain != "ai.onnx" else "",
            inputs=tuple(dict.fromkeys(x for x in list(n.input) + subgraph_captures(n) if x)),
            outputs=tuple(x for x in n.output if x),
        )
        for n in g.node
    ]
    order = topological_order(nodes, set(inputs) | init_set)
    if order != list(range(len(nodes))):
        notes.append("the file's node order is not topological; 'original' order is a stable topological sort of it")
        nodes = [nodes[i] for i in order]
        reordered = [g.node[i] for i in order]
        del g.node[:]
        g.node.extend(reordered)
    produced = {x for n in nodes for x in n.outputs}
    for out in g.output:
        if out.name not in produced and out.name not in init_set and out.name not in inputs:
            raise RoamError(f"graph output {out.name!r} is not produced by any node")

    types = shapes.infer(model, dims or {}, path if shapes_from_run else None)
    values = {}
    unknown = []
    names = list(dict.fromkeys(inputs + init_names + [x for n in nodes for x in n.inputs + n.outputs]))
    for name in names:
        t = types.get(name)
        if t is None:
            unknown.append(name)
            continue
        dtype, shape = t
        if any(d < 0 for d in shape):
            raise RoamError(f"tensor {name!r} has a negative dimension {list(shape)}")
        try:
            element_size(dtype)
        except ValueError as e:
            raise RoamError(f"tensor {name!r}: {e}") from None
        except KeyError:
            raise RoamError(f"tensor {name!r} has element type {dtype}, which ONNX does not define") from None
        values[name] = Value(name, dtype, tuple(shape))
    if unknown:
        shown = ", ".join(unknown[:10]) + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else "")
        hint = "" if shapes_from_run else "; try --shapes-from-run"
        raise RoamError(f"cannot determine the size of {len(unknown)} tensors: {shown}{hint}")
    for v in values.values():
        if v.nbytes >= 2**63:
            raise RoamError(f"tensor {v.name!r} of shape {list(v.shape)} has a byte size that overflows int64")

    constants = {o for n in nodes if n.op_type == "Constant" and n.domain == "" for o in n.outputs}
    metadata = {kv.key: kv.value for kv in model.metadata_props}
    graph = Graph(nodes, values, inputs, init_names, [o.name for o in g.output], constants, metadata)
    return Imported(graph, model, path, sha, renamed, notes)


