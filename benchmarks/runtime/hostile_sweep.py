"""The hostile sweep: corrupt files, outputs aimed at inputs, bad values, full and read-only file
systems and signals at every stage, against the commands users run, each case held to the contract.

    python -m benchmarks run runtime/hostile_sweep [--only KIND,...] [--jobs 2]

The cases are hostile_cases.py's (about 230 of them: each of the 17 defects issue 48 found is one).
Each runs `python -m roam_cli ARGV` as a user would, in a folder holding a fresh copy of the
fixtures (the README sample's export, the steps roam makes of it and their plans), and is held to
the contract (`check`): the exit code the case allows; no traceback; on failure one line on stderr,
saying what the case names; every file there before byte-identical after (inputs and their data
never written over); after a failure nothing new in the folder, and no temporary file after any
run; nothing left in the temporary folder (TMPDIR); no process left running in the folder. A full
or read-only file system is a tmpfs mounted at `small/`: where mounting is refused (not root), those
cases are reported as not run, as the rank cases are without MPI. A case that breaks the contract
is a defect; the table counts them by kind."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper

from benchmarks import harness
from benchmarks.runtime.hostile_cases import SMALL_FS, Case, all_cases

TAKES = "about 10 minutes on two cores; the rank cases need the mpi extra, the file systems root (tmpfs)"
SAMPLES = harness.ROOT / "sample_models"
WAIT_S = 120  # the longest a case may run once signalled (or at all, unsignalled)


class Result(NamedTuple):
    code: int
    out: str
    err: str


Runner = Callable[[list[str], Path], Result]


def run_process(argv: list[str], folder: Path) -> Result:
    """roam as a user runs it: a process of its own, its temporary folder inside the case's."""
    done = subprocess.run([sys.executable, "-m", "roam_cli", *argv], cwd=folder, capture_output=True, text=True, check=False,
                          env=environment(folder), timeout=WAIT_S, stdin=subprocess.DEVNULL)
    return Result(done.returncode, done.stdout, done.stderr)


def environment(folder: Path) -> dict:
    return {**os.environ, "TMPDIR": str(folder / "tmp"), "COLUMNS": "200"}


# ---- the fixtures ----------------------------------------------------------------------------------

