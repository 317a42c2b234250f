"""The state repository adapter against real git repositories and a real (bare) remote."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from adapters.gitrepo import StateRepo
from reconciler.daemon.loop import Reconciler
from tests.conftest import StateRepoFixture, _git

JOB = """
apiVersion: reconciler.dev/v1
kind: Job
metadata: {name: sleeper}
spec:
  command: ["sleep", "60"]
"""


def log(path: Path, *args: str) -> list[str]:
    return _git(path, "log", "--format=%an %s", *args).splitlines()


def test_rejected_push_is_rebased_and_retried_keeping_the_other_commit(
        state_repo: StateRepoFixture, tmp_path: Path) -> None:
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(remote)], check=True)
    state_repo.write("desired/sleeper.yaml", JOB)
    state_repo.commit("add sleeper")
    state_repo.git("remote", "add", "origin", str(remote))
    state_repo.git("push", "-q", "origin", "main")
    # Someone else pushes a commit the reconciler's clone has not seen.
    other = tmp_path / "other"
    subprocess.run(["git", "clone", "-q", str(remote), str(other)], check=True)
    (other / "desired" / "notes.txt").write_text("hello\n")
    _git(other, "add", "-A")
    _git(other, "commit", "-q", "-m", "a colleague's change")
    _git(other, "push", "-q", "origin", "main")

    repo = StateRepo(state_repo.path, remote="origin")
    repo.commit_status({"status/x.yaml": "phase: Pending\n"}, "status: x")
    first = subprocess.run(["git", "-C", str(state_repo.path), "push", "origin", "main"], capture_output=True)
    assert first.returncode != 0  # a plain push is rejected: the remote moved
    repo.push()
    subjects = log(remote)
    assert subjects[0] == "reconciler status: x"
    assert "alice a colleague's change" in subjects
    assert "alice add sleeper" in subjects


def test_tick_with_remote_from_settings_pushes_status(state_repo: StateRepoFixture, tmp_path: Path) -> None:
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(remote)], check=True)
    state_repo.write("desired/sleeper.yaml", JOB)
    text = (state_repo.path / "reconciler.yaml").read_text() + "remote: origin\n"
    state_repo.write("reconciler.yaml", text)
    state_repo.commit("add sleeper")
    state_repo.git("remote", "add", "origin", str(remote))
    state_repo.git("push", "-q", "origin", "main")
    Reconciler(state_repo.path).tick()
    # With a shared remote, status goes to a branch of its own; the users' branch is left alone.
    assert log(remote, "reconciler/status")[0].startswith("reconciler sleeper: Launching")
    assert log(remote, "main")[0] == "alice add sleeper"


def test_quiet_tick_commits_nothing_and_status_commits_touch_only_status(state_repo: StateRepoFixture) -> None:
    state_repo.write("desired/sleeper.yaml", JOB)
    state_repo.commit("add sleeper")
    rec = Reconciler(state_repo.path)
    rec.tick()
    # A person's staged, unrelated change must not be swept into a status commit.
    state_repo.write("desired/draft.yaml", "# work in progress\n")
    state_repo.git("add", "desired/draft.yaml")
    deadline = time.time() + 10
    while "Running" not in state_repo.status_text("sleeper") and time.time() < deadline:
        rec.tick()
        time.sleep(0.2)
    head = state_repo.git("rev-parse", "HEAD")
    for _ in range(3):
        report = rec.tick()
        assert report.status_commit is None
    assert state_repo.git("rev-parse", "HEAD") == head
    for line in state_repo.git("log", "--format=%H", "--author=reconciler").split():
        files = state_repo.git("show", "--name-only", "--format=", line).split()
        assert files and all(f.startswith("status/") for f in files)
    assert "desired/draft.yaml" in state_repo.git("diff", "--cached", "--name-only")
