"""`roam remat` against POET's own MILP on POET's problems: schedules, energy and seconds.

POET (Patil et al., ICML 2022) solves with PuLP and CBC. Its linear, VGG-16 (CIFAR), ResNet-18
(CIFAR) and transformer models on two of its platforms (a72: Raspberry Pi 4, m0: Arduino MKR1000),
at RAM budgets of 0.9, 0.7 and 0.5 of the graph's own peak, runtime budget 1.2 x the graph's total,
each solver given the same time limit.

    python -m benchmarks run tiers/poet_peers                     # 60 s per solver per problem: about 40 min
    python -m benchmarks run tiers/poet_peers --time-limit 120 --only linear,transformer
    python -m benchmarks run tiers/poet_peers --roam-only         # POET's side from the cache
    python -m benchmarks run tiers/poet_peers --poet-src DIR --samples DIR --problems DIR

POET runs from its public source, never part of roam: DIR is a checkout of
github.com/ShishirPatil/poet at commit POET_COMMIT or a git directory holding that commit
(default: cloned into --cache, benchmarks/.cache/poet). It runs in its own venv (--venv, made on
first use from --python, a 3.11, with the packages of its time: numpy 1.24, pandas 1.5, PuLP 2.7
with CBC 2.10.3, matplotlib 3.6) through tiers/poet_driver.py (run by path in that venv), which
exports POET's graphs and runs its POETSolver (pulp-cbc) on a problem file. The problem files
follow POET's samples (sample_models/poet/README.md: format poet-problem-v1; their `notes`
copied from a sample), which --samples names (default sample_models/poet): before anything else
the exporter must rebuild both samples byte for byte. A model's problems are exported once and kept in --problems: POET orders a branchy
model's nodes by random uuids, so a schedule belongs to its file, and a rerun reuses the files.

CBC overruns its time limit on the larger graphs; POET's process is killed at KILL_FACTOR x the
limit and recorded as "none" (no schedule). POET's runs are cached by problem digest and time
limit (--cache), so a rerun of roam's side costs only roam's. Both schedules are judged by
`python -m roam_cli.remat.poet_check` (shares no code with roam's solver): validity, peak RAM,
runtime and energy under POET's accounting, not the solvers' own claims. Seconds are each
process's wall time (POET's: the driver, including building its MILP in PuLP; CBC's own time is
in the results)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import harness

TAKES = "about 40 min (24 problems, 60 s per solver; POET's runs cached); needs POET's source, a Python 3.11 and its samples"
ROOT = harness.ROOT
DRIVER = Path(__file__).resolve().parent / "poet_driver.py"  # runs in POET's venv, by path
POET_URL = "https://github.com/ShishirPatil/poet"
POET_COMMIT = "6e630986dd1af0cb6d08971f16d89a8c51d25ae6"
POET_PACKAGES = ["numpy==1.24.*", "pandas==1.5.*", "pulp==2.7.*", "matplotlib==3.6.*", "loguru", "graphviz", "toposort"]
MODELS = ("linear", "vgg16_cifar", "resnet18_cifar", "transformer")
PLATFORMS = ("a72", "m0")
FRACTIONS = (0.9, 0.7, 0.5)
RUNTIME_FACTOR = 1.2
KILL_FACTOR = 2.5
BASELINE_DEFINITION = ("each node computed once in index order (R = identity), each value kept in RAM from its stage "
                       "to its last consumer, no paging; its peak under the accounting below")
SAMPLE_PROBLEMS = {"linear_a72nocache": ("linear", "a72nocache", 0.6), "vgg16_cifar_a72": ("vgg16_cifar", "a72", 0.8)}


def poet_source(given: Path | None, cache: Path) -> Path:
    """A folder holding POET's files at POET_COMMIT."""
    if given is not None and (given / "poet").is_dir():
        return given
    into = cache / f"poet-src-{POET_COMMIT[:12]}"
    if (into / "poet").is_dir():
        return into
    if given is None:
        given = cache / "poet.git"
        if not given.exists():
            subprocess.run(["git", "clone", "--bare", POET_URL, str(given)], check=True)
    archive = subprocess.run(["git", "--git-dir", str(given), "archive", POET_COMMIT], check=True,
                             capture_output=True).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def poet_python(venv: Path, base: str) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *POET_PACKAGES], check=True)
    return python


