"""python -m benchmarks list | run AREA | run AREA/NAME[.VARIANT] [options] | md

list   every benchmark by area, with what it takes
run    one benchmark (its options after its name; `.VARIANT` saves a second record beside the
       default one), or an area's headline benchmarks in turn; each writes
       benchmarks/results/AREA/NAME[.VARIANT].json and prints its table
md     BENCHMARKS.md and the README's results table, from the results files alone"""

from __future__ import annotations

import ast
import importlib
import sys

from benchmarks import AREAS, harness


def benchmarks_of(area: str) -> dict[str, str]:
    """NAME -> TAKES of every benchmark module in the area, read without importing it (a benchmark
    may import what this machine lacks)."""
    found = {}
    for path in sorted((harness.ROOT / "benchmarks" / area).glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["TAKES"]:
                found[path.stem] = ast.literal_eval(node.value)
    return found


def run_one(record: str, argv: list[str]) -> None:
    name = record.split(".", 1)[0]
    area, _, stem = name.partition("/")
    if area not in AREAS or stem not in benchmarks_of(area):
        sys.exit(f"no benchmark {name!r}: `python -m benchmarks list` names them")
    module = importlib.import_module(f"benchmarks.{area}.{stem}")
    with harness.Measured() as cost:
        results = module.main(argv)
    harness.save(harness.results_path(record), harness.record(record, argv, results, cost))
    print(module.table(results))
    print(f"{record}: {cost.wall_s} s wall, {cost.cpu_s} s CPU, peak RSS {cost.peak_rss_mib} MiB -> "
          f"{harness.results_path(record).relative_to(harness.ROOT)}", file=sys.stderr)


def main(argv: list[str]) -> None:
    command = argv[0] if argv else "list"
    if command == "list":
        for area in AREAS:
            title = importlib.import_module(f"benchmarks.{area}").TITLE
            print(f"{area}/  {title}")
            for name, takes in benchmarks_of(area).items():
                print(f"  {area}/{name:<22} {takes}")
    elif command == "run" and len(argv) >= 2:
        target = argv[1]
        if target in AREAS:
            for record, options in importlib.import_module(f"benchmarks.{target}").HEADLINES:
                run_one(record, options)
        else:
            run_one(target, argv[2:])
    elif command == "md":
        from benchmarks import markdown
        markdown.write()
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
