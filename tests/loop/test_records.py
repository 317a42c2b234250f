"""Records that match what happened, as a user meets them through real `reconciler` processes on a
real git repository: how a cancelled attempt ended, where a completing attempt ended, `plan` with
nothing to plan from, and a daemon stopped by a signal to its process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.conftest import StateRepoFixture
from tests.loop.test_cli import cli
from tests.loop.test_loop_local import job

ROOT = Path(__file__).resolve().parents[2]


def attempts(repo: StateRepoFixture, name: str) -> list[dict[str, object]]:
    return list(yaml.safe_load(repo.status_text(name))["attempts"])


def wait_until(done: object, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)



def test_plan_without_a_desired_folder_fails_as_validate_does(state_repo: StateRepoFixture) -> None:
    res = cli("plan", "--repo", str(state_repo.path), check=False)  # an empty desired/ on disk, none in git
    assert res.returncode == 1 and "commit job manifests under desired/" in res.stderr
    (state_repo.path / "desired").rmdir()
    for command in ("plan", "validate"):
        res = cli(command, "--repo", str(state_repo.path), check=False)
        assert res.returncode == 1, res.stdout
        assert "does not exist" in res.stderr and "world matches" not in res.stdout


def test_a_daemon_stopped_by_sigterm_to_its_process_group_logs_no_failure(state_repo: StateRepoFixture) -> None:
    """systemd (and Ctrl-C, as SIGINT) signal the whole group: the git processes a tick talks to end
    too, and the tick that was running fails; that is the stop, not an error."""
    state_repo.write("reconciler.yaml", f"storage: file://{state_repo.storage}\ntick_seconds: 0.05\n")
    for i in range(30):  # enough jobs that a tick is nearly always under way
        state_repo.write(f"desired/j{i}.yaml", job(f"j{i}", ["true"], "suspend: true"))
    state_repo.commit("thirty suspended jobs")
    proc = subprocess.Popen([sys.executable, "-m", "reconciler", "run", "--repo", str(state_repo.path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300"})
    wait_until(lambda: (state_repo.path / "status" / "j0.yaml").exists() or
               "status" in state_repo.git("log", "-1", "--format=%s"))
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert "received SIGTERM; stopping" in out
    assert "tick failed" not in out and "ERROR" not in out and "Traceback" not in out, out
