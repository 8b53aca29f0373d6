"""The hostile sweep's cases: what a hostile user does to the commands, and what roam must then do.

Every case runs `roam ARGV` in a folder holding a fresh copy of the sweep's fixtures (hostile_sweep.py
builds them: an inference export, with and without external data, the steps roam makes of it, their
plans, a batch). A case may first spoil a file there (`setup`), mount a full or read-only file system
at `small/`, or signal a process while it runs. `exits` are the exit codes the contract allows,
`says` what the one line on stderr must say; every case is also held to the contract that
hostile_sweep.check states (no traceback, every file there before unchanged, nothing left behind,
no process left). `defect` is the item of issue 48 the case reproduces."""

from __future__ import annotations

import json
import os
import pickle
import random
import signal
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Signal:
    """Send `signum` to `target` ("roam", "rank R" or "mpiexec") once `when` holds: "step K" (every rank,
    or the one process, finished K steps), "start" (the target rank has started), or seconds after launch."""
    target: str
    signum: int
    when: str | float


@dataclass(frozen=True)
class Case:
    kind: str
    name: str
    argv: tuple[str, ...]
    exits: tuple[int, ...] = (2,)
    says: str = ""
    defect: int | None = None
    setup: Callable[[Path], None] | None = field(default=None, compare=False)
    mount: str | None = None  # a tmpfs at small/: "full" (no byte free), "small" (SMALL_FS) or "read-only"
    signal: Signal | None = None
    needs: str | None = None  # "mpi": the case launches ranks
    then: tuple[tuple[str, ...], ...] = ()  # commands that must then succeed on what it wrote


SMALL_FS = 1 << 20  # the small file system: the trained weights fit (548 KiB), the model beside them does not

# the commands, each with the inputs a hostile user spoils and the outputs they aim elsewhere
STEP = ("step.onnx", "--plan", "plan.json")
COMMANDS = {
    "make-training-graph": ("make-training-graph", "export.onnx", "-o", "out.onnx", "--loss", "cross-entropy",
                            "--in-graph-optimizer", "--dim", "batch=2"),
    "make-training-graph --precision": ("make-training-graph", "export.onnx", "-o", "out.onnx", "--loss",
                                        "cross-entropy", "--in-graph-optimizer", "--dim", "batch=2", "--precision",
                                        "bf16"),
    "optimize": ("optimize", "step.onnx", "-o", "out.json", "--annotated-model", "out.onnx"),
    "optimize --offload": ("optimize", "step.onnx", "-o", "out.json", "--offload", "host", "--budget", "3MiB",
                           "--device", "pcie-gen5-gpu"),
    "verify": ("verify", "step.onnx", "plan.json"),
    "emulate": ("emulate", "bf16.onnx", "-o", "out.onnx"),
    "shard": ("shard", "step.onnx", "--ranks", "2", "-o", "out.onnx"),
    "train": ("train", *STEP, "--steps", "2", "--save-weights", "out.safetensors", "--save-model", "out.onnx"),
    "train --ranks": ("train", "rank.onnx", "--plan", "rank_plan.json", "--ranks", "2", "--steps", "2",
                      "--save-weights", "out.npz"),
    "remat": ("remat", "remat.graph.json", "--budget-fraction", "0.8", "-o", "out.json"),
    "lower": ("lower", "training_model.onnx", "-o", "out.onnx"),
    "gradcheck": ("gradcheck", "step.onnx"),
    "report": ("report", "plan.json"),
    "execute": ("execute", *STEP),
}
# what each command reads (the files a corrupt-file case spoils)
READS = {
    "make-training-graph": ["export.onnx"], "make-training-graph --precision": ["export_ext.onnx.data"],
    "optimize": ["step.onnx"], "optimize --offload": ["step.onnx"], "verify": ["step.onnx", "plan.json"],
    "emulate": ["bf16.onnx"], "shard": ["step.onnx"], "train": ["step.onnx", "plan.json", "inputs.npz"],
    "train --ranks": ["rank.onnx", "rank_plan.json"], "remat": ["remat.graph.json"], "lower": ["training_model.onnx"],
    "gradcheck": ["step.onnx"], "report": ["plan.json"], "execute": ["plan.json"],
}


