"""Solve a PuLP model with CBC (bundled with PuLP) or HiGHS (highspy) in a child process.

Both ILPs, the ordering one and the layout one, go through `solve`, so both get the same
protections. A solver is only ever a way to improve an incumbent the caller already holds, so
nothing here raises for the solver's trouble: `solve` returns what happened and the caller keeps
its incumbent unless the answer is FOUND.

- A deadline: neither solver checks its time limit often enough on large models (CBC ran a 30 s
  limit for 10 minutes on a 23,000-variable ordering model; HiGHS's cut separation ignores its
  limit for a minute), so the child is sent SIGINT at the deadline, which makes CBC stop and
  write its incumbent, and SIGKILL after GRACE.
- Faults: a solver that is missing, is killed, exits with an error, writes no or an unreadable
  solution, or calls a model infeasible (every model here has a known solution) is a failure,
  named in the returned status; only a caller that holds no solution (`proves=True`) gets the
  solver's proof of infeasibility back, as INFEASIBLE.
- Ctrl-C (or any exception while waiting) kills the child before it propagates: no solver is
  left running after roam exits."""

import importlib.util
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings

import pulp

from roam_cli.core.errors import RoamError

SOLVERS = ("cbc", "highs")
GRACE = 2.0  # seconds a solver gets to write its incumbent after it is told to stop
FOUND = ("optimal", "feasible")  # statuses that come with a solution in the model's variables
NO_SOLUTION_IN_TIME = "no solution in time"  # stopped at the deadline: not a fault
INFEASIBLE = "infeasible"  # the solver proved that the model has no solution (only with proves=True)


def failed(status: str) -> bool:
    return status not in FOUND and status != NO_SOLUTION_IN_TIME and status != INFEASIBLE


def solve(lp: pulp.LpProblem, solver: str, deadline: float, warm: bool, proves: bool = False) -> str:
    """Solve `lp` until `deadline` (time.perf_counter()),
    from the variables' initial values if `warm`. Returns "optimal" or "feasible" (the variables
    hold the solution), NO_SOLUTION_IN_TIME, INFEASIBLE (the solver proved there is no solution;
    only when `proves`: a caller that knows a solution gets it as a fault), or
    "<solver> failed: <why>"."""
    with tempfile.TemporaryDirectory(prefix="roam-milp-") as tmp:
        mps, start, sol = (os.path.join(tmp, f) for f in ("model.mps", "warm", "model.sol"))
        if solver == "cbc":
            status = solve_with_cbc(lp, mps, start if warm else None, sol, deadline)
        else:
            status = solve_with_highs(lp, mps, start if warm else None, sol, deadline)
    if status == INFEASIBLE and not proves:
        return f"{solver} failed: reports a model with a known solution infeasible"
    return status


def solve_with_cbc(lp, mps: str, start: str | None, sol: str, deadline: float) -> str:
    with warnings.catch_warnings():  # PuLP 3 says PULP_CBC_CMD goes in 4.0; it is the CBC PuLP ships
        warnings.simplefilter("ignore", DeprecationWarning)
        cbc = pulp.PULP_CBC_CMD(msg=False)
    variables, var_names, con_names, _ = lp.writeMPS(mps, rename=1)
    args = [cbc.path, mps]
    if start is not None:
        cbc.writesol(start, lp, variables, var_names, con_names)
        args += ["-mips", start]
    if math.isfinite(deadline):
        args += ["-sec", str(max(1, math.floor(deadline - time.perf_counter()))), "-timeMode", "elapsed"]
    # no "-threads": even "-threads 1" starts CBC's parallel branch and bound, whose worker now
    # and then misses its wake-up and stalls for 10 s (or up to -sec); the default is serial
    args += ["-ratio", "0", "-allow", "0", "-randomSeed", "1", "-randomCbcSeed", "1",
             "-solve", "-printingOptions", "all", "-solution", sol]
    fault = run("cbc", args, deadline, sol)
    if fault:
        return fault
    try:
        status, values, _, _, _, sol_status = cbc.readsol_MPS(sol, lp, variables, var_names, con_names)
    except (OSError, ValueError, IndexError):
        return "cbc failed: unreadable solution file"
    if status == pulp.LpStatusInfeasible:  # "Infeasible" (the relaxation) or "Integer infeasible", both proofs
        return INFEASIBLE
    if status != pulp.LpStatusOptimal:  # stopped before it had an incumbent
        return NO_SOLUTION_IN_TIME
    lp.assignVarsVals(values)
    return "optimal" if sol_status == pulp.LpSolutionOptimal else "feasible"


def solve_with_highs(lp, mps: str, start: str | None, sol: str, deadline: float) -> str:
    """HiGHS through `roam_cli.solvers.highs_run`, which writes "optimal" or "feasible" and the column
    values to `sol`, or "none" when it stopped without a solution."""
    variables, _, _, _ = lp.writeMPS(mps, rename=1)
    if start is not None:
        with open(start, "w") as f:
            f.write("\n".join(repr(v.value() or 0) for v in variables))
    limit = max(1.0, deadline - time.perf_counter()) if math.isfinite(deadline) else "inf"
    fault = run("highs", [sys.executable, "-m", "roam_cli.solvers.highs_run", mps, start or "-", sol, str(limit)],
                deadline, sol)
    if fault:
        return fault
    try:
        status, *values = open(sol).read().split()
        if status == "none":
            return NO_SOLUTION_IN_TIME
        if status == INFEASIBLE:
            return INFEASIBLE
        if status not in FOUND or len(values) != len(variables):
            raise ValueError
        for v, value in zip(variables, values):
            v.varValue = float(value)
    except (OSError, ValueError):
        return "highs failed: unreadable solution file"
    return status


def run(name: str, args: list[str], deadline: float, sol: str) -> str | None:
    """Run a solver process until `deadline`; None when it has written `sol` (or was stopped at
    the deadline with one), else what went wrong."""
    try:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    except OSError as e:
        return f"{name} failed: cannot run {args[0]}: {e.strerror or e}"
    stopped = False
    try:
        try:
            proc.wait(timeout=max(deadline - time.perf_counter(), 0) if math.isfinite(deadline) else None)
        except subprocess.TimeoutExpired:
            stopped = True
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=GRACE)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    finally:
        if proc.poll() is None:  # Ctrl-C or another exception while waiting: leave no solver behind
            proc.kill()
            proc.wait()
    if os.path.exists(sol):
        return None
    if stopped:
        return NO_SOLUTION_IN_TIME
    if proc.returncode < 0:
        return f"{name} failed: killed by signal {-proc.returncode}"
    if proc.returncode > 0:
        return f"{name} failed: exit status {proc.returncode}"
    return f"{name} failed: wrote no solution"


def check_solver(name: str) -> None:
    """Fail early, before any work, when the chosen MILP solver is not installed."""
    if name == "highs" and importlib.util.find_spec("highspy") is None:
        raise RoamError("--solver highs needs the highspy package: pip install highspy")
