"""`roam execute`: run a plan on ONNX Runtime and check it three ways.

1. Order: the annotated model (nodes in plan order) runs one step with
   `execution_order = PRIORITY_BASED`; ORT's profiler records the order its kernels ran in; the
   agreement is the fraction of node pairs that ran in plan order.
2. Numbers: that run's results and the arena replay's (`roam_cli.runtime.replay`) against a plain ORT
   run of the original model: graph outputs and the inputs the step updates in place.
3. ORT's own memory: the bytes ORT's arena allocated ("Total allocated bytes", summed over its
   extensions) running the annotated model with its nodes in the original order and in plan
   order, with its default extension (next power of two) and with kSameAsRequested. Each is
   measured in a fresh process, because the kSameAsRequested arena (CPU) is registered
   process-wide. Both models carry the same annotations: ORT's arena depends on the shape
   information a model carries, so only the order differs between the two.

Random ops without a seed get one, so every run draws the same masks."""

import json
import multiprocessing
import os
import re
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from rich.console import Console
from rich.table import Table

from roam_cli import pair, verify
from roam_cli.core import annotate
from roam_cli.core.errors import RoamError, first_line
from roam_cli.core.fileio import read_arrays
from roam_cli.core.units import format_bytes
from roam_cli.frontend.onnx_import import Imported
from roam_cli.frontend.ort_optimize import SessionOptimizations, planned_optimizations
from roam_cli.frontend.providers import arena_providers, check_device, check_runs, check_started, locate_weights
from roam_cli.frontend.synthetic import synthesize
from roam_cli.runtime.replay import replay, storage_roots

RTOL = 1e-5  # largest |difference| allowed, relative to the largest magnitude in the reference tensor
MIN_AGREEMENT = 0.999
# Random ops and the type of their `seed` attribute.
SEEDED_OPS = {("", "Dropout"): int, ("com.microsoft", "BitmaskDropout"): int, ("com.microsoft", "BiasDropout"): int,
              ("com.microsoft", "BitmaskBiasDropout"): int, ("", "RandomNormal"): float, ("", "RandomUniform"): float,
              ("", "RandomNormalLike"): float, ("", "RandomUniformLike"): float, ("", "Multinomial"): float}
ARENA_NAMES = {"cpu": "Cpu", "cuda": "Cuda"}  # the device arena's name in ORT's BFCArena log lines


def random_op(n: onnx.NodeProto) -> bool:
    return (n.domain if n.domain != "ai.onnx" else "", n.op_type) in SEEDED_OPS


def seed_random_ops(model: onnx.ModelProto, seed: int) -> int:
    """Give each random op without a seed its own, numbered by node name (any node order gets the same)."""
    unseeded = sorted((n for n in model.graph.node
                       if random_op(n) and not any(a.name == "seed" for a in n.attribute)), key=lambda n: n.name)
    for k, n in enumerate(unseeded):
        kind = SEEDED_OPS[(n.domain if n.domain != "ai.onnx" else "", n.op_type)]
        n.attribute.append(helper.make_attribute("seed", kind(seed + k)))
    return len(unseeded)


def initializer_values(model: onnx.ModelProto, folder: Path) -> dict[str, np.ndarray]:
    values = {}
    for t in model.graph.initializer:
        location = next((kv.value for kv in t.external_data if kv.key == "location"), None)
        if t.data_location == onnx.TensorProto.EXTERNAL and not (folder / str(location)).is_file():
            raise RoamError(f"execute runs the model, so it needs the weights, "
                            f"but external data file {location} is absent")
        copy = onnx.TensorProto()
        copy.CopyFrom(t)  # to_array loads external data into the proto it is given
        values[t.name] = numpy_helper.to_array(copy, base_dir=str(folder))
    return values


def in_order(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy of `model` with its nodes in the order of `names`."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    by_name = {n.name: n for n in model.graph.node}
    del copy.graph.node[:]
    copy.graph.node.extend(by_name[name] for name in names)
    return copy


def input_specs(graph) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(name, np.dtype(helper.tensor_dtype_to_np_dtype(graph.values[name].dtype)).str, graph.values[name].shape)
            for name in graph.inputs]


