"""The install ships every package of roam_cli: a subpackage missing from pyproject's list
imports from the source tree (editable install, these tests) but not from a wheel."""

import re
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the test extra brings tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "roam_cli").rglob("__init__.py")}
    assert found == listed


# `roam[extra]` or a bare `pip install roam` installs the package index's `roam`, another project
# (0.1–0.3.1 when this was written); `onnx-roam[extra]` and `.[extra]` (from a clone) are this one.
INDEX_ROAM = re.compile(r"(?<![\w./-])roam\[[a-z, ]+\]|pip3? install(?:\s+-\S+)*\s+['\"]?roam(?![\w.-])")
TEXTS = ["README.md", "BENCHMARKS.md", "Dockerfile", "pyproject.toml", "docs/**/*.md", "roam_cli/**/*.py",
         "scripts/*", "benchmarks/**/*.py", "benchmarks/**/*.sh", "sample_models/**/*.py", "sample_models/**/*.md"]


def test_the_distribution_has_a_name_of_its_own_and_the_command_stays_roam():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "onnx-roam" and project["scripts"] == {"roam": "roam_cli.__main__:main"}


def test_no_doc_or_message_installs_the_index_s_roam():
    files = sorted({p for pattern in TEXTS for p in ROOT.glob(pattern) if p.is_file()})
    assert len(files) > 50 and ROOT / "roam_cli" / "outputs" / "plot.py" in files
    found = [f"{p.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group()}"
             for p in files for text in [p.read_text(errors="replace")] for m in INDEX_ROAM.finditer(text)]
    assert found == []
