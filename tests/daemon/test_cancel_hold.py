"""The guard against a commit that cancels most jobs at once, as a user meets it: real `reconciler
run --once` processes (each one a fresh daemon, so every call is a restart) on a real git repository
with local workers. Held means held until a confirming commit or a commit that restores the
manifests; `plan`, `status`, the page and one notification say so."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from adapters.notify import Notifier
from desired.models import Notifications, NotifyTarget
from reconciler.daemon.loop import Reconciler
from reconciler.daemon.notices import events, messages
from reconciler.planner.plan import CONFIRM_CANCEL_TRAILER, confirms_cancel
from status.models import JobStatus, Phase
from tests.cli.test_cli import cli
from tests.conftest import StateRepoFixture
from tests.daemon.receiver import Receiver
from tests.daemon.test_loop_local import counter, job, live_workers
from tests.web.conftest import start_server, stop_server

SLOW = counter(3.0)  # 60 steps of 3 s: alive for the whole test, even on a loaded machine


def run_once(repo: StateRepoFixture) -> str:
    res = cli("run", "--once", "--repo", str(repo.path))
    return res.stdout + res.stderr


def two_running_then_deleted(repo: StateRepoFixture, local_workdir: Path) -> tuple[list[str], str]:
    """Jobs a and b launched by one `run --once`, then both manifests deleted in one plain commit:
    the live workers and the deleting commit."""
    for name in "ab":
        repo.write(f"desired/{name}.yaml", job(name, SLOW))
    repo.commit("add a and b")
    run_once(repo)
    workers = sorted(live_workers(local_workdir))
    assert len(workers) == 2
    repo.git("rm", "-q", "desired/a.yaml", "desired/b.yaml")
    return workers, repo.commit("delete a and b")


def phase_of(repo: StateRepoFixture, name: str) -> str:
    return str(repo.status_text(name).split("\nphase: ", 1)[1].split("\n", 1)[0])


def test_a_held_cancel_stays_held_across_run_once_calls_until_a_confirming_commit(
        state_repo: StateRepoFixture, local_workdir: Path) -> None:
    workers, _ = two_running_then_deleted(state_repo, local_workdir)
    for _ in range(3):  # each call is a new daemon: the hold is found from git again, never from memory
        out = run_once(state_repo)
        assert "would cancel 2 of 2 active jobs (a, b)" in out
        assert sorted(live_workers(local_workdir)) == workers
        assert phase_of(state_repo, "a") != Phase.CANCELLED.value
        assert "held: " in state_repo.status_text("a")
    assert "## Held" in (state_repo.path / "status" / "README.md").read_text()
    plan = cli("plan", "--repo", str(state_repo.path))
    assert "world matches" not in plan.stdout and "a change is held" in plan.stdout
    assert "terminate" not in plan.stdout
    assert plan.stderr.count("would cancel 2 of 2 active jobs") == 1
    status = cli("status", "--repo", str(state_repo.path))
    assert "held:" in status.stderr and CONFIRM_CANCEL_TRAILER in status.stderr
    for one in (["status", "--job", "a"], ["describe", "a"]):
        assert "held: holding: this change would cancel" in cli(*one, "--repo", str(state_repo.path)).stdout
    state_repo.git("commit", "-q", "--allow-empty", "-m", "yes, cancel them", "--trailer", CONFIRM_CANCEL_TRAILER)
    out = run_once(state_repo)
    assert "would cancel" not in out
    assert "terminate" in cli("plan", "--repo", str(state_repo.path)).stdout or not live_workers(local_workdir)
    for _ in range(20):
        if all(phase_of(state_repo, n) == Phase.CANCELLED.value for n in "ab"):
            break
        run_once(state_repo)
    assert [phase_of(state_repo, n) for n in "ab"] == [Phase.CANCELLED.value] * 2
    assert not live_workers(local_workdir)
    assert "held:" not in state_repo.status_text("a")


def test_a_commit_restoring_the_manifests_releases_the_hold_and_the_runs_go_on(
        state_repo: StateRepoFixture, local_workdir: Path) -> None:
    workers, deleting = two_running_then_deleted(state_repo, local_workdir)
    run_once(state_repo)
    assert "held: " in state_repo.status_text("b")
    state_repo.git("revert", "--no-edit", deleting)
    out = run_once(state_repo)
    assert "would cancel" not in out and "manifest deleted" not in out
    assert sorted(live_workers(local_workdir)) == workers  # the same workers, never stopped
    assert "held:" not in state_repo.status_text("a") and phase_of(state_repo, "a") != Phase.CANCELLED.value
    assert "world matches" in cli("plan", "--repo", str(state_repo.path)).stdout


def test_a_later_delete_without_the_trailer_is_held_again_whatever_was_confirmed_before(
        state_repo: StateRepoFixture, local_workdir: Path) -> None:
    two_running_then_deleted(state_repo, local_workdir)
    state_repo.git("commit", "-q", "--allow-empty", "-m", "cancel", "--trailer", CONFIRM_CANCEL_TRAILER)
    for name in "ab":  # put back before any tick acted on the confirmed delete
        state_repo.write(f"desired/{name}.yaml", job(name, SLOW))
    state_repo.commit("bring them back")
    run_once(state_repo)
    state_repo.git("rm", "-q", "desired/a.yaml", "desired/b.yaml")
    state_repo.commit("delete them again, by accident")
    assert "would cancel 2 of 2" in run_once(state_repo)
    assert len(live_workers(local_workdir)) == 2


def test_one_notification_says_what_releases_the_hold(state_repo: StateRepoFixture, local_workdir: Path) -> None:
    state_repo.write("reconciler.yaml", f"storage: file://{state_repo.storage}\ntick_seconds: 0.5\n"
                                        "notifications:\n  targets:\n    - url_env: HOOK_URL\n")
    state_repo.commit("notify")
    two_running_then_deleted(state_repo, local_workdir)
    receiver = Receiver()
    try:
        environ = {**os.environ, "HOOK_URL": receiver.url("tok")}
        for _ in range(2):  # a restarted daemon finds the same hold, and sends nothing again
            rec = Reconciler(state_repo.path, environ=environ)
            rec.notifier = Notifier(environ)
            rec.tick()
            assert rec.notifier.close(10)
        assert receiver.titles() == ["reconciler: 2 jobs held"]
        assert CONFIRM_CANCEL_TRAILER in receiver.received[0]["message"]
    finally:
        receiver.close()


def test_the_page_shows_the_hold(state_repo: StateRepoFixture, local_workdir: Path) -> None:
    two_running_then_deleted(state_repo, local_workdir)
    run_once(state_repo)
    server = start_server(state_repo.path)
    try:
        overview = httpx.get(server.url + "/").text
        job_page = httpx.get(server.url + "/job/a").text
    finally:
        stop_server(server)
    for html in (overview, job_page):
        assert 'class="held"' in html and "would cancel 2 of 2 active jobs (a, b)" in html


@pytest.mark.parametrize(("message", "confirms"), [
    (f"cancel them\n\n{CONFIRM_CANCEL_TRAILER}\n", True),
    ("cancel them\n\nSigned-off-by: x <x@example.com>\nreconciler-confirm:  Cancel\n", True),
    (CONFIRM_CANCEL_TRAILER, False),  # a subject alone is no trailer
    (f"status: 2 jobs changed\n\n- a: Running (the trailer '{CONFIRM_CANCEL_TRAILER}' releases it)\n", False),
    (f"x\n\n{CONFIRM_CANCEL_TRAILER}\n\nlast paragraph without it\n", False),
])
def test_only_a_trailer_confirms_never_a_quote_of_it(message: str, confirms: bool) -> None:
    assert confirms_cancel(message) is confirms


def test_a_target_for_some_jobs_hears_of_a_hold_that_holds_one_of_them() -> None:
    note = "holding: this change would cancel 2 of 2 active jobs (a, b)"
    before = {n: JobStatus(job=n, phase=Phase.RUNNING) for n in "ab"}
    after = {n: JobStatus(job=n, phase=Phase.RUNNING, held=note) for n in "ab"}
    rules = Notifications(targets=[NotifyTarget(url_env="ALL"), NotifyTarget(url_env="B", jobs=["b"]),
                                   NotifyTarget(url_env="C", jobs=["c"])])
    sent = messages(events(before, after, {}, rules), rules)
    assert [(m.url_env, m.body) for m in sent] == [("ALL", note), ("B", note)]
    assert events(after, after, {}, rules) == []
