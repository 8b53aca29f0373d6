"""BENCHMARKS.md and the README's results table, written from benchmarks/results/ alone: each area's
headline tables (`HEADLINES`), each under the command, date, machine and commit that made it, then
the area's method (its package docstring) and a link to its details page; the README's table from
the areas' `readme_rows`, every figure linking to its section."""

from __future__ import annotations

import importlib
import re

from benchmarks import AREAS, harness
from roam_cli.core.fileio import write_all_atomic

BENCHMARKS_MD = harness.ROOT / "BENCHMARKS.md"
README = harness.ROOT / "README.md"
# The README's table sits between these lines; everything else in the README is hand-written.
README_START = "<!-- results: written by `python -m benchmarks md` from benchmarks/results/ -->"
README_END = "<!-- end of results -->"

INTRO = """# Benchmarks

What roam achieves, by area, against the tool each area is measured against. Every table below is
written by `python -m benchmarks md` from the records in `benchmarks/results/` (each the output of the
command above its table, on the machine and commit named there); `python -m benchmarks list` names
every benchmark, with how long it takes and what it needs. Details, further tables and known limits
are on each area's page under `docs/benchmarks/`.
"""


def area(name: str):
    return importlib.import_module(f"benchmarks.{name}")


def anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def provenance(record: dict) -> str:
    m = record["machine"]
    where = m.get("note") or ", ".join(str(x) for x in (f"{m.get('cores')} cores" if m.get("cores") else None,
                                                       f"{m['memory_gib']} GiB" if m.get("memory_gib") else None,
                                                       m.get("cpu"), f"Python {m['python']}" if m.get("python") else None,
                                                       f"onnxruntime {m['onnxruntime']}" if m.get("onnxruntime") else None)
                                       if x)
    cost = f", {record['wall_s']:,.0f} s" if record.get("wall_s") else ""
    return f"`{record['command']}` · {record['date']} · {where} · commit {record['commit'] or 'unknown'}{cost}"


def section(name: str) -> str:
    package = area(name)
    parts = [f"## {package.TITLE}\n"]
    for record_name, _ in package.HEADLINES:
        record = harness.load(record_name)
        module = importlib.import_module(f"benchmarks.{record_name.split('.')[0].replace('/', '.')}")
        parts += [provenance(record) + "\n", module.table(record["results"]).rstrip() + "\n"]
    parts += [" ".join(package.__doc__.split()) + "\n", f"Details: [{package.DETAILS}]({package.DETAILS}).\n"]
    return "\n".join(parts)


def readme_table() -> str:
    rows = []
    for name in AREAS:
        package = area(name)
        link = f"BENCHMARKS.md#{anchor(package.TITLE)}"
        for row in package.readme_rows(lambda record: harness.load(record)["results"]):
            rows.append([row["against"], row["workload"], f"[{row['figure']}]({link})"])
    return harness.markdown_table(["against", "workload", "roam"], rows, align="lll")


def write() -> None:
    text = INTRO + "\n" + "\n".join(f"- [{area(n).TITLE}](#{anchor(area(n).TITLE)})" for n in AREAS) + "\n\n"
    text += "\n".join(section(n) for n in AREAS)
    readme = README.read_text()
    start, end = readme.index(README_START) + len(README_START), readme.index(README_END)
    # both pages or neither: the README's table and BENCHMARKS.md are written from the same records
    write_all_atomic({BENCHMARKS_MD: text, README: readme[:start] + "\n" + readme_table() + readme[end:]})
