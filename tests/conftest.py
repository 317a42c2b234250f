"""Shared fixtures: a real git state repository in a temp dir, run storage on local disk, and a
local-worker folder that is cleaned of live processes after each test."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# One OpenMP thread for torch in the test processes and the processes they start with this
# environment: six test workers share two cores here, and torch's default of one thread a core
# makes each of its threads spin-wait for the others; a language-model test used four times the
# CPU with two threads as with one. Workers the local provider starts get a minimal environment
# without it; the test workloads set one thread themselves.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _git(path: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, "GIT_AUTHOR_NAME": "alice", "GIT_AUTHOR_EMAIL": "alice@example.com",
                               "GIT_COMMITTER_NAME": "alice", "GIT_COMMITTER_EMAIL": "alice@example.com"}).stdout


class StateRepoFixture:
    """A user's state repository: write manifests, commit them like a person would."""

    def __init__(self, path: Path, storage: Path) -> None:
        self.path = path
        self.storage = storage
        path.mkdir(parents=True)
        _git(path, "init", "-q", "-b", "main")
        (path / "desired").mkdir()
        (path / "reconciler.yaml").write_text(f"storage: file://{storage}\ntick_seconds: 0.5\n")
        self.commit("settings")

    def git(self, *args: str) -> str:
        return _git(self.path, *args)

    def write(self, rel: str, text: str) -> None:
        target = self.path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def remove(self, rel: str) -> None:
        (self.path / rel).unlink()

    def commit(self, message: str) -> str:
        _git(self.path, "add", "-A")
        _git(self.path, "commit", "-q", "--allow-empty", "-m", message)
        return _git(self.path, "rev-parse", "HEAD").strip()

    def status_text(self, job: str) -> str:
        return (self.path / "status" / f"{job}.yaml").read_text()


def kill_local_workers(root: Path) -> None:
    """Ends every supervisor (and its process group) under a local worker folder."""
    workers = root / "workers"
    if not workers.exists():
        return
    for folder in workers.iterdir():
        pid_file = folder / "supervisor.pid"
        if pid_file.exists():
            try:
                os.killpg(int(pid_file.read_text().strip()), signal.SIGKILL)
            except (ProcessLookupError, ValueError, PermissionError):
                pass


@pytest.fixture
def local_workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "local-workers"
    monkeypatch.setenv("RECONCILER_LOCAL_WORKDIR", str(root))
    monkeypatch.setenv("RECONCILER_GRACE_SECONDS", "3")
    yield root
    kill_local_workers(root)


@pytest.fixture
def state_repo(tmp_path: Path, local_workdir: Path) -> StateRepoFixture:
    return StateRepoFixture(tmp_path / "state", tmp_path / "runs")


@pytest.fixture(scope="session")
def oci_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Debian's docker-registry on 127.0.0.1 (tests/fakes/oci_registry.py); with CI=true a registry
    that cannot start fails the test, elsewhere it is skipped with the reason."""
    from tests.fakes.oci_registry import Registry, RegistryUnavailable

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    registry = Registry(tmp_path_factory.mktemp("oci-registry"), port)
    try:
        registry.start()
    except RegistryUnavailable as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but {exc}", pytrace=False)
        pytest.skip(str(exc))
    yield registry
    registry.stop()