def driver(python: Path, src: Path, *args: str) -> dict:
    out = Path(args[-1])
    subprocess.run([str(python), str(DRIVER), str(src), *args], check=True)
    return json.loads(out.read_text())


def baseline_peak(graph: dict) -> float:
    """The peak of R = identity with each value held from its stage to its last consumer's, under
    POET's RAM recurrence: at stage t the held values plus node t, then the inputs of t that are
    not held into stage t+1 freed (one free per listed edge; frees at the last step never apply)."""
    T, ram = graph["T"], [n["cost_ram"] for n in graph["nodes"]]
    last = {}
    for u, v in graph["edges"]:
        last[u] = max(last.get(u, u), v)
    held = lambda t: [i for i in range(t) if last.get(i, i) >= t]  # noqa: E731
    peak = 0
    for t in range(T):
        u = sum(ram[i] for i in held(t)) + ram[t]
        peak = max(peak, u)
        if t + 1 < T:
            keep = set(held(t + 1))
            u -= sum(ram[i] for i, v in graph["edges"] if v == t and i not in keep)
            peak = max(peak, u)
    return float(peak)


def problem(graph: dict, fraction: float, notes: str) -> dict:
    """The problem file, fields in the samples' order."""
    peak = baseline_peak(graph)
    head = {"format": "poet-problem-v1", "source": "poet", "poet_repo": "github.com/ShishirPatil/poet",
            "poet_commit": POET_COMMIT}
    return head | graph | {"paging": True, "remat": True, "ram_budget_bytes": int(fraction * peak),
                           "runtime_budget_factor": RUNTIME_FACTOR,
                           "runtime_budget_ms": RUNTIME_FACTOR * graph["total_runtime_ms"], "notes": notes,
                           "ram_budget_fraction": fraction, "baseline_peak_bytes": peak,
                           "baseline_definition": BASELINE_DEFINITION}


def dump(doc: dict) -> str:
    return json.dumps(doc, indent=1)


def check_samples(python: Path, src: Path, samples: Path, tmp: Path) -> str:
    """The samples' `notes`, once the exporter has rebuilt each sample byte for byte."""
    notes = json.loads((samples / "linear_a72nocache.problem.json").read_text())["notes"]
    for name, (model, plat, fraction) in SAMPLE_PROBLEMS.items():
        built = dump(problem(driver(python, src, "graph", model, plat, str(tmp / "graph.json")), fraction, notes))
        if built != (samples / f"{name}.problem.json").read_text():
            sys.exit(f"the exporter does not rebuild {samples / name}.problem.json: POET's source or this script changed")
    return notes


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def judge(problem_path: Path, schedule: Path) -> dict:
    run = subprocess.run([sys.executable, "-m", "roam_cli.remat.poet_check", str(problem_path), str(schedule)],
                         capture_output=True, text=True, cwd=ROOT)
    try:
        return json.loads(run.stdout)
    except json.JSONDecodeError:
        return {"valid": False, "violations": [(run.stderr.strip().splitlines() or ["checker failed"])[-1]]}


def poet_record(path: Path, seconds: float, runs: Path) -> Path:
    """Where POET's run of this problem (by content) under this time limit is kept."""
    return runs / f"{path.name.removesuffix('.problem.json')}.{digest(path)}.{seconds:g}s.poet.json"


def run_poet(python: Path, src: Path, path: Path, seconds: float, runs: Path) -> dict:
    """POET's MILP on one problem, from the cache when this problem and limit were run before."""
    cached = poet_record(path, seconds, runs)
    if cached.exists():
        return json.loads(cached.read_text())
    out = runs / "poet-driver-out.json"
    out.unlink(missing_ok=True)
    t = time.perf_counter()
    proc = subprocess.Popen([str(python), str(DRIVER), str(src), "solve", str(path), str(seconds), str(out)],
                            start_new_session=True)  # CBC is its child: killed with its process group
    try:
        proc.wait(timeout=KILL_FACTOR * seconds)
        got = json.loads(out.read_text()) if proc.returncode == 0 else {"status": "error", "returncode": proc.returncode}
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        got = {"status": "none", "killed_after_seconds": KILL_FACTOR * seconds}
    got["seconds"] = time.perf_counter() - t
    if "schedule" in got:
        schedule = cached.with_suffix(".schedule.json")
        schedule.write_text(json.dumps(got.pop("schedule")) + "\n")
        got["schedule_file"] = schedule.name
    cached.write_text(json.dumps(got, indent=1) + "\n")
    return got


