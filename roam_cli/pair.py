"""The model files a plan belongs to (DESIGN.md, `model`): the source model `optimize` read and
the annotated model it wrote with the plan. Every command that takes a model and a plan accepts
either member and refuses any other file."""

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
