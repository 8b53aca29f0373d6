"""HiGHS on an MPS file, in a process of its own so that the caller can stop it at its deadline
(HiGHS's cut separation checks neither its time limit nor its interrupt callback for a minute
on some ordering models). Run by `milp.solve_with_highs`, which reads SOLUTION back:

    python -m roam_cli.solvers.highs_run MODEL.mps START|- SOLUTION TIME_LIMIT

START holds one initial value per column (the warm start); SOLUTION gets "optimal" or
"feasible" on its first line and the column values after, "infeasible" when HiGHS proved that
the model has none, or "none" when it stopped (time or node limit) without a solution."""

import sys

import highspy


def main(model: str, start: str, solution: str, time_limit: str) -> None:
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.readModel(model)
    for option, value in (("time_limit", float(time_limit)), ("threads", 1), ("mip_rel_gap", 0.0),
                          ("mip_abs_gap", 0.0), ("random_seed", 1)):
        h.setOptionValue(option, value)
    if start != "-":
        warm = highspy.HighsSolution()
        warm.col_value = [float(x) for x in open(start).read().split()]
        h.setSolution(warm)
    h.run()
    if start != "-" and not objective_matches_solution(h):
        # HiGHS 1.16 can hand the warm start back as "optimal" under an objective value that is
        # not the start's (an ordering model of 8 nodes: 14,316 reported, 23,028 the start's own,
        # 20,841 the optimum): its claim is then worthless, and a cold solve gets it right
        h.clearSolver()
        h.run()
    if h.getInfo().primal_solution_status != 2:  # no feasible solution: proved none, or time or node limit
        proved = h.getModelStatus() == highspy.HighsModelStatus.kInfeasible
        with open(solution, "w") as f:
            f.write("infeasible\n" if proved else "none\n")
        return
    status = "optimal" if h.getModelStatus() == highspy.HighsModelStatus.kOptimal else "feasible"
    with open(solution, "w") as f:
        f.write(status + "\n" + "\n".join(repr(x) for x in h.getSolution().col_value) + "\n")


def objective_matches_solution(h: highspy.Highs) -> bool:
    """Whether the objective HiGHS reports is the objective of the solution it returns."""
    if h.getInfo().primal_solution_status != 2:
        return True
    lp = h.getLp()
    own = lp.offset_ + sum(c * x for c, x in zip(lp.col_cost_, h.getSolution().col_value))
    return abs(own - h.getInfo().objective_function_value) <= 1e-6 * max(1.0, abs(own))


if __name__ == "__main__":
    main(*sys.argv[1:])
