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

from reconciler.daemon.loop import Reconciler
from tests import zygote
from tests.cli.test_cli import cli
from tests.conftest import StateRepoFixture
from tests.daemon.test_loop_local import counter, job, live_workers, phase, tick_until

ROOT = Path(__file__).resolve().parents[2]


def attempts(repo: StateRepoFixture, name: str) -> list[dict[str, object]]:
    return list(yaml.safe_load(repo.status_text(name))["attempts"])


def wait_until(done: object, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_an_attempt_stopped_for_a_deleted_manifest_stays_cancelled_when_the_manifest_comes_back(
        state_repo: StateRepoFixture, local_workdir: Path) -> None:
    """`run --once` stops the worker of a deleted job and leaves its attempt open until the worker is
    gone; when the next call finds the manifest restored, the end it judges is still the cancel."""
    state_repo.write("desired/a.yaml", job("a", counter(0.3)))
    state_repo.commit("add a")
    cli("run", "--once", "--repo", str(state_repo.path))
    wait_until(lambda: any((state_repo.storage / "a").rglob("progress.json")))  # its SDK is listening
    state_repo.remove("desired/a.yaml")
    deleting = state_repo.commit("delete a")
    out = cli("run", "--once", "--repo", str(state_repo.path)).stderr
    assert "manifest deleted; stopping" in out
    wait_until(lambda: not live_workers(local_workdir))
    state_repo.git("revert", "--no-edit", deleting)
    cli("run", "--once", "--repo", str(state_repo.path))
    first = attempts(state_repo, "a")[0]
    assert (first["outcome"], first["detail"], first["exit_code"]) == ("cancelled", "manifest deleted", 75)
    assert yaml.safe_load(state_repo.status_text("a"))["interruptions"] == 0


def test_a_completing_attempt_ends_at_its_last_step_not_at_its_last_checkpoint(
        state_repo: StateRepoFixture) -> None:
    state_repo.write("desired/c.yaml", job("c", counter(0.01), "target_steps: 25"))  # saves at 10 and 20
    state_repo.commit("add c")
    tick_until(Reconciler(state_repo.path), phase("c"))
    done = attempts(state_repo, "c")[-1]
    assert (done["outcome"], done["step_end"]) == ("succeeded", 25)
    assert "0→25" in cli("describe", "c", "--repo", str(state_repo.path)).stdout


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
    proc = zygote.popen([sys.executable, "-m", "reconciler", "run", "--repo", str(state_repo.path)],
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300"})
    wait_until(lambda: (state_repo.path / "status" / "j0.yaml").exists() or
               "status" in state_repo.git("log", "-1", "--format=%s"))
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert "received SIGTERM; stopping" in out
    assert "tick failed" not in out and "ERROR" not in out and "Traceback" not in out, out
