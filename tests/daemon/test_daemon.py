"""The daemon as an operator meets it: it stops promptly when told, follows its settings without a
restart, and acts alone even when two clones of one repository each run one."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from tests import zygote
from tests.conftest import StateRepoFixture, _git
from tests.daemon.test_loop_local import counter, job, live_workers


def daemon(repo: Path, log: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return zygote.popen([sys.executable, "-m", "reconciler", "run", "--repo", str(repo), *args],
                            stdout=out, stderr=subprocess.STDOUT,
                            env={**os.environ, "COLUMNS": "300", **(env or {})})


def wait_for(what: str, cond: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def commit(state_repo: StateRepoFixture, message: str) -> None:
    """Commit as a person would while the daemon runs: its status commit may hold the index lock."""
    for _ in range(50):
        try:
            state_repo.commit(message)
            return
        except subprocess.CalledProcessError:
            time.sleep(0.1)
    state_repo.commit(message)


def lock_is_free(repo: Path) -> bool:
    with open(repo / ".git" / "reconciler.lock", "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


def phase_of(repo: Path, name: str) -> str | None:
    path = repo / "status" / f"{name}.yaml"
    data = yaml.safe_load(path.read_text()) if path.exists() else None  # empty while git rewrites it
    return data.get("phase") if isinstance(data, dict) else None


def phase_on_status_branch(repo: Path, name: str) -> str | None:
    """With a shared remote, status is committed to the branch reconciler/status, not the work tree."""
    shown = subprocess.run(["git", "-C", str(repo), "show", f"reconciler/status:status/{name}.yaml"],
                           capture_output=True, text=True)
    data = yaml.safe_load(shown.stdout) if shown.returncode == 0 else None
    return data.get("phase") if isinstance(data, dict) else None


def test_sigterm_during_a_long_tick_stops_the_daemon_within_seconds(state_repo: StateRepoFixture,
                                                                     tmp_path: Path) -> None:
    """600 jobs make the first tick last 10-20 s on a busy 2-core machine; a SIGTERM in the middle
    of it must still end the daemon at once (exit 0), leaving the workers and freeing the lock."""
    sleeper = ["python", "-c", "import time; time.sleep(600)"]
    for i in range(600):
        state_repo.write(f"desired/j{i}.yaml", job(f"j{i}", sleeper))
    state_repo.commit("600 jobs")
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # a busy machine
    proc = daemon(state_repo.path, tmp_path / "daemon.log", "--tick-seconds", "0.1")
    lock = state_repo.path / ".git" / "reconciler.lock"
    try:
        wait_for("the daemon to take its lock", lambda: lock.exists() and lock.read_text() == str(proc.pid))
        time.sleep(1)  # inside the first tick
        proc.send_signal(signal.SIGTERM)
        sent = time.time()
        code = proc.wait(timeout=60)
        took = time.time() - sent
    finally:
        hog.kill()
        proc.kill()
    out = (tmp_path / "daemon.log").read_text()
    assert code == 0, out
    assert took < 10, f"stopped {took:.1f}s after SIGTERM\n{out}"
    assert "received SIGTERM" in out
    assert lock_is_free(state_repo.path)


def test_a_changed_tick_seconds_applies_without_a_restart(state_repo: StateRepoFixture, tmp_path: Path) -> None:
    """Without the watcher only the interval brings ticks: after a commit that lengthens it, the
    daemon must stop ticking every 2 s (a worker it launched stays Launching: no tick saw it run)."""
    state_repo.write("reconciler.yaml", f"storage: file://{state_repo.storage}\ntick_seconds: 2\n")
    state_repo.write("desired/first.yaml", job("first", counter(1.0)))
    state_repo.commit("tick every 2 s")
    proc = daemon(state_repo.path, tmp_path / "daemon.log", "--no-watch")
    try:
        wait_for("the first tick", lambda: phase_of(state_repo.path, "first") is not None)
        state_repo.write("reconciler.yaml", f"storage: file://{state_repo.storage}\ntick_seconds: 3600\n")
        state_repo.write("desired/count.yaml", job("count", counter(0.2)))
        commit(state_repo, "add count, tick hourly")
        wait_for("the launch", lambda: phase_of(state_repo.path, "count") is not None, timeout=30)
        time.sleep(6)  # three of the old intervals
        assert phase_of(state_repo.path, "count") == "Launching"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert "tick_seconds changed from 2 to 3600" in (tmp_path / "daemon.log").read_text()


def test_two_daemons_on_two_clones_elect_one_and_the_survivor_adopts_the_worker(
        state_repo: StateRepoFixture, local_workdir: Path, tmp_path: Path) -> None:
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(remote)], check=True)
    state_repo.write("reconciler.yaml",
                     f"storage: file://{state_repo.storage}\ntick_seconds: 0.5\nremote: origin\n")
    state_repo.write("desired/count.yaml", job("count", counter(0.25), "target_steps: 150"))  # ~40 s
    state_repo.commit("count, reconciled from origin")
    state_repo.git("remote", "add", "origin", str(remote))
    state_repo.git("push", "-q", "-u", "origin", "main")
    other = tmp_path / "other-clone"
    subprocess.run(["git", "clone", "-q", str(remote), str(other)], check=True)
    _git(other, "status")  # a clone like any other
    env = {"RECONCILER_LEADER_MIN_SECONDS": "4"}
    logs = {"a": tmp_path / "a.log", "b": tmp_path / "b.log"}
    procs = {"a": daemon(state_repo.path, logs["a"], env=env), "b": daemon(other, logs["b"], env=env)}
    try:
        wait_for("a worker", lambda: len(live_workers(local_workdir)) == 1)
        wait_for("a standby", lambda: any("standby:" in p.read_text() for p in logs.values()), timeout=30)
        time.sleep(3)  # several ticks of both daemons
        workers = live_workers(local_workdir)
        assert len(workers) == 1 and len(list((local_workdir / "workers").iterdir())) == 1
        leader = next(k for k, p in logs.items() if "leading:" in p.read_text())
        survivor = "b" if leader == "a" else "a"
        assert "leading:" not in logs[survivor].read_text()
        procs[leader].send_signal(signal.SIGKILL)
        procs[leader].wait(timeout=10)
        wait_for("the standby to take over", lambda: "leading:" in logs[survivor].read_text(), timeout=30)
        time.sleep(2)  # a few ticks of the new leader
        assert live_workers(local_workdir) == workers, "the new leader must adopt the worker, not launch another"
        survivor_repo = state_repo.path if survivor == "a" else other
        wait_for("the run to finish", lambda: phase_on_status_branch(survivor_repo, "count") == "Succeeded",
                 timeout=180)
        assert len(list((local_workdir / "workers").iterdir())) == 1
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            p.wait(timeout=30)


def test_a_local_worker_killed_is_relaunched_at_once_not_at_the_next_tick(
        state_repo: StateRepoFixture, tmp_path: Path, local_workdir: Path) -> None:
    """An hourly tick: only the exit record its supervisor writes can bring the relaunch soon."""
    state_repo.write("reconciler.yaml", f"storage: file://{state_repo.storage}\ntick_seconds: 3600\n")
    state_repo.write("desired/count.yaml", job("count", counter(0.2)))
    state_repo.commit("count, ticking hourly")
    proc = daemon(state_repo.path, tmp_path / "daemon.log")
    try:
        wait_for("a worker", lambda: len(live_workers(local_workdir)) == 1, timeout=30)
        first = live_workers(local_workdir)[0]
        wait_for("a checkpoint", lambda: any((state_repo.storage).rglob("COMMIT.json")), timeout=30)
        pid = int((local_workdir / "workers" / first / "child.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        killed = time.time()
        wait_for("the relaunch", lambda: any(w != first for w in live_workers(local_workdir)), timeout=30)
        assert time.time() - killed < 15
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
