"""Exit 0 when every requirement scripts/install-dev.sh would install is already met, so that it
can skip pip's resolver (9 s on a machine where nothing is missing) and reinstall only this checkout.

    python scripts/deps_ready.py EXTRAS [REQUIREMENT...]

EXTRAS is a comma-separated list of pyproject's optional-dependency groups; the package's own
dependencies, its build requirements and the REQUIREMENTs given are checked as well. Checked: each
named distribution is installed in a version its specifier allows (markers honoured). Not checked:
what those distributions require in turn; a broken environment is pip's to mend, with the full
install that a missing or out-of-range name brings on.
"""

from __future__ import annotations

import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement


def unmet(requirements: list[str]) -> list[str]:
    """The requirements not met here, each with what is installed instead."""
    missing = []
    for text in requirements:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            installed = version(req.name)
        except PackageNotFoundError:
            missing.append(f"{text} (not installed)")
            continue
        if req.specifier and not req.specifier.contains(installed, prereleases=True):
            missing.append(f"{text} ({installed} installed)")
    return missing


def main(argv: list[str]) -> int:
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    groups = project["project"].get("optional-dependencies", {})
    wanted = [*project["project"].get("dependencies", []), *project["build-system"].get("requires", [])]
    for extra in filter(None, argv[0].split(",") if argv else []):
        wanted += groups[extra]
    wanted += argv[1:]
    missing = unmet(wanted)
    for line in missing:
        print(f"needs installing: {line}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
