"""POET's problems (Patil et al., ICML 2022) as plain values: a `poet-problem-v1` file read into a
`Problem`, a `Schedule` (POET's five T x T 0/1 matrices, kept as sets of (t, i) pairs) written as
a `poet-schedule-v1` file. The format and POET's accounting: docs/poet.md."""

import json
import math
from dataclasses import dataclass
from pathlib import Path

from roam_cli.core.errors import RoamError
from roam_cli.core.fileio import read_json, write_atomic

PROBLEM_FORMAT = "poet-problem-v1"
SCHEDULE_FORMAT = "poet-schedule-v1"
MATRICES = ("R", "SRam", "SSd", "MIn", "MOut")


@dataclass(frozen=True)
class Problem:
    name: str  # "model on platform"
    ram: tuple[int, ...]  # bytes of each node's output
    cpu: tuple[float, ...]  # runtime of each node, in POET's unit
    compute: tuple[float, ...]  # joules to compute each node
    pagein: tuple[float, ...]  # joules to page it in (storage -> RAM)
    pageout: tuple[float, ...]  # joules to page it out (RAM -> storage)
    edges: tuple[tuple[int, int], ...]  # (u, v), u an input of v, POET's order, duplicates kept
    ram_budget: float
    runtime_budget: float
    paging: bool
    remat: bool
    baseline_peak: float

    @property
    def T(self) -> int:
        return len(self.ram)


@dataclass(frozen=True)
class Schedule:
    R: frozenset  # (t, i): node i is (re)computed in stage t
    SRam: frozenset  # i held in RAM at the start of stage t
    SSd: frozenset  # i held in storage at the start of stage t
    MIn: frozenset  # i paged in during stage t
    MOut: frozenset  # i paged out during stage t


def is_poet(path: str | Path) -> bool:
    """Whether `path` is a JSON document with POET's problem format (else a node-link graph)."""
    try:
        data = read_json(path)
    except RoamError:
        return False
    return isinstance(data, dict) and data.get("format") == PROBLEM_FORMAT


def _field(data: dict, key: str, kind, path: Path, minimum: float | None = 0):
    if key not in data:
        raise RoamError(f"{path}: no '{key}' field")
    value = data[key]
    ok = isinstance(value, kind) and not isinstance(value, bool) if kind is not bool else isinstance(value, bool)
    if ok and kind in ((int, float), int):
        ok = math.isfinite(value) and (minimum is None or value >= minimum)
    if not ok:
        raise RoamError(f"{path}: '{key}' is {json.dumps(value)[:40]}, not "
                        f"{'true or false' if kind is bool else f'a number >= {minimum}'}")
    return value


def read(path: str | Path) -> Problem:
    path = Path(path)
    data = read_json(path)
    if not isinstance(data, dict) or data.get("format") != PROBLEM_FORMAT:
        raise RoamError(f"{path}: not a POET problem (no 'format': '{PROBLEM_FORMAT}')")
    T = _field(data, "T", int, path, minimum=1)
    nodes = data.get("nodes")
    if not isinstance(nodes, list) or len(nodes) != T:
        raise RoamError(f"{path}: 'nodes' is not a list of T = {T} nodes")
    columns: dict[str, list] = {k: [] for k in ("cost_ram", "cost_cpu", "compute_joules", "pagein_joules",
                                                "pageout_joules")}
    for i, node in enumerate(nodes):
        if not isinstance(node, dict) or node.get("index") != i:
            raise RoamError(f"{path}: node {i} is not an object with 'index': {i}")
        for key, column in columns.items():
            column.append(_field(node, key, (int, float), Path(f"{path}: node {i}")))
    if any(r != int(r) for r in columns["cost_ram"]):
        raise RoamError(f"{path}: a node's cost_ram is not a whole number of bytes")
    edges = data.get("edges")
    if not isinstance(edges, list):
        raise RoamError(f"{path}: no 'edges' list")
    for e in edges:
        if (not isinstance(e, list) or len(e) != 2 or not all(isinstance(x, int) and not isinstance(x, bool)
                                                                 for x in e) or not 0 <= e[0] < e[1] < T):
            raise RoamError(f"{path}: edge {str(e)[:40]} is not a pair [u, v] of node indices with u < v < T")
    return Problem(
        name=f"{data.get('model', path.stem)} on {data.get('platform', '?')}",
        ram=tuple(int(r) for r in columns["cost_ram"]), cpu=tuple(columns["cost_cpu"]),
        compute=tuple(columns["compute_joules"]), pagein=tuple(columns["pagein_joules"]),
        pageout=tuple(columns["pageout_joules"]), edges=tuple((u, v) for u, v in edges),
        ram_budget=_field(data, "ram_budget_bytes", (int, float), path),
        runtime_budget=_field(data, "runtime_budget_ms", (int, float), path),
        paging=_field(data, "paging", bool, path), remat=_field(data, "remat", bool, path),
        baseline_peak=_field(data, "baseline_peak_bytes", (int, float), path))


def write(path: str | Path, schedule: Schedule, T: int) -> None:
    doc = {"format": SCHEDULE_FORMAT, "T": T,
           **{m: sorted([t, i] for t, i in getattr(schedule, m)) for m in MATRICES}}
    write_atomic(path, json.dumps(doc) + "\n")
