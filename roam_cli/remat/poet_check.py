"""`roam remat --check` for POET's problems: is a `poet-schedule-v1` schedule valid under POET's
exact accounting (POETSolver in POET's poet/poet_solver.py, restated in docs/poet.md), and what
does it cost? Written apart from the solver on purpose: it reads both files itself and imports
nothing from roam, so a bug in the solver cannot hide in shared code.

    python -m roam_cli.remat.poet_check PROBLEM.json SCHEDULE.json

prints the verdict as JSON and exits 0 when the schedule is valid, 1 when it is not, 2 when a file
cannot be read. RAM is compared exactly (whole bytes); the runtime within RUNTIME_SLACK of its
budget, as its float sum depends on the order of the additions."""

import json
import sys

MATRICES = ("R", "SRam", "SSd", "MIn", "MOut")
RUNTIME_SLACK = 1e-9  # relative


def _load(path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data


def _matrices(schedule: dict, T: int) -> dict[str, list[list[int]]]:
    """The five matrices as dense T x T lists of 0/1; ValueError for a malformed schedule."""
    if schedule.get("T") != T:
        raise ValueError(f"the schedule's T {schedule.get('T')!r} is not the problem's {T}")
    dense = {}
    for name in MATRICES:
        pairs = schedule.get(name)
        if not isinstance(pairs, list):
            raise ValueError(f"the schedule has no '{name}' list of [t, i] pairs")
        m = [[0] * T for _ in range(T)]
        for p in pairs:
            if not (isinstance(p, list) and len(p) == 2 and all(type(x) is int and 0 <= x < T for x in p)):
                raise ValueError(f"{name} holds {str(p)[:40]}, not a pair [t, i] of indices below T = {T}")
            m[p[0]][p[1]] = 1
        dense[name] = m
    return dense


def evaluate(problem: dict, schedule: dict) -> dict:
    """The verdict on `schedule` (a poet-schedule-v1 document) for `problem` (poet-problem-v1):
    {valid, violations, peak_ram_bytes, runtime, energy_joules, compute_joules, paging_joules}."""
    try:
        T = problem["T"]
        nodes = problem["nodes"]
        ram = [n["cost_ram"] for n in nodes]
        cpu = [n["cost_cpu"] for n in nodes]
        compute_j = [n["compute_joules"] for n in nodes]
        pagein_j = [n["pagein_joules"] for n in nodes]
        pageout_j = [n["pageout_joules"] for n in nodes]
        edges = [(u, v) for u, v in problem["edges"]]
        ram_budget, runtime_budget = problem["ram_budget_bytes"], problem["runtime_budget_ms"]
        paging, remat = problem["paging"], problem["remat"]
    except (KeyError, TypeError, ValueError):
        raise ValueError("not a POET problem (poet-problem-v1)") from None
    if len(nodes) != T or any(not (0 <= u < v < T) for u, v in edges):
        raise ValueError("not a POET problem: T nodes, edges u < v < T")
    m = _matrices(schedule, T)
    R, SRam, SSd, MIn, MOut = (m[name] for name in MATRICES)
    bad: list[str] = []

    for name, first_zero in (("R", 1), ("SRam", 0), ("SSd", 0), ("MIn", 1), ("MOut", 1)):
        for t in range(T):
            for i in range(t + first_zero, T):
                if m[name][t][i]:
                    bad.append(f"stage {t}: {name}[{t}][{i}] = 1, but it must be 0 (node {i} "
                               f"{'is after' if first_zero else 'is not before'} the stage)")
    for t in range(T):
        if not R[t][t]:
            bad.append(f"stage {t}: node {t} is not computed (R[{t}][{t}] must be 1)")
    if not paging:
        bad += [f"stage {t}: {name} of node {i}, but the problem disables paging"
                for name in ("SSd", "MIn", "MOut") for t in range(T) for i in range(T) if m[name][t][i]]
    if not remat:
        bad += [f"stage {t}: node {i} recomputed, but the problem disables rematerialisation"
                for t in range(T) for i in range(t) if R[t][i]]
    for t in range(T):
        for u, v in sorted(set(edges)):
            if R[t][v] and not (R[t][u] or SRam[t][u]):
                bad.append(f"stage {t}: node {v} computed but its input {u} is neither computed nor in RAM")
    for t in range(T - 1):
        for i in range(T):
            if SRam[t + 1][i] and not (SRam[t][i] or R[t][i] or MIn[t][i]):
                bad.append(f"stage {t + 1}: node {i} in RAM, but in stage {t} it was neither in RAM, "
                           "computed nor paged in")
            if SSd[t + 1][i] and not (SSd[t][i] or MOut[t][i]):
                bad.append(f"stage {t + 1}: node {i} on storage, but in stage {t} it was neither on storage "
                           "nor paged out")
    for t in range(T):
        for i in range(T):
            if MIn[t][i] and not SSd[t][i]:
                bad.append(f"stage {t}: node {i} paged in but not on storage")
            if MOut[t][i] and not SRam[t][i]:
                bad.append(f"stage {t}: node {i} paged out but not in RAM")

    # RAM: POET's U recurrence, Free_E[t][e] = 1 iff edge e = (i, k) has no hazard in stage t
    successors = [set() for _ in range(T)]
    into = [[] for _ in range(T)]  # the sources of the edges into k, a duplicated edge twice
    for u, v in edges:
        successors[u].add(v)
        into[v].append(u)
    peak = None
    for t in range(T):
        U = R[t][0] * ram[0] + sum(SRam[t][i] * ram[i] for i in range(T))
        worst = (U, 0)
        for k in range(T - 1):
            freed = sum(ram[i] for i in into[k]
                        if R[t][k] and not (t + 1 < T and SRam[t + 1][i])
                        and not any(R[t][j] for j in successors[i] if j > k))
            U += R[t][k + 1] * ram[k + 1] - freed
            if U > worst[0] or U < 0:
                worst = (U, k + 1)
            if U < 0:
                break
        peak = worst[0] if peak is None else max(peak, worst[0])
        if worst[0] < 0:
            bad.append(f"stage {t}: RAM is {worst[0]} bytes (negative) at node {worst[1]}")
        elif worst[0] > ram_budget:
            bad.append(f"stage {t}: RAM {worst[0]} bytes at node {worst[1]} is over the budget {ram_budget}")

    runtime = sum(R[t][i] * cpu[i] for t in range(T) for i in range(T))
    if runtime > runtime_budget * (1 + RUNTIME_SLACK):
        bad.append(f"runtime {runtime:.6g} is over the budget {runtime_budget:.6g}")
    compute = sum(R[t][i] * compute_j[i] for t in range(T) for i in range(T))
    paged = sum(MIn[t][i] * pagein_j[i] + MOut[t][i] * pageout_j[i] for t in range(T) for i in range(T))
    return {"valid": not bad, "violations": bad, "peak_ram_bytes": peak, "runtime": runtime,
            "energy_joules": compute + paged, "compute_joules": compute, "paging_joules": paged}


def check(problem_path, schedule_path) -> dict:
    """`evaluate` on two files; ValueError when one cannot be read or is malformed."""
    try:
        return evaluate(_load(problem_path), _load(schedule_path))
    except ValueError as e:
        raise ValueError(str(e) if str(e).startswith("cannot read") else f"{schedule_path}: {e}") from None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m roam_cli.remat.poet_check PROBLEM.json SCHEDULE.json", file=sys.stderr)
        return 2
    try:
        verdict = check(*argv)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    print(json.dumps(verdict, indent=1))
    return 0 if verdict["valid"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
