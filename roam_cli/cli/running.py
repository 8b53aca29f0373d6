"""`roam execute` and `train`: a plan run on ONNX Runtime."""

import json
from pathlib import Path

import click

from roam_cli.cli import RATE, SECONDS, Progress, cli, out
from roam_cli.core import plan as plan_io
from roam_cli.core.errors import CheckFailed, RoamError
from roam_cli.core.fileio import check_output_folder, check_outputs
from roam_cli.runtime import checkpoints, progress


@cli.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--plan", "plan_path", required=True, type=click.Path(path_type=Path), help="Plan JSON made for MODEL.")
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="ONNX Runtime execution provider.")
@click.option("--inputs", "inputs_path", type=click.Path(path_type=Path),
              help="Feeds: an .npz with one array per graph input; inputs it lacks are synthesised.")
@click.option("--seed", default=0, show_default=True, type=int,
              help="Seed of the synthetic inputs and of random ops (Dropout) that have none.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.pass_obj
def execute(obj, model, plan_path, provider, inputs_path, seed, as_json):
    """Run MODEL on ONNX Runtime as the plan says, and check that the plan can be followed.
    MODEL is either file of the plan's pair: the model optimize read or the annotated model it wrote.

    One training step of the annotated model with execution_order PRIORITY_BASED (the order
    ORT ran the nodes in, from its profiler, against the plan's), and the arena replay: every
    node in plan order in one buffer of arena_bytes, each tensor bound at its planned offset.
    Both are compared with a plain ORT run of MODEL. Also reports ORT's own arena bytes for
    the original and the planned order. Exit 1 when under 99.9% of node pairs ran in plan
    order or a result differs by more than 1e-5 relative.

    \b
    Examples:
      roam execute training_model.onnx --plan plan.json
      roam execute training_model.onnx --plan plan.json --provider cuda --inputs batch.npz --json
    """
    from roam_cli.runtime.execute import execute_plan, render

    plan = plan_io.read(plan_path)
    with Progress(obj["quiet"]) as progress:
        result = execute_plan(model, plan, provider, inputs_path, seed, progress)
    if as_json:
        click.echo(json.dumps(result, indent=1))
    elif not obj["quiet"]:
        render(result, out)
    if result["failures"]:
        more = f" (and {len(result['failures']) - 1} more)" if len(result["failures"]) > 1 else ""
        raise CheckFailed(result["failures"][0] + more)


@cli.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--plan", "plan_path", required=True, type=click.Path(path_type=Path), help="Plan JSON made for MODEL.")
@click.option("--steps", default=20, show_default=True, type=int, help="Training steps to run.")
@click.option("--inputs", "inputs_path", type=click.Path(path_type=Path),
              help="An .npz by input name: starting state, and data (one batch, or [steps, ...] cycled); "
                   "or a folder of NAME.npy arrays (or NAME/ of .npy shards: examples along the first axis), "
                   "or a .bin file of uint16 token ids cut into windows, read a batch at a time. "
                   "What it lacks is synthesised, optimizer state starts at zero.")
@click.option("--shuffle", is_flag=True,
              help="With a folder or token file as --inputs: each epoch's examples in an order drawn from --seed.")
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="ONNX Runtime execution provider.")
@click.option("--allocator", type=click.Choice(["roam", "ort", "ort-same-as-requested"]), default="roam",
              show_default=True, help="roam: ORT's requests served from the plan's arena; ort: ORT's own arena.")
@click.option("--learning-rate", default=1e-3, show_default=True, type=RATE,
              help="The learning_rate input, when --inputs does not give it.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of synthetic inputs and of random ops.")
@click.option("--compare", is_flag=True,
              help="Run the same steps on a plain ORT session too and check outputs and final state (1e-5).")
@click.option("--allow-unplanned", is_flag=True,
              help="Serve requests the plan does not cover from the system and count them, instead of stopping.")
@click.option("--save-weights", "save_weights", type=click.Path(path_type=Path),
              help="Write the trained parameters under their PyTorch names (.safetensors or .npz): "
                   "model.load_state_dict(weights, strict=False) loads them.")
@click.option("--save-model", "save_model", type=click.Path(path_type=Path),
              help="Write the inference export the step was made from, with the trained weights.")
@click.option("--ranks", type=int, metavar="N",
              help="MODEL is the step of one of N ranks (roam shard): run it on N processes over MPI "
                   "(pip install mpich mpi4py onnxruntime-extensions), each with its shards and its rows of each batch.")
@click.option("--timeout", default=300.0, show_default=True, type=SECONDS,
              help="With --ranks: the longest a step may take on every rank (the first counts from when every rank "
                   "has started); past it the run is a hang, and every rank is stopped.")