def run_roam(path: Path, seconds: float, runs: Path) -> dict:
    """`roam remat` as its own command; its --json summary (status, its own energy and seconds) kept."""
    schedule = runs / f"{path.name.removesuffix('.problem.json')}.roam.schedule.json"
    schedule.unlink(missing_ok=True)
    t = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "roam_cli", "remat", str(path), "-o", str(schedule),
                          "--time-limit", f"{seconds:g}", "--json"], capture_output=True, text=True, cwd=ROOT)
    got = {"seconds": time.perf_counter() - t, "returncode": run.returncode}
    if run.returncode == 0 and schedule.exists():
        got["summary"] = json.loads(run.stdout.strip().splitlines()[-1])
        got["status"] = got["summary"]["status"]
        got["schedule_file"] = schedule.name
    else:
        got["message"] = (run.stderr.strip().splitlines() or [""])[-1]
        # exit 1 is "infeasible: <proof>" or "no schedule found: <what ran>" (issue 41)
        got["status"] = ("infeasible" if got["message"].startswith("roam: infeasible") else "none") \
            if run.returncode == 1 else "error"
    return got


def energy(side: dict) -> float | None:
    check = side.get("check")
    return check["energy_joules"] if check and check.get("valid") else None


def shortfalls(row: dict, seconds: float) -> list[str]:
    """Where roam misses the issue's bar on this problem: a valid schedule (or, with POET, a proof
    that none fits), within the time POET was given, at no more energy than POET's schedule (1 % above where CBC proved it optimal:
    CBC's optimum on these joule values is within about that)."""
    p, r = row["poet"], row["roam"]
    ep, er = energy(p), energy(r)
    if er is None:
        if r["status"] == "infeasible" and p["status"] == "infeasible":
            return []  # both show that no schedule fits
        return [f"roam {r['status']}" + (" (schedule invalid)" if "check" in r else f", POET {p['status']}")]
    out = [] if r["seconds"] <= seconds else [f"roam took {r['seconds']:.1f} s"]
    if ep is not None and er > ep * (1.01 if p["status"] == "optimal" else 1.0):
        out.append(f"roam energy {100 * (er / ep - 1):+.2f} % vs POET {p['status']}")
    return out


def row_cells(row: dict) -> list:
    p, r = row["poet"], row["roam"]
    ep, er = energy(p), energy(r)
    versus = f"{100 * (er / ep - 1):+.2f}" if ep and er else ""
    valid = "/".join("yes" if side.get("check", {}).get("valid") else ("-" if "check" not in side else "NO")
                     for side in (p, r))

    def cell(side: dict, e: float | None) -> list:
        return [side["status"], "" if e is None else f"{e:.6g}", f"{side['seconds']:.1f}"]

    return [row["model"], row["platform"], row["T"], row["fraction"], *cell(p, ep), *cell(r, er), versus, valid]


def table(results: dict) -> str:
    body = [row_cells(row) for row in results["rows"]]
    text = harness.markdown_table(["model", "platform", "T", "RAM budget", "POET", "energy J", "s", "roam", "energy J",
                                   "s", "roam vs POET %", "valid POET/roam"], body, "llrrlrrlrrrl")
    text += (f"\nTime limit {results['time_limit']:g} s per solver per problem (POET killed at "
             f"{results['kill_factor']:g} x); runtime budget {RUNTIME_FACTOR} x the graph's total; RAM budget a fraction "
             "of the graph's own peak; energies as `python -m roam_cli.remat.poet_check` evaluates each schedule; "
             f"seconds: each solver's wall time. POET at commit {results['poet_commit'][:7]}, {results['poet_solver']}.\n")
    if any("shortfalls" in row for row in results["rows"]):
        missed = [f"{row['problem']}: {'; '.join(row['shortfalls'])}" for row in results["rows"] if row.get("shortfalls")]
        text += f"\nroam meets the bar on {len(results['rows']) - len(missed)} of {len(results['rows'])} problems"
        text += (": " + "; ".join(missed) + ".\n") if missed else ".\n"
    return text


