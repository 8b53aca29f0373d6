"""The folder list shows the stages, and data flows one way: a module imports only from its own
package or from a stage below it (docs/structure.md). Imports inside functions count too: a
lazy import is still a dependency."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "roam_cli"

# Stage -> rank. Packages are stages; the few top-level modules have a rank each.
RANKS = {
    "roam_cli": 0,  # the package itself: __version__
    "core": 0, "cost": 0.5, "solvers": 1, "lower": 1.5, "precision": 1.75, "frontend": 2, "backward": 2.5, "recompute": 3, "offload": 3.5, "shard": 3.75,
    "pair": 4, "verify": 4.5,
    "order": 5, "remat": 5.5, "layout": 6, "runtime": 7, "outputs": 7, "gradcheck": 7.5,
    "pipeline": 8, "budget": 9, "tradeoff": 9, "cli": 10, "__main__": 11,
}


def stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path, name: str) -> set[str]:
    """The roam_cli modules a file imports (a `from pkg import mod` names the module)."""
    known = modules()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("roam_cli")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if base.startswith("roam_cli"):
                for alias in node.names:
                    found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return found - {name}


def test_top_level_holds_packages_and_at_most_six_modules():
    loose = [p.stem for p in ROOT.glob("*.py") if not p.stem.startswith("__")]
    assert len(loose) <= 6, loose
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert set(loose) | packages | {"roam_cli", "__main__"} == set(RANKS), "every stage has a rank"


def test_no_import_from_a_lower_stage_to_a_higher_one():
    upward = []
    for name, path in modules().items():
        for target in imports(path, name):
            if stage(target) == stage(name) and "." in name and "." in target:
                continue  # within one package
            if RANKS[stage(target)] >= RANKS[stage(name)] and stage(target) not in ("roam_cli",):
                upward.append(f"{name} imports {target}")
    assert upward == [], upward


def test_no_import_cycle():
    # a module's import of its own package (`from roam_cli.order import _ideals`, a C extension)
    # is no edge: the package is already being imported, whichever module the search starts from
    graph = {name: {t for t in imports(path, name) if not name.startswith(t + ".")} for name, path in modules().items()}
    state: dict[str, int] = {}

    def visit(node, trail):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                raise AssertionError(" -> ".join(trail + [nxt]))
            if nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def test_no_folder_holds_more_than_15_percent_of_the_code():
    """A folder that outgrows its share is several rooms in one: split it by what its files do."""
    project = ROOT.parent
    lines: dict[Path, int] = {}
    for path in project.rglob("*"):
        parts = path.relative_to(project).parts
        if path.suffix in (".py", ".c", ".cc", ".h") and not any(p.startswith(".") or p == "build" for p in parts):
            lines[path.parent] = lines.get(path.parent, 0) + len(path.read_text().splitlines())
    total = sum(lines.values())
    over = {str(folder.relative_to(project)): n for folder, n in lines.items() if n > 0.15 * total}
    assert over == {}, f"{over} of {total} lines"
