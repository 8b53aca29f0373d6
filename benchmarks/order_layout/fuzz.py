"""The property run at scale: random training graphs planned with every order x layout strategy and
checked by `roam verify`'s checker, random buffer sets placed by every layout strategy, and corrupted
model files (bytes overwritten) that must plan or exit 2 with one line.

    python -m benchmarks run order_layout/fuzz                      # 10,000 of each
    python -m benchmarks run order_layout/fuzz.small --graphs 500 --buffer-sets 0 --corrupted 0 --max-nodes 40

The checks are the tests' own (tests/order/test_properties.py's check_plans and check_layouts,
tests/cli/test_hostile.py's check_corrupted); hypothesis draws the cases and, on a failure, shrinks
it to a minimal example, prints it and the run stops (no results are written). The
checks run in a worker process, `python -m benchmarks.order_layout.fuzz --worker`, with the test
folders on its PYTHONPATH as pytest puts them. Needs the test extra (hypothesis); the default run
takes about 2 hours on two cores (most of it the 10,000 graphs' 300,000 plans)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict

from benchmarks import harness

TAKES = "about 2 h for 10,000 of each (minutes with --graphs 100 ...); needs the test extra (hypothesis)"
INVALID = 3  # the worker's exit status when a check fails (any other: the worker itself failed)
TEST_PATHS = [harness.ROOT, harness.ROOT / "tests", harness.ROOT / "tests" / "order", harness.ROOT / "tests" / "cli"]


def parser(prog: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=int, default=10_000, help="random graphs to plan with every strategy pair")
    ap.add_argument("--buffer-sets", type=int, default=10_000, help="random buffer sets to place with every layout")
    ap.add_argument("--corrupted", type=int, default=10_000, help="corrupted model files to plan through the CLI")
    ap.add_argument("--max-nodes", type=int, default=20, help="largest random graph, in nodes")
    ap.add_argument("--time-limit", type=float, default=4.0,
                    help="solver seconds per plan (under ~3 the ordering ILP never starts CBC)")
    ap.add_argument("--seed", type=int, default=0)
    return ap


def main(argv: list[str]) -> dict:
    parser("python -m benchmarks run order_layout/fuzz").parse_args(argv)  # --help and errors here
    env = os.environ | {"PYTHONPATH": os.pathsep.join(map(str, TEST_PATHS))}
    done = subprocess.run([sys.executable, "-m", "benchmarks.order_layout.fuzz", "--worker", *argv], cwd=harness.ROOT,
                          env=env, stdout=subprocess.PIPE, text=True)  # its progress goes to our stderr
    if done.returncode == INVALID:
        sys.exit("fuzz: invalid plans or layouts; the shrunk case is above")
    if done.returncode:
        sys.exit(f"fuzz: the worker failed (exit {done.returncode}); its error is above")
    return json.loads(done.stdout)


def table(results: dict) -> str:
    checks = [[c["check"], f"{c['cases']:,}", f"{c['checked']:,}", c["invalid"], f"{c['seconds']:,.1f}"]
              for c in results["checks"]]
    strategies = [[s["name"], f"{s['count']:,}", f"{s['mean_ms']:.2f}"] for s in results["strategies"]]
    return (harness.markdown_table(["check", "cases", "plans / layouts checked", "invalid", "seconds"], checks)
            + f"\nSeed {results['seed']}, graphs of up to {results['max_nodes']} nodes, solver limit "
            f"{results['time_limit']:g} s per plan; {results['seconds']:,.0f} s in all.\n\n"
            + harness.markdown_table(["strategy (or outcome)", "count", "mean ms"], strategies))


# The worker: the tests' checks under hypothesis (imported here only: they live in tests/).

def corrupted_files(max_nodes: int):
    from hypothesis import strategies as st
    from random_graphs import training_graphs

    @st.composite
    def files(draw) -> bytes:
        data = bytearray(draw(training_graphs(max_nodes)).SerializeToString())
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data)
    return files()


def run(name: str, strategy, check, cases: int, rng_seed: int, totals: dict) -> int:
    """Run `check` on `cases` drawn cases; returns how many ran. Raises on the first failure."""
    import onnx
    from hypothesis import HealthCheck, given, note, seed, settings
    done = 0

    @settings(max_examples=cases, deadline=None, database=None, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def prop(case):
        nonlocal done
        note(onnx.printer.to_text(case) if isinstance(case, onnx.ModelProto) else repr(case)[:2000])
        for key, seconds in check(case).items():
            totals[key][0] += 1
            totals[key][1] += seconds
        done += 1
        if done % 100 == 0:
            print(f"{name}: {done}/{cases}", file=sys.stderr, flush=True)

    while done < cases:  # hypothesis may stop a run early; top it up with a fresh seed
        before = done
        seed(rng_seed + done)(prop)()
        if done == before:
            raise RuntimeError(f"{name}: hypothesis generated no cases")
    return done


def timed(check):
    """A check returning an outcome name -> {outcome: seconds}, as the totals expect."""
    def run_check(case):
        start = time.perf_counter()
        outcome = check(case)
        return {outcome: time.perf_counter() - start}
    return run_check


def worker(argv: list[str]) -> int:
    from random_graphs import buffer_sets, training_graphs
    from test_hostile import check_corrupted
    from test_properties import check_layouts, check_plans

    args = parser("python -m benchmarks.order_layout.fuzz --worker").parse_args(argv)
    plan_totals = defaultdict(lambda: [0, 0.0])
    layout_totals = defaultdict(lambda: [0, 0.0])
    corrupted_totals = defaultdict(lambda: [0, 0.0])
    checks = []
    start = time.perf_counter()
    out, sys.stdout = sys.stdout, sys.stderr  # stdout carries the results alone; hypothesis reports to stderr
    try:
        if args.graphs:
            t = time.perf_counter()
            n = run("graphs", training_graphs(args.max_nodes), lambda m: check_plans(m, args.time_limit),
                    args.graphs, args.seed, plan_totals)
            checks.append(("random graphs -> plan -> verify", n, sum(c for c, _ in plan_totals.values()),
                           time.perf_counter() - t))
        if args.buffer_sets:
            t = time.perf_counter()
            n = run("buffer sets", buffer_sets(), lambda b: check_layouts(b, args.time_limit),
                    args.buffer_sets, args.seed, layout_totals)
            checks.append(("random buffer sets -> layout", n, sum(c for c, _ in layout_totals.values()),
                           time.perf_counter() - t))
        if args.corrupted:
            t = time.perf_counter()
            n = run("corrupted files", corrupted_files(args.max_nodes), timed(check_corrupted), args.corrupted,
                    args.seed, corrupted_totals)
            checks.append(("corrupted files -> plan or exit 2", n, corrupted_totals.get("planned", [0])[0],
                           time.perf_counter() - t))
    except Exception as e:  # hypothesis attaches the shrunk falsifying example as notes
        print("\n".join(getattr(e, "__notes__", [])))
        print(f"\nINVALID: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return INVALID
    finally:
        sys.stdout = out
    strategies = [(f"order {o} x layout {lay}", v) for (o, lay), v in sorted(plan_totals.items())]
    strategies += [(f"layout {lay} (buffer sets)", v) for lay, v in sorted(layout_totals.items())]
    strategies += [(f"corrupted file: {outcome}", v) for outcome, v in sorted(corrupted_totals.items())]
    print(json.dumps({
        "seed": args.seed, "max_nodes": args.max_nodes, "time_limit": args.time_limit,
        "checks": [{"check": c, "cases": n, "checked": k, "invalid": 0, "seconds": round(s, 1)}
                   for c, n, k, s in checks],
        "strategies": [{"name": name, "count": count, "mean_ms": round(1000 * seconds / count, 3)}
                       for name, (count, seconds) in strategies],
        "seconds": round(time.perf_counter() - start, 1)}))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["--worker"]:
        sys.exit("the worker of order_layout/fuzz: run `python -m benchmarks run order_layout/fuzz`")
    sys.exit(worker(sys.argv[2:]))
