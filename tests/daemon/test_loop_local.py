"""The whole loop against real local processes and a real git repository: the faults of issue 2."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from adapters.compute import WorkerPhase
from adapters.local import LocalAdapter
from reconciler.daemon.loop import Reconciler, TickReport
from status.models import Outcome, Phase
from tests import zygote
from tests.conftest import StateRepoFixture

WORKLOAD = Path(__file__).parent / "workloads" / "counter.py"


def job(name: str, command: list[str], extra: str = "") -> str:
    return yaml.safe_dump({
        "apiVersion": "reconciler.dev/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"command": command, "target_steps": 60, "checkpoint_every": 10,
                 "retry": {"max_retries": 2, "backoff_seconds": 0.2, "backoff_max_seconds": 0.5},
                 **(yaml.safe_load(extra) or {})},
    })


def counter(steps_seconds: float = 0.05) -> list[str]:
    return [sys.executable, str(WORKLOAD), str(steps_seconds)]


def tick_until(rec: Reconciler, done: Callable[[TickReport], bool], timeout: float = 60,
               between: float = 0.2, each: Callable[[TickReport], None] | None = None) -> TickReport:
    deadline = time.time() + timeout
    while True:
        report = rec.tick()
        if each:
            each(report)
        if done(report):
            return report
        assert time.time() < deadline, f"timed out; last statuses: {report.statuses}, errors {report.errors}"
        time.sleep(between)


def phase(name: str) -> Callable[[TickReport], bool]:
    return lambda r: name in r.statuses and r.statuses[name].phase.terminal


def live_workers(root: Path) -> list[str]:
    adapter = LocalAdapter("local")
    return [ref.id for ref, st in adapter.observe().items()
            if st.phase in (WorkerPhase.RUNNING, WorkerPhase.PENDING)]


def test_worker_killed_twice_resumes_from_checkpoint_and_succeeds(state_repo: StateRepoFixture,
                                                                  local_workdir: Path) -> None:
    state_repo.write("desired/count.yaml", job("count", counter()))
    state_repo.commit("add count")
    rec = Reconciler(state_repo.path)
    adapter = LocalAdapter("local")
    kills: list[int] = []

    def chaos(report: TickReport) -> None:
        st = report.statuses.get("count")
        if st is None or st.current is None or len(kills) >= 2:
            return
        progress = state_repo.storage / "count" / st.run_id / "progress.json"
        beat = json.loads(progress.read_text()) if progress.exists() else {}
        # Kill only a worker that has made progress of its own, so each attempt gains ground.
        if beat.get("epoch") == st.current.epoch and beat.get("step", 0) >= st.current.step_start + 15:
            for ref, ws in adapter.observe().items():
                if ref.epoch == st.current.epoch and ws.phase == WorkerPhase.RUNNING:
                    if adapter.kill_worker(ref, signal.SIGKILL):
                        kills.append(ref.epoch)

    final = tick_until(rec, phase("count"), each=chaos)
    st = final.statuses["count"]
    assert st.phase == Phase.SUCCEEDED, st.message
    assert len(kills) == 2
    # No provider's word for either kill: the first is free, the one right after it is charged.
    assert st.interruptions == 1 and st.failures == 1
    assert [a.outcome for a in st.attempts] == [Outcome.INTERRUPTION, Outcome.JOB_ERROR, Outcome.SUCCEEDED]
    assert [a.unconfirmed for a in st.attempts] == [True, True, None]
    # Each relaunch resumed from the newest checkpoint rather than from zero.
    assert st.attempts[1].step_start > 0 and st.attempts[2].step_start >= st.attempts[1].step_start
    assert st.steps_lost <= 2 * 10
    history = state_repo.git("log", "--format=%s", "--", "status/count.yaml")
    assert "Succeeded" in history and "killed by SIGKILL" in history


def test_daemon_killed_while_worker_runs_adopts_it_on_restart(state_repo: StateRepoFixture,
                                                              local_workdir: Path) -> None:
    state_repo.write("desired/count.yaml", job("count", counter(0.1)))
    state_repo.commit("add count")
    cmd = [sys.executable, "-m", "reconciler", "run", "--repo", str(state_repo.path), "--tick-seconds", "0.3"]
    daemon = zygote.popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            status = state_repo.path / "status" / "count.yaml"
            if status.exists() and "phase: Running" in status.read_text():
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the worker never ran")
    finally:
        daemon.send_signal(signal.SIGKILL)
        daemon.wait()
    assert len(live_workers(local_workdir)) == 1  # the worker outlives the daemon
    restarted = subprocess.run([*cmd, "--until-done"], capture_output=True, text=True, timeout=120)
    assert restarted.returncode == 0, restarted.stderr
    st = yaml.safe_load(state_repo.status_text("count"))
    assert st["phase"] == "Succeeded"
    assert st["total_attempts"] == 1  # adopted, never duplicated
    assert len(list((local_workdir / "workers").iterdir())) == 1


def test_job_that_always_fails_is_failed_after_retry_budget_with_log_tail(state_repo: StateRepoFixture) -> None:
    crash = [sys.executable, "-c", "import sys; print('loading config'); print('boom: no such dataset'); sys.exit(1)"]
    state_repo.write("desired/crash.yaml", job("crash", crash))
    state_repo.commit("add crash")
    final = tick_until(Reconciler(state_repo.path), phase("crash"))
    st = final.statuses["crash"]
    assert st.phase == Phase.FAILED
    assert st.failures == 3 and st.total_attempts == 3
    assert "retry budget" in st.message
    assert "boom: no such dataset" in (st.log_tail or "")
    assert "boom: no such dataset" in state_repo.status_text("crash")


def test_twenty_interruptions_are_free_and_the_job_still_succeeds(state_repo: StateRepoFixture) -> None:
    # The job's own exit_codes rule makes its exit 75 free (the local provider has no word of its own).
    flaky = [sys.executable, str(WORKLOAD), "0.0", "--interrupt-until-epoch", "20"]
    retry = ("retry: {max_unproductive_attempts: 25, backoff_seconds: 0.2, backoff_max_seconds: 0.5, "
             "exit_codes: [{codes: [75], action: ignore}]}")
    state_repo.write("desired/flaky.yaml", job("flaky", flaky, retry))
    state_repo.commit("add flaky")
    final = tick_until(Reconciler(state_repo.path), phase("flaky"), timeout=120, between=0.05)
    st = final.statuses["flaky"]
    assert st.phase == Phase.SUCCEEDED, st.message
    assert st.interruptions == 20 and st.failures == 0 and st.total_attempts == 21


def test_a_command_that_exits_interrupted_at_once_every_time_fails_as_a_crash_loop(
        state_repo: StateRepoFixture) -> None:
    """Exit 75 made free by the job's rule, but five in a row without a new checkpoint is a loop, not bad luck."""
    looping = [sys.executable, str(WORKLOAD), "0.0", "--interrupt-until-epoch", "1000"]
    retry = "retry: {backoff_seconds: 0.2, backoff_max_seconds: 0.5, exit_codes: [{codes: [75], action: ignore}]}"
    state_repo.write("desired/loop.yaml", job("loop", looping, retry))
    state_repo.commit("add loop")
    final = tick_until(Reconciler(state_repo.path), phase("loop"), timeout=120, between=0.05)
    st = final.statuses["loop"]
    assert st.phase == Phase.FAILED and st.message.startswith("crash loop: 5 attempts in a row")
    assert st.failures == 0 and st.total_attempts == 5


