"""`reconciler reconcile`: a running daemon ticks now when asked from the command line, and the
command prints what that tick did."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import zygote
from tests.cli.test_cli import cli
from tests.conftest import StateRepoFixture
from tests.daemon.test_loop_local import counter, job


def test_reconcile_makes_a_running_daemon_tick_now_and_says_what_it_did(state_repo: StateRepoFixture,
                                                                        local_workdir: Path) -> None:
    daemon = zygote.popen([sys.executable, "-m", "reconciler", "run", "--repo", str(state_repo.path),
                           "--tick-seconds", "3600", "--no-watch"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        socket = state_repo.path / ".git" / "reconciler.sock"
        deadline = time.time() + 60
        while not socket.exists():
            assert daemon.poll() is None and time.time() < deadline, "the daemon did not start"
            time.sleep(0.1)
        first = cli("reconcile", "--repo", str(state_repo.path)).stdout  # after the first tick: nothing to do
        assert "no status changed" in first, first
        # A job committed now would wait an hour for the next tick (no watch, no webhook).
        state_repo.write("desired/count.yaml", job("count", counter(1.0)))
        state_repo.commit("add count")
        res = cli("reconcile", "--repo", str(state_repo.path))
        head = state_repo.git("rev-parse", "HEAD").strip()
        assert res.stdout.startswith("reconciled commit "), res.stdout
        assert "launch count" in res.stdout and "count: " in res.stdout, res.stdout
        status_commit = res.stdout.split("status committed as ")[1].split()[0]
        assert head.startswith(status_commit)  # the tick's status commit is the branch's tip now
        assert "add count" in state_repo.git("log", "--format=%s", "-2")  # acted on the new commit
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0
    assert not socket.exists()  # the daemon removes it on its way out


def test_reconcile_without_a_daemon_is_one_sentence(state_repo: StateRepoFixture) -> None:
    res = cli("reconcile", "--repo", str(state_repo.path), check=False)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "no daemon is running on this repository" in res.stderr and "reconciler run" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_git_folder_too_deep_for_a_socket_path_gets_one_in_a_private_folder(tmp_path: Path) -> None:
    from reconciler.daemon.nudge import MAX_SOCKET_PATH, NudgeError, NudgeServer, socket_path

    deep = tmp_path / ("d" * 60) / ("e" * 60) / ".git"
    deep.mkdir(parents=True)
    path = socket_path(deep)
    assert len(os.fsencode(path)) <= MAX_SOCKET_PATH and path.parent.name == f"reconciler-{os.getuid()}"
    server = NudgeServer(deep, lambda: {})
    try:
        assert server.start() == path and path.exists()
        assert path.stat().st_mode & 0o077 == 0 and path.parent.stat().st_mode & 0o077 == 0
    finally:
        server.stop()
    assert not path.exists()
    path.parent.chmod(0o755)  # a folder others may write in could hold a socket of theirs
    try:
        with pytest.raises(NudgeError, match="not a folder of this user's own"):
            NudgeServer(deep, lambda: {}).start()
    finally:
        path.parent.chmod(0o700)
