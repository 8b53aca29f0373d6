"""POET's problems (`roam remat` on poet-problem-v1): the checker on hand-built schedules of a
5-node problem whose RAM per stage is worked out below under POET's accounting, the solver on it
and on the two samples, and the CLI's refusals."""

import json
import re
from pathlib import Path

import pytest

from roam_cli.remat import poet, poet_solve
from roam_cli.remat.poet_check import evaluate
from tests.conftest import roam

SAMPLES = Path(__file__).resolve().parents[2] / "sample_models" / "poet"

# input 0 (8 bytes) -> layer 1 (4) -> loss 2 (2) -> gradient 3 (2, reads 2 twice as POET lists it,
# and 1) -> gradient 4 (2, reads 3 and 0). Runtime = compute joules = [1, 4, 1, 2, 2], total 10;
# page-in 0.5 J, page-out 3 J each. RAM budget 14, runtime budget 12.
# Keep-all (R = identity, each value held to its last read): RAM per stage 8, 12, 14, 16, 12 --
# stage 3 holds 0, 1, 2 (14) and computes 3 (16); its frees then drop 2 twice (the duplicated
# edge) and 1: 16 - 4 - 4 = 8. Over the budget at stage 3 only.
NODES = [(8, 1), (4, 4), (2, 1), (2, 2), (2, 2)]  # (cost_ram, cost_cpu = compute_joules)
EDGES = [[0, 1], [1, 2], [2, 3], [2, 3], [1, 3], [3, 4], [0, 4]]


def tiny(**changes) -> dict:
    doc = {"format": "poet-problem-v1", "model": "tiny", "platform": "hand", "T": 5,
           "nodes": [{"index": i, "name": f"n{i}", "cost_cpu": c, "cost_ram": r, "compute_joules": c,
                      "pagein_joules": 0.5, "pageout_joules": 3.0, "backward": i >= 3}
                     for i, (r, c) in enumerate(NODES)],
           "edges": EDGES, "parameter_cost": 0, "total_runtime_ms": 10, "ram_budget_bytes": 14,
           "runtime_budget_factor": 1.2, "runtime_budget_ms": 12, "paging": True, "remat": True,
           "baseline_peak_bytes": 16}
    doc.update(changes)
    return doc


def schedule(R, SRam, SSd=(), MIn=(), MOut=()) -> dict:
    return {"format": "poet-schedule-v1", "T": 5, **{k: [list(p) for p in v] for k, v in
                                                      dict(R=R, SRam=SRam, SSd=SSd, MIn=MIn, MOut=MOut).items()}}


DIAG = [(t, t) for t in range(5)]
KEEP_ALL = dict(R=DIAG, SRam=[(1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2), (4, 0), (4, 3)])
# 0 dropped after stage 1 and recomputed in stage 4: stage 1 frees 0 after node 1 (12 -> 4);
# stage 2 holds 1 (4 + 2 = 6); stage 3 holds 1, 2 (6 + 2 = 8, then 8 - 4 - 4 = 0); stage 4 holds
# 3 and recomputes 0 (2 + 8 + 2 = 12). Peak 12, energy 10 + 1 = 11, runtime 11.
RECOMPUTE = dict(R=DIAG + [(4, 0)], SRam=[(1, 0), (2, 1), (3, 1), (3, 2), (4, 3)])
# 0 paged out in stage 1, on storage in stages 2 and 3, paged in during stage 3: RAM per stage
# 8, 12, 6, 8, 12 (stage 4 holds 0 and 3). Energy 10 + 3 + 0.5 = 13.5.
PAGING = dict(R=DIAG, SRam=[(1, 0), (2, 1), (3, 1), (3, 2), (4, 0), (4, 3)], SSd=[(2, 0), (3, 0)], MIn=[(3, 0)],
              MOut=[(1, 0)])


def minus(spec: dict, key: str, pair) -> dict:
    return {**spec, key: [p for p in spec[key] if p != pair]}


def plus(spec: dict, key: str, pair) -> dict:
    return {**spec, key: list(spec.get(key, [])) + [pair]}


@pytest.mark.parametrize("spec, peak, energy, paging", [(RECOMPUTE, 12, 11.0, 0.0), (PAGING, 12, 13.5, 3.5)])
def test_checker_accepts_a_valid_schedule(spec, peak, energy, paging):
    verdict = evaluate(tiny(), schedule(**spec))
    assert verdict["valid"], verdict["violations"]
    assert verdict["peak_ram_bytes"] == peak
    assert verdict["energy_joules"] == pytest.approx(energy)
    assert verdict["paging_joules"] == pytest.approx(paging)
    assert verdict["compute_joules"] == pytest.approx(energy - paging)