def _wait_running(rec: Reconciler, name: str) -> TickReport:
    return tick_until(rec, lambda r: r.statuses[name].phase == Phase.RUNNING)


def test_deleted_manifest_terminates_worker_and_cancels(state_repo: StateRepoFixture, local_workdir: Path) -> None:
    state_repo.write("desired/count.yaml", job("count", counter(1.0)))
    state_repo.commit("add count")
    rec = Reconciler(state_repo.path)
    _wait_running(rec, "count")
    state_repo.remove("desired/count.yaml")
    state_repo.commit("remove count")
    first = rec.tick()
    assert "billed until it is gone" in first.statuses["count"].message
    report = tick_until(rec, phase("count"), timeout=20)
    assert report.statuses["count"].phase == Phase.CANCELLED
    deadline = time.time() + 10
    while live_workers(local_workdir) and time.time() < deadline:
        time.sleep(0.1)
    assert live_workers(local_workdir) == []
    assert "manifest deleted" in state_repo.status_text("count")


def test_command_change_replaces_the_run_placement_change_keeps_it(state_repo: StateRepoFixture,
                                                                    local_workdir: Path) -> None:
    state_repo.write("desired/count.yaml", job("count", counter(1.0)))
    state_repo.commit("add count")
    rec = Reconciler(state_repo.path)
    first = _wait_running(rec, "count").statuses["count"]
    # Placement and retry are "where and how": same run, same worker.
    state_repo.write("desired/count.yaml", job("count", counter(1.0),
                                               "placement: {providers: [local]}\nbudget_usd: 5"))
    state_repo.commit("pin to local")
    same = rec.tick().statuses["count"]
    assert same.run_id == first.run_id and same.total_attempts == 1 and same.phase == Phase.RUNNING
    assert live_workers(local_workdir) == [first.attempts[-1].worker]
    # The command is "what": a new run, the old worker terminated.
    state_repo.write("desired/count.yaml", job("count", counter(0.9)))
    state_repo.commit("change the command")
    new = _wait_running(rec, "count").statuses["count"]
    assert new.run_id != first.run_id
    deadline = time.time() + 10
    while first.attempts[-1].worker in live_workers(local_workdir) and time.time() < deadline:
        time.sleep(0.1)
    assert live_workers(local_workdir) == [new.attempts[-1].worker]