def make_feeds(specs: list, inputs_path: Path | None, seed: int) -> tuple[dict[str, np.ndarray], int]:
    """(feeds, how many were synthesised): the arrays in `inputs_path`, synthetic ones for the rest."""
    given: dict[str, np.ndarray] = {}
    if inputs_path is not None:
        given = read_arrays(inputs_path, "--inputs")
        expected = {name: (np.dtype(dtype), tuple(shape)) for name, dtype, shape in specs}
        for name, array in given.items():
            if name not in expected:
                raise RoamError(f"--inputs: {name!r} is not an input of the model")
            if (array.dtype, array.shape) != expected[name]:
                dtype, shape = expected[name]
                raise RoamError(f"--inputs: {name!r} is {array.dtype}{list(array.shape)}, "
                                f"the model takes {dtype}{list(shape)}")
    missing = [(name, np.dtype(dtype), shape) for name, dtype, shape in specs if name not in given]
    feeds = given | synthesize(missing, seed)
    return {name: feeds[name] for name, _, _ in specs}, len(missing)


def session(model_bytes: bytes, device: str, ordered: SessionOptimizations | None, profile_prefix: str | None = None,
            same_as_requested: bool = False, config: dict[str, str] | None = None) -> ort.InferenceSession:
    """A session for one step. `ordered`: nodes in file order (PRIORITY_BASED) with the graph
    optimisations `planned_optimizations` gives the annotated model; None: ORT's defaults.
    `config`: session config entries (locate_weights')."""
    options = ort.SessionOptions()
    options.log_severity_level = 4  # a failing node's error comes back as the exception roam says, not on stderr too
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    if ordered:
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
        options.graph_optimization_level = ordered.level
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    providers = arena_providers(device, options, same_as_requested)
    try:
        s = ort.InferenceSession(model_bytes, options, providers=providers,
                                 disabled_optimizers=ordered.disabled_optimizers if ordered else None)
    except Exception as e:
        raise RoamError(f"ONNX Runtime cannot load the model: {first_line(e)}") from None
    check_started(s, device)
    return s


def on_device(feeds: dict[str, np.ndarray], device: str) -> dict[str, ort.OrtValue]:
    return {name: ort.OrtValue.ortvalue_from_numpy(array.copy(), device, 0) for name, array in feeds.items()}


def run_step(s: ort.InferenceSession, inputs: dict[str, ort.OrtValue], device: str) -> tuple[dict, dict]:
    """(outputs, inputs after the step): in-place ops write into the bound input buffers."""
    binding = s.io_binding()
    for i in s.get_inputs():
        binding.bind_ortvalue_input(i.name, inputs[i.name])
    names = [o.name for o in s.get_outputs()]
    for name in names:
        binding.bind_output(name, device)
    try:
        s.run_with_iobinding(binding)
    except Exception as e:
        raise RoamError(f"ONNX Runtime could not run the model: {first_line(e)}") from None
    return dict(zip(names, binding.copy_outputs_to_cpu())), {name: owned(v.numpy()) for name, v in inputs.items()}


def owned(array: np.ndarray) -> np.ndarray:
    """OrtValue.numpy() on CPU is a view that dies with the OrtValue: keep a copy of such."""
    return array if array.flags.owndata else array.copy()