def main(argv: list[str]) -> dict:
    cache = harness.CACHE / "poet"
    ap = harness.options(__name__, __doc__)
    ap.add_argument("--poet-src", type=Path, help="POET checkout or git directory (default: cloned into --cache)")
    ap.add_argument("--venv", type=Path, default=cache / "venv")
    ap.add_argument("--python", default=shutil.which("python3.11"),
                    help="the interpreter POET's venv is made from (numpy 1.24 needs <= 3.11)")
    ap.add_argument("--cache", type=Path, default=cache, help="POET's source, its runs and the schedules (default %(default)s)")
    ap.add_argument("--problems", type=Path, default=cache / "problems")
    ap.add_argument("--samples", type=Path, default=harness.ROOT / "sample_models" / "poet",
                    help="the two POET samples, linear_a72nocache and vgg16_cifar_a72 .problem.json (default %(default)s)")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--only", default="", help="comma-separated models")
    ap.add_argument("--poet-only", action="store_true", help="export and run POET; roam not run")
    ap.add_argument("--roam-only", action="store_true", help="POET's side from the cache only (not run)")
    args = ap.parse_args(argv)
    for name in SAMPLE_PROBLEMS:
        harness.needs(args.samples / f"{name}.problem.json",
                      "--samples names the folder of POET's two sample problems")
    if not (args.venv / "bin" / "python").exists() and not args.python:
        sys.exit("POET's venv needs a Python 3.11: --python PATH (or --venv DIR, an existing one)")
    src = poet_source(args.poet_src, args.cache)
    python = poet_python(args.venv, args.python)
    runs = args.cache / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    args.problems.mkdir(parents=True, exist_ok=True)
    notes = check_samples(python, src, args.samples, runs)
    models = args.only.split(",") if args.only else MODELS

    paths = []
    for model in models:
        for plat in PLATFORMS:
            files = [args.problems / f"{model}_{plat}_{f}.problem.json" for f in FRACTIONS]
            if not all(f.exists() for f in files):
                graph = driver(python, src, "graph", model, plat, str(runs / "graph.json"))
                for fraction, f in zip(FRACTIONS, files):
                    f.write_text(dump(problem(graph, fraction, notes)))
            paths += files
    print(f"{len(paths)} problems in {args.problems}", file=sys.stderr, flush=True)

    rows = []
    for path in paths:
        doc = json.loads(path.read_text())
        row = {"problem": path.name, "digest": digest(path), "model": doc["model"], "platform": doc["platform"],
               "T": doc["T"], "fraction": doc["ram_budget_fraction"], "ram_budget_bytes": doc["ram_budget_bytes"]}
        if args.roam_only:
            cached = poet_record(path, args.time_limit, runs)
            row["poet"] = json.loads(cached.read_text()) if cached.exists() else {"status": "not run", "seconds": 0.0}
        else:
            row["poet"] = run_poet(python, src, path, args.time_limit, runs)
        if "schedule_file" in row["poet"]:
            row["poet"]["check"] = judge(path, runs / row["poet"]["schedule_file"])
        row["roam"] = {"status": "not run", "seconds": 0.0} if args.poet_only else run_roam(path, args.time_limit, runs)
        if "schedule_file" in row["roam"]:
            row["roam"]["check"] = judge(path, runs / row["roam"]["schedule_file"])
        if not args.poet_only:
            row["shortfalls"] = shortfalls(row, args.time_limit)
        rows.append(row)
        print(f"{path.name}: POET {row['poet']['status']}, roam {row['roam']['status']}", file=sys.stderr, flush=True)
    return {"time_limit": args.time_limit, "kill_factor": KILL_FACTOR, "poet_commit": POET_COMMIT,
            "poet_solver": "POETSolver pulp-cbc (PuLP 2.7, CBC 2.10.3), default threads", "rows": rows}
