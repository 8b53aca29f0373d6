"""plan.json: build it from an order and a layout, and read/write it against the JSON Schema."""

import json
import os
from functools import cache
from importlib import resources
from pathlib import Path

import fastjsonschema

from roam_cli import __version__
from roam_cli.core.errors import RoamError
from roam_cli.core.fileio import write_atomic
from roam_cli.core.graph import Graph, type_name
from roam_cli.core.memory import DEVICE, MemoryModel, lifetimes, peak_live

FORMAT, VERSION = "roam-plan", 1
# Keys under which stats hold wall-clock figures (times, and budgets derived from elapsed time).
# Every strategy uses these names; `optimize --reproducible` drops them all.
WALL_CLOCK_KEYS = frozenset({"seconds", "time_limit"})


@cache
def schema() -> dict:
    return json.loads(resources.files("roam_cli").joinpath("schemas/plan.schema.json").read_text())


def build(graph: Graph, mm: MemoryModel, order: list[int], offsets: list[int], *, model_path: Path,
          model_sha256: str, plan_path: Path, dims: dict[str, int], stats: dict, workspace: list[dict] = ()) -> dict:
    """The plan for `order` and `offsets` (one offset per transient storage, as in mm.storages);
    `workspace`: kernel scratch buffers placed besides, {node, step, bytes, offset} (field written
    only when there are some)."""
    n = len(order)
    pos = [0] * n
    for step, i in enumerate(order):
        pos[i] = step
    spans = lifetimes(mm, order)
    storage_index = {s.root: k for k, s in enumerate(mm.storages)}
    end = max(n - 1, 0)

    def own_span(name: str) -> tuple[int, int]:
        first = pos[graph.producer[name]]
        if name in graph.outputs:
            return first, end
        return first, max([first] + [pos[c] for c in graph.consumers.get(name, ())])

    tiers = mm.tiers
    copies = weight_copies(graph, mm)

    def typed(name: str) -> dict:
        """The tensor's element type, and the parameter it is a cast of (a mixed-precision step's
        low-precision weight copy)."""
        return {"dtype": type_name(graph.values[name].dtype)} | ({"copy_of": copies[name]} if name in copies else {})

    tensors = []
    for name, kind in mm.persistent.items():
        tensors.append({"name": name, "bytes": mm.tensor_bytes[name], "offset": None,
                        "first_step": 0, "last_step": end, "kind": kind} | typed(name)
                       | ({"tier": tiers.slow} if tiers and name in tiers.homes else {}))
    produced = sorted(((pos[i], k, out) for i, node in enumerate(graph.nodes)
                       for k, out in enumerate(node.outputs) if out not in mm.persistent))
    for _, _, name in produced:
        if name in storage_index:
            k = storage_index[name]
            first, last = spans[k]
            tier = mm.storages[k].tier
            tensors.append({"name": name, "bytes": mm.tensor_bytes[name], "offset": offsets[k],
                            "first_step": first, "last_step": last, "kind": mm.kind[name]} | typed(name)
                           | ({"tier": tier} if tier != DEVICE else {}))
        else:
            first, last = own_span(name)
            root = mm.storage_of[name]
            if root in mm.persistent:
                tier = tiers.slow if tiers and root in tiers.homes else DEVICE
            else:
                tier = mm.storages[storage_index[root]].tier
            tensors.append({"name": name, "bytes": mm.tensor_bytes[name], "offset": None,
                            "first_step": first, "last_step": last, "kind": mm.kind[name],
                            "alias_of": root} | typed(name) | ({"tier": tier} if tier != DEVICE else {})
                           | ({"written_over": mm.written_over[name]} if name in mm.written_over else {}))
    arena = max([o + s.bytes for o, s in zip(offsets, mm.storages) if s.tier == DEVICE]
                + [w["offset"] + w["bytes"] for w in workspace], default=0)
    peak, peak_step = peak_live(mm, spans)
    slow = {} if tiers is None else {"tiers": {
        "slow": tiers.slow,
        "arena_bytes": max([o + s.bytes for o, s in zip(offsets, mm.storages) if s.tier == tiers.slow], default=0),
        "persistent_bytes": mm.slow_persistent_bytes,
        "peak_live_bytes": peak_live(mm, spans, tiers.slow)[0],
        "host_nodes": sorted(graph.nodes[i].name for i in tiers.host_nodes)}}
    return {
        "format": FORMAT,
        "version": VERSION,
        "roam_version": __version__,
        "model": file_ref(model_path, model_sha256, plan_path),
        "dims": dict(sorted(dims.items())),
        "alignment": mm.alignment,
        "order": [graph.nodes[i].name for i in order],
        "tensors": tensors,
        "arena_bytes": arena,
        "persistent_bytes": mm.persistent_bytes,
        "peak_live_bytes": peak,
        "peak_step": peak_step,
        "stats": stats,
    } | ({"workspace": list(workspace)} if workspace else {}) | slow


