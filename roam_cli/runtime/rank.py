"""One rank of `roam train --ranks N`, which starts N of these with mpiexec (`ranks.py`):
`python -m roam_cli.runtime.rank FOLDER`, FOLDER holding the run's `job.json`.

The rank opens the planned session on the rank step, its collectives over MPI_COMM_WORLD
(`collectives`); starts from its part of the whole step's first values (`shards`: its shard of
each parameter and moment, its rows of each batch); runs the steps; with `compare` runs them again
without the plan; and at the end gathers the parameters' shards on rank 0 (MPI_Gather), which
writes them whole to FOLDER/weights.npz.

What it tells the launcher goes through files in FOLDER, not MPI: `rank<r>.status`, rewritten every
HEARTBEAT_S seconds by a thread and at each phase (pid, time, phase, collectives entered and left);
`rank<r>.steps`, a JSON line per step finished; at the end `rank<r>.json` (its figures) or
`rank<r>.error` (what stopped it); and a socket to the launcher, held open for the process's life,
that the launcher sees close when it dies. A rank that fails stops every rank (MPI_Abort): the
others would wait for it in the next collective. A rank whose launcher is gone (killed) removes the run's folder and ends itself."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np

from roam_cli.core.collectives import COLLECTIVES
from roam_cli.core.errors import CheckFailed, RoamError, first_line
from roam_cli.runtime import checkpoints, collectives
from roam_cli.runtime.execute import input_specs
from roam_cli.runtime.train import (PlannedSession, StepResult, batch_for, compare_with_plain, exported_values,
                                     read_batches, starting_values)

HEARTBEAT_S = 0.5
EXIT_CODES = {"usage": 2, "check": 1, "internal": 3}  # the CLI's, by what stopped the rank


class Reporter:
    """This rank's files in the run's folder (see the module's doc)."""

    def __init__(self, folder: Path, rank: int, launcher: int, lifeline: str):
        self.folder, self.rank, self.launcher = folder, rank, launcher
        # held open until this process ends: the launcher sees it close as this rank dies (ranks.Run).
        # It becomes fd 0 (stdin, unread): a dying process closes its files from fd 0 up, so it closes
        # before the socket through which mpiexec hears of the death and ends the other ranks
        line = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        line.connect("\0" + lifeline)
        line.sendall(f"{rank}\n".encode())
        os.dup2(line.fileno(), 0)
        line.close()
        self.phase = "start"
        self.lock = threading.Lock()  # the thread's beat and the phase's
        self.steps = open(folder / f"rank{rank}.steps", "a")
        self.beat()
        threading.Thread(target=self.beat_forever, daemon=True).start()

    def write(self, name: str, text: str) -> None:
        """FOLDER/name, whole or not at all (the launcher reads it any time)."""
        part = self.folder / f".{name}.part"
        part.write_text(text)
        os.replace(part, self.folder / name)

    def beat(self) -> None:
        p = collectives.progress
        with self.lock:
            self.write(f"rank{self.rank}.status", json.dumps({"pid": os.getpid(), "time": time.time(),
                                                              "phase": self.phase, "entered": p.entered, "left": p.left}))

    def begin(self, phase: str) -> None:
        """This rank is now in `phase`: "planned" (its steps), "plain" (--compare's), "gather"."""
        self.phase = phase
        self.beat()

    def beat_forever(self) -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            try:
                os.kill(self.launcher, 0)
            except ProcessLookupError:  # nobody would end this run nor clean up after it: this rank does both
                shutil.rmtree(self.folder, ignore_errors=True)  # (mpiexec then ends the others)
                os._exit(1)
            self.beat()

    def step_done(self, phase: str, result: StepResult) -> None:
        self.steps.write(json.dumps({"phase": phase, "step": result.number, "seconds": result.seconds,
                                     "outputs": {n: v.tolist() for n, v in result.outputs.items() if v.size == 1},
                                     "memory": result.memory}) + "\n")
        self.steps.flush()

    def done(self, figures: dict) -> None:
        self.write(f"rank{self.rank}.json", json.dumps(figures))

    def failed(self, e: Exception) -> int:
        """What stopped this rank, written down; returns the exit code it calls for."""
        kind = "usage" if isinstance(e, RoamError) else "check" if isinstance(e, CheckFailed) else "internal"
        message = str(e).splitlines()[0] if kind != "internal" else f"{type(e).__name__}: {first_line(e)}"
        self.write(f"rank{self.rank}.error", json.dumps({"kind": kind, "message": message}))
        return EXIT_CODES[kind]


def run(job: dict, comm, reporter: Reporter, folder: Path) -> dict:
    collectives.use(comm)
    model_path, plan, rank = Path(job["model"]), job["plan"], comm.rank
    session = PlannedSession(model_path, plan, allocator=job["allocator"], seed=job["seed"],
                             allow_unplanned=job["allow_unplanned"], collective=True, threads=job["threads"])
    try:
        layout = session.sharding
        # the whole step's inputs, in the rank step's order: the values drawn for them are the ones a
        # single process running the whole step draws
        specs = [(name, dtype, layout.full_shape(name, tuple(shape))) for name, dtype, shape in input_specs(session.graph)]
        shapes = {name: shape for name, _, shape in specs}
        inputs = Path(job["inputs"]) if job["inputs"] else None
        arrays = read_batches(inputs, session, specs, job["shuffle"], job["seed"])
        exported, unread = exported_values(session, arrays)
        kinds = ({t["name"]: t["kind"] for t in plan["tensors"]} | {p: "parameter" for p in layout.parameters}
                 | {s: "optimizer_state" for s in layout.state})
        start, synthesised = starting_values(session, {**exported, **arrays}, job["seed"], job["learning_rate"], kinds,
                                             specs)
        mine = {name: layout.of_rank(name, value, rank) for name, value in start.items()}
        checkpointing, first = None, 1
        if job["checkpoint"]:
            c = job["checkpoint"]
            whole = {name: [dtype, list(shape)] for name, dtype, shape in specs}
            checkpointing = checkpoints.Checkpointing(
                checkpoints.Options(Path(c["folder"]), c["every"], c["keep"], False), checkpoints.Run(*c["run"]),
                inputs=whole, layout=layout, comm=comm)
            if c["resume"]:  # the launcher chose it (its checksums hold): this rank's part, re-sharded if need be
                found = checkpoints.Checkpoint(c["resume"]["step"], Path(c["resume"]["folder"]), c["resume"]["manifest"])
                mine, first = {**mine, **found.state(whole, layout, rank)}, found.step + 1
        session.set_state(mine)
        session.steps = first - 1  # the run's step numbers: a resumed run goes on from its checkpoint's

        def batch_of(k: int, s: PlannedSession) -> dict[str, np.ndarray]:
            return {name: layout.of_rank(name, v, rank) for name, v in batch_for(k, start, arrays, s, shapes).items()}

        reporter.begin("planned")
        rows = []
        for k in range(first, job["steps"] + 1):
            rows.append(session.step(batch_of(k, session)))
            if checkpointing:
                checkpointing.after(k, job["steps"], session.state_arrays)
            reporter.step_done("planned", rows[-1])
        figures = {"rank": rank, "pid": os.getpid(), "synthesised_inputs": synthesised,
                   "weights_from": str(session.source.path) if exported else None, "weights_unread": unread,
                   "arena": session.arena.layout if session.arena else None,
                   "collective_outputs": collective_outputs(session),
                   "per_step": [{"step": r.number, "seconds": r.seconds, "memory": r.memory} for r in rows]}
        if job["compare"]:
            reporter.begin("plain")
            figures["compare"] = compare_with_plain(model_path, plan, mine, batch_of, rows, session, "cpu", job["seed"],
                                                    collective=True, threads=job["threads"],
                                                    on_step=lambda r: reporter.step_done("plain", r))
        reporter.begin("gather")
        trained = [n for n in session.state_names if kinds.get(n) == "parameter" or n in exported]
        whole = gathered(comm, session.state_arrays(), trained, layout)
        if rank == 0:
            np.savez(folder / "weights.npz", **whole)
        return figures
    finally:
        session.close()


def collective_outputs(session: PlannedSession) -> dict | None:
    """The collectives' outputs the plan places, and those roam's allocator serves at their plan offsets
    (None without it)."""
    arena = session.arena
    if arena is None or arena.planned is None:
        return None
    made = {n.name for n in session.graph.nodes if (n.domain, n.op_type) in COLLECTIVES}
    planned = [t.name for t in arena.planned if t.node in made]
    served = [arena.planned[m].name for k, m in enumerate(arena.matched) if arena.at_offset(k) and arena.planned[m].node in made]
    return {"planned": planned, "at_plan_offset": served}


def gathered(comm, state: dict[str, np.ndarray], names: list[str], layout) -> dict[str, np.ndarray]:
    """On rank 0, each of `names` whole: a sharded one from every rank's shard (MPI_Gather), a
    replicated one as rank 0 holds it; on the others, {}."""
    whole = {}
    for name in names:  # every rank gathers in this one order
        value = np.ascontiguousarray(state[name])
        if layout.sharded(name) is None:
            whole[name] = value
            continue
        buffer = np.empty(value.size * comm.size, value.dtype) if comm.rank == 0 else None
        comm.Gather(value, buffer, root=0)
        if comm.rank == 0:
            whole[name] = layout.whole(name, np.split(buffer, comm.size))
    return whole if comm.rank == 0 else {}


def main(folder: str) -> None:
    folder = Path(folder)
    job = json.loads((folder / "job.json").read_text())
    # mpiexec (hydra) names the rank before MPI starts: a rank that dies while MPI starts is named too
    reporter = Reporter(folder, int(os.environ.get("PMI_RANK", "0")), job["launcher"], job["lifeline"])
    comm = None
    try:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        figures = run(job, comm, reporter, folder)
    except Exception as e:
        code = reporter.failed(e)
        if comm is not None:
            comm.Abort(code)
        os._exit(code)
    reporter.done(figures)


if __name__ == "__main__":
    main(sys.argv[1])
