"""Every manifest the README shows is one that `reconciler validate` accepts."""

from __future__ import annotations

import re
from pathlib import Path

from desired.parse import parse_desired

README = Path(__file__).resolve().parent.parent / "README.md"


def test_every_yaml_example_in_the_readme_is_a_valid_manifest() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 4
    for index, block in enumerate(blocks):
        # As in a repository whose run storage hosted providers can reach (they refuse file://).
        state = parse_desired({f"desired/example{index}.yaml": block}, "storage: s3://bucket/runs\n")
        # The Job reference names providers defined elsewhere; everything else must be clean.
        errors = [e for e in state.errors if "no provider named" not in e.message]
        assert not errors, (block, errors)
        assert state.jobs or state.providers
