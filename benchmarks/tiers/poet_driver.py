"""POET's side of tiers/poet_peers: runs inside POET's own venv (numpy 1.24, pandas 1.5, PuLP 2.7), on
POET's source, started by path (`python benchmarks/tiers/poet_driver.py ...`) by tiers/poet_peers;
standalone (neither roam nor the benchmarks package is importable there), never imported by roam.

    python poet_driver.py POET_SRC graph MODEL PLATFORM OUT.json     # POET's graph of a model on a platform
    python poet_driver.py POET_SRC solve PROBLEM.json SECONDS OUT.json  # POET's MILP (pulp-cbc) on a problem file

`poet/__init__.py` imports poet/solve.py, which imports gurobipy; the pulp-cbc path needs neither,
so the package is registered without running its __init__ and its modules are imported directly.

`solve` rebuilds POET's DFGraph (its own class) from the problem file rather than building the
model again: POET orders nodes by random uuids, so a second build of a branchy model is a
different problem. The rebuilt graph's edge_list must equal the file's, duplicates and order
included, or the driver stops."""

import json
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, sys.argv[1])
sys.modules["poet"] = types.ModuleType("poet")
sys.modules["poet"].__path__ = [str(Path(sys.argv[1]) / "poet")]

import numpy as np  # noqa: E402
import poet.chipsets  # noqa: E402
import pulp as pl  # noqa: E402
from poet.poet_solver import POETSolver  # noqa: E402
from poet.util import get_chipset_and_net, make_dfgraph_costs  # noqa: E402
from poet.utils.checkmate.core.dfgraph import DFGraph  # noqa: E402


def plain(x):
    return x.item() if isinstance(x, np.generic) else x


def graph(model: str, platform: str, batch_size: int = 1, mem_power_scale: float = 1.0) -> dict:
    """The problem's graph fields as poet/solve.py solve() builds them (budgets are the caller's)."""
    chipset, net = get_chipset_and_net(platform=platform, model=model, batch_size=batch_size,
                                       mem_power_scale=mem_power_scale)
    g, compute, pagein, pageout = make_dfgraph_costs(net=net, device=chipset)
    chipset_name = next(name for name, value in vars(poet.chipsets).items() if value is chipset)
    nodes = [{"index": i, "name": g.node_names[i], "cost_cpu": plain(g.cost_cpu[i]), "cost_ram": plain(g.cost_ram[i]),
              "compute_joules": plain(compute[i, 0]), "pagein_joules": plain(pagein[i, 0]),
              "pageout_joules": plain(pageout[i, 0]), "backward": i in g.backward_nodes} for i in range(g.size)]
    return {"model": model, "platform": platform, "chipset": chipset_name, "batch_size": batch_size,
            "mem_power_scale": mem_power_scale, "T": g.size, "num_edges": len(g.edge_list), "nodes": nodes,
            "edges": [[plain(u), plain(v)] for u, v in g.edge_list],
            "parameter_cost": float(g.cost_ram_parameters),
            "total_runtime_ms": plain(sum(g.cost_cpu.values())),
            "forward_ram_total_bytes": plain(sum(g.cost_ram[i] for i in g.vfwd))}


def rebuilt_graph(problem: dict) -> DFGraph:
    """POET's DFGraph with the file's edge_list. POET fills `args` in the net's layer order (the
    number in each node's name) with each layer's inputs, and edge_list groups edges by source in
    order of first appearance; sorting each node's inputs by where their group starts restores it."""
    nodes, edges = problem["nodes"], [tuple(e) for e in problem["edges"]]
    group_start = {}
    for position, (u, _) in enumerate(edges):
        group_start.setdefault(u, position)
    layer = {n["index"]: int(n["name"].split("_")[0][len("layer"):]) for n in nodes}
    args = {v: sorted((u for u, w in edges if w == v), key=group_start.__getitem__)
            for v in sorted(layer, key=layer.__getitem__)}
    g = DFGraph(args=args, v=[n["index"] for n in nodes], backward_nodes=[n["index"] for n in nodes if n["backward"]],
                cost_cpu={n["index"]: n["cost_cpu"] for n in nodes}, cost_ram={n["index"]: n["cost_ram"] for n in nodes},
                node_names={n["index"]: n["name"] for n in nodes}, cost_ram_parameters=problem["parameter_cost"])
    if g.edge_list != edges:
        sys.exit("the rebuilt DFGraph's edge_list differs from the problem file's")
    return g


def solve(problem: dict, seconds: float) -> dict:
    """POETSolver with pulp-cbc as solve() calls it; PuLP 2.7 reports a timed-out CBC run that has
    a schedule as LpStatusOptimal, so optimal vs feasible is read from sol_status ("infeasible":
    CBC proved that no schedule fits)."""
    g = rebuilt_graph(problem)
    vector = lambda key: np.asarray([n[key] for n in problem["nodes"]]).reshape((-1, 1))  # noqa: E731
    start = time.perf_counter()
    solver = POETSolver(g=g, cpu_power_cost_vec_joule=vector("compute_joules"),
                        pagein_power_cost_vec_joule=vector("pagein_joules"),
                        pageout_power_cost_vec_joule=vector("pageout_joules"),
                        ram_budget_bytes=problem["ram_budget_bytes"], runtime_budget_ms=problem["runtime_budget_ms"],
                        paging=int(problem["paging"]), remat=int(problem["remat"]), solver="pulp-cbc",
                        time_limit_s=seconds)
    built = time.perf_counter()
    solution = solver.solve()
    solved = time.perf_counter()
    status = ("infeasible" if solver.m.status == pl.LpStatusInfeasible else
              {pl.LpSolutionOptimal: "optimal", pl.LpSolutionIntegerFeasible: "feasible"}.get(solver.m.sol_status, "none"))
    out = {"status": status, "pulp_status": pl.LpStatus[solver.m.status], "build_seconds": built - start,
           "solve_seconds": solved - built, "poet_solve_time_s": solution.solve_time_s}
    if status in ("optimal", "feasible"):
        names = {"R": solver.R, "SRam": solver.SRam, "SSd": solver.SSd, "MIn": solver.MIn, "MOut": solver.MOut}
        out["schedule"] = {"format": "poet-schedule-v1", "T": g.size} | {
            name: [[t, i] for t in range(g.size) for i in range(g.size) if round(pl.value(m[t][i]) or 0) == 1]
            for name, m in names.items()}
        out["objective_joules"] = float(np.sum(pl.value(solver.m.objective)))  # costs are 1-element arrays
    return out


if __name__ == "__main__":
    command, rest = sys.argv[2], sys.argv[3:]
    if command == "graph":
        result = graph(rest[0], rest[1])
    else:
        result = solve(json.loads(Path(rest[0]).read_text()), float(rest[1]))
    Path(rest[-1]).write_text(json.dumps(result, indent=1) + "\n")
