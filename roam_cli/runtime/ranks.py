"""`roam train RANK_STEP --ranks N`: N processes over MPI, started, watched and ended here.

The launcher checks what it can before any process starts (the step is a rank step of N ranks, the
plan is for that layout, MPI is installed), then runs the venv's `mpiexec -n N python -m
roam_cli.runtime.rank FOLDER` (`rank.py`) in a session of its own and watches the ranks' files in
FOLDER: a step is reported when every rank finished it, with the mean of the ranks' outputs (each
the mean over its rows, so the whole batch's mean loss).

A rank that fails writes why and stops the others (MPI_Abort); a rank that dies is named from the
launcher's own record, the first of the ranks' lifelines (a socket each holds open) to close
(MPICH's hydra ends the others at once; its text names whichever process it saw end); mpiexec
killed or stopped is said as such. A run where no step finishes on every rank within
`timeout` seconds is a hang (the first step's counting from when every rank has started: opening
a rank's session takes what its size takes, under whatever else the machine runs); while starting,
a rank is hung when it has not reported, or its heartbeat stopped, for `start_timeout` seconds
(START_S by default: one call into a library can hold the interpreter that long on a large step).
The rank to blame is the one whose heartbeat stopped, else the one not waiting in a collective
while others wait in one. Either way every rank and mpiexec are ended, the error is one line
naming the rank, and nothing is written: the weights reach their paths only after every rank
finished (written whole, then renamed)."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import socket
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import astuple
from pathlib import Path

import numpy as np

import roam_cli
from roam_cli.core.collectives import SHARDING_KEY
from roam_cli.core.errors import CheckFailed, RoamBug, RoamError
from roam_cli.core.units import format_bytes
from roam_cli.frontend.onnx_import import load_model
from roam_cli import pair
from roam_cli.runtime import checkpoints, collectives, data, shards, weights
from roam_cli.runtime.train import RTOL, render_weights

DEFAULT_TIMEOUT = 300.0
POLL_S = 0.05
END_S = 5.0  # how long mpiexec gets to end after its ranks were killed
STALE_S = 5.0  # a heartbeat older than this (rank.HEARTBEAT_S is 0.5 s) is a rank that stopped
START_S = 120.0  # while starting: the longest a rank may be silent (imports, MPI_Init, a large session's build)


def mpiexec() -> str | None:
    """The mpiexec of this Python's environment (pip's mpich puts it beside the interpreter), else the PATH's."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if os.access(beside, os.X_OK) else shutil.which("mpiexec")


def check(model_path: Path, plan: dict, ranks: int) -> tuple[shards.Sharding, weights.Source | None]:
    """Refuse, before any process starts, a run of the wrong layout or without MPI."""
    if ranks < 1:
        raise RoamError(f"--ranks must be at least 1, got {ranks}")
    model = load_model(model_path)[0]
    layout = shards.read({p.key: p.value for p in model.metadata_props}, str(model_path))
    if layout is None:
        raise RoamError(f"--ranks {ranks}: {model_path} is not a rank step (no {SHARDING_KEY} metadata); roam shard "
                        "writes one, and a whole step runs without --ranks")
    if ranks != layout.ranks:
        raise RoamError(f"--ranks {ranks}, but {model_path} is the step of one of {layout.ranks} ranks "
                        f"(its {SHARDING_KEY}): run it with --ranks {layout.ranks}")
    planned = plan.get("sharding", {}).get("ranks")
    if planned is not None and planned != ranks:
        raise RoamError(f"the plan was made for a layout of {planned} ranks, not {ranks}: plan the rank step of "
                        f"{ranks} ranks")
    if any(key in os.environ for key in ("PMI_RANK", "OMPI_COMM_WORLD_RANK")):
        raise RoamError(f"--ranks {ranks} starts the {ranks} processes itself (with mpiexec): run roam train once, "
                        "not under mpiexec")
    why = collectives.missing() or (None if mpiexec() else "no mpiexec in this environment or on the PATH")
    if why:
        raise RoamError(f"--ranks runs the rank step on {ranks} processes over MPI, but {why}: {collectives.INSTALL}")
    return layout, weights.source_of(model, model_path.resolve().parent)


