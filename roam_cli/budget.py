"""Memory budgets: does a plan fit, and the largest value of a symbolic dimension that fits.

A plan needs its persistent bytes plus its arena: that is what a runtime following it allocates.
A plan with a slower tier (optimize --offload) counts the device's alone, as its figures are.
`max_value()` re-plans the model at each probed value of one symbolic dimension (a batch size),
galloping (by doubling strides) until the plan no longer fits and then bisecting, so it always
ends on a value n whose plan fits while n + 1's does not."""

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from roam_cli import pipeline
from roam_cli.core.errors import RoamError
from roam_cli.core.plan import needed_bytes
from roam_cli.frontend.onnx_import import check_dims

# what max-batch reports of the plan at its answer
FIGURES = ("persistent_bytes", "peak_live_bytes", "arena_bytes")
# Doubling stops here: memory that still fits at this batch hardly depends on the dimension.
LIMIT = 2**30


def check(plan: dict, budget: int) -> dict:
    """Whether the plan fits `budget` bytes; headroom < 0 is how much it is over. `slow_tier`:
    the tier whose bytes are not counted, for a plan with one."""
    needed = needed_bytes(plan)
    return {"budget_bytes": budget, "needed_bytes": needed, "fits": needed <= budget,
            "headroom_bytes": budget - needed} | ({"slow_tier": plan["tiers"]["slow"]} if "tiers" in plan else {})


def largest_fitting(needed: Callable[[int], int], budget: int, start: int = 1,
                    limit: int = LIMIT) -> tuple[int, dict[int, int]]:
    """The largest n in [1, limit] with needed(n) <= budget such that needed(n + 1) > budget,
    and every probe made (n -> bytes). 0 when even n = 1 does not fit.

    Gallops from `start` (up while plans fit, down while they do not, doubling the stride),
    then bisects: 2 log2|n - start| + 2 probes. The bisection keeps `lo` fitting and `hi` not
    fitting, so the answer's successor was probed and does not fit. A good `start` (the
    answer of a cheaper strategy) saves the expensive strategy most of its plans."""
    probes: dict[int, int] = {}

    def fits(n: int) -> bool:
        if n not in probes:
            probes[n] = needed(n)
        return probes[n] <= budget

    stride = 1
    if fits(start):
        lo = start
        while True:
            hi = min(start + stride, limit)
            if not fits(hi):
                break
            if hi == limit:
                raise RoamError(f"the plan still fits at {limit:,}: memory barely depends on this dimension")
            lo, stride = hi, stride * 2
    else:
        hi = start
        while True:
            lo = max(start - stride, 0)  # 0 stands for "nothing fits"
            if lo == 0 or fits(lo):
                break
            hi, stride = lo, stride * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo, probes


@dataclass
class MaxResult:
    order: str
    layout: str
    max_value: int  # 0 when even 1 does not fit
    at_max: dict | None  # the plan's figures at max_value (None when nothing fits)
    next_needed_bytes: int  # what max_value + 1 needs
    probes: dict[int, int] = field(default_factory=dict)  # value -> bytes needed


def max_value(model_path: Path, dim: str, budget: int, options: pipeline.Options, start: int = 1,
              on_probe: Callable[[int, int], None] = lambda n, nbytes: None) -> MaxResult:
    """Largest value of symbolic dimension `dim` whose plan (made with `options`) fits `budget`,
    searched from `start`. `on_probe(value, bytes needed)` is called after each plan."""
    check_dims(model_path, [dim], "--dim-name")
    if dim in options.dims:
        raise RoamError(f"--dim {dim}=... fixes the dimension that max-batch searches; leave it out")
    largest: dict = {"value": 0, "plan": None}  # the largest fitting value: bisection only grows it

    def needed(n: int) -> int:
        # nothing is written: the plan path only makes the plan's model path relative
        plan = pipeline.run(model_path, model_path.parent / "plan.json",
                            replace(options, dims={**options.dims, dim: n})).plan
        nbytes = needed_bytes(plan)
        if nbytes <= budget and n > largest["value"]:
            largest.update(value=n, plan={"needed_bytes": nbytes, **{k: plan[k] for k in FIGURES}})
        on_probe(n, nbytes)
        return nbytes

    best, probes = largest_fitting(needed, budget, start)
    return MaxResult(options.order, options.layout, best, largest["plan"], probes[best + 1], probes)
