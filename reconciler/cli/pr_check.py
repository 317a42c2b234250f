"""`reconciler init --github-actions`: writes the pull-request check, a GitHub Actions workflow that
validates the manifests and keeps one `reconciler plan --base` comment on every pull request that
touches `desired/` or `reconciler.yaml` (the workflow text is `reconciler/cli/templates/reconciler-plan.yml`).

The workflow passes every `${{ ... }}` value to its shell steps through `env:`, never inside a
`run:` script (a branch name or title cannot inject shell), asks for `contents: read` and
`pull-requests: write` only, and pins the actions it uses to commit hashes.
"""

from __future__ import annotations

import re
from importlib import metadata, resources
from pathlib import Path

WORKFLOW_PATH = ".github/workflows/reconciler-plan.yml"
FAIL_ON_CHOICES = ("restart", "cancel")
# a pip requirement or URL: nothing a YAML string or a shell would act on
_PACKAGE_TEXT = re.compile(r"[A-Za-z0-9_.+\-=<>!~@:/\[\],]+")


class WorkflowError(ValueError):
    """A value for the workflow that cannot be used; the message says which and why."""


def default_package() -> str:
    """What the workflow installs unless told otherwise: this reconciler's own version."""
    try:
        return f"reconciler=={metadata.version('reconciler')}"
    except metadata.PackageNotFoundError:
        return "reconciler"


def parse_fail_on(text: str) -> list[str]:
    wanted = sorted({w.strip() for w in text.split(",") if w.strip()})
    unknown = [w for w in wanted if w not in FAIL_ON_CHOICES]
    if unknown:
        raise WorkflowError(f"--fail-on takes {', '.join(FAIL_ON_CHOICES)} or both (comma-separated), "
                            f"not {', '.join(unknown)}")
    return wanted


def render_workflow(package: str | None = None, fail_on: str = "") -> str:
    """The workflow text, with what pip installs and what fails the check filled in."""
    package = package or default_package()
    if not _PACKAGE_TEXT.fullmatch(package):
        raise WorkflowError(f"--package {package!r} is not a pip requirement or URL (no spaces, quotes, "
                            "`$`, `#` or newlines)")
    template = resources.files("reconciler.cli").joinpath("templates/reconciler-plan.yml").read_text()
    return template.replace("__PACKAGE__", package).replace("__FAIL_ON__", ",".join(parse_fail_on(fail_on)))


def write_workflow(root: Path, text: str) -> str | None:
    """Writes the workflow text under `root`; returns its path relative to root, or None when a file
    is already there (a workflow someone may have edited is never overwritten)."""
    target = root / WORKFLOW_PATH
    if target.exists():
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return WORKFLOW_PATH
