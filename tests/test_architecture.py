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
            *(ROOT / "reconciler" / f"{name}.py" for name in ("plan", "judge", "placement", "ledger", "forecast",
                                                                   "deadline", "outlook", "tick", "launching",
                                                                   "review", "notices", "trust"))]
    for path in pure:
        bad = {m for m in imported_modules(path) if m in IO_MODULES or m.split(".")[0] in IO_MODULES}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"
