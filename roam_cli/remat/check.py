"""`roam remat --check`: is a schedule of a node-link graph valid, within its budget, and are its
reported totals true? Written apart from the solver on purpose: it reads both files itself and
imports nothing from roam, so a bug in the solver cannot hide in shared code.

Memory is Moccasin's `util.get_mem_from_schedule`: a read binds to the latest computation of the
value before it; a computation's output counts at its own step and at every step up to the last
read bound to it."""

import json


def _load(path) -> object:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def _graph(path) -> tuple[dict, dict, dict, dict]:
    """(ram, cpu, inputs) by node id, plus the file's ids keyed by their JSON spelling."""
    data = _load(path)
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise ValueError(f"{path}: not a node-link graph")
    ram, cpu, inputs = {}, {}, {}
    for node in data["nodes"]:
        if not isinstance(node, dict):
            raise ValueError(f"{path}: a node is not an object")
        key = node.get("id", node.get("name"))
        size = node.get("cost_ram", node.get("out_cost"))
        time = node.get("cost_cpu", node.get("duration"))
        if not isinstance(key, (int, str)) or not isinstance(size, int) or not isinstance(time, int):
            raise ValueError(f"{path}: node {key!r} lacks an id, cost_ram/out_cost or cost_cpu/duration")
        ram[key], cpu[key], inputs[key] = size, time, set()
    for edge in data.get("links", data.get("edges")) or []:
        source = edge.get("source", edge.get("0")) if isinstance(edge, dict) else None
        target = edge.get("target", edge.get("1")) if isinstance(edge, dict) else None
        if source not in ram or target not in ram:
            raise ValueError(f"{path}: an edge names no node: {str(edge)[:80]}")
        inputs[target].add(source)
    return ram, cpu, inputs


def check(graph_path, schedule_path, budget: int | None = None) -> tuple[str | None, dict]:
    """(the first violation or None, the measured totals). ValueError when a file is unreadable.
    `budget` defaults to the one the schedule records."""
    ram, cpu, inputs = _graph(graph_path)
    doc = _load(schedule_path)
    if not isinstance(doc, dict) or not isinstance(doc.get("schedule"), list):
        raise ValueError(f"{schedule_path}: no 'schedule' list")
    steps = doc["schedule"]
    if budget is None:
        budget = doc.get("budget")
    if not isinstance(budget, int) or isinstance(budget, bool):
        raise ValueError(f"{schedule_path}: no budget recorded: give --budget")
    for j, v in enumerate(steps):
        if not isinstance(v, (int, str)) or isinstance(v, bool) or v not in ram:
            return f"step {j} runs {v!r}, which is no node of the graph", {}
    missing = [v for v in ram if v not in set(steps)]
    if missing:
        return f"node {missing[0]!r} never runs ({len(missing)} node(s) missing)", {}

    latest = {}  # node -> step of its latest computation so far
    ends = []  # per step: the last step its output is read at (its own step when never)
    for j, v in enumerate(steps):
        for u in sorted(inputs[v], key=str):
            if u not in latest:
                return f"step {j} runs {v!r}, which reads {u!r} before any computation of it", {}
            ends[latest[u]] = j
        ends.append(j)
        latest[v] = j
    frees = {}
    for i, end in enumerate(ends):
        frees[end] = frees.get(end, 0) + ram[steps[i]]
    live = peak = 0
    at = 0
    for j, v in enumerate(steps):
        live += ram[v]
        if live > peak:
            peak, at = live, j
        live -= frees.get(j, 0)
    measured = {"peak": peak, "compute": sum(cpu[v] for v in steps), "baseline_compute": sum(cpu.values())}
    if peak > budget:
        return f"peak {peak} at step {at} ({steps[at]!r}) is over the budget {budget}", measured
    for key, value in measured.items():
        if doc.get(key) != value:
            return f"the schedule reports {key} {doc.get(key)!r}, the graph gives {value}", measured
    return None, measured
