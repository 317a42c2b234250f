"""The four rooms of DESIGN.md §1: imports flow one way and the pure parts do no I/O."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IO_MODULES = {"git", "fsspec", "s3fs", "subprocess", "socket", "requests", "time", "shutil", "watchfiles",
              "apscheduler", "adapters.storage", "adapters.stores", "adapters.gitrepo", "adapters.local",
              "adapters.registry"}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_import_contracts_hold() -> None:
    """import-linter checks the layers reconciler -> adapters -> status -> desired and that
    compute adapters do not import each other (contracts in pyproject.toml)."""
    res = subprocess.run([sys.executable, "-m", "importlinter.cli", "--config", str(ROOT / "pyproject.toml")],
                         cwd=ROOT, capture_output=True, text=True)
    if res.returncode != 0 and "No module named importlinter.cli" in res.stderr:
        res = subprocess.run(["lint-imports", "--config", str(ROOT / "pyproject.toml")], cwd=ROOT,
                             capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "BROKEN" not in res.stdout


def test_desired_status_and_planner_do_no_io() -> None:
    pure = [*sorted((ROOT / "desired").glob("*.py")), *sorted((ROOT / "status").glob("*.py")),
            *sorted((ROOT / "reconciler" / "planner").rglob("*.py")),
            *(ROOT / "reconciler" / f"{name}.py" for name in ("cli/review", "daemon/notices", "trust/policy"))]
    assert len(pure) > 20
    for path in pure:
        bad = {m for m in imported_modules(path) if m in IO_MODULES or m.split(".")[0] in IO_MODULES}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def import_circles(package: str) -> list[list[str]]:
    """The strongly connected groups of modules (Tarjan) in the run-time import graph of a package:
    every import counts, lazy ones inside functions too, except those only a type checker sees."""
    import grimp

    graph = grimp.build_graph(package, exclude_type_checking_imports=True)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph.find_modules_directly_imported_by(module)):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = [stack.pop()]
            while group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1:
                circles.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return circles


def test_no_import_circles() -> None:
    for package in ("reconciler", "adapters", "status", "desired"):
        assert import_circles(package) == [], package


def test_the_top_of_the_package_keeps_at_most_eight_modules() -> None:
    """The loop's parts are sub-packages (planner, daemon, trust, cli, demo, web, sim, worker); only
    shared leaves stay at the top (CONTRIBUTING.md has the map)."""
    top = sorted(p.name for p in (ROOT / "reconciler").glob("*.py"))
    assert len(top) <= 8, top