@pytest.mark.parametrize("problem, spec, violation", [
    (tiny(), plus(RECOMPUTE, "R", (1, 2)), "stage 1: R[1][2] = 1, but it must be 0"),
    (tiny(), plus(RECOMPUTE, "SRam", (2, 2)), "stage 2: SRam[2][2] = 1, but it must be 0"),
    (tiny(), minus(RECOMPUTE, "R", (1, 1)), "stage 1: node 1 is not computed"),
    (tiny(), minus(RECOMPUTE, "R", (4, 0)), "stage 4: node 4 computed but its input 0 is neither computed nor in RAM"),
    (tiny(), minus(KEEP_ALL, "SRam", (2, 0)),
     "stage 3: node 0 in RAM, but in stage 2 it was neither in RAM, computed nor paged in"),
    (tiny(), minus(PAGING, "MOut", (1, 0)), "stage 2: node 0 on storage, but in stage 1 it was neither"),
    (tiny(), minus(PAGING, "SSd", (3, 0)), "stage 3: node 0 paged in but not on storage"),
    (tiny(), plus(RECOMPUTE, "MOut", (3, 0)), "stage 3: node 0 paged out but not in RAM"),
    (tiny(), KEEP_ALL, "stage 3: RAM 16 bytes at node 3 is over the budget 14"),
    # 2 made 10 bytes: stage 3 holds 1, 2 (14), computes 3 (16), frees 2 twice and 1: -8
    (tiny(nodes=[{**n, "cost_ram": 10} if n["index"] == 2 else n for n in tiny()["nodes"]], ram_budget_bytes=100),
     RECOMPUTE, "stage 3: RAM is -8 bytes (negative) at node 4"),
    (tiny(runtime_budget_ms=10.5), RECOMPUTE, "runtime 11 is over the budget 10.5"),
    (tiny(paging=False), PAGING, "stage 2: SSd of node 0, but the problem disables paging"),
])
def test_checker_names_each_violation(problem, spec, violation):
    verdict = evaluate(problem, schedule(**spec))
    assert not verdict["valid"]
    assert any(line.startswith(violation) for line in verdict["violations"]), verdict["violations"]


def test_solver_finds_the_least_energy_on_the_tiny_problem(tmp_path):
    # stage 3 must lose a byte: recomputing 0 for node 4 (1 J) is the cheapest way (paging 0
    # costs 3.5 J; recomputing 2 in stage 3 frees nothing there): energy 11, proven optimal
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(tiny()))
    found = poet_solve.solve(poet.read(path), time_limit=10)
    verdict = evaluate(tiny(), schedule_doc(found.schedule))
    assert verdict["valid"], verdict["violations"]
    assert verdict["energy_joules"] == pytest.approx(11.0)
    assert found.optimal


def schedule_doc(s: poet.Schedule) -> dict:
    return {"format": "poet-schedule-v1", "T": max(t for t, _ in s.R) + 1,
            **{m: sorted([t, i] for t, i in getattr(s, m)) for m in poet.MATRICES}}


@pytest.mark.parametrize("name", ["linear_a72nocache", "vgg16_cifar_a72"])
def test_solver_on_the_samples(name, tmp_path):
    path = SAMPLES / f"{name}.problem.json"
    out = tmp_path / "schedule.json"
    r = roam("remat", path, "-o", out, "--time-limit", "5", "--json")
    assert r.code == 0, r.err
    r = roam("remat", "--check", path, out, "--json")
    assert r.code == 0, r.err
    verdict = json.loads(r.out)
    problem = json.loads(path.read_text())
    nodes = problem["nodes"]
    computed_once = sum(n["compute_joules"] for n in nodes)
    # no schedule computes less than every node once; paging every value out and in once more
    # than covers what these budgets need (linear: recomputing its input layer is free, so its
    # bound is computing each node once)
    bound = computed_once if name == "linear_a72nocache" else \
        computed_once + sum(n["pagein_joules"] + n["pageout_joules"] for n in nodes)
    assert computed_once * (1 - 1e-12) <= verdict["energy_joules"] <= bound * (1 + 1e-12)
    assert verdict["peak_ram_bytes"] <= problem["ram_budget_bytes"]


