"""`roam remat` against Moccasin on Moccasin's own graphs: schedules, compute overhead and seconds.

roam and Moccasin (Bartan et al., ICML 2023, OR-Tools CP-SAT) side by side on every
public graph of Moccasin's repository (`data/`: Checkmate's training and inference graphs, the
random layered graphs), at budgets of 0.8 and 0.9 x the peak of the graph's given order.

    python -m benchmarks run recompute/remat_peers                # 30 s per solver per instance: about 20 min
    python -m benchmarks run recompute/remat_peers --time-limit 60 --only random_layered_n100,VGG16
    python -m benchmarks run recompute/remat_peers --moccasin SRC --venv DIR

Moccasin is run from its public source, never part of roam: SRC is a checkout or bare git
directory of github.com/haoming-codes/moccasin (default benchmarks/.cache/moccasin:
`git clone https://github.com/haoming-codes/moccasin benchmarks/.cache/moccasin`). Its files are
exported into this run's temp folder, where two things change: the CP-SAT worker count (16,
hard-coded) becomes --workers, and `rockmate.def_op`, which cp.py imports for a converter the
benchmark does not use, is a stand-in module. It runs in its own venv (DIR, default
benchmarks/.cache/moccasin-venv) with `pip install 'ortools==9.11.*' networkx numpy`: its cp.py
fails on OR-Tools 9.15's AddCumulative. The driver calls `cp.remat` with the arguments of
Moccasin's main.py (C = 2 computations per node, stages, reservoir option 2, phase 1), the time
limit split between its two CP-SAT phases (each gets half).

roam runs as the command (`roam remat GRAPH --budget-fraction F --time-limit T`). Both
schedules are validated by `roam remat --check` (which shares no code with roam's solver), with
the peak and compute Moccasin reports for its own schedule (its `get_mem_from_schedule`). Times
are each solver's own, from reading the graph to the schedule (Moccasin's include building its
CP model), without the interpreter's start and imports; the JSON has the processes' wall times
too. An instance whose budget is below the largest single step (a node's output and
inputs together) has no schedule at all: roam says so and Moccasin is not run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness

TAKES = "about 20 min (36 instances, 30 s per solver); needs Moccasin's source and a venv with OR-Tools 9.11"
ROOT = harness.ROOT
VENV_HOW = ("python3 -m venv benchmarks/.cache/moccasin-venv && "
            "benchmarks/.cache/moccasin-venv/bin/pip install 'ortools==9.11.*' networkx numpy, or --venv DIR")

ROCKMATE_STANDIN = "RunOp = DelOp = OpSchedule = None  # cp.py imports them for schedule_to() only\n"

DRIVER = r'''
import json, math, sys, time
import networkx as nx
sys.path.insert(0, sys.argv[1])
from moccasin.cp import remat
from moccasin.util import get_mem_from_schedule
graph_path, fraction, seconds, log_dir = sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
start = time.perf_counter()
data = json.load(open(graph_path))
G = nx.DiGraph()
for node in data["nodes"]:
    G.add_node(node.get("id", node.get("name")), cost_ram=node.get("cost_ram", node.get("out_cost")),
               cost_cpu=node.get("cost_cpu", node.get("duration")))
for e in data.get("links", data.get("edges")):
    G.add_edge(e.get("source", e.get("0")), e.get("target", e.get("1")))
G.graph["name"] = data["graph"].get("name", "graph")
order = data["graph"].get("order")
order = (json.loads(order) if isinstance(order, str) else order) if order else list(nx.topological_sort(G))
topo_mem, _ = get_mem_from_schedule(G, order)
B = math.ceil(topo_mem * fraction)
result = remat(G=G, B=B, C=2, timeout=seconds / 2, discretized=True, reservoir=True, use_end_global=False,
               use_stage=True, topo_order=order, phase1=True, use_interval_length_domain=True, use_gcd=True,
               reservoir_option=2, log_dir=log_dir)
print("RESULT " + json.dumps({"budget": B, "status": result.get("status"), "schedule": result.get("schedule"),
                              "peak": result.get("mem_schedule"), "compute": result.get("cpu_schedule"),
                              "seconds": time.perf_counter() - start}))
'''


def build_moccasin(source: Path, workers: int, into: Path) -> Path:
    """Moccasin's files at HEAD in `into`, worker count patched; returns the folder to import from."""
    if (source / "HEAD").exists() and not (source / ".git").exists():  # a bare git directory
        archive = subprocess.run(["git", "--git-dir", str(source), "archive", "HEAD"], check=True,
                                 capture_output=True).stdout
        into.mkdir(parents=True)
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    else:
        subprocess.run(["cp", "-r", f"{source}/.", str(into)], check=True)
    cp = into / "src" / "moccasin" / "cp.py"
    text = cp.read_text()
    assert "num_search_workers = 16" in text, "Moccasin's cp.py changed: the worker count is not where it was"
    cp.write_text(text.replace("num_search_workers = 16", f"num_search_workers = {workers}"))
    (into / "src" / "rockmate").mkdir()
    (into / "src" / "rockmate" / "__init__.py").write_text("")
    (into / "src" / "rockmate" / "def_op.py").write_text(ROCKMATE_STANDIN)
    (into / "driver.py").write_text(DRIVER)
    return into / "src"