def test_only_one_daemon_per_repository(state_repo: StateRepoFixture) -> None:
    cmd = [sys.executable, "-m", "reconciler", "run", "--repo", str(state_repo.path)]
    first = zygote.popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(3)
        second = zygote.run(cmd, capture_output=True, text=True, timeout=30)
        assert second.returncode == 1
        assert "another reconciler is already running" in second.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=20) == 0


def test_daemon_ticks_at_once_when_a_manifest_is_committed(state_repo: StateRepoFixture) -> None:
    cmd = [sys.executable, "-m", "reconciler", "run", "--repo", str(state_repo.path), "--tick-seconds", "3600"]
    daemon = zygote.popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3)
        state_repo.write("desired/count.yaml", job("count", counter(1.0)))
        state_repo.commit("add count")
        deadline = time.time() + 20
        while not (state_repo.path / "status" / "count.yaml").exists():
            assert time.time() < deadline, "no tick after the commit"
            time.sleep(0.2)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=20)


def test_commits_while_the_daemon_ticks_never_break_a_tick(state_repo: StateRepoFixture) -> None:
    """The watcher reads the repository while a tick may be reading it too (GitPython objects are
    not thread-safe): many commits during a run must not make any tick fail."""
    state_repo.write("desired/count.yaml", job("count", counter(0.05)))
    state_repo.commit("add count")
    cmd = [sys.executable, "-m", "reconciler", "run", "--repo", str(state_repo.path), "--tick-seconds", "0.2",
           "--until-done"]
    daemon = zygote.popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for i in range(15):
        state_repo.write(f"desired/note-{i}.yaml", f"# note {i}\n")
        for _ in range(20):  # the daemon's status commit may hold the index lock for a moment
            try:
                state_repo.commit(f"note {i}")
                break
            except subprocess.CalledProcessError:
                time.sleep(0.1)
        time.sleep(0.15)
    try:
        out, _ = daemon.communicate(timeout=120)
    finally:
        daemon.kill()
    assert daemon.returncode == 0, out
    assert "tick failed" not in out
    assert yaml.safe_load(state_repo.status_text("count"))["phase"] == "Succeeded"


def test_deleting_everything_stops_workers_through_the_last_known_provider_and_bills_them(
        state_repo: StateRepoFixture, local_workdir: Path) -> None:
    """desired/ emptied, Provider included: the worker on a $2/h provider is stopped anyway, and
    its attempt is billed until it is gone (it was recorded as $0 and left running)."""
    state_repo.write("desired/pricey.yaml", yaml.safe_dump({
        "apiVersion": "reconciler.dev/v1", "kind": "Provider", "metadata": {"name": "pricey"},
        "spec": {"settings": {"type": "local"}, "price_per_hour": 2.0}}))
    state_repo.write("desired/count.yaml", job("count", counter(1.0)))
    state_repo.commit("add count on pricey")
    rec = Reconciler(state_repo.path)
    _wait_running(rec, "count")
    time.sleep(1.0)
    state_repo.remove("desired/pricey.yaml")
    state_repo.remove("desired/count.yaml")
    state_repo.commit("remove everything")
    final = tick_until(rec, phase("count"), timeout=30)
    st = final.statuses["count"]
    assert st.phase == Phase.CANCELLED
    assert st.attempts[-1].provider == "pricey" and st.cost_usd > 0
    assert live_workers(local_workdir) == []


def test_broken_settings_hold_every_job_instead_of_falling_back_to_defaults(
        state_repo: StateRepoFixture, local_workdir: Path) -> None:
    """A typo in reconciler.yaml must not send the loop to the default store, where every run
    looks new: nothing is launched, stopped or committed until it is fixed."""
    state_repo.write("desired/count.yaml", job("count", counter(1.0)))
    state_repo.commit("add count")
    rec = Reconciler(state_repo.path)
    running = _wait_running(rec, "count").statuses["count"]
    state_repo.write("reconciler.yaml", f"storage: file://{state_repo.storage}\ntick_secnds: 1\n")
    head = state_repo.commit("typo in settings")
    report = rec.tick()
    assert any("reconciler.yaml has errors" in e for e in report.errors)
    assert not report.actions and report.status_commit is None and not report.all_terminal
    assert state_repo.git("rev-parse", "HEAD").strip() == head
    assert live_workers(local_workdir) == [running.attempts[-1].worker]


def test_a_code_path_that_does_not_exist_fails_the_job_at_once(state_repo: StateRepoFixture) -> None:
    """It used to wait as if the provider were unavailable, Pending forever with a new epoch every
    2 minutes."""
    state_repo.write("desired/nowhere.yaml", job("nowhere", counter(), "code: {path: /no/such/project}"))
    state_repo.commit("add nowhere")
    report = Reconciler(state_repo.path).tick()
    st = report.statuses["nowhere"]
    assert st.phase == Phase.FAILED
    assert "config error: code.path /no/such/project is not a folder" in st.message