def weight_copies(graph: Graph, mm: MemoryModel) -> dict[str, str]:
    """Cast outputs of a parameter: tensor -> the parameter (its float32 master)."""
    return {n.outputs[0]: n.inputs[0] for n in graph.nodes if n.op_type == "Cast" and n.domain in ("", "ai.onnx")
            and n.inputs and mm.persistent.get(n.inputs[0]) == "parameter"}


def needed_bytes(plan: dict) -> int:
    """What a runtime following the plan allocates on the device: its persistent bytes there plus
    its arena (a slower tier's bytes are the plan's `tiers`)."""
    return plan["persistent_bytes"] + plan["arena_bytes"]


def file_ref(path: Path, sha256: str, plan_path: Path) -> dict:
    """{path, sha256} of a model file, its path relative to the plan's folder."""
    try:
        rel = os.path.relpath(path.resolve(), plan_path.resolve().parent)
    except ValueError:  # another drive on Windows
        rel = str(path.resolve())
    return {"path": Path(rel).as_posix(), "sha256": sha256}


def without_wall_clock(stats: dict) -> dict:
    """`stats` minus every wall-clock figure, so that the same input and options give the same
    bytes. The schema's `seconds` stays, empty; `reproducible: true` says why."""
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in WALL_CLOCK_KEYS}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    return {**strip(stats), "seconds": {}, "reproducible": True}


@cache
def validator():
    """The schema compiled to Python (fastjsonschema): a 70B-class plan's 100,000 tensors validate
    in 0.2 s, where jsonschema's interpreter took 6 s."""
    return fastjsonschema.compile(schema())


def validate(plan: dict, where: str) -> None:
    try:
        validator()(plan)
    except fastjsonschema.JsonSchemaValueException as e:
        at = "/".join(e.path[1:]) or "(top level)"  # path[0] is "data", the plan itself
        raise RoamError(f"{where}: plan does not match the schema at {at}: {e.message[:200]}") from None


def dumps(plan: dict) -> str:
    """The plan file's text; refuses a plan that does not match the schema."""
    validate(plan, "internal error, refusing to write")
    # json's C encoder runs only without `indent`: a long list is written an element a line, each
    # by it (a 70B-class plan in 0.5 s instead of 4), the rest indented as json.dumps(indent=1)
    fields = []
    for key, value in plan.items():
        if isinstance(value, list) and len(value) > 1:
            text = "[\n  " + ",\n  ".join(map(json.dumps, value)) + "\n ]"
        else:
            text = json.dumps(value, indent=1).replace("\n", "\n ")
        fields.append(f" {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(fields) + "\n}\n"


def write(plan: dict, path: Path) -> None:
    write_atomic(path, dumps(plan))


def read(path: str | os.PathLike) -> dict:
    path = Path(path)
    if not path.is_file():
        raise RoamError(f"{path}: " + ("a directory, not a plan file" if path.is_dir() else "no such plan file"))
    try:
        plan = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:  # RecursionError: nested too deep
        raise RoamError(f"{path}: not a JSON plan ({str(e).splitlines()[0][:120]})") from None
    if not isinstance(plan, dict) or plan.get("format") != FORMAT:
        raise RoamError(f"{path}: not a roam plan (format is not {FORMAT!r})")
    validate(plan, str(path))
    return plan
