"""`roam make-training-graph`, `lower`, `emulate` and `shard`: graphs written; `gradcheck`: a graph's gradients checked."""

import json
from pathlib import Path

import click

from roam_cli.cli import cli, out, parse_pairs, split_names
from roam_cli.core.errors import CheckFailed, RoamError
from roam_cli.core.fileio import check_output_path
from roam_cli.frontend import training_graph
from roam_cli.precision import PRECISIONS


@cli.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out_path", required=True, type=click.Path(path_type=Path),
              help="Standard-ONNX model to write.")
@click.option("--json", "as_json", is_flag=True, help="Print what was rewritten as JSON.")
@click.pass_obj
def lower(obj, model, out_path, as_json):
    """Rewrite ONNX Runtime's fused training ops (com.microsoft) as standard ONNX ops.

    Same graph inputs and outputs, in the same order; an in-place update (gradient accumulator)
    adds a graph output `<state>.out`. Any ONNX runtime then runs the graph. Weights are not read.

    \b
    Example:
      roam lower training_model.onnx -o training_model.lowered.onnx
    """
    from roam_cli import lower as lower_mod
    from roam_cli.frontend.onnx_import import load_model

    check_output_path(out_path, [model])
    source, sha = load_model(model)
    lowered = lower_mod.lower_model(source)
    lower_mod.write_lowered(lowered, model, sha, out_path)
    summary = lower_mod.summary(source, lowered)
    if as_json:
        out.print_json(json.dumps({"model": str(model), "output": str(out_path), **summary}))
    elif not obj["quiet"]:
        rewritten = ", ".join(f"{op} {n}" for op, n in summary["rewritten"].items()) or "nothing to rewrite"
        out.print(f"wrote {out_path}: {summary['nodes_before']} -> {summary['nodes_after']} nodes; rewritten: "
                  f"{rewritten}", soft_wrap=True, highlight=False)


@cli.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out_path", required=True, type=click.Path(path_type=Path),
              help="The graph the CPU provider runs, to write.")
@click.option("--json", "as_json", is_flag=True, help="Print how many nodes were emulated as JSON.")
@click.pass_obj
def emulate(obj, model, out_path, as_json):
    """Run a bf16 or fp16 graph on ONNX Runtime's CPU provider with a GPU's rounding.

    The CPU provider has no bfloat16 arithmetic, and runs float16 in float32 without rounding
    products' inputs. Each node without a kernel of its 16-bit type computes in float32 between a
    Cast of its inputs and a rounding Cast of its results, as a GPU's kernel rounds; every 16-bit
    tensor keeps its name, type and size. Plan the written graph: it is the one that runs.

    \b
    Example:
      roam emulate step.onnx -o step.cpu.onnx && roam optimize step.cpu.onnx -o plan.json
    """
    from roam_cli import lower as lower_mod
    from roam_cli.frontend.onnx_import import load_model
    from roam_cli.precision.emulate import check_types
    from roam_cli.precision.emulate import emulate as rewrite

    check_output_path(out_path, [model])
    source, _ = load_model(model)
    check_types(source, model)
    count = rewrite(source)
    if not count:
        raise RoamError(f"{model} has no bf16 or fp16 node the CPU provider lacks a kernel for: nothing to emulate")
    lower_mod.write_with_weights(source, model, out_path)
    if as_json:
        out.print_json(json.dumps({"model": str(model), "output": str(out_path), "emulated_nodes": count}))
    elif not obj["quiet"]:
        out.print(f"wrote {out_path}: {count:,} 16-bit nodes computed in float32 and rounded", highlight=False)


@cli.command()
@click.argument("step", type=click.Path(path_type=Path))
@click.option("--ranks", type=int, required=True, help="N: the ranks the step is split over (at least 1).")
@click.option("-o", "--output", "out_path", required=True, type=click.Path(path_type=Path),
              help="The rank step to write.")
