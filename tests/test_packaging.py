"""The install ships every package of roam_cli: a subpackage missing from pyproject's list
imports from the source tree (editable install, these tests) but not from a wheel."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "roam_cli").rglob("__init__.py")}
    assert found == listed