def test_cli_exits_1_when_a_stage_cannot_fit(tmp_path):
    # stage 1 computes 1 (4 bytes) reading 0 (8): 12 bytes at least, over a budget of 11
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(tiny(ram_budget_bytes=11)))
    r = roam("remat", path, "-o", tmp_path / "s.json")
    assert r.code == 1
    assert "stage 1 needs 12 bytes (node 1 and its 1 inputs), over the RAM budget 11" in r.err
    assert not (tmp_path / "s.json").exists()


@pytest.mark.parametrize("change, message", [
    (dict(edges=EDGES + [[3, 1]]), "edge [3, 1] is not a pair [u, v] of node indices with u < v < T"),
    (dict(T=6), "'nodes' is not a list of T = 6 nodes"),
    (dict(ram_budget_bytes=-1), "'ram_budget_bytes' is -1"),
    (dict(runtime_budget_ms=None), "'runtime_budget_ms' is null, not a number >= 0"),
    (dict(nodes=[{k: v for k, v in n.items() if k != "pageout_joules"} for n in tiny()["nodes"]]),
     "node 0: no 'pageout_joules' field"),
])
def test_cli_refuses_a_malformed_problem_in_one_line(change, message, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(tiny(**change)))
    r = roam("remat", path, "-o", tmp_path / "s.json")
    assert r.code == 2
    assert message in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_cli_check_exits_1_on_an_invalid_schedule(tmp_path):
    problem, sched = tmp_path / "tiny.json", tmp_path / "keep_all.json"
    problem.write_text(json.dumps(tiny()))
    sched.write_text(json.dumps(schedule(**KEEP_ALL)))
    r = roam("remat", "--check", problem, sched)
    assert r.code == 1
    assert "stage 3: RAM 16 bytes at node 3 is over the budget 14" in r.err


# --- when the greedy finds no plan (issue 41): the MILP from no start, a proof, or what ran ---

def problem_of(ram, cpu, joules, edges, ram_budget, runtime_budget, paging=False) -> dict:
    T = len(ram)
    return {"format": "poet-problem-v1", "model": "hand", "platform": "hand", "T": T,
            "nodes": [{"index": i, "name": f"n{i}", "cost_cpu": cpu[i], "cost_ram": ram[i], "compute_joules": joules[i],
                       "pagein_joules": 1.0, "pageout_joules": 1.0, "backward": False} for i in range(T)],
            "edges": edges, "parameter_cost": 0, "total_runtime_ms": sum(cpu), "ram_budget_bytes": ram_budget,
            "runtime_budget_factor": runtime_budget / sum(cpu), "runtime_budget_ms": runtime_budget,
            "paging": paging, "remat": True, "baseline_peak_bytes": 0}


# 0 -> 1 -> 2 -> 3 -> 4, and 4 reads 0 and 1 too. RAM [1, 6, 4, 4, 2], runtime [3, 1, 1, 1, 1]
# (7; budget 10: 3 to spare), joules [0.1, 1, 1, 1, 1]; RAM budget 13; no paging.
# Keep-all: stage 3 holds 0, 1, 2 (11) and computes 3: 15, over by 2 (stage 4: 0, 1, 3 + 4 = 13).
# The greedy weighs, per byte of stage 3's excess, recomputing 0 in stage 4 (0.1 J for 1 byte)
# against recomputing 1 there (1 J for 2 bytes: 0.5 J/byte), takes 0 (stage 3: 14), and has
# spent the spare runtime (7 + 3 = 10): recomputing 1 (1 more) no longer fits, no move is left.
# The only schedule: recompute 1 in stage 4 (runtime 8): stage 3 holds 0, 2 and computes 3 (9);
# stage 4 holds 0, 3 (5), computes 1 (11; 0 is read by 4 later, not freed) and 4 (13). Energy
# 4.1 + 1 = 5.1 (recomputing 0 as well would take runtime 11).
GREEDY_TRAP = problem_of([1, 6, 4, 4, 2], [3, 1, 1, 1, 1], [0.1, 1, 1, 1, 1],
                         [[0, 1], [1, 2], [2, 3], [3, 4], [0, 4], [1, 4]], 13, 10)
# 0 -> 1 -> 2 -> 3 -> 4 -> 5, 4 reads 0, 5 reads 1. RAM [2, 2, 4, 4, 1, 1], runtime [2, 2, 1, 1, 1, 1]
# (8; budget 9: 1 to spare), RAM budget 10, no paging. Stage 3 must hold 0 and 1 (recomputing either
# takes 2 of runtime, 1 is spare) and needs 2 (held, or recomputed from 1) with 3: 2 + 2 + 4 + 4 =
# 12 > 10. No stage's own working set shows it (the largest, stage 3's: 3 and 2, is 8), and a
# recomputation (of 2, 3, 4 or 5) fits the runtime: only the search over schedules proves it.
NO_FIT = problem_of([2, 2, 4, 4, 1, 1], [2, 2, 1, 1, 1, 1], [1] * 6,
                    [[0, 1], [1, 2], [2, 3], [3, 4], [0, 4], [4, 5], [1, 5]], 10, 9)