@click.option("--json", "as_json", is_flag=True, help="Print the rank step's record (its metadata roam.sharding) as JSON.")
@click.pass_obj
def shard(obj, step, ranks, out_path, as_json):
    """Write the step of one of N ranks of fully sharded data parallelism.

    STEP is a full training step, the optimizer inside (make-training-graph --in-graph-optimizer,
    or a functional step: new state as outputs paired in metadata roam.inplace). Each rank holds
    1/N of every parameter and its optimizer state (flat, zero-padded), all-gathers a parameter
    before the forward and backward read it, reduce-scatters each gradient (the mean over ranks)
    and updates its shard. A fixed batch is the rank's own, of a global batch N times it; a
    symbolic one stays symbolic (bind the rank's with optimize's --dim). Inputs and outputs keep
    their names. Plan it with `roam optimize` like any step (docs/sharding.md).

    \b
    Example:
      roam shard step.onnx --ranks 4 -o rank.onnx && roam optimize rank.onnx -o plan.json --recompute free
    """
    from roam_cli import lower as lower_mod
    from roam_cli import shard as shard_mod

    check_output_path(out_path, [step])
    model, record = shard_mod.shard(step, ranks)
    lower_mod.write_with_weights(model, step, out_path)
    if as_json:
        out.print_json(json.dumps({"model": str(step), "output": str(out_path), **record}))
    elif not obj["quiet"]:
        batch = record["batch"]
        rows = f"{batch['rank']} rows of {batch['global']}" if batch["global"] else f"1/{ranks} of {batch['rank']}"
        out.print(f"wrote {out_path}: one rank of {ranks}, {len(record['parameters']):,} parameters and "
                  f"{len(record['state']):,} optimizer state tensors in 1/{ranks} shards, {len(record['replicated']):,} "
                  f"inputs replicated, the batch {rows} ({', '.join(record['data_inputs'])})",
                  highlight=False, soft_wrap=True)


@cli.command("make-training-graph")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out_path", required=True, type=click.Path(path_type=Path),
              help="Training graph to write (with --in-graph-optimizer: the whole step).")
@click.option("--loss", type=click.Choice(list(training_graph.LOSSES)),
              help="Loss added on the first output (none: the first output already is the loss).")
@click.option("--requires-grad", "requires_grad", multiple=True, metavar="NAMES",
              help="Trainable parameters, comma-separated (default: initializers named like parameters).")
@click.option("--frozen", multiple=True, metavar="PATTERNS",
              help="Parameters not to train: globs, comma-separated (buffers are never trained).")
@click.option("--trainable", multiple=True, metavar="PATTERNS",
              help="Also train the floating-point initializers (not scalars) these globs match, comma-separated "
                   "(weights the exporter folded into constants, e.g. 'val_*').")
@click.option("--json", "as_json", is_flag=True,
              help="Print the trainable, frozen, constant, recovered, folded, merged, missing, tied and computed names "
                   "as JSON.")
@click.option("--optimizer", type=click.Choice(list(training_graph.ARTIFACT_OPTIMIZERS)), default="adamw",
              show_default=True)
@click.option("--in-graph-optimizer", "in_graph", is_flag=True,
              help="One graph for the whole step: each parameter's update right after its backward.")
@click.option("--optimizer-model", "optimizer_path", type=click.Path(path_type=Path),
              help="Optimizer graph to write [default: OUTPUT with .optimizer.onnx].")
@click.option("--checkpoint", "checkpoint_path", type=click.Path(path_type=Path),
              help="Also write the ONNX Runtime checkpoint (the only output that reads the weights).")
@click.option("--dim", "dims", multiple=True, metavar="NAME=N",
              help="Bind a symbolic input dimension before differentiating (repeatable; roam's backward needs "
                   "static shapes).")
@click.option("--backend", type=click.Choice(["roam", "ort-artifacts"]), default="roam", show_default=True,
              help="Who builds the backward: roam (standard ONNX, no torch) or ONNX Runtime's training artifacts.")
@click.option("--fused", is_flag=True,
              help="With --backend ort-artifacts: keep ONNX Runtime's fused training ops (runs on "
                   "onnxruntime-training only) instead of writing standard ONNX.")
