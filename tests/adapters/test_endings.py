"""Deaths seen at once on SSH and Slurm (`watch_endings`), against the real sshd and the real Slurm
controller of the test session: the watch says nothing while workers run, says so within seconds
when one ends, and the daemon on an hourly tick relaunches a SIGKILLed worker long before the
next tick."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from adapters.compute import ComputeAdapter, LaunchSpec, WatchesEndings, worker_folder_name
from adapters.slurm import SlurmAdapter
from adapters.ssh import SshAdapter
from tests import zygote
from tests.adapters.conftest import Slurm, Sshd
from tests.adapters.e2e import job_manifest, progress_step, provider_manifest, wait_for
from tests.adapters.test_contract import OWNER, pid_alive
from tests.adapters.test_slurm import spec_for
from tests.conftest import StateRepoFixture

HOURLY = 3600.0
ROOT = Path(__file__).parents[2]


class Watch:
    """An adapter's endings watch on a thread, counting its notifications."""

    def __init__(self, adapter: ComputeAdapter) -> None:
        assert isinstance(adapter, WatchesEndings)
        self.calls: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=adapter.watch_endings, args=(self.stop, self.notify), daemon=True)
        self.thread.start()

    def notify(self) -> None:
        self.calls.append(time.monotonic())

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        assert not self.thread.is_alive(), "the watch ends when told to"


def child_pid(folder: Path, timeout: float = 60) -> int:
    """The worker command's pid, from the supervisor's record in the worker folder (created soon)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return int(json.loads((folder / "child.pid").read_text())["pid"])
        except (OSError, ValueError, KeyError):
            time.sleep(0.1)
    raise AssertionError(f"no child.pid in {folder}")


def notified_after(watch: Watch, since: float, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        late = [t for t in watch.calls if t >= since]
        if late:
            return late[0] - since
        time.sleep(0.05)
    raise AssertionError(f"no notification within {timeout}s of the worker's end")


def check_watch(adapter: ComputeAdapter, workdir: Path, spec: LaunchSpec) -> None:
    """Launch a sleeping probe, watch, stay quiet while it runs, notify soon after its SIGKILL."""
    adapter.launch(spec)
    pid = child_pid(workdir / "workers" / worker_folder_name(OWNER, spec.job, spec.run_id, spec.epoch))
    watch = Watch(adapter)
    try:
        time.sleep(4)  # connected and a few answers while the worker runs
        assert watch.calls == [], "nothing ended yet"
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        assert notified_after(watch, killed, timeout=15) < 10
        assert not pid_alive(pid)
    finally:
        watch.close()


def test_ssh_watch_notifies_when_a_worker_ends_and_not_before(sshd: Sshd, tmp_path: Path) -> None:
    adapter = SshAdapter("ssh", sshd.settings(tmp_path / "wd"), owner=OWNER)
    spec = spec_for(tmp_path, "watched", sleep="600")
    check_watch(adapter, tmp_path / "wd", spec)


def test_ssh_watch_survives_a_host_that_does_not_answer(sshd: Sshd, tmp_path: Path) -> None:
    settings = sshd.settings(tmp_path / "wd")
    settings = settings.model_copy(update={"hosts": [settings.hosts[0].model_copy(update={"port": 9})]})  # closed
    watch = Watch(SshAdapter("ssh", settings, owner=OWNER))
    time.sleep(2)
    assert watch.calls == [] and watch.thread.is_alive()
    watch.close()


def test_slurm_watch_notifies_when_a_job_ends_and_not_before(slurm: Slurm, tmp_path: Path) -> None:
    adapter = SlurmAdapter("slurm", slurm.settings(tmp_path / "wd"), owner=OWNER)
    spec = spec_for(tmp_path, "watched", sleep="600")
    check_watch(adapter, tmp_path / "wd", spec)


# ---- the daemon on an hourly tick ------------------------------------------------------------------

def relaunch_after_sigkill(repo: StateRepoFixture, provider: str, settings_yaml: str, workdir: Path,
                           log: Path) -> float:
    """Starts `reconciler run` ticking hourly, SIGKILLs the first worker after a checkpoint, and
    returns the seconds until the second worker's folder appears."""
    repo.write("reconciler.yaml", f"storage: file://{repo.storage}\ntick_seconds: {HOURLY:g}\n")
    repo.write(f"desired/{provider}.yaml", settings_yaml)
    job = yaml.safe_load(job_manifest("count", provider, step_seconds=0.1, target=600))
    job["spec"]["env"] = {"PYTHONPATH": str(ROOT)}  # the worker gets a minimal environment: this checkout's SDK
    repo.write("desired/count.yaml", yaml.safe_dump(job))
    repo.commit("count, ticking hourly")
    cmd = [sys.executable, "-m", "reconciler", "run", "--repo", str(repo.path), "--tick-seconds", f"{HOURLY:g}"]
    daemon = zygote.popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    try:
        folder = wait_for(lambda: next(iter(workdir.glob("workers/*.count.*.e1")), None), 60, "the first worker",
                          daemon, log)
        assert isinstance(folder, Path)
        pid = child_pid(folder)
        wait_for(lambda: progress_step(repo, "count") >= 12, 60, "checkpoints", daemon, log)
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: next(iter(workdir.glob("workers/*.count.*.e2")), None), 60, "the relaunch", daemon, log)
        took = time.monotonic() - killed
        assert "ended; ticking now" in log.read_text()
        return took
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
        for pid_file in workdir.glob("workers/*/child.pid"):
            try:
                os.kill(int(json.loads(pid_file.read_text())["pid"]), signal.SIGKILL)
            except (OSError, ValueError, KeyError):
                pass


@pytest.mark.slow
def test_daemon_relaunches_a_sigkilled_ssh_worker_long_before_the_hourly_tick(
        sshd: Sshd, state_repo: StateRepoFixture, tmp_path: Path) -> None:
    workdir = tmp_path / "ssh-workdir"
    took = relaunch_after_sigkill(state_repo, "box", provider_manifest("box", sshd.settings(workdir)), workdir,
                                  tmp_path / "daemon.log")
    assert took < 20, f"relaunched {took:.1f}s after the SIGKILL"


@pytest.mark.slow
def test_daemon_relaunches_a_sigkilled_slurm_worker_long_before_the_hourly_tick(
        slurm: Slurm, state_repo: StateRepoFixture, tmp_path: Path) -> None:
    workdir = tmp_path / "slurm-workdir"
    took = relaunch_after_sigkill(state_repo, "cluster", provider_manifest("cluster", slurm.settings(workdir)),
                                  workdir, tmp_path / "daemon.log")
    assert took < 20, f"relaunched {took:.1f}s after the SIGKILL"