def executed_order(profile: Path) -> list[str]:
    """Node names in the order ORT ran their kernels (profiler events 'Node', '<name>_kernel_time')."""
    kernels = [e for e in json.loads(profile.read_text())
               if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")]
    kernels.sort(key=lambda e: e["ts"])  # stable: equal start times keep the profiler's order
    return [e["name"][: -len("_kernel_time")] for e in kernels]


def kernel_spans(profile: Path, start_ns: int) -> list[tuple[int, int, str]]:
    """(start, end, node) of each kernel ORT ran, in ns on the clock of `start_ns`
    (InferenceSession.get_profiling_start_time_ns), sorted by start."""
    kernels = [e for e in json.loads(profile.read_text())
               if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")]
    return sorted((start_ns + e["ts"] * 1000, start_ns + (e["ts"] + e["dur"]) * 1000, e["name"][: -len("_kernel_time")])
                  for e in kernels)


def order_agreement(plan_order: list[str], executed: list[str]) -> dict:
    """Fraction of pairs of plan nodes that ran in plan order. Nodes ORT removed (folded,
    eliminated) or created (fusions, copies) are counted apart and left out of the pairs."""
    pos = {name: i for i, name in enumerate(plan_order)}
    ran = list(dict.fromkeys(executed))
    seq = [pos[name] for name in ran if name in pos]
    tree = [0] * (len(plan_order) + 1)  # Fenwick tree over plan positions already seen
    inversions, first = 0, None
    for k, p in enumerate(seq):
        i, seen_before = p + 1, 0
        while i > 0:
            seen_before += tree[i]
            i -= i & -i
        later = k - seen_before  # nodes already run that come after p in the plan
        if later and first is None:
            first = [plan_order[max(seq[:k])], plan_order[p]]
        inversions += later
        i = p + 1
        while i < len(tree):
            tree[i] += 1
            i += i & -i
    pairs = len(seq) * (len(seq) - 1) // 2
    return {"agreement": 1 - inversions / pairs if pairs else 1.0, "pairs": pairs, "inversions": inversions,
            "plan_nodes": len(plan_order), "ran": len(seq), "not_run": len(plan_order) - len(seq),
            "added_by_ort": len(ran) - len(seq), "first_out_of_order": first}


def difference(ref: np.ndarray, got: np.ndarray) -> tuple[float, float, bool]:
    """(max |got - ref|, that relative to max |ref|, bitwise equal); inf where not comparable."""
    if ref.shape != got.shape or ref.dtype != got.dtype:
        return float("inf"), float("inf"), False
    if ref.tobytes() == got.tobytes():
        return 0.0, 0.0, True
    a, b = ref.astype(np.float64), got.astype(np.float64)
    with np.errstate(invalid="ignore"):
        diff = np.where((a == b) | (np.isnan(a) & np.isnan(b)), 0.0, np.abs(a - b))
    max_abs = float(np.nan_to_num(diff, nan=np.inf).max())
    finite = np.abs(a[np.isfinite(a)])
    scale = float(finite.max()) if finite.size else 0.0
    return max_abs, (max_abs / scale if scale else float("inf")), False


def compare(reference: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> dict:
    rows = []
    for name, ref in reference.items():
        max_abs, max_rel, bitwise = difference(ref, got[name])
        rows.append({"name": name, "max_abs": max_abs, "max_rel": max_rel, "bitwise": bitwise})
    worst = max(rows, key=lambda r: r["max_rel"], default=None)

    def finite(x):
        return x if np.isfinite(x) else None  # JSON has no infinity: null = not comparable

    return {"tensors": len(rows), "bitwise_equal": sum(r["bitwise"] for r in rows),
            "max_abs": finite(max((r["max_abs"] for r in rows), default=0.0)),
            "max_rel": finite(worst["max_rel"]) if worst else 0.0, "worst": worst["name"] if worst else None,
            "passed": all(r["max_rel"] <= RTOL for r in rows),
            "not_bitwise": [{"name": r["name"], "max_abs": finite(r["max_abs"]), "max_rel": finite(r["max_rel"])}
                            for r in rows if not r["bitwise"]]}


def extended_bytes(log: str, arena: str) -> int | None:
    """Bytes the named BFC arenas grew by, from ORT's INFO log; None when ORT logged no arena."""
    if "BFCArena" not in log:
        return None
    total, current = 0, None
    for line in log.splitlines():
        m = re.search(r"Extending BFCArena for (\w+)", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"Extended allocation by (\d+) bytes", line)
        if m and current == arena:
            total += int(m.group(1))
    return total


def ort_arena_bytes(model_bytes: bytes, specs: list, inputs_path: Path | None, seed: int, device: str,
                    ordered: SessionOptimizations, config: dict[str, str]) -> dict:
    """In a fresh process: ORT's arena bytes for session start plus one step, per extension
    strategy. ORT logs arena growth at INFO on stderr: stderr goes to a file and is parsed.
    The step's input buffers are made before counting starts: the caller owns them."""
    log = tempfile.TemporaryFile()
    os.dup2(log.fileno(), 2)
    ort.set_default_logger_severity(1)
    inputs = on_device(make_feeds(specs, inputs_path, seed)[0], device)
    figures = {}
    for strategy in ("next_power_of_two", "same_as_requested"):
        same = strategy == "same_as_requested"
        begin = os.lseek(2, 0, os.SEEK_CUR)
        s = session(model_bytes, device, ordered, same_as_requested=same, config=config)
        run_step(s, inputs, device)
        del s
        end = os.lseek(2, 0, os.SEEK_CUR)
        log.seek(begin)
        figures[strategy] = extended_bytes(log.read(end - begin).decode(errors="replace"), ARENA_NAMES[device])
    return figures


def measure_in_child(*args) -> dict:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(ort_arena_bytes, *args).result()


def execute_plan(model_path: Path, plan: dict, device: str, inputs_path: Path | None = None, seed: int = 0,
                 progress=None) -> dict:
    """Everything `roam execute` reports, as plain values; `failures` lists the checks that failed.
    `model_path` is either member of the plan's pair."""
    check_device(device)
    (progress or (lambda message: None))("importing the model")
    with pair.planned_graph(model_path, plan) as imported:
        if pair.member(plan, imported.sha256) is None:
            raise RoamError(f"{model_path}: {pair.refusal(plan, imported.sha256)}")
        verify.require(imported.graph, imported.sha256, plan)
        return execute_graph(imported, model_path, plan, device, inputs_path, seed, progress)


def execute_graph(imported: Imported, model_path: Path, plan: dict, device: str, inputs_path: Path | None, seed: int,
                  progress) -> dict:
    """execute_plan() on the plan's graph, read from `model_path`."""
    say = progress or (lambda message: None)
    seconds: dict[str, float] = {}
    check_runs(imported.model, str(model_path), device, planned=True)
    graph = imported.graph
    storage_roots(graph, plan)  # a plan the replay cannot follow safely stops here
    notes = []
    seeded = seed_random_ops(imported.model, seed)
    if seeded:
        notes.append(f"{seeded} random ops had no seed and got one (from --seed {seed}): "
                     "every run draws the same masks")
    folder = imported.path.resolve().parent  # for ORT's graph of a source model, a temporary folder
    initializers = initializer_values(imported.model, folder)
    annotated = annotate.annotate(imported.model, graph, plan, imported.path, imported.path)
    ordered = planned_optimizations(annotated)
    config = locate_weights(imported.model, folder)
    locate_weights(annotated, folder)
    original_bytes, annotated_bytes = imported.model.SerializeToString(), annotated.SerializeToString()
    annotated_in_original_order = in_order(annotated, [n.name for n in graph.nodes]).SerializeToString()
    specs = input_specs(graph)
    feeds, synthesised = make_feeds(specs, inputs_path, seed)
    if synthesised:
        notes.append(f"{synthesised} of {len(specs)} inputs are synthetic (seed {seed}): random floats, zero integers, masks of ones")

    t = time.perf_counter()
    say("plain run of the original model")
    outputs, after = run_step(session(original_bytes, device, None, config=config), on_device(feeds, device), device)
    updated = [name for name in after if not np.array_equal(after[name], feeds[name])]
    reference = outputs | {name: after[name] for name in updated}
    del outputs, after
    seconds["plain_run"] = time.perf_counter() - t

    t = time.perf_counter()
    say("annotated model in plan order, profiled")
    with tempfile.TemporaryDirectory() as tmp:
        s = session(annotated_bytes, device, ordered, profile_prefix=os.path.join(tmp, "ort"), config=config)
        outputs, after = run_step(s, on_device(feeds, device), device)
        order = order_agreement(plan["order"], executed_order(Path(s.end_profiling())))
        del s
    annotated_run = compare(reference, outputs | after)
    del outputs, after
    seconds["annotated_run"] = time.perf_counter() - t

    say(f"replaying {len(plan['order'])} nodes in the plan's arena")
    replayed = replay(annotated, graph, plan, feeds | initializers, device, list(reference))
    replay_result = compare(reference, replayed.values) | {"nodes": replayed.nodes, "sessions": replayed.sessions}
    seconds["replay"] = replayed.seconds
    del replayed

    t = time.perf_counter()
    arena = {}
    for key, model_bytes in (("original_order", annotated_in_original_order), ("plan_order", annotated_bytes)):
        say(f"measuring ORT's arena ({key.replace('_', ' ')})")
        arena[key] = measure_in_child(model_bytes, specs, inputs_path, seed, device, ordered, config)
    seconds["ort_arena"] = time.perf_counter() - t

    failures = []
    if order["agreement"] < MIN_AGREEMENT:
        failures.append(f"ONNX Runtime ran {1 - order['agreement']:.3%} of node pairs out of plan order "
                        f"(first: {order['first_out_of_order'][1]!r} after {order['first_out_of_order'][0]!r})")
    for what, result in (("the annotated model", annotated_run), ("the arena replay", replay_result)):
        if not result["passed"]:
            rel = "not comparable" if result["max_rel"] is None else f"{result['max_rel']:.3g} relative"
            failures.append(f"{what} differs from the plain run: {result['worst']!r} ({rel}; tolerance {RTOL:g})")
    return {
        "model": str(model_path), "provider": device, "seed": seed,
        "plan": {"order_strategy": plan["stats"]["order"]["strategy"],
                 "layout_strategy": plan["stats"]["layout"]["strategy"],
                 "arena_bytes": plan["arena_bytes"], "peak_live_bytes": plan["peak_live_bytes"],
                 "persistent_bytes": plan["persistent_bytes"]}
                | ({"tiers": {key: plan["tiers"][key] for key in ("slow", "arena_bytes", "peak_live_bytes")}}
                   if "tiers" in plan else {}),
        "order": order,
        "compared": {"graph_outputs": len(graph.outputs), "inputs_updated_in_place": len(updated)},
        "annotated_run": annotated_run,
        "replay": replay_result,
        "ort_arena_bytes": arena,
        "tolerance": {"relative": RTOL, "order_agreement": MIN_AGREEMENT},
        "notes": notes,
        "seconds": seconds,
        "failures": failures,
    }


def render(r: dict, console: Console) -> None:
    def numbers(c: dict) -> str:
        rel = "not comparable" if c["max_rel"] is None else f"max relative difference {c['max_rel']:.2g}"
        return f"{c['bitwise_equal']} of {c['tensors']} tensors bitwise equal, {rel}"

    o = r["order"]
    head = Table(title=f"roam execute {r['model']} ({r['provider']})", show_header=False, title_justify="left")
    head.add_column(style="bold")
    head.add_column()
    head.add_row("order agreement", f"{o['agreement']:.4%} of {o['pairs']:,} node pairs in plan order "
                 f"({o['ran']} plan nodes ran, {o['not_run']} folded away by ORT, {o['added_by_ort']} added by ORT)")
    head.add_row("compared", f"{r['compared']['graph_outputs']} graph outputs and "
                 f"{r['compared']['inputs_updated_in_place']} inputs updated in place")
    head.add_row("annotated run vs plain", numbers(r["annotated_run"]))
    rp = r["replay"]
    head.add_row("arena replay vs plain", f"{numbers(rp)} ({rp['sessions']} single-node sessions for "
                 f"{rp['nodes']} nodes, {r['seconds']['replay']:.1f} s)")
    console.print(head)

    memory = Table(title="arena bytes", title_justify="left")
    for col in ("", "next power of two (ORT default)", "same as requested"):
        memory.add_column(col, justify="right" if col else "left")

    def cell(n):
        return "not logged" if n is None else format_bytes(n)

    for key, label in (("original_order", "ORT, original order"),
                       ("plan_order", f"ORT, plan order ({r['plan']['order_strategy']})")):
        memory.add_row(label, cell(r["ort_arena_bytes"][key]["next_power_of_two"]),
                       cell(r["ort_arena_bytes"][key]["same_as_requested"]))
    memory.add_row("roam plan: arena (peak live)",
                   f"{format_bytes(r['plan']['arena_bytes'])} ({format_bytes(r['plan']['peak_live_bytes'])})", "")
    if "tiers" in r["plan"]:  # the replay's second arena
        t = r["plan"]["tiers"]
        memory.add_row(f"roam plan: {t['slow']} arena (peak live)",
                       f"{format_bytes(t['arena_bytes'])} ({format_bytes(t['peak_live_bytes'])})", "")
    console.print(memory)
    for note in r["notes"]:
        console.print(f"[dim]note: {note}[/dim]")
    if not r["failures"]:
        console.print("[bold green]OK[/bold green]: ONNX Runtime follows the plan's order and the arena replay "
                      "reproduces the plain run")