@click.option("--optimizer-setting", "optimizer_settings", multiple=True, metavar="NAME=VALUE",
              help="A setting of the in-graph optimizer over its default (AdamW: beta1, beta2, eps, weight_decay, "
                   "convention=onnxruntime|pytorch: whose maths).")
@click.option("--allow-folded-batchnorm", is_flag=True,
              help="Train an export whose BatchNorms the exporter folded into its convolutions as it is, the "
                   "folded convolution weights and biases its parameters (refused by default: it computes the "
                   "eval-mode function).")
@click.option("--precision", type=click.Choice(list(PRECISIONS)),
              help="Mixed precision: float32 master weights and optimizer state, matrix products and convolutions "
                   "in bf16 or fp16 as torch.autocast runs them [default: what the export computes in].")
@click.option("--grad-scaler", "scaler_settings", multiple=True, metavar="NAME=VALUE",
              help="fp16's loss scaling over torch.amp.GradScaler's defaults (init_scale, growth_factor, "
                   "backoff_factor, growth_interval, enabled).")
@click.pass_obj
def make_training_graph(obj, model, out_path, loss, requires_grad, frozen, trainable, as_json, optimizer, in_graph,
                        optimizer_path, checkpoint_path, dims, backend, fused, optimizer_settings, allow_folded_batchnorm,
                        precision, scaler_settings):
    """Turn an inference ONNX export into a training graph: forward, loss, backward.

    Repairs what exporters leave out, reports which parameters survived the export, and builds
    the backward without reading a weight: roam's own (default; standard ONNX, nothing but onnx
    installed; no optimizer graph, use --in-graph-optimizer for the step) or, with --backend
    ort-artifacts, ONNX Runtime's training artifacts (needs onnxruntime-training and torch), written
    in standard ONNX as `roam lower` writes it unless --fused.

    \b
    Examples:
      roam make-training-graph model.onnx -o train.onnx --loss cross-entropy
      roam make-training-graph model.onnx -o step.onnx --loss none --in-graph-optimizer
      roam make-training-graph training_model.onnx -o step.onnx --in-graph-optimizer --optimizer sgd
      roam make-training-graph model.onnx -o train.onnx --loss none --trainable 'val_*' --json
      roam make-training-graph model.onnx -o step.onnx --loss cross-entropy --dim batch=8 --dim seq=128
    """
    if optimizer_path is None:
        optimizer_path = out_path.with_name(out_path.name.removesuffix(".onnx") + ".optimizer.onnx")
    from roam_cli.backward import step

    sizes = parse_pairs(dims, "--dim", True)
    if empty := [name for name, size in sizes.items() if size == 0]:  # a step of no rows trains on nothing: a typo
        raise RoamError(f"--dim {empty[0]}=0: a training step's dimensions are at least 1")
    made = training_graph.make(model, out_path, loss=loss, requires_grad=split_names(requires_grad) or None,
                               frozen=split_names(frozen), trainable=split_names(trainable), optimizer=optimizer,
                               in_graph=in_graph, optimizer_path=optimizer_path, checkpoint_path=checkpoint_path,
                               dims=sizes, backward=step.build if backend == "roam" else training_graph.build, fused=fused,
                               allow_folded_batchnorm=allow_folded_batchnorm,
                               optimizer_settings=parse_pairs(optimizer_settings, "--optimizer-setting", False),
                               precision=precision, scaler_settings=parse_pairs(scaler_settings, "--grad-scaler", False))
    if as_json:
        names = made.survey.names() if made.survey is not None else {}
        click.echo(json.dumps(names | {"warnings": made.survey.warnings() if made.survey else [],
                                       "written": [str(path) for path, _, _ in made.written]}
                              | ({"precision": made.precision} if made.precision else {}), indent=1))
    elif made.survey is not None and not obj["quiet"]:
        s = made.survey
        out.print(f"parameters: {len(s.trainable):,} trainable ({s.elements:,} elements), {len(s.frozen):,} frozen, "
                  f"{len(s.constants):,} constants", highlight=False)
        if made.repaired:
            out.print("repaired: " + ", ".join(f"{op} ×{n}" for op, n in sorted(made.repaired.items())), highlight=False)
        if s.recovered:
            shown = ", ".join(f"{c} -> {p}" for c, p in list(s.recovered.items())[:3])
            out.print(f"recovered: {len(s.recovered)} weights the exporter folded into constants (transposed, cast), trained "
                      f"as their parameters ({shown}{', ...' if len(s.recovered) > 3 else ''}; --json lists them)",
                      highlight=False, soft_wrap=True)
        if made.precision:
            out.print(precision_line(made.precision), highlight=False, soft_wrap=True)
    if made.survey is not None:
        for warning in made.survey.warnings():
            click.echo(f"warning: {warning}", err=True)
    if not obj["quiet"] and not as_json:
        for path, what, nodes in made.written:
            out.print(f"wrote {path}: {what}" + (f", {nodes:,} nodes" if nodes else ""), highlight=False)


