"""Every `roam` line of the README's code blocks runs as written, in order, on the files the
repository ships, from a folder laid out as the clone's root (its `roam_cli` source tree beside
`sample_models`, as where the README's set-up leaves a newcomer), and exits 0. A block whose first
line announces `# needs ...` (torch, the user's own model) is skipped by that announcement."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

README = ROOT / "README.md"
TIMEOUT = 300  # seconds a line may take (the slowest, a POET problem, is given 10)
ROAM = str(Path(sys.executable).parent / "roam")  # the command as the README types it, this install's


def blocks(text: str) -> list[list[str]]:
    """The command lines of each fenced block: continuations joined, comments dropped."""
    found = []
    for body in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M):
        found.append([line.strip() for line in body.replace("\\\n", " ").splitlines() if line.strip()])
    return found


def roam_commands(line: str) -> list[list[str]]:
    """The `roam` commands of one line (a line may chain several with &&), as argument lists."""
    words = shlex.split(line, comments=True)
    commands, current = [], []
    for word in [*words, "&&"]:
        if word == "&&":
            if current and current[0] == "roam":
                commands.append(current[1:])
            current = []
        else:
            current.append(word)
    return commands


def test_the_readme_is_read_as_the_test_expects():
    found = blocks(README.read_text())
    announced = [b for b in found if b[0].startswith("# needs")]
    run = [c for b in found if not b[0].startswith("# needs") for line in b for c in roam_commands(line)]
    assert len(announced) == 1 and "torch" in announced[0][0]  # the PyTorch round trip: the user's model
    assert len(run) >= 30 and all(c for c in run)
    assert roam_commands("python -m pip install . && roam report plan.json  # a comment") == [["report", "plan.json"]]


@pytest.mark.slow
def test_every_readme_line_runs_on_the_shipped_files(tmp_path):
    for name in ("sample_models", "roam_cli"):  # the clone's root: its source tree shadows nothing
        (tmp_path / name).symlink_to(ROOT / name)
    ran = 0
    for block in blocks(README.read_text()):
        if block[0].startswith("# needs"):
            continue
        for line in block:
            for args in roam_commands(line):
                r = subprocess.run([ROAM, *args], cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)
                assert r.returncode == 0, f"roam {shlex.join(args)}: exit {r.returncode}\n{r.stderr[-2000:]}"
                ran += 1
    assert ran >= 30
    assert Path(tmp_path / "pictures").is_dir() and (tmp_path / "rank_plan.json").is_file()
