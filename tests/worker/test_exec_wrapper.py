"""`reconciler exec -- CMD`: heartbeats for a non-Python job, forwarded signals, mapped exit codes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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


def test_sigterm_is_forwarded_and_the_attempt_exits_75(store: Store, tmp_path: Path) -> None:
    if store.kind == "s3":
        pytest.skip("signal handling does not depend on the store")
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


def test_a_missing_command_is_reported_as_127(store: Store) -> None:
    if store.kind == "s3":
        pytest.skip("does not depend on the store")
    folder = store.folder()
    full = dict(os.environ)
    full.update(store.env(folder, folder.bump_lease()))
    proc = subprocess.run([*WRAPPER, "--", "/nonexistent/tool"], env=full, capture_output=True, text=True)
    assert proc.returncode == 127
    assert "cannot start '/nonexistent/tool'" in proc.stderr
