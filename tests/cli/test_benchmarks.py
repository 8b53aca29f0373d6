"""The benchmarks' one entry point, and the pages written from their results: every benchmark is
listed by area with what it takes, every results file is drawn by its benchmark's own table, and
BENCHMARKS.md and the README's results table are exactly what the results files give today (a
figure typed by hand, or a result changed without the pages written again, fails here)."""

import importlib
import json
import subprocess
import sys

import pytest
from conftest import ROOT

from benchmarks import AREAS, harness, markdown


def test_list_names_every_benchmark_module_by_area_with_what_it_takes():
    listed = subprocess.run([sys.executable, "-m", "benchmarks", "list"], cwd=ROOT, capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    modules = {f"{p.parent.name}/{p.stem}" for area in AREAS for p in (ROOT / "benchmarks" / area).glob("*.py")
               if p.stem != "__init__" and "TAKES = " in p.read_text()}
    names = {line.split()[0] for line in listed.stdout.splitlines() if line.startswith("  ")}
    assert names == modules and len(modules) >= 40
    assert {p.name for p in (ROOT / "benchmarks").iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(AREAS)


# results/AREA/NAME[.VARIANT].json; a folder beside them holds what a record points to (pictures, a problem)
@pytest.mark.parametrize("path", sorted(harness.RESULTS.glob("*/*.json")), ids=lambda p: str(p.relative_to(harness.RESULTS)))
def test_every_record_names_its_command_and_is_drawn_by_its_benchmark(path):
    record = json.loads(path.read_text())
    name = str(path.relative_to(harness.RESULTS).with_suffix(""))
    assert record["benchmark"] == name and record["command"].startswith(f"python -m benchmarks run {name}")
    assert record["date"] and record["machine"]
    module = importlib.import_module("benchmarks." + name.split(".")[0].replace("/", "."))
    assert module.table(record["results"]).count("\n|") >= 2  # a header, its rule and rows


def test_benchmarks_md_and_the_readme_table_are_written_from_the_results(tmp_path, monkeypatch):
    monkeypatch.setattr(markdown, "BENCHMARKS_MD", tmp_path / "BENCHMARKS.md")
    monkeypatch.setattr(markdown, "README", tmp_path / "README.md")
    (tmp_path / "README.md").write_text((ROOT / "README.md").read_text())
    markdown.write()
    assert (tmp_path / "BENCHMARKS.md").read_text() == (ROOT / "BENCHMARKS.md").read_text(), \
        "BENCHMARKS.md differs from the results: python -m benchmarks md"
    assert (tmp_path / "README.md").read_text() == (ROOT / "README.md").read_text(), \
        "the README's results table differs from the results: python -m benchmarks md"
    assert len((ROOT / "BENCHMARKS.md").read_text().splitlines()) < 800


def test_the_readme_table_has_a_row_for_every_anchor_each_linking_to_its_section():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index(markdown.README_START):readme.index(markdown.README_END)]
    for anchor in ("PyTorch eager", "PyTorch AMP", "FSDP2", "XLA", "Moccasin", "POET", "minimalloc", "405B"):
        assert anchor in table, anchor
    sections = {markdown.anchor(line[3:].strip()) for line in (ROOT / "BENCHMARKS.md").read_text().splitlines()
                if line.startswith("## ")}
    links = [part.split(")")[0] for part in table.split("](BENCHMARKS.md#")[1:]]
    assert links and set(links) <= sections