def check(graph: Path, schedule: Path) -> str:
    """'valid', or the checker's one line."""
    run = subprocess.run([sys.executable, "-m", "roam_cli", "-q", "remat", "--check", str(graph), str(schedule)],
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return "valid" if run.returncode == 0 else (run.stderr.strip().splitlines() or ["?"])[-1]


def run_roam(graph: Path, fraction: float, seconds: float, tmp: Path) -> dict:
    out = tmp / "roam.json"
    out.unlink(missing_ok=True)
    t = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "roam_cli", "remat", str(graph), "--budget-fraction", str(fraction),
                          "-o", str(out), "--time-limit", str(seconds), "--json"],
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - t
    if run.returncode != 0:
        return {"status": "infeasible" if "no schedule fits" in run.stderr else "none", "seconds": wall,
                "message": run.stderr.strip()}
    doc = json.loads(out.read_text())
    return {"status": doc["status"], "seconds": doc["seconds"], "wall_seconds": wall, "budget": doc["budget"], "peak": doc["peak"],
            "compute": doc["compute"], "baseline_compute": doc["baseline_compute"],
            "overhead_percent": doc["overhead_percent"], "recomputations": doc["recomputations"],
            "check": check(graph, out)}


def run_moccasin(python: Path, src: Path, graph: Path, fraction: float, seconds: float, tmp: Path,
                 baseline: int, n: int) -> dict:
    t = time.perf_counter()
    try:
        run = subprocess.run([str(python), str(src.parent / "driver.py"), str(src), str(graph), str(fraction),
                              str(seconds), str(tmp / "moccasin-log")],
                             capture_output=True, text=True, timeout=2 * seconds + 120, cwd=tmp)  # its log files
    except subprocess.TimeoutExpired:
        return {"status": "killed", "seconds": time.perf_counter() - t}
    wall = time.perf_counter() - t
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        return {"status": "error", "seconds": wall, "message": (run.stderr.strip().splitlines() or ["?"])[-1]}
    got = json.loads(lines[-1][len("RESULT "):])
    out = {"status": got["status"].lower(), "seconds": got["seconds"], "wall_seconds": wall, "budget": got["budget"]}
    if got["schedule"] is None:
        return out
    doc = {"schedule": got["schedule"], "budget": got["budget"], "peak": got["peak"], "compute": got["compute"],
           "baseline_compute": baseline}
    (tmp / "moccasin.json").write_text(json.dumps(doc))
    out.update(peak=got["peak"], compute=got["compute"], overhead_percent=100.0 * (got["compute"] - baseline) / baseline,
               recomputations=len(got["schedule"]) - n, check=check(graph, tmp / "moccasin.json"))
    return out


