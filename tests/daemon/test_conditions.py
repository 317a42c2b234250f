"""A condition that holds tick after tick is said once when it starts and once when it ends: a remote
that cannot be fetched, a change held for its signature (real git, real ticks, the daemon's logger)."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from reconciler.daemon.conditions import Conditions
from reconciler.daemon.loop import Reconciler
from tests.conftest import StateRepoFixture
from tests.trust.test_signatures import SLEEP, signed_repo, ssh_commit  # noqa: F401 - the fixture


def said(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if words in r.getMessage()]


def test_a_condition_is_said_when_it_starts_when_its_words_change_and_when_it_ends(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test-conditions")
    conditions = Conditions(logging.getLogger("test-conditions"))
    for _ in range(3):
        conditions.exactly("tick", ["remote down", "remote down"])
    conditions.exactly("tick", ["remote down: timeout"])
    conditions.exactly("tick", [])
    conditions.exactly("tick", [])
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "remote down"), ("INFO", "resolved: remote down"), ("WARNING", "remote down: timeout"),
        ("INFO", "resolved: remote down: timeout")]


def test_a_fetch_error_on_every_tick_is_logged_once_in_full_and_its_end_once(
        state_repo: StateRepoFixture, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(remote)], check=True)
    state_repo.write("reconciler.yaml", (state_repo.path / "reconciler.yaml").read_text() + "remote: origin\n")
    state_repo.commit("push status to origin")
    state_repo.git("remote", "add", "origin", str(remote))
    state_repo.git("push", "-q", "origin", "main")
    rec = Reconciler(state_repo.path)
    caplog.set_level(logging.INFO, logger="reconciler")
    rec.tick()
    remote.rename(tmp_path / "moved.git")
    for _ in range(3):
        assert any("cannot update from remote" in e for e in rec.tick().errors)
    (tmp_path / "moved.git").rename(remote)
    rec.tick()
    rec.tick()
    failed = said(caplog, "cannot update from remote 'origin'")
    assert len(failed) == 2 and failed[1] == f"resolved: {failed[0]}", failed
    assert "does not appear to be a git repository" in failed[0]  # git's reason, not its last line of advice


def test_a_held_change_is_warned_about_once_while_it_is_held(
        signed_repo: tuple[StateRepoFixture, Path, Path], local_workdir: Path,  # noqa: F811 - a fixture
        caplog: pytest.LogCaptureFixture) -> None:
    from tests.daemon.test_loop_local import job

    repo, alice, _ = signed_repo
    rec = Reconciler(repo.path)
    caplog.set_level(logging.INFO, logger="reconciler")
    repo.write("desired/b.yaml", job("b", SLEEP))
    unsigned = ssh_commit(repo, "add b, unsigned", None)
    for _ in range(3):
        assert "b" not in rec.tick().statuses
    repo.write("desired/b.yaml", job("b", SLEEP) + "# signed now\n")
    ssh_commit(repo, "b, signed", alice)
    assert "b" in rec.tick().statuses
    rec.tick()
    held = said(caplog, f"commit {unsigned[:12]} is held")
    assert len(held) == 2 and held[1] == f"resolved: {held[0]}", held


def test_a_tick_that_keeps_failing_is_logged_once_and_its_recovery_once(
        state_repo: StateRepoFixture, caplog: pytest.LogCaptureFixture) -> None:
    from reconciler.daemon.service import Daemon

    daemon = Daemon(Reconciler(state_repo.path), watch=False)
    caplog.set_level(logging.INFO, logger="reconciler")
    head = state_repo.path / ".git" / "HEAD"
    kept = head.read_text()
    head.write_text("ref: refs/heads/no-such-branch\n")  # the repository cannot say what HEAD is
    for _ in range(3):
        daemon._tick()  # noqa: SLF001 - one tick, as the scheduler runs it
    head.write_text(kept)
    daemon._tick()  # noqa: SLF001
    daemon._tick()  # noqa: SLF001
    failed = said(caplog, "tick failed")
    assert len(failed) == 1 and said(caplog, "ticks work again") == ["ticks work again"], caplog.text


@pytest.mark.parametrize(("path", "broken"), [
    ("desired/bad.yaml", "apiVersion: reconciler.dev/v1\nkind: Job\nmetadata: {name: bad}\n"
                         "spec: {command: [python, x.py], target_steps: nope}\n"),
    ("reconciler.yaml", "storage: [not, a, url]\n")])
def test_a_broken_manifest_is_warned_about_once_while_the_daemon_ticks_and_once_when_fixed(
        state_repo: StateRepoFixture, caplog: pytest.LogCaptureFixture, path: str, broken: str) -> None:
    """Issue 27 item 7: the daemon ticking on a broken manifest printed its warning on every tick."""
    from reconciler.daemon.service import Daemon

    daemon = Daemon(Reconciler(state_repo.path), watch=False)
    caplog.set_level(logging.INFO, logger="reconciler")
    kept = (state_repo.path / path).read_text() if (state_repo.path / path).exists() else None
    state_repo.write(path, broken)
    state_repo.commit(f"break {path}")
    for _ in range(4):
        daemon._tick()  # noqa: SLF001 - one tick, as the scheduler runs it
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and path in r.getMessage()]
    assert len(warned) == 1 + (path == "reconciler.yaml"), warned  # the error, and for settings the hold
    if kept is None:
        (state_repo.path / path).unlink()
    else:
        state_repo.write(path, kept)
    state_repo.commit(f"fix {path}")
    daemon._tick()  # noqa: SLF001
    daemon._tick()  # noqa: SLF001
    resolved = [r.getMessage() for r in caplog.records if r.getMessage().startswith("resolved:")]
    assert resolved == [f"resolved: {w}" for w in warned], caplog.text
