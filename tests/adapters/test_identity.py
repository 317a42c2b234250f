"""The state repository's identity (issue 8, item 0): made by `init`, or derived from the first
commit; the loop builds every adapter with it."""

from __future__ import annotations

import yaml
from typer.testing import CliRunner

from adapters.gitrepo import StateRepo
from adapters.registry import make_adapter
from desired.models import Settings, default_local_provider
from desired.parse import parse_settings
from reconciler.cli.main import app
from reconciler.daemon.loop import Reconciler, repository_identity
from tests.conftest import StateRepoFixture


def test_init_writes_a_random_identity_into_reconciler_yaml(tmp_path) -> None:
    identities = []
    for name in ("one", "two"):
        result = CliRunner().invoke(app, ["init", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
        text = (tmp_path / name / "reconciler.yaml").read_bytes()
        settings, errors = parse_settings(text)
        assert not errors and settings.identity
        identities.append(settings.identity)
    assert identities[0] != identities[1]


def test_an_all_digit_identity_from_init_reads_back_as_written(tmp_path, monkeypatch) -> None:
    """One identity in about 280 is twelve digits, which YAML would read as a number unquoted."""
    monkeypatch.setattr("secrets.token_hex", lambda n: "012345678901")
    assert CliRunner().invoke(app, ["init", str(tmp_path)]).exit_code == 0
    settings, errors = parse_settings((tmp_path / "reconciler.yaml").read_bytes())
    assert not errors and settings.identity == "012345678901"


def test_an_unquoted_numeric_identity_is_refused_with_how_to_quote_it() -> None:
    _, errors = parse_settings(b"identity: 123456789012\n")
    assert len(errors) == 1 and errors[0].field == "identity"
    assert "read the identity as a number: put it in quotes" in errors[0].message, errors


def test_identity_is_the_setting_or_else_derived_from_the_first_commit(state_repo: StateRepoFixture) -> None:
    root = state_repo.git("rev-list", "--max-parents=0", "HEAD").strip()
    assert StateRepo(state_repo.path).root_commit() == root
    reconciler = Reconciler(state_repo.path)
    derived = repository_identity(root)
    assert derived == f"r{root[:12]}" and Settings(identity=derived).identity == derived
    state_repo.commit("a later commit does not change it")
    desired = reconciler.read_desired(state_repo.git("rev-parse", "HEAD").strip())
    assert reconciler.identity(desired) == derived
    adapters = reconciler.adapters_for(desired, [])
    assert adapters["local"].owner == derived
    settings = yaml.safe_load((state_repo.path / "reconciler.yaml").read_text())
    (state_repo.path / "reconciler.yaml").write_text(yaml.safe_dump({**settings, "identity": "lab-42"}))
    head = state_repo.commit("name the repository")
    desired = reconciler.read_desired(head)
    assert reconciler.adapters_for(desired, [])["local"].owner == "lab-42"  # rebuilt with the new owner


def test_registry_builds_adapters_with_their_owner() -> None:
    adapter = make_adapter(default_local_provider(), "repo-x")
    assert (adapter.name, adapter.owner, adapter.foreign_workers) == ("local", "repo-x", 0)