def cell(r: dict) -> list[str]:
    """status, overhead %, seconds."""
    if "compute" not in r:
        return [r["status"], "", f"{r['seconds']:.1f}"]
    return [f"{r['status']}{'' if r.get('check') == 'valid' else ' INVALID'}", f"{r['overhead_percent']:.3f}",
            f"{r['seconds']:.1f}"]


def peak_share(r: dict) -> str:
    return f"{r['peak'] / r['budget']:.3f}" if "peak" in r else ""


def table(results: dict) -> str:
    """The instances that may have a schedule; those that cannot (budget below the largest single
    step, Moccasin not run) named below."""
    body, none = [], []
    for row in results["rows"]:
        r, m = row["roam"], row["moccasin"]
        if r["status"] == "infeasible" and m["status"] == "not run":
            none.append(f"{row['graph']} at {row['fraction']}")
            continue
        body.append([row["graph"], row["n"], row["fraction"], *cell(r), peak_share(r), *cell(m), peak_share(m)])
    text = harness.markdown_table(["graph", "n", "budget", "roam", "overhead %", "s", "peak/budget", "Moccasin",
                                   "overhead %", "s", "peak/budget"], body, "lrrlrrrlrrr")
    text += (f"\nTime limit {results['time_limit']:g} s per solver per instance; Moccasin with {results['workers']} "
             "CP-SAT workers. Overhead: total compute above running every node once (%); peak as a fraction of the "
             "budget; every schedule checked by `roam remat --check`.\n")
    if none:
        text += (f"\nNo schedule exists on {len(none)} instances (the budget is below the largest single step; "
                 f"roam exits 1 at once, Moccasin is not run): {', '.join(none)}.\n")
    return text


def main(argv: list[str]) -> dict:
    ap = harness.options(__name__, __doc__)
    ap.add_argument("--moccasin", type=Path, default=harness.CACHE / "moccasin",
                    help="Moccasin's checkout or bare git directory (default %(default)s)")
    ap.add_argument("--venv", type=Path, default=harness.CACHE / "moccasin-venv",
                    help="a venv with OR-Tools 9.11, networkx, numpy (default %(default)s)")
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--fractions", default="0.9,0.8")
    ap.add_argument("--only", default="", help="comma-separated prefixes of graph file names")
    args = ap.parse_args(argv)
    harness.needs(args.moccasin, "git clone https://github.com/haoming-codes/moccasin benchmarks/.cache/moccasin, "
                                 "or --moccasin DIR")
    harness.needs(args.venv / "bin" / "python", VENV_HOW)
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        src = build_moccasin(args.moccasin, args.workers, tmp / "moccasin")
        graphs = sorted((tmp / "moccasin" / "data").glob("*.json"), key=lambda p: (p.stat().st_size, p.name))
        if args.only:
            graphs = [g for g in graphs if any(g.name.startswith(p) for p in args.only.split(","))]
        for graph in graphs:
            data = json.loads(graph.read_text())
            n = len(data["nodes"])
            baseline = sum(node.get("cost_cpu", node.get("duration")) for node in data["nodes"])
            for fraction in (float(f) for f in args.fractions.split(",")):
                r = run_roam(graph, fraction, args.time_limit, tmp)
                if r["status"] == "infeasible":
                    m = {"status": "not run", "seconds": 0.0}
                else:
                    m = run_moccasin(args.venv / "bin" / "python", src, graph, fraction, args.time_limit, tmp, baseline, n)
                rows.append({"graph": graph.stem.replace("_nx", ""), "n": n, "fraction": fraction, "roam": r, "moccasin": m})
                print(f"{rows[-1]['graph']} at {fraction}: roam {r['status']}, Moccasin {m['status']}",
                      file=sys.stderr, flush=True)
    return {"time_limit": args.time_limit, "workers": args.workers, "rows": rows}
