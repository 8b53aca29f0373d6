"""POET's problems (`roam remat` on poet-problem-v1): the checker on hand-built schedules of a
5-node problem whose RAM per stage is worked out below under POET's accounting, the solver on it
and on the two samples, and the CLI's refusals."""

import json
from pathlib import Path

import pytest

from roam_cli.remat import poet, poet_solve
from roam_cli.remat.poet_check import evaluate
from tests.conftest import roam

SAMPLES = Path("/work/shared/bench/poet")

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
    if not path.exists():
        pytest.skip(f"{path} is not here")
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