def precision_line(p: dict) -> str:
    """`mixed precision bf16: 28 weight copies cast from float32 masters; ...`"""
    line = (f"mixed precision {p['precision']}: float32 masters and optimizer state, {p['weight_copies']} "
            f"low-precision weight copies cast in the step")
    s = p["grad_scaler"]
    if s:
        line += (f"; loss scaled as GradScaler scales it (from {s['init_scale']:g}, ×{s['growth_factor']:g} after "
                 f"{s['growth_interval']} clean steps, ×{s['backoff_factor']:g} and the update skipped on an overflow)")
    return line


@cli.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--inputs", "inputs_path", type=click.Path(path_type=Path),
              help="An .npz of values by input name (the batch, weights); the rest drawn at random or read from "
                   "the export the step was made from.")
@click.option("--loss", default=None, help="The loss output  [default: the first output]")
@click.option("--seed", default=0, show_default=True, type=int,
              help="Seed of the directions, the Dropout masks and the values drawn.")
@click.option("--tolerance", type=float, help="Most a float64 gradient may differ from its forward's "
              "differences, relative to its norm  [default: 1e-06]")
@click.option("--float32-tolerance", type=float, help="Most a gradient as the graph runs may differ from its "
              "float64 self, relative to its norm  [default: 0.01]")
@click.option("--json", "as_json", is_flag=True, help="Print every parameter's errors as JSON.")
@click.pass_obj
def gradcheck(obj, model, inputs_path, loss, seed, tolerance, float32_tolerance, as_json):
    """Check a training graph's gradients against its forward alone, in float64.

    MODEL: a training graph (make-training-graph's, ONNX Runtime's artifacts) or a full step; every
    input or initializer P whose gradient it computes (`P_grad`) is checked. The rules: the graph
    run in float64 against central differences of its loss along a random direction of P. Float32:
    the graph as it runs against its float64 self, what training follows. Dropout masks are drawn
    once and held. Exit 1 when either is beyond its tolerance, naming the parameters.

    \b
    Examples:
      roam gradcheck training_model.onnx
      roam gradcheck step.onnx --inputs batch.npz --json
    """
    import math

    from roam_cli import gradcheck as check_mod
    from roam_cli.core.fileio import read_arrays

    limits = {"tolerance": tolerance, "float32_tolerance": float32_tolerance}  # None: gradcheck's default
    for option, value in limits.items():
        if value is not None and (not 0 < value <= 1 or math.isnan(value)):
            raise RoamError(f"--{option.replace('_', '-')} {value}: a fraction above 0 and at most 1")
    given = read_arrays(inputs_path, "--inputs") if inputs_path is not None else {}
    report = check_mod.check(model, given, seed, loss, **{k: v for k, v in limits.items() if v is not None})
    if as_json:
        out.print_json(json.dumps(check_mod.as_json(report)))
    elif not obj["quiet"]:
        check_mod.render(report, out)
    verdict = check_mod.verdict(report)
    if verdict:
        raise CheckFailed(verdict)