@click.option("--start-timeout", default=120.0, show_default=True, type=SECONDS,
              help="With --ranks: the longest a rank may be silent while it starts (imports, MPI, building its "
                   "session: minutes on a large step); past it the rank is hung, and every rank is stopped.")
@click.option("--checkpoint-dir", "checkpoint_dir", type=click.Path(path_type=Path),
              help="Write checkpoints here as the run goes (step-K folders: the state and a manifest with checksums).")
@click.option("--checkpoint-every", default=100, show_default=True, type=click.IntRange(min=1), metavar="K",
              help="With --checkpoint-dir: a checkpoint every K steps, and after the last.")
@click.option("--checkpoint-keep", default=3, show_default=True, type=click.IntRange(min=1), metavar="N",
              help="With --checkpoint-dir: the newest N checkpoints are kept.")
@click.option("--resume", is_flag=True,
              help="Continue from the newest complete checkpoint in --checkpoint-dir (from step 1 when there is none) "
                   "to --steps in all: the result is bit for bit an uninterrupted run's.")
@click.option("--restarts", default=0, show_default=True, type=click.IntRange(min=0), metavar="R",
              help="With --ranks and --checkpoint-dir: a group that lost a rank (it died or hung) starts again from "
                   "the newest checkpoint, at most R times.")
