"""The model files a plan belongs to (DESIGN.md, `model`): the source model `optimize` read and
the annotated model it wrote with the plan. Every command that takes a model and a plan accepts
either member and refuses any other file."""

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from roam_cli import recompute
from roam_cli.offload import rewrite as offload_rewrite
from roam_cli.frontend.onnx_import import Imported, import_model

# The plan's fields that name the members. A plan made before roam recorded the pair names only
# `model`, the graph it orders, and that file alone belongs to it.
MEMBERS = ("source_model", "annotated_model")


def members(plan: dict) -> dict[str, dict]:
    """Field -> {path, sha256} of each file the plan belongs to."""
    return {field: plan[field] for field in MEMBERS if field in plan} or {"model": plan["model"]}


def member(plan: dict, sha256: str) -> str | None:
    """Which member of the plan's pair the file with this sha256 is ('source_model',
    'annotated_model', or 'model' for a plan that names no pair); None when it is neither."""
    return next((field for field, ref in members(plan).items() if ref["sha256"] == sha256), None)


def refusal(plan: dict, sha256: str) -> str:
    """One line for a file outside the pair: the digests the plan expects, and the file's."""
    expected = " or ".join(f"{ref['sha256'][:12]}... ({ref['path']})" for ref in members(plan).values())
    return f"the plan was made for another model (sha256 {expected}; this file is {sha256[:12]}...)"


def source(plan: dict) -> dict:
    """{path, sha256} of the model `optimize` read, whose nodes are in their original order."""
    return plan.get("source_model", plan["model"])


@contextmanager
def planned_graph(model_path: Path, plan: dict, shapes_from_run: bool = False) -> Iterator[Imported]:
    """The graph `plan` orders, read from `model_path`: the file itself, except for the source
    model of a plan that changed the graph, which is changed again the same way: ORT's
    optimisations (`ort_optimized`), which ORT applies again into a folder that lasts as long as
    the context, then the recomputing copies (`recompute`), then the transfers between tiers
    (`offload`). `sha256` is always the given file's, for member(); a file outside the pair is
    imported as it is, for the caller to refuse."""
    imported = import_model(model_path, plan.get("dims", {}), shapes_from_run)
    if member(plan, imported.sha256) != "source_model":
        yield imported
        return
    with tempfile.TemporaryDirectory(prefix="roam-") as folder:
        if "ort_optimized" in plan:
            from roam_cli.frontend import ort_optimize  # ONNX Runtime is loaded only for such a plan

            optimized = Path(folder) / Path(model_path).name
            ort_optimize.reproduce(Path(model_path), plan["ort_optimized"], optimized)
            imported = replace(import_model(optimized, plan.get("dims", {}), shapes_from_run), sha256=imported.sha256)
        if "recompute" in plan:
            imported = recompute.reapply(imported, plan["recompute"])
        if "offload" in plan:
            imported = offload_rewrite.reapply(imported, plan)
        yield imported