def argv_of(command: str, *extra: str, replace: dict[str, str] | None = None) -> tuple[str, ...]:
    """The command's arguments with `replace`'s files swapped in (and `inputs.npz` given where the
    command reads it), then `extra`."""
    argv = list(COMMANDS[command])
    if command == "make-training-graph --precision":
        argv[1] = "export_ext.onnx"
    if command.startswith("train") and "inputs.npz" not in argv:
        argv += ["--inputs", "inputs.npz" if command == "train" else "rank_inputs.npz"]
    return tuple((replace or {}).get(a, a) for a in argv) + extra


# ---- spoiled files ---------------------------------------------------------------------------------

def spoil(name: str, how: str) -> Callable[[Path], None]:
    def setup(folder: Path) -> None:
        path = folder / name
        data = path.read_bytes()
        rng = random.Random(f"{name}/{how}")
        if how == "missing":
            path.unlink()
        elif how == "empty":
            path.write_bytes(b"")
        elif how == "truncated":
            path.write_bytes(data[:len(data) // 2])
        elif how == "garbage":
            path.write_bytes(rng.randbytes(len(data)))
        elif how == "bytes flipped":
            spoilt = bytearray(data)
            for i in rng.sample(range(len(data)), 16):
                spoilt[i] ^= 0xFF
            path.write_bytes(bytes(spoilt))
        elif how == "a folder":
            path.unlink()
            path.mkdir()
        elif how == "another format":
            path.write_text(json.dumps({"nodes": []}) if path.suffix != ".json" else "ir_version: 10\n")
    return setup


CORRUPTIONS = ["missing", "empty", "truncated", "garbage", "bytes flipped", "a folder", "another format"]


def corrupt_files() -> list[Case]:
    cases = []
    for command, files in READS.items():
        for name in files:
            for how in CORRUPTIONS:
                # flipped bytes may leave a file that still reads: it then works, or the check fails (exit 1)
                exits = (0, 1, 2) if how == "bytes flipped" else (1, 2) if command == "verify" else (2,)
                says = ""
                if name.endswith(".data") and how in ("missing", "garbage"):
                    # the weights are not read to make a step: absent, its constants become inputs (warned);
                    # garbage of the right length cannot be told from weights
                    exits, says = ((0,), "absent external data") if how == "missing" else ((0, 2), "")
                cases.append(Case("corrupt file", f"{command}: {name} {how}", argv_of(command), exits, says=says,
                                  setup=spoil(name, how), needs="mpi" if "--ranks" in command else None))
    return cases


# ---- outputs aimed at inputs and at each other -----------------------------------------------------

def link(target: str, name: str, hard: bool = False) -> Callable[[Path], None]:
    def setup(folder: Path) -> None:
        (os.link if hard else os.symlink)(folder / target if hard else target, folder / name)
    return setup


def subfolder(folder: Path) -> None:
    (folder / "sub").mkdir()


EXTERNAL = {"make-training-graph": {"export.onnx": "export_ext.onnx"}, "emulate": {"bf16.onnx": "bf16_ext.onnx"},
            "shard": {"step.onnx": "step_ext.onnx"}}  # the command reading the model with its weights in a .data file
ALIASES = [  # command, output option's value to replace, what it is aimed at, the defect it was
    ("make-training-graph", "out.onnx", "export.onnx", None), ("make-training-graph", "out.onnx", "export_ext.onnx.data", 1),
    ("make-training-graph --precision", "out.onnx", "export_ext.onnx.data", 1),
    ("make-training-graph --precision", "out.onnx", "export_ext.onnx", None),
    ("emulate", "out.onnx", "bf16.onnx", None), ("emulate", "out.onnx", "bf16_ext.onnx.data", 1),
    ("shard", "out.onnx", "step.onnx", None), ("shard", "out.onnx", "step_ext.onnx.data", 1),
    ("shard", "out.onnx", "export.onnx", None), ("shard", "out.onnx", "export_ext.onnx.data", None),
    ("optimize", "out.json", "step.onnx", None), ("optimize", "out.onnx", "step.onnx", None),
    ("optimize", "out.onnx", "out.json", 16), ("optimize", "out.json", "export.onnx", None),
    ("optimize --offload", "out.json", "step.onnx", None),
    ("train", "out.onnx", "export.onnx", 2), ("train", "out.safetensors", "export.onnx", 2),
    ("train", "out.safetensors", "inputs.npz", 3), ("train", "out.onnx", "inputs.npz", 3),
    ("train", "out.safetensors", "out.onnx", None), ("train", "out.safetensors", "plan.json", None),
    ("train", "out.onnx", "step.onnx", None),
    ("train --ranks", "out.npz", "rank_inputs.npz", 3), ("train --ranks", "out.npz", "rank_plan.json", None),
    ("train --ranks", "out.npz", "export.onnx", 2),
    ("remat", "out.json", "remat.graph.json", None), ("lower", "out.onnx", "training_model.onnx", None),
]


def aliased_outputs() -> list[Case]:
    cases = []
    for command, output, aimed, defect in ALIASES:
        mpi = "mpi" if "--ranks" in command else None
        spelled = {"as named": (aimed, None), "through a link": ("link_to_input", link(aimed, "link_to_input")),
                   "through a hard link": ("hard_link", link(aimed, "hard_link", hard=True)),
                   "as sub/../": (f"sub/../{aimed}", subfolder)}
        for way, (name, setup) in spelled.items():
            if way != "as named" and (defect is not None or aimed.startswith("out.")):
                continue  # the ways round are the plain aims' (a defect's case stays as it was reported)
            reads = EXTERNAL.get(command, {}) if aimed.endswith(".data") and command != "shard" or \
                aimed == "step_ext.onnx.data" else {}
            if command == "shard" and aimed == "export_ext.onnx.data":
                reads = {"step.onnx": "step_from_ext.onnx"}  # the step whose weights are that export's
            cases.append(Case("aliased output", f"{command}: {output} aimed at {aimed} {way}",
                              argv_of(command, replace={output: name, **reads}), says="same file as", defect=defect,
                              setup=setup, needs=mpi))
    # written into another folder, a model's data is found from there, by ONNX Runtime too (defect 5)
    cases.append(Case("aliased output", "emulate of a model with external data into another folder",
                      ("emulate", "bf16_ext.onnx", "-o", "sub/out.onnx"), exits=(0,), defect=5, setup=subfolder,
                      then=(("optimize", "sub/out.onnx", "-o", "sub/plan.json"),
                            ("train", "sub/out.onnx", "--plan", "sub/plan.json", "--steps", "1"))))
    cases.append(Case("aliased output", "shard of a step with external data into another folder",
                      ("shard", "step_ext.onnx", "--ranks", "2", "-o", "sub/out.onnx"), exits=(0,), defect=5,
                      setup=subfolder, needs="mpi",
                      then=(("optimize", "sub/out.onnx", "-o", "sub/plan.json"),
                            ("train", "sub/out.onnx", "--plan", "sub/plan.json", "--ranks", "2", "--steps", "1"))))
    for command in ("make-training-graph", "optimize", "emulate", "shard", "train", "remat", "lower"):
        output = "out.json" if command in ("optimize", "remat") else "out.safetensors" if command == "train" else "out.onnx"
        cases.append(Case("aliased output", f"{command}: {output} is a folder", argv_of(command, replace={output: "sub"}),
                          says="it is a directory", setup=subfolder))
        cases.append(Case("aliased output", f"{command}: {output} in a folder that does not exist",
                          argv_of(command, replace={output: f"nowhere/{output}"}), says="nowhere"))
    return cases


# ---- values ----------------------------------------------------------------------------------------

def write_npz_member_not_an_array(folder: Path) -> None:
    with zipfile.ZipFile(folder / "inputs.npz", "w") as z:
        z.writestr("input_ids.txt", b"not an array")


def write_pickled(folder: Path) -> None:
    np.savez(folder / "inputs.npz", input_ids=np.array([{"a": 1}], dtype=object))


def write_pickle_file(folder: Path) -> None:
    (folder / "inputs.npz").write_bytes(pickle.dumps({"input_ids": [1, 2]}))


def write_inputs(**arrays) -> Callable[[Path], None]:
    def setup(folder: Path) -> None:
        np.savez(folder / "inputs.npz", **{**dict(np.load(folder / "inputs.npz")), **arrays})
    return setup


def weights_with(value: float) -> Callable[[Path], None]:
    def setup(folder: Path) -> None:
        w = np.full((64, 64), value, np.float32)
        write_inputs(**{"transformer.wpe.weight": w})(folder)
    return setup


def checkpointed(folder: Path) -> None:
    """ck/ holding the checkpoints of a 2-step run of the step (seed 0): step-1 and step-2."""
    subprocess.run([sys.executable, "-m", "roam_cli", "-q", "train", *STEP, "--steps", "2", "--checkpoint-dir", "ck",
                    "--checkpoint-every", "1"], cwd=folder, check=True, capture_output=True)


def checkpointed_then_corrupt(folder: Path) -> None:
    checkpointed(folder)
    state = folder / "ck" / "step-2" / "rank0.npz"
    state.write_bytes(state.read_bytes()[:1000])


def values() -> list[Case]:
    train, ranks = argv_of("train"), argv_of("train --ranks")
    cases = [Case("bad value", f"make-training-graph --optimizer-setting {s}",
                  argv_of("make-training-graph", "--optimizer-setting", s), says=said, defect=d)
             for s, said, d in [("beta1=nan", "beta1", 6), ("eps=-1", "eps", 6), ("beta1=7", "beta1", 6),
                                ("weight_decay=-5", "weight_decay", 6), ("beta2=inf", "beta2", 6),
                                ("beta1=1", "beta1", None), ("eps=abc", "eps", None), ("nosuch=1", "nosuch", None),
                                ("beta1", "beta1", None)]]
    cases += [Case("bad value", f"train --ranks 2 {o} {v}", ranks + (o, v), says=o.lstrip("-"), defect=d, needs="mpi")
              for o, v, d in [("--timeout", "nan", 8), ("--timeout", "inf", 8), ("--timeout", "0", None),
                              ("--timeout", "-1", None), ("--start-timeout", "nan", 9), ("--start-timeout", "0", None)]]
    cases += [Case("bad value", f"train {o} {v}", argv_of("train", o, v), says=o.lstrip("-"))
              for o, v in [("--steps", "0"), ("--steps", "-3"), ("--steps", "x"), ("--learning-rate", "nan"),
                           ("--learning-rate", "inf"), ("--provider", "tpu"), ("--allocator", "mine"), ("--ranks", "0")]]
    cases += [Case("bad value", "train --ranks 3 of a 2-rank step", argv_of("train --ranks", replace={"2": "3"}),
                   says="2", needs="mpi"),
              Case("bad value", "train of a rank step without --ranks",
                   ("train", "rank.onnx", "--plan", "rank_plan.json", "--steps", "2"), says="--ranks"),
              Case("bad value", "train of the whole step with --ranks 2",
                   ("train", "step.onnx", "--plan", "plan.json", "--ranks", "2", "--steps", "2"), says="rank", needs="mpi"),
              Case("bad value", "train with another step's plan", ("train", "step.onnx", "--plan", "rank_plan.json"),
                   exits=(1, 2)),
              Case("bad value", "train --plan a folder", ("train", "step.onnx", "--plan", "sub"), says="a directory",
                   defect=16, setup=subfolder),
              Case("bad value", "verify with another step's plan", ("verify", "step.onnx", "rank_plan.json"), exits=(1, 2)),
              Case("bad value", "train --inputs whose member is not an array", train, says="not an array", defect=7,
                   setup=write_npz_member_not_an_array),
              Case("bad value", "train --inputs holding Python objects", train, says="python objects", defect=7,
                   setup=write_pickled),
              Case("bad value", "train --inputs that is a pickle", train, says="not an .npz", defect=16,
                   setup=write_pickle_file),
              Case("bad value", "train --inputs with input_ids of another shape", train, says="input_ids",
                   setup=write_inputs(input_ids=np.zeros((3, 7), np.int64))),
              Case("bad value", "train --inputs with input_ids of floats", train, says="input_ids",
                   setup=write_inputs(input_ids=np.zeros((2, 32), np.float32))),
              Case("bad value", "train --inputs with token ids past the vocabulary", train, says="out of data bounds",
                   setup=write_inputs(input_ids=np.full((2, 32), 10**6, np.int64))),
              Case("bad value", "train --inputs with NaN weights", train, exits=(0,), says="nan", defect=17,
                   setup=weights_with(float("nan"))),
              Case("bad value", "train --inputs with infinite weights", train, exits=(0,), says="inf", defect=17,
                   setup=weights_with(float("inf")))]
    mtg = argv_of("make-training-graph")
    cases += [Case("bad value", f"make-training-graph {o} {v}", mtg[:-2] + (o, v) if o == "--dim" else mtg + (o, v),
                   says=said)
              for o, v, said in [("--dim", "batch=0", "batch"), ("--dim", "batch=-2", "batch"), ("--dim", "batch=x", "batch"),
                                 ("--dim", "nosuch=2", "nosuch"), ("--dim", "batch", "batch"), ("--loss", "nosuch", "loss"),
                                 ("--precision", "fp8", "precision")]]
    opt = argv_of("optimize")
    cases += [Case("bad value", f"optimize {' '.join(extra)}", opt + extra, says=said)
              for extra, said in [(("--budget", "-1MiB"), "budget"), (("--budget", "3XB"), "budget"),
                                  (("--recompute", "budget"), "budget"), (("--gap", "nan"), "gap"),
                                  (("--gap", "-1"), "gap"), (("--time-limit", "nan"), "time-limit"),
                                  (("--time-limit", "0"), "time-limit"), (("--jobs", "0"), "jobs"),
                                  (("--offload", "tape"), "offload"),
                                  (("--offload", "host", "--budget", "3MiB", "--device", "abacus"), "device"),
                                  (("--recompute", "everything"), "recompute")]]
    cases += [Case("bad value", f"shard --ranks {v}", argv_of("shard", replace={"2": v}), says="ranks")
              for v in ("0", "-2", "x")]
    cases += [Case("bad value", f"remat --budget-fraction {v}", argv_of("remat", replace={"0.8": v}), says="budget")
              for v in ("0", "-1", "nan", "inf")]
    cases += [
        Case("wrong model", "shard of a training graph without its optimizer", ("shard", "graph.onnx", "--ranks", "2", "-o",
             "out.onnx"), says="updates no parameter", defect=13),
        Case("wrong model", "shard of an inference export", ("shard", "export.onnx", "--ranks", "2", "-o", "out.onnx"),
             says="updates no parameter", defect=13),
        Case("wrong model", "shard of an fp16 step", ("shard", "fp16.onnx", "--ranks", "2", "-o", "out.onnx"),
             says="overflow", defect=14),
        Case("wrong model", "shard of a rank step", ("shard", "rank.onnx", "--ranks", "2", "-o", "out.onnx"), says="rank"),
        Case("wrong model", "emulate of a rank step", ("emulate", "rank.onnx", "-o", "out.onnx"), says="", defect=15),
        Case("wrong model", "emulate of a float32 step", ("emulate", "step.onnx", "-o", "out.onnx"),
             says="nothing to emulate", defect=15),
        Case("wrong model", "emulate of a float32 graph with a custom op", ("emulate", "custom_op.onnx", "-o", "out.onnx"),
             says="", defect=15),
        Case("wrong model", "emulate of an invalid bf16 model (MatMul at opset 11)",
             ("emulate", "bad_opset.onnx", "-o", "out.onnx"), says="not a valid onnx model", defect=15),
        Case("wrong model", "train --save-model of a step whose export is gone",
             ("train", *STEP, "--steps", "2", "--save-model", "out.onnx"), says="export", setup=spoil("export.onnx", "missing")),
        Case("wrong model", "train of a step whose export is gone (weights synthesised, warned)",
             ("train", *STEP, "--steps", "2"), exits=(0,), says="synthes", setup=spoil("export.onnx", "missing")),
        Case("wrong model", "make-training-graph of a training step", ("make-training-graph", "step.onnx", "-o", "out.onnx",
             "--loss", "cross-entropy", "--in-graph-optimizer"), exits=(0, 2)),
        Case("wrong model", "optimize of a plan", ("optimize", "plan.json", "-o", "out.json"), says="plan.json"),
        Case("wrong model", "train --resume from a checkpoint of another seed",
             ("train", *STEP, "--steps", "3", "--checkpoint-dir", "ck", "--resume", "--seed", "1"),
             says="is not of this run", setup=checkpointed),
        Case("wrong model", "train --resume past a corrupt newest checkpoint",
             ("train", *STEP, "--steps", "3", "--checkpoint-dir", "ck", "--resume"), exits=(0,),
             says="passed over: step-2", setup=checkpointed_then_corrupt),
        Case("bad value", "train --checkpoint-dir that is a file", ("train", *STEP, "--checkpoint-dir", "plan.json"),
             says="not a directory"),
        Case("bad value", "train --resume without --checkpoint-dir", ("train", *STEP, "--resume"), says="--checkpoint-dir"),
    ]
    return cases


# ---- full and read-only file systems ---------------------------------------------------------------

FS_WRITES = [("make-training-graph", "out.onnx"), ("optimize", "out.json"), ("emulate", "out.onnx"),
             ("shard", "out.onnx"), ("lower", "out.onnx"), ("train", "out.onnx"), ("train --ranks", "out.npz"),
             ("remat", "out.json"), ("train", "ck"), ("train --ranks", "ck")]


def file_systems() -> list[Case]:
    cases = []
    for mount, said in (("full", "no space left"), ("read-only", "read-only file system")):
        for command, output in FS_WRITES:
            replace = {output: f"small/{output}"}
            if output == "ck":  # checkpoints there (the weights elsewhere): exit 1, the run's state not kept
                argv = (("train", *STEP) if command == "train" else RANKS_ARGV) + ("--steps", "2", "--checkpoint-dir",
                                                                                    "small/ck")
                cases.append(Case("file system", f"{command}: checkpoints on a {mount} file system", argv, exits=(1, 2),
                                  says=said, mount=mount, needs="mpi" if "--ranks" in command else None))
                continue
            if command == "train":  # both outputs there: the weights fit a full one, the model does not
                replace["out.safetensors"] = "small/out.safetensors"
            small = mount == "full" and command == "train"  # the weights written, then no room for the model
            cases.append(Case("file system", f"{command}: {output} on a {'1 MiB' if small else mount} file system",
                              argv_of(command, replace=replace), says=said,
                              defect=4 if small else 16 if mount == "read-only" else None,
                              mount="small" if small else mount, needs="mpi" if "--ranks" in command else None))
    return cases


# ---- signals ---------------------------------------------------------------------------------------

LONG = {"optimize": ("optimize", "step.onnx", "-o", "out.json", "--annotated-model", "out.onnx", "--recompute", "free",
                     "--gap", "0", "--order", "ilp-global", "--time-limit", "20"),
        "train": ("train", *STEP, "--steps", "100000", "--save-weights", "out.safetensors"),
        "make-training-graph": COMMANDS["make-training-graph"], "emulate": COMMANDS["emulate"],
        "shard": COMMANDS["shard"], "remat": ("remat", "remat.graph.json", "--budget-fraction", "0.5", "-o", "out.json",
                                               "--time-limit", "20")}
RANKS_ARGV = ("train", "rank.onnx", "--plan", "rank_plan.json", "--ranks", "2")
RANKS_LONG = (*RANKS_ARGV, "--steps", "100000", "--timeout", "3", "--start-timeout", "5", "--save-weights", "out.npz")
RANKS4_LONG = ("train", "rank4.onnx", "--plan", "rank4_plan.json", "--ranks", "4", "--steps", "100000", "--timeout", "30",
               "--save-weights", "out.npz")


def signals() -> list[Case]:
    rng = random.Random(48)
    cases = []
    for command, argv in LONG.items():
        # from 0.3 s: before, the interpreter itself starts (site hooks: no program handles a signal there)
        moments = [rng.uniform(0.3, 3.0) for _ in range(3 if command in ("optimize", "train") else 1)]
        for sig, code, said in ((signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")):
            for s in moments:
                cases.append(Case("signal", f"{command}: {sig.name} after {s:.2f} s", argv, exits=(0, code), says=said,
                                  signal=Signal("roam", sig, round(s, 2))))
    K, S = signal.SIGKILL, signal.SIGSTOP
    for target, sig, when, code, said, defect in [
            ("rank 0", K, "step 3", 1, "rank 0 died in step", None), ("rank 1", K, "step 3", 1, "rank 1 died in step", None),
            ("rank 1", K, "start", 1, "died while starting", 11), ("rank 0", S, "step 3", 1, "rank 0 hung", None),
            ("rank 1", S, "start", 1, "rank 1 hung while starting", 9),
            ("mpiexec", K, "step 3", 1, "mpiexec was killed by signal 9", 11),
            ("mpiexec", S, "step 3", 1, "mpiexec is stopped", 11),
            ("roam", signal.SIGINT, "step 3", 130, "interrupted", None),
            ("roam", signal.SIGTERM, "step 3", 143, "terminated", 12),
            ("roam", signal.SIGTERM, "start", 143, "terminated", 12),
            ("roam", K, "step 3", -9, "", None)]:
        cases.append(Case("signal", f"train --ranks 2: {sig.name} to {target} at {when}", RANKS_LONG, exits=(code,),
                          says=said, defect=defect, signal=Signal(target, sig, when), needs="mpi"))
    for r in (1, 2, 3):
        cases.append(Case("signal", f"train --ranks 4: SIGKILL to rank {r} at step 3", RANKS4_LONG, exits=(1,),
                          says=f"rank {r} died in step", defect=10, signal=Signal(f"rank {r}", K, "step 3"), needs="mpi"))
    for target, sig, said in (("rank 1", K, "rank 1 died in step"), ("rank 0", S, "rank 0 hung")):
        # under --restarts the run goes on from its newest checkpoint, and ends
        cases.append(Case("signal", f"train --ranks 2 --restarts 1: {sig.name} to {target} at step 3",
                          (*RANKS_ARGV, "--steps", "20", "--timeout", "3", "--checkpoint-dir", "ck",
                           "--checkpoint-every", "2", "--restarts", "1", "--save-weights", "out.npz"), exits=(0,),
                          says=f"{said}", signal=Signal(target, sig, "step 3"), needs="mpi"))
    return cases


def all_cases() -> list[Case]:
    return corrupt_files() + aliased_outputs() + values() + file_systems() + signals()
