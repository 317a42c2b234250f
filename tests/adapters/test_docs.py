"""The docs' page on SSH hosts and Slurm clusters shows manifests that really parse."""

from __future__ import annotations

import re
from pathlib import Path

from adapters.slurm import SlurmAdapter
from adapters.ssh import SshAdapter
from desired.models import SlurmSettings, SshSettings
from desired.parse import parse_desired

DOC = Path(__file__).parents[2] / "docs" / "guides" / "ssh-slurm.md"


def test_example_manifests_in_the_docs_parse_and_build_adapters() -> None:
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
              if "type: ssh" in b or "type: slurm" in b]
    assert len(blocks) == 2
    kinds = []
    for index, block in enumerate(blocks):
        desired = parse_desired({f"desired/example{index}.yaml": block})
        assert not desired.errors, desired.errors
        assert desired.jobs and desired.providers
        for provider in desired.providers.values() if isinstance(desired.providers, dict) else desired.providers:
            settings = provider.spec.settings
            kinds.append(settings.type)
            if isinstance(settings, SshSettings):
                SshAdapter(provider.name, settings)
            elif isinstance(settings, SlurmSettings):
                SlurmAdapter(provider.name, settings)
    assert sorted(kinds) == ["slurm", "ssh"]