def train_ranks(model_path: Path, plan: dict, ranks: int, steps: int, *, inputs_path: Path | None = None,
                seed: int = 0, learning_rate: float = 1e-3, allocator: str = "roam", compare: bool = False,
                allow_unplanned: bool = False, timeout: float = DEFAULT_TIMEOUT, start_timeout: float = START_S,
                on_step=None, save_weights: Path | None = None, save_model: Path | None = None,
                checkpointing: checkpoints.Options | None = None, restarts: int = 0, say=None,
                shuffle: bool = False) -> dict:
    """Run `steps` steps of the rank step on `ranks` processes; the figures (as `train.train`'s, per
    step the mean over ranks, per rank its allocator's figures). With `checkpointing`, each rank
    writes its part of a checkpoint as the run goes, and with `restarts` a group that lost a rank
    (died, hung) is started again from the newest checkpoint, at most that many times, each said
    to `say`."""
    if steps < 1:
        raise RoamError(f"--steps must be at least 1, got {steps}")
    if restarts and checkpointing is None:
        raise RoamError("--restarts starts the ranks again from their newest checkpoint: name --checkpoint-dir")
    if save_weights is not None:
        weights.check_weights_path(save_weights)
    layout, source = check(model_path, plan, ranks)
    if save_model is not None and (source is None or not source.path.is_file()):
        raise RoamError(f"--save-model: {model_path} does not record an inference export that is there "
                        "(roam make-training-graph records it)")
    job = {"model": str(model_path.resolve()), "plan": plan, "steps": steps,
           "inputs": str(inputs_path.resolve()) if inputs_path else None, "seed": seed, "shuffle": shuffle, "learning_rate": learning_rate,
           "allocator": allocator, "compare": compare, "allow_unplanned": allow_unplanned, "launcher": os.getpid(),
           "threads": max(1, len(os.sched_getaffinity(0)) // ranks), "checkpoint": None}
    keeper = None
    if checkpointing is not None:
        run_id = checkpoints.Run(pair.source(plan)["sha256"], ranks, seed,
                                 data.identity(inputs_path) if inputs_path else None)
        keeper = checkpoints.Checkpointing(checkpointing, run_id, say)
        made = not checkpointing.folder.exists()
    rows: dict[int, dict] = {}  # every step run, by number: a restart runs some again
    resumed, attempt = None, 0
    try:
        while True:
            if keeper is not None:
                found = keeper.find() if checkpointing.resume or attempt else None
                job["checkpoint"] = {"folder": str(checkpointing.folder.resolve()), "every": checkpointing.every,
                                     "keep": checkpointing.keep, "run": list(astuple(keeper.run)),
                                     "resume": found and {"step": found.step, "folder": str(found.folder.resolve()),
                                                          "manifest": found.manifest}}
                if found is not None and resumed is None:
                    resumed = checkpoints.resumed(found)
            folder = Path(tempfile.mkdtemp(prefix="roam-ranks-"))
            job["lifeline"] = f"roam-{folder.name}"
            (folder / "job.json").write_text(json.dumps(job))
            run = Run(folder, ranks, steps, timeout, start_timeout, job["lifeline"],
                      job["checkpoint"]["resume"]["step"] + 1 if job["checkpoint"] and job["checkpoint"]["resume"] else 1)
            try:
                per_rank = run.supervise(on_step or (lambda row: None))
                rows.update((row["step"], row) for row in run.rows if row["phase"] == "planned")
                run.rows = [rows[k] for k in sorted(rows)] + [row for row in run.rows if row["phase"] != "planned"]
                figures = summary(run, per_rank, model_path, plan, allocator, seed) | {"resumed": resumed,
                                                                                       "restarts": attempt}
                trained = dict(np.load(folder / "weights.npz"))
                return figures | weights.save_trained(save_weights, save_model, source, trained)
            except GroupLost as e:
                rows.update((row["step"], row) for row in run.rows if row["phase"] == "planned")
                if attempt >= restarts:
                    raise
                attempt += 1
                if say is not None:
                    say(f"{e}; restart {attempt} of {restarts}")
            finally:
                run.end()
                shutil.rmtree(folder, ignore_errors=True)
                if keeper is not None:
                    checkpoints.unfinished(checkpointing.folder)  # a write the stopped ranks left
    except BaseException:
        if keeper is not None and made and not checkpoints.complete(checkpointing.folder):
            shutil.rmtree(checkpointing.folder, ignore_errors=True)  # made by this run, for nothing
        raise


class GroupLost(CheckFailed):
    """A rank died or hung, or mpiexec was killed: what `--restarts` starts the group again after
    (an error a rank reports would come again)."""


class Run:
    """mpiexec and its ranks, seen through the files they write in `folder` (`rank.py`)."""

    def __init__(self, folder: Path, ranks: int, steps: int, timeout: float, start_timeout: float = START_S,
                 lifeline: str | None = None, first: int = 1):
        self.folder, self.ranks, self.steps, self.timeout = folder, ranks, steps, timeout
        self.first = first  # the step this run starts at (after the checkpoint it resumes from)
        self.start_timeout = start_timeout
        self.lines: list[list[dict]] = [[] for _ in range(ranks)]  # each rank's steps finished
        self.read_to = [0] * ranks
        self.proc: subprocess.Popen | None = None
        self.rows: list[dict] = []  # the steps every rank finished, combined
        # each rank's lifeline: a socket it connects at its start and never closes; the kernel closes it
        # as the process dies, before mpiexec can hear of the death and end the others, so the first
        # to close is the rank that died (MPICH's own text names whichever process it saw end)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind("\0" + (lifeline or folder.name))  # abstract: no file, no path length limit
        self.listener.listen(ranks)
        # epoll hands back the sockets in the order they became ready: the first to close comes first
        # even when several closed before this process next ran
        self.poll = select.epoll()
        self.poll.register(self.listener, select.EPOLLIN)
        self.lifelines: dict[int, tuple[socket.socket, bytes]] = {}  # fd -> the connection, what it said (its rank)
        self.dead: list[int] = []  # the ranks whose lifeline closed, in the order they closed

    def supervise(self, on_step) -> list[dict]:
        """Start the ranks and watch them to the end: every rank's figures, or the error naming the rank."""
        # the ranks import this roam, wherever it was imported from: first on their path, and run in the
        # run's folder (`python -m` puts the working directory first: a clone's root would shadow it)
        env = dict(os.environ)
        root = str(Path(roam_cli.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        if self.ranks > len(os.sched_getaffinity(0)):
            # more ranks than cores: MPICH's busy wait in a collective takes the core from the rank it
            # waits for; sleeping when it yields made the sample's 4 ranks on 2 cores 2.7x faster (it
            # slows 2 ranks on 2 cores down, so only here)
            env.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
        with open(self.folder / "mpiexec.out", "wb") as out, open(self.folder / "mpiexec.err", "wb") as err:
            # a session of its own: the terminal's Ctrl-C reaches the launcher, which ends everything
            self.proc = subprocess.Popen([mpiexec(), "-n", str(self.ranks), sys.executable, "-m", "roam_cli.runtime.rank",
                                          str(self.folder)], stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                         cwd=self.folder, start_new_session=True)
        began = progress = time.monotonic()
        starting = True
        stopped = None  # since when mpiexec is seen stopped
        while True:
            code = self.proc.poll()
            for row in self.read_steps():
                progress = time.monotonic()
                if row["phase"] == "planned":
                    on_step(row)
            if code is not None:
                break
            if starting:
                starting, blame = self.start_hang(time.monotonic() - began)
                progress = time.monotonic()
            elif time.monotonic() - progress > self.timeout:
                blame = (f"{self.hung()}: no step finished on every rank within the timeout "
                         f"({self.timeout:g} s)")
            else:
                blame = None
            # stopped, mpiexec can end neither the ranks nor the run: said once it has been so for the
            # timeout (its ranks may train on till their last step), and as the cause of any hang
            stopped = (stopped or time.monotonic()) if self.launcher_stopped() else None
            if stopped and (blame or time.monotonic() - stopped > self.timeout):
                blame = "mpiexec is stopped (SIGSTOP, or a terminal's Ctrl-Z), so its ranks cannot go on"
            if blame:
                self.end()
                raise GroupLost(f"{blame}; every rank was stopped")
            self.listen(POLL_S)
        if code == 0 and all((self.folder / f"rank{r}.json").is_file() for r in range(self.ranks)):
            return [json.loads((self.folder / f"rank{r}.json").read_text()) for r in range(self.ranks)]
        raise self.failure(code)

    def read_steps(self) -> list[dict]:
        """The steps that every rank has now finished and were not read before, combined."""
        for r in range(self.ranks):
            try:
                with open(self.folder / f"rank{r}.steps", "rb") as f:
                    f.seek(self.read_to[r])
                    text = f.read()
            except FileNotFoundError:
                continue
            whole = text[:text.rfind(b"\n") + 1]  # a line still being written waits for the next look
            self.read_to[r] += len(whole)
            self.lines[r] += [json.loads(line) for line in whole.splitlines()]
        new = []
        while all(len(lines) > len(self.rows) for lines in self.lines):
            k = len(self.rows)
            each = [lines[k] for lines in self.lines]
            self.rows.append({"phase": each[0]["phase"], "step": each[0]["step"],
                              "outputs": {n: statistics.fmean(e["outputs"][n] for e in each) for n in each[0]["outputs"]},
                              "rank_outputs": [e["outputs"] for e in each], "seconds": max(e["seconds"] for e in each),
                              "memory": [e["memory"] for e in each]})
            new.append(self.rows[-1])
        return new

    def listen(self, seconds: float) -> None:
        """Wait up to `seconds` for the ranks' lifelines: one connecting, saying its rank, or closing."""
        for fd, _ in self.poll.poll(seconds):
            if fd == self.listener.fileno():
                conn = self.listener.accept()[0]
                self.poll.register(conn, select.EPOLLIN)
                self.lifelines[conn.fileno()] = (conn, b"")
                continue
            conn, said = self.lifelines[fd]
            data = conn.recv(64)
            if data:
                self.lifelines[fd] = (conn, said + data)
                continue
            self.poll.unregister(conn)
            del self.lifelines[fd]
            conn.close()
            if said.endswith(b"\n"):
                self.dead.append(int(said))

    def launcher_stopped(self) -> bool:
        """mpiexec itself is stopped (SIGSTOP, a terminal's Ctrl-Z): its ranks cannot end a step."""
        return self.proc is not None and process_state(self.proc.pid) in ("T", "t")

    def status(self, r: int) -> dict | None:
        try:
            return json.loads((self.folder / f"rank{r}.status").read_text())
        except (FileNotFoundError, ValueError):
            return None

    def where(self, r: int, status: dict | None) -> str:
        """Where rank r was, in words: the step it was in (the one after the last it finished)."""
        phase = status["phase"] if status else "start"
        if phase in ("start", "gather"):
            return "while starting" if phase == "start" else "while gathering the weights"
        numbers = [line["step"] for line in self.lines[r] if line["phase"] == phase]
        done = numbers[-1] if numbers else self.first - 1 if phase == "planned" else 0
        which = "" if phase == "planned" else " of the run without the plan"
        return f"in step {min(done + 1, self.steps)} of {self.steps}{which}"

    def start_hang(self, seconds: float) -> tuple[bool, str | None]:
        """While the ranks start: (whether some rank is still starting, the rank hung while starting)."""
        statuses = [self.status(r) for r in range(self.ranks)]
        silent = [r for r, s in enumerate(statuses) if s is None]
        now = time.time()
        if silent:
            if seconds <= self.start_timeout:
                return True, None
            # one that reported and was then stopped keeps the silent ones waiting (inside MPI_Init)
            stopped = [r for r, s in enumerate(statuses) if s is not None and is_stopped(s)]
            if stopped:
                r = stopped[0]
                return True, f"rank {r} hung while starting (stopped; no heartbeat for {now - statuses[r]['time']:.1f} s)"
            return True, f"rank {silent[0]} hung while starting (it never reported in {self.start_timeout:g} s; --start-timeout)"
        stale = [r for r, s in enumerate(statuses) if s["phase"] == "start" and now - s["time"] > self.start_timeout]
        if stale:
            r = self.culprit(stale, statuses, now)
            return True, f"rank {r} hung while starting (no heartbeat for {now - statuses[r]['time']:.1f} s)"
        return any(s["phase"] == "start" for s in statuses), None

    @staticmethod
    def culprit(silent: list[int], statuses: list[dict], now: float) -> int:
        """Of the ranks whose heartbeat stopped, the one to blame: a stopped process (SIGSTOP, a
        terminal's Ctrl-Z) first, silent yet or not (a rank blocked inside MPI waiting for it stops
        beating too, MPI_Init holding the interpreter, and may have stopped beating before it),
        else the one silent longest."""
        stopped = [r for r, s in enumerate(statuses) if s is not None and is_stopped(s)]
        return stopped[0] if stopped else max(silent, key=lambda r: now - statuses[r]["time"])

    def hung(self) -> str:
        """The rank to blame for a hang once every rank has started, in words."""
        self.read_steps()
        now = time.time()
        statuses = [self.status(r) for r in range(self.ranks)]
        stale = [r for r, s in enumerate(statuses) if now - s["time"] > min(STALE_S, self.timeout / 2)]
        if stale:
            r = self.culprit(stale, statuses, now)
            return (f"rank {r} hung {self.where(r, statuses[r])} (no heartbeat for "
                    f"{now - statuses[r]['time']:.1f} s)")
        waiting = [s["entered"] > s["left"] for s in statuses]
        if any(waiting) and not all(waiting):  # the others wait in a collective for one that does not come to it
            r = min((r for r in range(self.ranks) if not waiting[r]), key=lambda r: statuses[r]["left"])
            return f"rank {r} hung {self.where(r, statuses[r])} outside the collectives, the other ranks waiting in one"
        r = min(range(self.ranks), key=lambda r: statuses[r]["left"])
        return f"rank {r} hung {self.where(r, statuses[r])}"

    def failure(self, code: int) -> Exception:
        """Why mpiexec ended with `code`: a signal to mpiexec itself, else the error a rank wrote (the
        first), else the rank whose process ended first (this launcher's own record: MPICH's text
        names the process it saw end, not always the one that died first)."""
        self.read_steps()  # each rank's last steps, for where it was
        for _ in range(len(self.lifelines) * 2):
            self.listen(0)  # the closings not yet read
        if code < 0:
            return GroupLost(f"mpiexec was killed by signal {-code}; every rank was stopped")
        errors = sorted((path.stat().st_mtime, int(path.stem[4:]), json.loads(path.read_text()))
                        for path in self.folder.glob("rank*.error"))
        if errors:
            _, r, e = errors[0]
            message = e["message"] if e["kind"] == "usage" else f"rank {r} stopped: {e['message']}"
            return {"usage": RoamError, "check": CheckFailed}.get(e["kind"], RoamBug)(message)
        said = (self.folder / "mpiexec.err").read_text(errors="replace") + \
            (self.folder / "mpiexec.out").read_text(errors="replace")
        signalled = re.search(r"\(signal (\d+)\)", said)  # how: MPICH says the signal a process ended by
        how = f"killed by signal {signalled.group(1)}" if signalled else f"mpiexec exit status {code}"
        dead = [r for r in self.dead if not (self.folder / f"rank{r}.json").is_file()]  # not one that finished
        if not dead:  # it died before it could connect
            return GroupLost(f"a rank died while starting ({how}); every rank was stopped")
        r = dead[0]
        return GroupLost(f"rank {r} died {self.where(r, self.status(r))} ({how}); every rank was stopped")

    def end(self) -> None:
        """Every rank and mpiexec ended: each rank by its pid (it is in a session of its own; killed
        even when mpiexec is gone, as it is when mpiexec itself was killed), then mpiexec, given END_S
        to see them die and clean up (its proxy reaps them) before it is killed too."""
        for conn, _ in self.lifelines.values():
            conn.close()
        self.listener.close()
        self.poll.close()
        if self.proc is None:
            return
        for r in range(self.ranks):
            s = self.status(r)
            if s is not None and (self.proc.poll() is None or self.proc.returncode < 0):
                try:
                    os.kill(s["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.proc.poll() is not None:
            return
        try:
            self.proc.wait(END_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def is_stopped(status: dict) -> bool:
    """The rank whose status this is, is a stopped process (SIGSTOP, a terminal's Ctrl-Z)."""
    return process_state(status["pid"]) in ("T", "t")


def process_state(pid: int) -> str | None:
    """The state letter /proc gives a process (R, S, T stopped, Z zombie, ...), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:][:1] or None


def summary(run: Run, per_rank: list[dict], model_path: Path, plan: dict, allocator: str, seed: int) -> dict:
    """The figures of a finished run: per step the mean over ranks, per rank its allocator's."""
    planned = [row for row in run.rows if row["phase"] == "planned"]
    figures = {"model": str(model_path), "provider": "cpu", "allocator": allocator, "steps": run.steps, "seed": seed,
               "ranks": run.ranks, "synthesised_inputs": per_rank[0]["synthesised_inputs"],
               "weights_from": per_rank[0]["weights_from"], "weights_unread": per_rank[0]["weights_unread"],
               "plan": {"arena_bytes": plan["arena_bytes"], "peak_live_bytes": plan["peak_live_bytes"],
                        "persistent_bytes": plan["persistent_bytes"]},
               "per_step": [{key: row[key] for key in ("step", "outputs", "rank_outputs", "seconds", "memory")}
                            for row in planned],
               "per_rank": [{key: f[key] for key in ("rank", "pid", "arena", "collective_outputs")} for f in per_rank]}
    if "compare" in per_rank[0]:
        each = [f["compare"] for f in per_rank]
        figures["compare"] = {"outputs_max_rel": max(c["outputs_max_rel"] for c in each),
                              "state_max_rel": max(c["state_max_rel"] for c in each),
                              "state_tensors": each[0]["state_tensors"], "bit_equal": all(c["bit_equal"] for c in each),
                              "plain_seconds": [max(s) for s in zip(*(c["plain_seconds"] for c in each))]}
    return figures


def render_step(row: dict, steps: int) -> str:
    scalars = "  ".join(f"{name} {value:.6g}" for name, value in row["outputs"].items())
    served = [m.get("served_at_plan_offset") for m in row["memory"]]
    where = ("recorded" if "recorded" in row["memory"][0] else
             f"at plan offsets: {'/'.join(str(s) for s in served)}" if None not in served else "")
    return (f"step {row['step']:>{len(str(steps))}}/{steps}  {scalars} (mean of {len(row['memory'])} ranks)  "
            f"{where}  {row['seconds'] * 1e3:.1f} ms").rstrip()


def render_summary(result: dict, console) -> None:
    rows = result["per_step"]
    later = rows[1:] or rows
    console.print(f"{result['steps']} steps on {result['ranks']} ranks (cpu, {result['allocator']} allocator)"
                  + (f"; median step {statistics.median(r['seconds'] for r in later) * 1e3:.1f} ms (slowest rank)"
                     if rows else ": none left to run after the checkpoint")
                  + (f"; {result['restarts']} restart(s)" if result.get("restarts") else ""),
                  highlight=False, soft_wrap=True)
    for k, rank in enumerate(result["per_rank"]):
        a = rank["arena"]
        if not a:
            continue
        mine = [r["memory"][k] for r in later]
        at_plan = min(m.get("served_at_plan_offset", 0) for m in mine)
        unplanned = sum(r["memory"][k].get("unplanned", 0) for r in rows[1:])
        console.print(f"rank {rank['rank']}: arena {format_bytes(a['arena_bytes'])} for {a['requests']} requests per "
                      f"step (plan arena {format_bytes(result['plan']['arena_bytes'])}); "
                      + (f"{at_plan} of {a['planned_requests']} planned requests at their plan offset; "
                         if rows[1:] else "")
                      + f"{unplanned} unplanned requests after step 1"
                      + (f"; {len(c['at_plan_offset'])} of the collectives' {len(c['planned'])} planned outputs among them"
                         if (c := rank["collective_outputs"]) else ""), highlight=False, soft_wrap=True)
    render_weights(result, console, "trained weights, gathered from the ranks' shards")
    if "compare" in result:
        c = result["compare"]
        ok = max(c["outputs_max_rel"], c["state_max_rel"]) <= RTOL
        console.print(f"{'[bold green]OK[/bold green]' if ok else '[bold red]DIFFERS[/bold red]'}: against the same "
                      f"ranks without the plan (ORT's order and arena), "
                      + ("bit-equal" if c["bit_equal"] else
                         f"outputs differ by at most {c['outputs_max_rel']:.3g} and the final shards "
                         f"({c['state_tensors']} tensors per rank) by {c['state_max_rel']:.3g} relative (tolerance {RTOL:g})"),
                      soft_wrap=True)