def build_fixtures(folder: Path, run: Runner, ranks: bool) -> None:
    """The files every case starts from, in `folder` (made by roam itself, as a user would)."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(SAMPLES / "gpt2_tiny" / "model.onnx", folder / "export.onnx")
    shutil.copy(SAMPLES / "gpt2_tiny" / "training_model.onnx", folder / "training_model.onnx")
    shutil.copy(SAMPLES / "remat" / "gpt2_tiny_step.graph.json", folder / "remat.graph.json")
    external(folder / "export.onnx", folder / "export_ext.onnx")
    mtg = ["--loss", "cross-entropy", "--dim", "batch=2"]
    commands = [["make-training-graph", "export.onnx", "-o", "step.onnx", "--in-graph-optimizer", *mtg],
                ["make-training-graph", "export_ext.onnx", "-o", "step_from_ext.onnx", "--in-graph-optimizer", *mtg],
                ["make-training-graph", "export.onnx", "-o", "graph.onnx", *mtg],
                ["make-training-graph", "export.onnx", "-o", "bf16.onnx", "--in-graph-optimizer", "--precision", "bf16", *mtg],
                ["make-training-graph", "export.onnx", "-o", "fp16.onnx", "--in-graph-optimizer", "--precision", "fp16", *mtg],
                ["optimize", "step.onnx", "-o", "plan.json"],
                ["shard", "step.onnx", "--ranks", "2", "-o", "rank.onnx"],
                ["optimize", "rank.onnx", "-o", "rank_plan.json"]]
    if ranks:
        commands += [["shard", "step.onnx", "--ranks", "4", "-o", "rank4.onnx"], ["optimize", "rank4.onnx", "-o", "rank4_plan.json"]]
    for argv in commands:
        done = run(argv, folder)
        if done.code != 0:
            raise RuntimeError(f"building the fixtures: roam {' '.join(argv)}: exit {done.code}: {done.err.strip()}")
    external(folder / "step.onnx", folder / "step_ext.onnx")
    external(folder / "bf16.onnx", folder / "bf16_ext.onnx")
    rng = np.random.default_rng(0)
    batch = rng.integers(0, 512, (4, 32), dtype=np.int64)
    np.savez(folder / "inputs.npz", input_ids=batch[:2], labels=batch[:2])
    np.savez(folder / "rank_inputs.npz", input_ids=batch, labels=batch)
    onnx.save(custom_op_model(), folder / "custom_op.onnx")
    onnx.save(bf16_matmul_at_opset_11(), folder / "bad_opset.onnx")
    (folder / "tmp").mkdir()


def external(model: Path, out: Path) -> None:
    """`model` saved as `out` with its initializers of 1 KiB or more in `out`.data (as exporters save
    large models: onnx's default threshold)."""
    m = onnx.load(model)
    onnx.save(m, out, save_as_external_data=True, all_tensors_to_one_file=True, location=out.name + ".data")


def custom_op_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    g = helper.make_graph([helper.make_node("Swish", ["x"], ["y"], domain="com.example")], "g", [x], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.example", 1)])


def bf16_matmul_at_opset_11() -> onnx.ModelProto:
    """A bf16 MatMul at opset 11, whose MatMul takes no bf16: not a valid model."""
    a = helper.make_tensor_value_info("a", TensorProto.BFLOAT16, [2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2, 2])
    g = helper.make_graph([helper.make_node("MatMul", ["a", "a"], ["y"])], "g", [a], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])


# ---- one case --------------------------------------------------------------------------------------

def snapshot(folder: Path) -> dict[str, str]:
    """Every file and link under `folder` (but the temporary folder) -> its content's hash or link target."""
    seen = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if rel == "tmp" or rel.startswith("tmp/"):
            continue
        if path.is_symlink():
            seen[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            seen[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif path.is_dir():
            seen[rel + "/"] = "folder"
    return seen


def processes_in(folder: Path) -> list[str]:
    """The processes whose working folder is inside `folder`, or whose command line names it."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cwd = os.readlink(proc / "cwd")
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if state != "Z" and (cwd.startswith(str(folder)) or str(folder) in command):
                found.append(f"{proc.name} {command[:80]}")
    return found


def check(case: Case, result: Result, before: dict, after: dict, folder: Path) -> list[str]:
    """How the run broke the contract (nothing: it held)."""
    broken = []
    if "Traceback" in result.out + result.err:
        broken.append("a traceback")
    if result.code not in case.exits:
        broken.append(f"exit {result.code}, not {' or '.join(map(str, case.exits))}")
    lines = [line for line in result.err.splitlines() if line.strip()]
    if result.code not in (0, -9):
        if len(lines) != 1:
            broken.append(f"{len(lines)} lines on stderr")
        elif not lines[0].startswith("roam: "):
            broken.append("its line is not roam's")
    # an error says it on stderr; a warning (a run that goes on: exit 0) is printed with the run's output
    said = result.err if result.code != 0 else result.out + result.err
    if case.says and (result.code != 0 or case.exits == (0,)) and case.says.lower() not in said.lower():
        broken.append(f"does not say {case.says!r}")
    for name, digest in before.items():
        if name not in after:
            broken.append(f"{name} removed")
        elif after[name] != digest:
            broken.append(f"{name} written over")
    new = [name for name in after if name not in before]
    if result.code != 0 and new:
        broken.append(f"left {', '.join(new)}")
    broken += [f"left {name}" for name in new if Path(name).name.startswith(".") or ".tmp" in name or ".part" in name]
    # what roam makes there (roam-*) and what the libraries it drives make under tempfile's own names
    # (tmp*); not a file the machine's site hooks write
    left = [p for p in (folder / "tmp").iterdir() if p.name.startswith(("roam-", "tmp"))]
    if left:
        broken.append(f"left {', '.join(p.name for p in left)} in TMPDIR")
    return broken


def run_case(case: Case, fixtures: Path, work: Path, run: Runner) -> dict:
    """The case run in its own copy of the fixtures: its outcome, and how it broke the contract."""
    folder = Path(tempfile.mkdtemp(prefix="case-", dir=work))
    shutil.rmtree(folder)
    shutil.copytree(fixtures, folder, symlinks=True)
    mounted = False
    try:
        if case.mount:
            small = folder / "small"
            small.mkdir()
            options = f"size={SMALL_FS}" if case.mount != "read-only" else "ro,size=64k"
            if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(small)], capture_output=True,
                              check=False).returncode != 0:
                return {"case": case.name, "kind": case.kind, "ran": False, "why": "mounting a tmpfs was refused (not root)"}
            mounted = True
            if case.mount == "full":  # taken to the last byte by a file of the user's
                free = os.statvfs(small).f_bavail * os.statvfs(small).f_frsize
                (small / "taken").write_bytes(bytes(free))
        if case.setup:
            case.setup(folder)
        before = snapshot(folder)
        began = time.perf_counter()
        result = signalled(case, folder) if case.signal else run(list(case.argv), folder)
        seconds = time.perf_counter() - began
        after = snapshot(folder)
        then = [] if result.code != 0 else [(argv, run(list(argv), folder)) for argv in case.then]
        deadline = time.monotonic() + 10  # ranks a killed launcher left: they end themselves within seconds
        while (alive := processes_in(folder)) and time.monotonic() < deadline:
            time.sleep(0.2)
        broken = check(case, result, before, after, folder)
        broken += [f"left process {p}" for p in alive]
        broken += [f"then `roam {' '.join(argv)}` exit {r.code}: {r.err.strip()[-200:]}" for argv, r in then if r.code != 0]
        return {"case": case.name, "kind": case.kind, "defect": case.defect, "ran": True, "exit": result.code,
                "said": result.err.strip().splitlines()[-1] if result.err.strip() else "", "seconds": round(seconds, 2),
                "broken": broken}
    finally:
        for pid in processes_in(folder):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid.split()[0]), signal.SIGKILL)
        if mounted:
            subprocess.run(["umount", "-l", str(folder / "small")], capture_output=True, check=False)
        shutil.rmtree(folder, ignore_errors=True)


def signalled(case: Case, folder: Path) -> Result:
    """Run the case's command and send its signal once its moment comes."""
    s = case.signal
    proc = subprocess.Popen([sys.executable, "-m", "roam_cli", *case.argv], cwd=folder, env=environment(folder),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = wait_for(s.target, s.when, proc, folder)
    if pid is None and proc.poll() is None:
        proc.kill()
        out, err = proc.communicate()
        return Result(proc.returncode, out, err + f"\n(the sweep: {s.target} never came to {s.when})")
    if pid is not None:
        os.kill(pid, s.signum)
    try:
        out, err = proc.communicate(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err += f"\n(the sweep: still running {WAIT_S} s after the signal)"
    return Result(proc.returncode, out, err)


def wait_for(target: str, when: str | float, proc: subprocess.Popen, folder: Path) -> int | None:
    """The pid of `target` once `when` holds; None if the command ended first."""
    deadline = time.monotonic() + 60
    if isinstance(when, float):
        time.sleep(when)
        return proc.pid if proc.poll() is None else None
    while proc.poll() is None and time.monotonic() < deadline:
        runs = list((folder / "tmp").glob("roam-ranks-*"))
        if runs:
            found = moment(target, when, proc, runs[0])
            if found is not None:
                return found
        time.sleep(0.02)
    return None


def moment(target: str, when: str, proc: subprocess.Popen, run: Path) -> int | None:
    """The pid of `target` in the rank run `run` if `when` has come."""
    statuses = {}
    for path in run.glob("rank*.status"):
        with contextlib.suppress(OSError, ValueError):
            statuses[int(path.stem[4:])] = json.loads(path.read_text())
    if when == "start":
        ready = target == "roam" and statuses or target.startswith("rank") and int(target.split()[1]) in statuses
    else:
        steps = int(when.split()[1])
        counts = [p.read_text().count("\n") for p in run.glob("rank*.steps")]
        ready = len(counts) == len(statuses) > 0 and min(counts) >= steps
    if not ready:
        return None
    if target == "roam":
        return proc.pid
    if target == "mpiexec":
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        return next(int(c) for c in children if b"mpiexec" in Path(f"/proc/{c}/cmdline").read_bytes())
    return statuses[int(target.split()[1])]["pid"]


# ---- the sweep -------------------------------------------------------------------------------------

def has_mpi() -> bool:
    from roam_cli.runtime import collectives, ranks
    return collectives.missing() is None and ranks.mpiexec() is not None


def progress(outcome: dict) -> dict:
    """The outcome, said on stderr as it comes (the sweep takes minutes)."""
    if not outcome["ran"]:
        print(f"not run  {outcome['case']}: {outcome['why']}", file=sys.stderr, flush=True)
        return outcome
    print(f"{'held' if not outcome['broken'] else 'BROKEN'}  {outcome['seconds']:6.1f} s  {outcome['case']}"
          + "".join(f"\n    {b}" for b in outcome["broken"]), file=sys.stderr, flush=True)
    return outcome


def sweep(cases: list[Case], jobs: int, work: Path, run: Runner = run_process) -> list[dict]:
    mpi = has_mpi()
    fixtures = work / "fixtures"
    build_fixtures(fixtures, run, ranks=mpi)
    runnable = [c for c in cases if mpi or c.needs != "mpi"]
    quiet = [c for c in runnable if c.signal is None]
    loud = [c for c in runnable if c.signal is not None]  # one at a time: their timing is the machine's
    with ThreadPoolExecutor(jobs) as pool:
        outcomes = list(pool.map(lambda c: progress(run_case(c, fixtures, work, run)), quiet))
    outcomes += [progress(run_case(c, fixtures, work, run)) for c in loud]
    outcomes += [{"case": c.name, "kind": c.kind, "ran": False, "why": "needs the mpi extra"}
                 for c in cases if c not in runnable]
    return outcomes


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(prog="python -m benchmarks run runtime/hostile_sweep", description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="kinds to run, comma-separated (corrupt file, aliased output, bad value, "
                    "wrong model, file system, signal)")
    ap.add_argument("--jobs", type=int, default=2, help="cases run at once (the signal cases run one at a time)")
    args = ap.parse_args(argv)
    cases = all_cases()
    if args.only:
        kinds = set(args.only.split(","))
        cases = [c for c in cases if c.kind in kinds]
    with tempfile.TemporaryDirectory(prefix="roam-hostile-") as work:
        outcomes = sweep(cases, args.jobs, Path(work))
    return {"cases": outcomes, "defects_of_issue_48": sorted({c.defect for c in cases if c.defect})}


def table(results: dict) -> str:
    by_kind: dict[str, Counter] = {}
    for o in results["cases"]:
        count = by_kind.setdefault(o["kind"], Counter())
        count["cases"] += 1
        count["ran"] += o["ran"]
        count["held"] += o["ran"] and not o["broken"]
        count["defects"] += o["ran"] and bool(o["broken"])
    rows = [[kind, c["cases"], c["ran"], c["held"], c["defects"]] for kind, c in by_kind.items()]
    total = sum(by_kind.values(), Counter())
    rows.append(["**all**", total["cases"], total["ran"], total["held"], total["defects"]])
    broken = [f"- {o['case']}: {'; '.join(o['broken'])} (exit {o['exit']}: {o['said'][:120]})"
              for o in results["cases"] if o["ran"] and o["broken"]]
    not_run = Counter(o["why"] for o in results["cases"] if not o["ran"])
    notes = [f"Not run: {n} ({why})." for why, n in not_run.items()]
    notes.append(f"Cases reproducing the defects issue 48 listed: {len(results['defects_of_issue_48'])} of its 17 items.")
    return "\n".join([harness.markdown_table(["kind", "cases", "ran", "held", "defects"], rows), *notes, *broken])
