"""The property run at scale: random training graphs planned with every order x layout strategy
and checked by `roam verify`'s checker, random buffer sets placed by every layout strategy, and
corrupted model files (bytes overwritten) that must plan or exit 2 with one line.

    python benchmarks/fuzz.py                      # 10,000 of each
    python benchmarks/fuzz.py --graphs 500 --buffer-sets 0 --corrupted 0 --max-nodes 40

The checks are tests/test_properties.py's and tests/test_hostile.py's; hypothesis draws the cases
and, on a failure, shrinks it to a minimal example, prints it and this script exits 1. Prints a
table of counts and times."""

import argparse
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import onnx  # noqa: E402
from hypothesis import HealthCheck, given, note, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from random_graphs import buffer_sets, training_graphs  # noqa: E402
from test_hostile import check_corrupted  # noqa: E402
from test_properties import check_layouts, check_plans  # noqa: E402


@st.composite
def corrupted_files(draw, max_nodes: int) -> bytes:
    data = bytearray(draw(training_graphs(max_nodes)).SerializeToString())
    for _ in range(draw(st.integers(1, 4))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


def run(name: str, strategy, check, cases: int, rng_seed: int, totals: dict) -> int:
    """Run `check` on `cases` drawn cases; returns how many ran. Raises on the first failure."""
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", type=int, default=10_000, help="random graphs to plan with every strategy pair")
    ap.add_argument("--buffer-sets", type=int, default=10_000, help="random buffer sets to place with every layout")
    ap.add_argument("--corrupted", type=int, default=10_000, help="corrupted model files to plan through the CLI")
    ap.add_argument("--max-nodes", type=int, default=20, help="largest random graph, in nodes")
    ap.add_argument("--time-limit", type=float, default=4.0,
                    help="solver seconds per plan (under ~3 the ordering ILP never starts CBC)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    plan_totals = defaultdict(lambda: [0, 0.0])
    layout_totals = defaultdict(lambda: [0, 0.0])
    corrupted_totals = defaultdict(lambda: [0, 0.0])
    rows = []
    start = time.perf_counter()
    try:
        if args.graphs:
            t = time.perf_counter()
            n = run("graphs", training_graphs(args.max_nodes), lambda m: check_plans(m, args.time_limit),
                    args.graphs, args.seed, plan_totals)
            rows.append(("random graphs -> plan -> verify", n, sum(c for c, _ in plan_totals.values()),
                         time.perf_counter() - t))
        if args.buffer_sets:
            t = time.perf_counter()
            n = run("buffer sets", buffer_sets(), lambda b: check_layouts(b, args.time_limit),
                    args.buffer_sets, args.seed, layout_totals)
            rows.append(("random buffer sets -> layout", n, sum(c for c, _ in layout_totals.values()),
                         time.perf_counter() - t))
        if args.corrupted:
            t = time.perf_counter()
            n = run("corrupted files", corrupted_files(args.max_nodes), timed(check_corrupted), args.corrupted,
                    args.seed, corrupted_totals)
            rows.append(("corrupted files -> plan or exit 2", n, corrupted_totals["planned"][0],
                         time.perf_counter() - t))
    except Exception as e:  # hypothesis attaches the shrunk falsifying example as notes
        print("\n".join(getattr(e, "__notes__", [])))
        print(f"\nINVALID: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        print("invalid plans or layouts: at least 1 (hypothesis stops at the first and shrinks it)")
        return 1

    print(f"machine: {platform.processor() or platform.machine()}, {platform.python_implementation()} "
          f"{platform.python_version()}; seed {args.seed}, max {args.max_nodes} nodes, "
          f"solver limit {args.time_limit} s per plan")
    print(f"{'check':36} {'cases':>8} {'plans checked':>14} {'invalid':>8} {'seconds':>9}")
    for name, cases, checked, seconds in rows:
        print(f"{name:36} {cases:>8} {checked:>14} {0:>8} {seconds:>9.1f}")
    print(f"\n{'strategy':36} {'plans':>8} {'mean ms':>9}")
    for (o, lay), (count, seconds) in sorted(plan_totals.items()):
        print(f"{'order ' + o + ' x layout ' + lay:36} {count:>8} {1000 * seconds / count:>9.2f}")
    for lay, (count, seconds) in sorted(layout_totals.items()):
        print(f"{'layout ' + lay + ' (buffer sets)':36} {count:>8} {1000 * seconds / count:>9.2f}")
    for outcome, (count, seconds) in sorted(corrupted_totals.items()):
        print(f"{'corrupted file: ' + outcome:36} {count:>8} {1000 * seconds / count:>9.2f}")
    print(f"\ntotal: {time.perf_counter() - start:.1f} s, 0 invalid")
    return 0


if __name__ == "__main__":
    sys.exit(main())
