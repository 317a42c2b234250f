"""Notifications as a user meets them: a real local job through the real loop, apprise posting to
a local HTTP receiver on 127.0.0.1, the daemon restarted, receivers that fail or hang."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.notify import Notifier
from reconciler.daemon.loop import Reconciler, TickReport
from tests import zygote
from tests.conftest import StateRepoFixture
from tests.daemon.receiver import Receiver
from tests.daemon.test_loop_local import counter, job, phase, tick_until

TOKEN = "T0kenCanary7q9Z"  # the secret part of the webhook URL
ROOT = Path(__file__).resolve().parents[2]
# The worker imports the SDK from this checkout, whatever the installed package points at.
SDK = f"env: {{PYTHONPATH: {ROOT}}}"
CRASH = [sys.executable, "-c", "import sys; print('boom'); sys.exit(1)"]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def notifying(state_repo: StateRepoFixture, extra: str = "") -> None:
    state_repo.write("reconciler.yaml", f"storage: file://{state_repo.storage}\ntick_seconds: 0.5\n"
                                        f"notifications:\n  targets:\n    - url_env: HOOK_URL\n{extra}")


def both_terminal(report: TickReport) -> bool:
    return phase("count")(report) and phase("crash")(report)


def test_a_notification_reaches_the_receiver_when_a_job_succeeds_and_when_one_fails(
        state_repo: StateRepoFixture, receiver: Receiver) -> None:
    notifying(state_repo)
    state_repo.write("desired/count.yaml", job("count", counter(0.02), SDK))
    state_repo.write("desired/crash.yaml", job("crash", CRASH))
    state_repo.commit("a job that succeeds, one that fails")
    environ = {**os.environ, "HOOK_URL": receiver.url(TOKEN)}
    rec = Reconciler(state_repo.path, environ=environ)
    rec.notifier = Notifier(environ)
    tick_until(rec, both_terminal)
    assert rec.notifier.close(10)
    assert sorted(receiver.titles()) == ["reconciler: count succeeded", "reconciler: crash failed"]
    assert all(p == f"/hooks/{TOKEN}" for p in receiver.paths)
    assert rec.redactor.redact(f"posting to {receiver.url(TOKEN)}") == "posting to ***"  # a secret like any
    failed = next(m for m in receiver.received if "crash" in m["title"])
    succeeded = next(m for m in receiver.received if "count" in m["title"])
    assert failed["type"] == "failure" and succeeded["type"] == "success"  # apprise's types, shown as such
    assert re.match(r"crash: failed \d+ times, more than the retry budget", failed["message"]), failed  # once
    for _ in range(3):  # later ticks change nothing: nothing more is sent
        rec.tick()
    rec.notifier = Notifier(environ)
    rec.tick()
    assert rec.notifier.close(10)
    assert len(receiver.received) == 2


def daemon_until_done(repo: Path, log: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return zygote.run([sys.executable, "-m", "reconciler", "run", "--repo", str(repo), "--until-done",
                       "--tick-seconds", "0.3", "--verbose"], capture_output=True, text=True, timeout=120,
                      env={**os.environ, "COLUMNS": "300", **env})


def test_no_notification_is_sent_twice_after_a_daemon_restart_and_the_token_stays_out_of_logs_and_git(
        state_repo: StateRepoFixture, receiver: Receiver, tmp_path: Path) -> None:
    """Two targets: one that works, one that answers 500 (its failure is logged, without its URL)."""
    broken = Receiver("error")
    try:
        notifying(state_repo, "    - url_env: BROKEN_HOOK\n")
        state_repo.write("desired/count.yaml", job("count", counter(0.02), SDK))
        state_repo.commit("count")
        env = {"HOOK_URL": receiver.url(TOKEN), "BROKEN_HOOK": broken.url(TOKEN + "b"),
               "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        first = daemon_until_done(state_repo.path, tmp_path / "first.log", env)
        assert first.returncode == 0, first.stderr
        assert receiver.titles() == ["reconciler: count succeeded"]
        assert broken.titles() == ["reconciler: count succeeded"]  # it got it, and answered 500
        assert "notification to BROKEN_HOOK not delivered" in first.stderr
        second = daemon_until_done(state_repo.path, tmp_path / "second.log", env)
        assert second.returncode == 0, second.stderr
        time.sleep(0.5)
        assert receiver.titles() == ["reconciler: count succeeded"]  # not again after the restart
        logs = first.stdout + first.stderr + second.stdout + second.stderr
        assert TOKEN not in logs and receiver.url(TOKEN) not in logs
        history = state_repo.git("log", "-p", "--all")
        assert TOKEN not in history
    finally:
        broken.close()


def test_a_hanging_receiver_does_not_hold_the_tick_and_a_failing_one_is_logged_once(
        state_repo: StateRepoFixture, caplog: pytest.LogCaptureFixture) -> None:
    hanging, failing = Receiver("hang"), Receiver("error")
    try:
        notifying(state_repo, "    - url_env: FAILING_HOOK\n")
        for name in ("a", "b"):
            state_repo.write(f"desired/{name}.yaml", job(name, CRASH, "retry: {max_retries: 0}"))
        state_repo.commit("two jobs that fail")
        environ = {**os.environ, "HOOK_URL": hanging.url(TOKEN), "FAILING_HOOK": failing.url(TOKEN + "f")}
        rec = Reconciler(state_repo.path, environ=environ)
        rec.notifier = Notifier(environ, timeout=60)  # the hanging send would last a minute
        slowest = 0.0
        with caplog.at_level(logging.INFO, logger="reconciler"):
            while True:
                started = time.monotonic()
                report = rec.tick()
                slowest = max(slowest, time.monotonic() - started)
                if phase("a")(report) and phase("b")(report):
                    break
                time.sleep(0.2)
            assert hanging.arrived.wait(10), "the first notification never reached the hanging receiver"
            assert slowest < 10, f"a tick took {slowest:.1f}s while the receiver hung"
            hanging.release()
            assert rec.notifier.close(30)
        assert len(failing.received) == 2 and len(hanging.received) == 2
        warnings = [r.getMessage() for r in caplog.records if "not delivered" in r.getMessage()]
        assert len(warnings) == 1 and "FAILING_HOOK" in warnings[0]
        assert not any(TOKEN in r.getMessage() for r in caplog.records)
    finally:
        hanging.close()
        failing.close()


def test_an_unset_variable_or_a_url_apprise_does_not_know_is_one_clear_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    notifier = Notifier({"BAD_URL": "nosuchscheme://x/" + TOKEN})
    with caplog.at_level(logging.WARNING, logger="reconciler"):
        notifier.submit("MISSING_URL", "t", "b")
        notifier.submit("BAD_URL", "t", "b")
        assert notifier.close(10)
    lines = [r.getMessage() for r in caplog.records]
    assert any("MISSING_URL is not set" in m for m in lines)
    assert any("BAD_URL is not one apprise understands" in m for m in lines)
    assert not any(TOKEN in m for m in lines)