@click.option("--log", "log_path", type=click.Path(path_type=Path),
              help="Append a JSON line per step to this file (step, time, seconds, outputs), flushed as it goes.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.pass_obj
def train(obj, model, plan_path, steps, inputs_path, provider, allocator, learning_rate, seed, compare,
          allow_unplanned, save_weights, save_model, ranks, timeout, start_timeout, checkpoint_dir, checkpoint_every,
          checkpoint_keep, resume, restarts, shuffle, log_path, as_json):
    """Run STEPS training steps of MODEL on ONNX Runtime as PLAN says. MODEL is either file of
    the plan's pair: the whole-step model optimize read (roam make-training-graph
    --in-graph-optimizer writes one) or the annotated model it wrote; both run the same graph.

    The pair is verified first: a plan that does not hold stops before step 1 (exit 1). Then
    the plan's order (PRIORITY_BASED), the state updated in place (each `<state>.out` output
    written into its input's buffer), and with --allocator roam ORT's own session allocating
    from the plan's arena: each request of step 1 is matched to the planned tensor it is, and
    every later step serves it at that tensor's plan offset. A request that leaves the plan
    stops the run (exit 1) unless --allow-unplanned, which serves it from the system and
    counts it. Prints the loss per step, the bytes ORT held and the plan's. Exit 1 with
    --compare when the planned run differs from the plain one by more than 1e-5 relative.

    A step roam made from an inference export starts from that export's weights (where it can be
    read; else they are synthesised, and a warning says so), and gives them
    back: --save-weights for PyTorch, --save-model as the export with the trained weights.

    With --ranks N, MODEL is a rank step (roam shard) and N processes run it under mpiexec, its
    collectives over MPI: rank r starts from its shard of every parameter and moment and reads rows
    [r*b, (r+1)*b) of each global batch; each step prints the mean of the ranks' losses, and the
    parameters are gathered whole at the end. A rank that dies or hangs (no step within --timeout)
    stops every rank: one line naming it, exit 1, nothing written.

    With --checkpoint-dir, the run's state (parameters, optimizer state, step counter, loss scale)
    is checkpointed every --checkpoint-every steps and after the last, each checkpoint written whole
    or not at all; --resume continues from the newest complete one (a corrupt or partial one is
    passed over, and said) to --steps in all, on the same step, seed and --inputs (another run's
    checkpoint is refused). A run killed at any moment and resumed ends with the parameters of a run
    never interrupted, bit for bit. A resumed run that has nothing left to run gives its weights
    back all the same (--save-weights, --save-model). With --ranks each rank writes its shards, and
    a checkpoint resumes on another number of ranks (re-sharded) or on one process; --restarts R
    starts a group that lost a rank again from its newest checkpoint, at most R times.

    \b
    Examples:
      roam train step.onnx --plan plan.json --steps 20
      roam train step.onnx --plan plan.json --inputs batches.npz --compare --json
      roam train step.onnx --plan plan.json --allow-unplanned
      roam train step.onnx --plan plan.json --steps 100 --save-weights trained.safetensors --save-model trained.onnx
      roam train rank_step.onnx --plan rank_plan.json --ranks 4 --steps 20 --compare
      roam train step.onnx --plan plan.json --steps 10000 --checkpoint-dir ckpt --checkpoint-every 500 --resume
      roam train rank_step.onnx --plan rank_plan.json --ranks 4 --steps 10000 --checkpoint-dir ckpt --restarts 3
    """
    from roam_cli.runtime.train import RTOL, render_step, render_summary
    from roam_cli.runtime.train import train as run_training

    outputs = [p for p in (save_weights, save_model, log_path) if p is not None]
    # the starting weights are read from --inputs, else from the export the step records (an input too)
    read = [p for p in (model, plan_path, inputs_path) if p is not None]
    check_outputs(outputs, read)
    checkpointing = None
    if checkpoint_dir is not None:
        check_output_folder(checkpoint_dir, [], read)
        checkpointing = checkpoints.Options(checkpoint_dir, checkpoint_every, checkpoint_keep, resume)
    elif resume:
        raise RoamError("--resume continues from the checkpoints in --checkpoint-dir: name it")
    if restarts and ranks is None:
        raise RoamError("--restarts starts a group of --ranks again: one process is restarted by resuming it "
                        "(--resume)")
    plan = plan_io.read(plan_path)
    show = not (as_json or obj["quiet"])
    say = None if obj["quiet"] or as_json else lambda line: out.print(line, highlight=False, soft_wrap=True)
    log = progress.Log(log_path) if log_path is not None else None
    try:
        if ranks is not None:
            return train_ranks(obj, model, plan, ranks, steps, inputs_path, provider, allocator, learning_rate, seed,
                               compare, allow_unplanned, save_weights, save_model, timeout, start_timeout, as_json,
                               show, checkpointing, restarts, say, shuffle, log)
        report = reporter(steps, show, log, lambda r: render_step(r, steps, plan),
                          lambda r: (r.number, r.seconds, {n: float(v) for n, v in r.outputs.items() if v.size == 1}, {}))
        result = run_training(model, plan, steps, device=provider, inputs_path=inputs_path, seed=seed,
                              learning_rate=learning_rate, allocator=allocator, compare=compare,
                              allow_unplanned=allow_unplanned, on_step=report, save_weights=save_weights,
                              save_model=save_model, checkpointing=checkpointing, say=say, shuffle=shuffle)
    finally:
        if log is not None:
            log.close()
    if as_json:
        click.echo(json.dumps(result, indent=1))
    elif not obj["quiet"]:
        render_summary(result, out)
    differs = compare and max(result["compare"]["outputs_max_rel"], result["compare"]["state_max_rel"]) > RTOL
    if differs:
        raise CheckFailed(f"the planned run differs from the plain ORT run by more than {RTOL:g} relative "
                          f"(outputs {result['compare']['outputs_max_rel']:.3g}, state {result['compare']['state_max_rel']:.3g})")


def reporter(steps: int, show: bool, log, line, figures):
    """What runs after each step: its `line` printed (on a terminal, with the pace and the time left)
    when `show`, and its `figures` (number, seconds, outputs, more) appended to `log`."""
    pace = progress.Pace(steps) if out.is_terminal else None

    def report(step) -> None:
        number, seconds, outputs, more = figures(step)
        if log is not None:
            log.write(number, seconds, outputs, **more)
        if show:
            said = pace.after(number) if pace else ""
            out.print(line(step) + (f"  {said}" if said else ""), highlight=False, soft_wrap=True)
    return report


def train_ranks(obj, model, plan, ranks, steps, inputs_path, provider, allocator, learning_rate, seed, compare,
                allow_unplanned, save_weights, save_model, timeout, start_timeout, as_json, show, checkpointing,
                restarts, say, shuffle, log):
    """`roam train --ranks N`."""
    from roam_cli.runtime import ranks as rank_run

    if provider != "cpu":
        raise RoamError("--ranks runs on the CPU provider (its collectives over MPI); a GPU run needs ONNX "
                        "Runtime's NCCL collectives, which this build does not have")
    if allocator == "ort-same-as-requested":
        raise RoamError("--ranks runs with --allocator roam or ort")
    result = rank_run.train_ranks(model, plan, ranks, steps, inputs_path=inputs_path, seed=seed,
                                  learning_rate=learning_rate, allocator=allocator, compare=compare,
                                  allow_unplanned=allow_unplanned, timeout=timeout, start_timeout=start_timeout,
                                  on_step=reporter(steps, show, log, lambda row: rank_run.render_step(row, steps),
                                                   lambda row: (row["step"], row["seconds"], row["outputs"],
                                                                {"rank_outputs": row["rank_outputs"]})),
                                  save_weights=save_weights, save_model=save_model, checkpointing=checkpointing,
                                  restarts=restarts, say=say, shuffle=shuffle)
    if as_json:
        click.echo(json.dumps(result, indent=1))
    elif not obj["quiet"]:
        rank_run.render_summary(result, out)
    c = result.get("compare")
    if c and max(c["outputs_max_rel"], c["state_max_rel"]) > rank_run.RTOL:
        raise CheckFailed(f"the planned ranks differ from the same ranks without the plan by more than "
                          f"{rank_run.RTOL:g} relative (outputs {c['outputs_max_rel']:.3g}, state {c['state_max_rel']:.3g})")
