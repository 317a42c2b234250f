"""`reconciler exec -- CMD`: heartbeats for a non-Python job, forwarded signals, a SIGTERM a margin
before RECONCILER_DEADLINE, mapped exit codes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapters.storage import RunFolder
from tests.worker.harness import Store

WRAPPER = [sys.executable, "-c", "import sys; from reconciler.execwrap import main; sys.exit(main(sys.argv[1:]))"]


def wrap(store: Store, epoch: int, folder_uri: str, script: str, **env: str) -> subprocess.Popen[bytes]:
    folder = store.folder()  # only for env(); the uri below is what counts
    full = dict(os.environ)
    full.update(store.env(folder, epoch, RECONCILER_HEARTBEAT_INTERVAL=0.1))
    full.update(RECONCILER_RUN_URI=folder_uri, **env)
    return subprocess.Popen([*WRAPPER, "--", "sh", "-c", script], env=full)


def test_success_writes_done_and_reports_the_childs_step(store: Store) -> None:
    folder = store.folder()
    epoch = folder.bump_lease()
    script = 'echo "5 {\\"loss\\": 0.5}" > "$RECONCILER_STEP_FILE"; sleep 0.5; echo 9 > "$RECONCILER_STEP_FILE"'
    proc = wrap(store, epoch, folder.uri, script)
    assert proc.wait(60) == 0
    done = folder.done()
    assert done is not None and done["epoch"] == epoch and done["step"] == 9
    progress = folder.progress()
    assert progress is not None and (progress.epoch, progress.step) == (epoch, 9)


def test_failure_passes_the_exit_code_through_and_writes_no_done(store: Store) -> None:
    folder = store.folder()
    proc = wrap(store, folder.bump_lease(), folder.uri, "exit 3")
    assert proc.wait(60) == 3
    assert folder.done() is None


@pytest.mark.parametrize("store", ["file"], indirect=True)  # signal handling does not depend on the store
def test_sigterm_is_forwarded_and_the_attempt_exits_75(store: Store, tmp_path: Path) -> None:
    folder = store.folder()
    marker = tmp_path / "got-term"
    script = f'trap "echo term > {marker}; exit 0" TERM; echo ready > {tmp_path}/ready; while true; do sleep 0.05; done'
    proc = wrap(store, folder.bump_lease(), folder.uri, script)
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").exists():
        assert time.monotonic() < deadline, "child never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 75
    assert marker.read_text().strip() == "term"
    assert folder.done() is None


def test_a_replaced_attempt_stops_its_command_and_exits_75(store: Store, tmp_path: Path) -> None:
    folder = store.folder()
    epoch = folder.bump_lease()
    script = f"echo ready > {tmp_path}/ready; sleep 60"
    proc = wrap(store, epoch, folder.uri, script)
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").exists():
        assert time.monotonic() < deadline, "child never started"
        time.sleep(0.05)
    folder.bump_lease()
    assert proc.wait(30) == 75
    assert folder.done() is None


@pytest.mark.parametrize("store", ["file"], indirect=True)  # does not depend on the store
def test_a_missing_command_is_reported_as_127(store: Store) -> None:
    folder = store.folder()
    full = dict(os.environ)
    full.update(store.env(folder, folder.bump_lease()))
    proc = subprocess.run([*WRAPPER, "--", "/nonexistent/tool"], env=full, capture_output=True, text=True)
    assert proc.returncode == 127
    assert "cannot start '/nonexistent/tool'" in proc.stderr


def test_exec_sends_its_command_sigterm_a_margin_before_the_deadline(tmp_path: Path) -> None:
    folder = RunFolder(str(tmp_path / "run"))
    margin = 2.0
    deadline = time.time() + margin + 3.0
    saved = tmp_path / "saved"
    script = (
        f"n=0; trap 'echo $n > {saved}; echo $n > \"$RECONCILER_STEP_FILE\"; exit 0' TERM; "
        "while [ $n -lt 1200 ]; do n=$((n+1)); sleep 0.05; done; exit 3"  # ends by itself if never stopped
    )
    env = dict(
        os.environ,
        RECONCILER_RUN_URI=folder.uri,
        RECONCILER_EPOCH=str(folder.bump_lease()),
        RECONCILER_HEARTBEAT_INTERVAL="0.1",
        RECONCILER_GRACE=str(margin),
        RECONCILER_DEADLINE=str(deadline),
    )
    proc = subprocess.run([*WRAPPER, "--", "sh", "-c", script], env=env, timeout=120, capture_output=True, text=True)
    assert proc.returncode == 75, proc.stderr
    assert "deadline" in proc.stderr
    assert time.time() >= deadline - margin
    step = int(saved.read_text())
    progress = folder.progress()
    assert progress is not None and progress.step == step
    assert folder.done() is None


def test_exec_with_a_deadline_already_within_the_margin_does_not_start_the_command(tmp_path: Path) -> None:
    folder = RunFolder(str(tmp_path / "run"))
    started = tmp_path / "started"
    env = dict(
        os.environ,
        RECONCILER_RUN_URI=folder.uri,
        RECONCILER_EPOCH=str(folder.bump_lease()),
        RECONCILER_GRACE="30",
        RECONCILER_DEADLINE=str(time.time() + 5),
    )
    proc = subprocess.run([*WRAPPER, "--", "touch", str(started)], env=env, timeout=120, capture_output=True, text=True)
    assert proc.returncode == 75, proc.stderr
    assert not started.exists()
    assert folder.done() is None


def test_a_stop_signal_that_lands_while_the_command_starts_is_forwarded_once_it_exists() -> None:
    from reconciler.execwrap import _Notice

    notice = _Notice()
    notice(signal.SIGTERM)  # the wrapper's handler ran before Popen returned
    child = subprocess.Popen(["sleep", "30"])
    try:
        notice.attach(child)
        assert child.wait(10) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()
