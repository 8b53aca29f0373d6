"""The hostile sweep (benchmarks/runtime/hostile_sweep.py, its cases in hostile_cases.py) as tests:
each case run as the sweep runs it and held to the same contract (exit code, one line naming the
fault, no traceback, every file there before unchanged, nothing left behind).

By default: every case that reproduces one of the defects issue 48 found, and the first case of
each kind for each command (the commands are forked from the tests' preloaded server: `roam`).
The slow run: every other case, and the signals (real processes, signalled at their moment)."""

import fcntl
import os
from pathlib import Path

import pytest
from conftest import roam

from benchmarks.runtime import hostile_sweep
from benchmarks.runtime.hostile_cases import all_cases

CASES = all_cases()


def first_of_each(cases):
    """The cases reproducing a defect, and the first of each kind for each command."""
    seen, chosen = set(), []
    for case in cases:
        key = (case.kind, case.argv[0])
        if case.defect is not None or (key not in seen and case.signal is None):
            chosen.append(case)
        seen.add(key)
    return [c for c in chosen if c.signal is None]


QUICK = first_of_each(CASES)
REST = [c for c in CASES if c not in QUICK]


def run_forked(argv: list[str], folder: Path) -> hostile_sweep.Result:
    r = roam(*argv, cwd=folder, env={"TMPDIR": str(folder / "tmp")})
    return hostile_sweep.Result(r.code, r.out, r.err)


@pytest.fixture(scope="session")
def fixtures(tmp_path_factory):
    """The sweep's fixtures, built once for every pytest worker (the first to come builds them)."""
    shared = tmp_path_factory.getbasetemp().parent / "hostile-fixtures"
    shared.mkdir(exist_ok=True)
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (shared / "built").exists():
            hostile_sweep.build_fixtures(shared / "files", run_forked, ranks=hostile_sweep.has_mpi())
            (shared / "built").touch()
    return shared / "files"


def held(case, fixtures, tmp_path):
    if case.needs == "mpi" and not hostile_sweep.has_mpi():
        pytest.skip("needs the mpi extra (MPICH and mpi4py)")
    if case.mount and os.geteuid() != 0:
        pytest.skip("a full or read-only file system is a tmpfs mounted for the case: needs root")
    outcome = hostile_sweep.run_case(case, fixtures, tmp_path, run_forked)
    if not outcome["ran"]:
        pytest.skip(outcome["why"])
    assert not outcome["broken"], f"{case.name}: {'; '.join(outcome['broken'])} (exit {outcome['exit']}: {outcome['said']})"


def test_the_sweep_has_a_case_for_every_defect_of_issue_48():
    assert {c.defect for c in CASES if c.defect} == set(range(1, 18))


@pytest.mark.parametrize("case", QUICK, ids=[c.name for c in QUICK])
def test_a_hostile_case_is_refused_as_the_contract_says(case, fixtures, tmp_path):
    held(case, fixtures, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("case", REST, ids=[c.name for c in REST])
def test_every_other_hostile_case_is_refused_as_the_contract_says(case, fixtures, tmp_path):
    held(case, fixtures, tmp_path)
