"""The documentation builds without a warning, and the README stays a short front door inside the repository.

This is how the docs are built in CI: `mkdocs build --strict` fails on a broken link, a missing
anchor, a page left out of the nav, or a reference page the generator cannot write.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 300
# [text](target) and <a href="target">; an image's ![alt](target) is a link too.
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|href=\"([^\"]+)\"")


def _links(text: str) -> list[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # a command in a code block is not a link
    return [a or b for a, b in LINK.findall(text)]


def test_the_docs_build_strict_without_a_warning(tmp_path: Path) -> None:
    if os.environ.get("CI", "").lower() != "true":  # in CI a missing mkdocs fails, as a missing sshd does
        pytest.importorskip("mkdocs", reason="mkdocs is in the dev extra (pip install -e '.[dev]')")
        pytest.importorskip("material", reason="mkdocs-material is in the dev extra")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "WARNING" not in output, output
    for page in ("reference/manifests", "reference/settings", "reference/cli"):
        assert (tmp_path / "site" / page / "index.html").is_file(), f"{page} was not generated"


def test_the_generated_reference_covers_every_field_and_command() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gen_reference
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    from typer.main import get_command

    from desired import models
    from reconciler.cli.main import app

    settings, manifests, cli = gen_reference.settings_page(), gen_reference.manifests_page(), gen_reference.cli_page()
    assert all(f"| `{name}` |" in settings for name in models.Settings.model_fields)
    assert all(f"| `{name}` |" in manifests for name in models.JobSpec.model_fields)
    assert all(f"| `{name}` |" in manifests for name in models.VastSettings.model_fields)
    group = get_command(app)
    commands = group.list_commands(group.context_class(group))
    assert commands and all(f"## reconciler {name}\n" in cli for name in commands)


def test_the_readme_is_a_short_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move sections into docs/"


def test_no_readme_link_leaves_the_repository() -> None:
    for target in _links(README.read_text()):
        outside = re.match(r"^[a-z][a-z0-9+.-]*:|^//|^/", target, re.I)  # a URL, a scheme, an absolute path
        assert not outside, f"README links outside the repository: {target}"
        path = (ROOT / target.split("#", 1)[0]).resolve()
        assert path.is_relative_to(ROOT), f"README link leaves the repository: {target}"
        assert path.exists(), f"README links to {target}, which does not exist"


def test_the_readmes_test_command_is_the_one_ci_runs() -> None:
    commands = re.search(r"## The two commands\n\n```sh\n(.*?)```", README.read_text(), re.S)
    assert commands is not None, "README.md has no '## The two commands' block"
    test_line = [line for line in commands.group(1).splitlines() if line.startswith("scripts/test")]
    assert len(test_line) == 1
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^exec scripts/test\b", ci, re.M), ".ci/run no longer runs scripts/test: update README.md"