def read_doc(doc: dict, tmp_path) -> poet.Problem:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    return poet.read(path)


def test_greedy_trap_needs_the_milp_which_finds_the_only_schedule(tmp_path):
    p = read_doc(GREEDY_TRAP, tmp_path)
    assert poet_solve.greedy(p, poet_solve.Graph(p), float("inf")) is None
    found = poet_solve.solve(p, time_limit=30)
    assert isinstance(found, poet_solve.Result), found
    assert found.found_by == "MILP (CBC, no start)" and found.greedy_energy is None
    verdict = evaluate(GREEDY_TRAP, schedule_doc(found.schedule))
    assert verdict["valid"], verdict["violations"]
    assert verdict["energy_joules"] == pytest.approx(5.1)
    assert verdict["runtime"] == pytest.approx(8)
    assert found.optimal


def test_cli_writes_the_milps_schedule_when_the_greedy_finds_none(tmp_path):
    path, out = tmp_path / "p.json", tmp_path / "s.json"
    path.write_text(json.dumps(GREEDY_TRAP))
    r = roam("remat", path, "-o", out, "--time-limit", "30")
    assert r.code == 0, r.err
    assert "(the greedy found none; MILP (CBC, no start))" in r.out
    assert roam("remat", "--check", path, out).code == 0


def test_milp_proves_that_no_schedule_fits(tmp_path):
    p = read_doc(NO_FIT, tmp_path)
    assert poet_solve.floor(p, poet_solve.Graph(p)) is None  # no cheap bound shows it
    found = poet_solve.solve(p, time_limit=30)
    assert isinstance(found, poet_solve.NoSchedule) and found.proved, found
    assert found.message().startswith("infeasible: CBC proved that the MILP of the problem has no solution")
    assert re.search(r"\(\d+\.\d s\), after greedy found none \(\d+\.\d s\)$", found.message())  # no paging, no repair


def test_cli_says_infeasible_with_the_bound_when_nothing_can_leave_ram(tmp_path):
    # NO_FIT with runtime 8.5: 0.5 to spare, below the cheapest recomputation (1); paging is off,
    # so every schedule keeps each value to its last read: stage 3 holds 0, 1, 2 (8) and computes 3
    path = tmp_path / "p.json"
    path.write_text(json.dumps({**NO_FIT, "runtime_budget_ms": 8.5}))
    r = roam("remat", path, "-o", tmp_path / "s.json")
    assert r.code == 1
    assert r.err.strip() == ("roam: infeasible: paging is off and the cheapest recomputation takes 1, over the 0.5 "
                             "of runtime left, so every schedule holds each value from its computation to its last "
                             "read: stage 3 then needs 12 bytes, over the RAM budget 10")


def test_message_says_the_milp_ran_out_of_time(tmp_path, monkeypatch):
    # the solver stopped at the deadline without a point (as on a problem too hard for the limit)
    p = read_doc(GREEDY_TRAP, tmp_path)
    monkeypatch.setattr(poet_solve.milp_mod, "solve", lambda *a, **k: poet_solve.milp_mod.NO_SOLUTION_IN_TIME)
    found = poet_solve.solve(p, time_limit=30)
    assert isinstance(found, poet_solve.NoSchedule) and not found.proved
    assert re.fullmatch(r"no schedule found: greedy found none \(\d+\.\d s\); "
                        r"MILP \(CBC, no start\) ran \d+\.\d s without a feasible point", found.message()), found.message()


def test_message_says_the_milp_did_not_run_when_no_time_is_left(tmp_path):
    # a limit under the margin leaves the search 0.5 s: the greedy's, none for the MILP
    path = tmp_path / "p.json"
    path.write_text(json.dumps(GREEDY_TRAP))
    r = roam("remat", path, "-o", tmp_path / "s.json", "--time-limit", "0.1")
    assert r.code == 1
    assert re.fullmatch(r"roam: no schedule found: greedy found none \(\d+\.\d s\); "
                        r"MILP \(CBC, no start\) not run: no time left", r.err.strip()), r.err
    assert "300" not in r.err and "repair" not in r.err
