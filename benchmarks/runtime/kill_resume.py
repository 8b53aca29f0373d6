"""Runs killed and resumed: does a long `roam train` killed with SIGKILL at random moments, and
resumed each time, end bit for bit where a run never interrupted ends?

    python -m benchmarks run runtime/kill_resume [--steps 200] [--kills 20] [--corpus NAME]

For the README sample's export and a corpus export (benchmarks/exporters/exporters_corpus's cell,
default gpt2-dynamo, from its cache: `python -m benchmarks run exporters/exporters_corpus` makes it),
each made a full step (`make-training-graph --in-graph-optimizer`, batch 4) and planned: one run of
`--steps` steps never interrupted, then the same command line with `--resume` started again and
again, each start SIGKILLed within 4 ms of reporting a step drawn at random (some inside a checkpoint's
write: a checkpoint every 5 steps, written after the step is reported), until `--kills` kills, then
run to its end. Then the sample's step sharded for 4
ranks, `--restarts`, a random rank of 1–3 SIGKILLed `--rank-kills` times once a checkpoint exists.
Each row: whether the final checkpoint's state is byte-equal to the uninterrupted run's."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness

TAKES = "about 4 min; needs only roam (the mpi extra for the ranks' row)"
SAMPLE = harness.ROOT / "sample_models" / "gpt2_tiny" / "model.onnx"
CORPUS = harness.CACHE / "exporters_corpus"


def roam(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "roam_cli", "-q", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, check=False)


def made(export: Path, work: Path, ranks: int | None = None) -> tuple[str, str]:
    """The step of `export` (the sample's at batch 4, for `ranks` 4 / ranks sharded; a corpus export's at
    the batch it was exported with) and its plan, in `work`."""
    dims = ["--dim", f"batch={4 // (ranks or 1)}"] if export == SAMPLE else []
    for argv in (["make-training-graph", export, "-o", "whole.onnx", "--loss", "cross-entropy", "--in-graph-optimizer",
                  *dims],
                 *([["shard", "whole.onnx", "--ranks", ranks, "-o", "step.onnx"]] if ranks else []),
                 ["optimize", "step.onnx" if ranks else "whole.onnx", "-o", "plan.json"]):
        r = roam(*argv, cwd=work)
        if r.returncode:
            raise RuntimeError(f"roam {' '.join(map(str, argv))}: {r.stderr.strip()}")
    return ("step.onnx" if ranks else "whole.onnx"), "plan.json"


def final_state(folder: Path, steps: int) -> bytes:
    return b"".join(p.read_bytes() for p in sorted((folder / f"step-{steps}").glob("rank*.npz")))


def killed_runs(export: Path, steps: int, kills: int, rng: random.Random) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model, plan = made(export, work)
        base = ["train", model, "--plan", plan, "--steps", steps, "--checkpoint-every", 5, "--checkpoint-keep", 2]
        t = time.perf_counter()
        r = roam(*base, "--checkpoint-dir", "whole", cwd=work)
        if r.returncode:
            raise RuntimeError(r.stderr)
        uninterrupted_s = time.perf_counter() - t
        # each start killed just after it reports a step drawn at random (sorted: each past where the
        # last kill left the run); a step that is a multiple of 5 is followed by its checkpoint's write
        inside_write = 0
        argv = [sys.executable, "-m", "roam_cli", *map(str, base), "--checkpoint-dir", "killed", "--resume"]
        for target in sorted(rng.sample(range(2, steps), kills)):
            proc = subprocess.Popen(argv, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
            for line in proc.stdout:
                step = re.match(r"step\s+(\d+)/", line)
                if step and int(step.group(1)) >= target:
                    time.sleep(rng.uniform(0, 0.004))
                    break
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
            inside_write += any((work / "killed").glob(".step-*.part"))
        done = sorted(int(p.name[5:]) for p in (work / "killed").glob("step-*"))
        t = time.perf_counter()
        r = subprocess.run([*argv[:3], "-q", *argv[3:]], cwd=work, capture_output=True, text=True, check=False)
        return {"steps": steps, "kills": kills, "inside_write": inside_write, "at_last_kill": done[-1] if done else 0,
                "uninterrupted_s": round(uninterrupted_s, 1), "finish_s": round(time.perf_counter() - t, 1),
                "exit": r.returncode,
                "bit_equal": r.returncode == 0 and final_state(work / "killed", steps) == final_state(work / "whole", steps)}


def killed_ranks(steps: int, kills: int, rng: random.Random) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model, plan = made(SAMPLE, work, ranks=4)
        base = ["train", model, "--plan", plan, "--ranks", 4, "--steps", steps, "--checkpoint-every", 5]
        r = roam(*base, "--checkpoint-dir", "whole", cwd=work)
        if r.returncode:
            raise RuntimeError(r.stderr)
        (work / "tmp").mkdir()
        proc = subprocess.Popen([sys.executable, "-m", "roam_cli", *map(str, base), "--checkpoint-dir", "killed",
                                 "--restarts", str(kills)], cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env={**os.environ, "TMPDIR": str(work / "tmp")})
        for _ in range(kills):
            while True:
                folders = list((work / "tmp").glob("roam-ranks-*"))
                lines = [f.read_text().count("\n") for f in folders[0].glob("rank*.steps")] if folders else []
                if len(lines) == 4 and min(lines) >= 1 and list((work / "killed").glob("step-*")):
                    break
                if proc.poll() is not None:
                    raise RuntimeError(proc.communicate()[1])
                time.sleep(0.02)
            time.sleep(rng.uniform(0, 0.5))
            status = json.loads((folders[0] / f"rank{rng.randint(1, 3)}.status").read_text())
            os.kill(status["pid"], signal.SIGKILL)
            while folders[0].exists():
                time.sleep(0.02)
        out, err = proc.communicate()
        return {"steps": steps, "kills": kills, "restarts_said": out.count("every rank was stopped; restart "),
                "exit": proc.returncode,
                "bit_equal": proc.returncode == 0 and final_state(work / "killed", steps) == final_state(work / "whole", steps)}


def main(argv: list[str]) -> dict:
    ap = harness.options(__name__, __doc__)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--rank-kills", type=int, default=5)
    ap.add_argument("--corpus", default="gpt2-dynamo")
    a = ap.parse_args(argv)
    rng = random.Random(49)
    corpus = harness.needs(CORPUS / a.corpus / "model.onnx", "python -m benchmarks run exporters/exporters_corpus")
    rows = []
    for name, export in (("README sample (gpt2_tiny)", SAMPLE), (f"corpus: {a.corpus}", corpus)):
        rows.append({"run": name, "ranks": 1} | killed_runs(export, a.steps, a.kills, rng))
        print(rows[-1], file=sys.stderr, flush=True)
    from roam_cli.runtime import collectives, ranks
    if collectives.missing() is None and ranks.mpiexec():
        rows.append({"run": "README sample, 4 ranks, --restarts", "ranks": 4} | killed_ranks(30, a.rank_kills, rng))
        print(rows[-1], file=sys.stderr, flush=True)
    return {"rows": rows}


def table(results: dict) -> str:
    rows = results["rows"]
    body = harness.markdown_table(
        ["run", "ranks", "steps", "SIGKILLs", "inside a checkpoint's write", "then resumed to the end", "bit-equal to the uninterrupted run"],
        [[r["run"], r["ranks"], r["steps"], r["kills"], r.get("inside_write", "–"),
          "exit 0" if r["exit"] == 0 else f"exit {r['exit']}", "yes" if r["bit_equal"] else "**no**"] for r in rows], "lrrrrll")
    equal = sum(r["bit_equal"] for r in rows)
    return body + f"\n{equal} of {len(rows)} runs end bit-equal to the run never interrupted.\n"
