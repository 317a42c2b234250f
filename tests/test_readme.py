"""Every manifest the README and the docs show is one that `reconciler validate` accepts."""

from __future__ import annotations

import re
from pathlib import Path

from desired.parse import parse_desired

ROOT = Path(__file__).resolve().parent.parent
# Object storage, which every provider accepts (hosted ones refuse file:// storage).
HOSTED_OK = "storage: s3://example-bucket/runs\n"


def test_every_yaml_example_in_the_readme_and_docs_is_a_valid_manifest() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    blocks = [(page.relative_to(ROOT), block) for page in pages
              for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S)]
    assert len(blocks) >= 10
    for index, (page, block) in enumerate(blocks):
        state = parse_desired({f"desired/example{index}.yaml": block}, HOSTED_OK)
        # The Job reference names providers defined elsewhere; everything else must be clean.
        errors = [e for e in state.errors if "no provider named" not in e.message]
        assert not errors, (str(page), block, errors)
        assert state.jobs or state.providers, (str(page), block)
