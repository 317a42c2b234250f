"""A stop request written to the run folder (stop.json) is honoured at the worker's next heartbeat:
final checkpoint, exit 75, resumable. It is how a provider without a cancel API (Kaggle) is stopped.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from adapters.compute import WorkerRef
from adapters.storage import RunFolder, StorageError
from desired.models import Settings
from reconciler.daemon.execute import execute
from reconciler.planner.plan import Terminate
from reconciler.worker import Run
from tests.worker.harness import Store, attempt, join, start

QUIET = {"RECONCILER_HEARTBEAT_INTERVAL": 1000}
WRAPPER = [sys.executable, "-c", "import sys; from reconciler.execwrap import main; sys.exit(main(sys.argv[1:]))"]
GARBAGE = [b'{"epoch": 3, "rea', b"[1, 2]", b'"stop"', b'{"epoch": "soon"}', b'{"reason": "x"}', b"\xff\xfe", b""]


def wait_for(predicate: Any, timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


# ---- the record -------------------------------------------------------------------------------------


def test_a_stop_request_applies_to_its_epoch_and_older_ones_only(store: Store) -> None:
    folder = store.folder()
    assert folder.stop_request(1) is None
    folder.request_stop(3, "manifest deleted")
    assert [folder.stop_request(e) for e in (2, 3, 4)] == ["manifest deleted", "manifest deleted", None]


def test_stopping_an_old_zombie_does_not_withdraw_the_newer_stop(tmp_path: Path) -> None:
    folder = RunFolder.for_run(str(tmp_path), "job", "r1")
    folder.request_stop(5, "suspended by the manifest")
    folder.request_stop(4, "worker of an older epoch")
    assert folder.stop_request(5) == "suspended by the manifest"
    folder.request_stop(6, "manifest deleted")
    assert folder.stop_request(6) == "manifest deleted"


@pytest.mark.parametrize("blob", GARBAGE)
def test_a_torn_or_foreign_stop_file_is_no_request(tmp_path: Path, blob: bytes) -> None:
    folder = RunFolder.for_run(str(tmp_path), "job", "r1")
    folder.store.write("stop.json", blob)
    assert folder.stop_request(0) is None


# ---- the SDK, in process ------------------------------------------------------------------------------


def _run(folder: RunFolder) -> Run:
    return Run(folder, "r1", folder.bump_lease(), heartbeat_interval=0.0, install_signal_handlers=False)


def test_the_sdk_stops_as_on_sigterm_and_names_the_reason(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = RunFolder.for_run(str(tmp_path), "job", "r1")
    run = _run(folder)
    run.heartbeat(1)
    assert not run.stop_requested
    folder.request_stop(run.epoch, "manifest deleted")
    run.heartbeat(2)
    assert run.stop_requested and run.should_checkpoint(2)
    with caplog.at_level(logging.WARNING, logger="reconciler.worker"), pytest.raises(SystemExit) as exit_:
        run.exit_if_stopping(2)
    assert exit_.value.code == 75
    assert "stop requested by the reconciler: manifest deleted" in caplog.text


def test_the_stop_request_is_read_at_heartbeat_cadence_not_every_step(tmp_path: Path) -> None:
    folder = RunFolder.for_run(str(tmp_path), "job", "r1")
    run = Run(folder, "r1", folder.bump_lease(), heartbeat_interval=1000.0, install_signal_handlers=False)
    run.heartbeat(1)
    folder.request_stop(run.epoch, "manifest deleted")
    run.heartbeat(2)
    assert not run.stop_requested, "read again only after heartbeat_interval"
    run.close()


def test_an_unreadable_stop_request_does_not_stop_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    folder = RunFolder.for_run(str(tmp_path), "job", "r1")
    run = _run(folder)

    def broken(epoch: int) -> str | None:
        raise StorageError("cannot read stop.json: connection reset")

    monkeypatch.setattr(folder, "stop_request", broken)
    with caplog.at_level(logging.DEBUG, logger="reconciler.worker"):
        run.heartbeat(1)
    assert not run.stop_requested
    assert "connection reset" in caplog.text
    run.close()


# ---- the SDK, a real training worker ---------------------------------------------------------------------


def test_a_stop_request_ends_a_real_worker_with_a_checkpoint_and_the_next_attempt_resumes(
    store: Store, tmp_path: Path
) -> None:
    steps, seed = 300, 4
    folder = store.folder()
    epoch = folder.bump_lease()
    env = store.env(folder, epoch, RECONCILER_CHECKPOINT_EVERY=10**6, RECONCILER_GRACE=20)
    worker = start(env, {"steps": steps, "seed": seed, "sleep": 0.01})
    try:
        wait_for(lambda: (p := folder.progress()) is not None and p.step >= 10, what="progress")
        folder.request_stop(epoch, "manifest deleted")
        assert join(worker, 30) == 75
    finally:
        if worker.exitcode is None:
            worker.kill()
    progress = folder.progress()
    assert progress is not None
    assert 10 <= folder.durable_step() == progress.step < steps, "the final checkpoint is the last step reached"
    log = tmp_path / "next.log"
    env = store.env(folder, folder.bump_lease(), RECONCILER_CHECKPOINT_EVERY=10**6, **QUIET)
    assert attempt(env, {"steps": steps, "seed": seed, "log": str(log)}) == 0, "the old stop does not stop epoch+1"
    assert log.read_text().splitlines()[0] == f"restored {progress.step}"
    assert folder.done() is not None


def test_a_stop_request_for_an_older_epoch_does_not_stop_a_newer_worker(store: Store) -> None:
    folder = store.folder()
    folder.request_stop(folder.bump_lease(), "worker of an older epoch")
    env = store.env(folder, folder.bump_lease(), RECONCILER_CHECKPOINT_EVERY=10)
    assert attempt(env, {"steps": 30, "seed": 1}) == 0
    assert folder.done() is not None


def test_a_garbage_stop_file_does_not_crash_a_real_worker(store: Store) -> None:
    folder = store.folder()
    folder.store.write("stop.json", b'{"epoch": 99, "rea')
    env = store.env(folder, folder.bump_lease(), RECONCILER_CHECKPOINT_EVERY=10)
    assert attempt(env, {"steps": 30, "seed": 1}) == 0
    assert folder.done() is not None


# ---- reconciler exec ------------------------------------------------------------------------------------


def test_exec_sends_its_command_sigterm_on_a_stop_request_and_exits_75(store: Store, tmp_path: Path) -> None:
    folder = store.folder()
    epoch = folder.bump_lease()
    marker = tmp_path / "got-term"
    script = f'trap "echo term > {marker}; exit 0" TERM; echo ready > {tmp_path}/ready; while true; do sleep 0.05; done'
    env = dict(os.environ)
    env.update(store.env(folder, epoch, RECONCILER_HEARTBEAT_INTERVAL=0.1))
    proc = subprocess.Popen([*WRAPPER, "--", "sh", "-c", script], env=env, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: (tmp_path / "ready").exists(), 30, "the command to start")
        folder.request_stop(epoch, "manifest deleted")
        assert proc.wait(30) == 75
    finally:
        if proc.poll() is None:
            proc.kill()
    assert marker.read_text().strip() == "term"
    assert folder.done() is None
    assert proc.stderr is not None and b"stop requested by the reconciler: manifest deleted" in proc.stderr.read()


# ---- the executor ------------------------------------------------------------------------------------------


class RecordingAdapter:
    """A provider boundary that records terminate calls and what stop.json said at that moment."""

    name = owner = "kaggle"
    foreign_workers = 0

    def __init__(self, folder: RunFolder | None = None) -> None:
        self.folder = folder
        self.calls: list[tuple[WorkerRef, str | None]] = []

    def terminate(self, ref: WorkerRef) -> None:
        seen = self.folder.stop_request(ref.epoch) if self.folder is not None else None
        self.calls.append((ref, seen))


def _ref(folder: RunFolder, epoch: int) -> WorkerRef:
    return WorkerRef("kaggle", "kernel-1", "job", folder.uri.rsplit("/", 1)[-1], epoch)


def test_execute_writes_the_stop_request_before_it_calls_terminate(store: Store) -> None:
    folder = store.folder()
    ref = _ref(folder, folder.bump_lease())
    fake = RecordingAdapter(folder)
    settings = Settings(storage=store.base, storage_options=store.options)
    report = execute([Terminate(ref, "manifest deleted")], jobs={}, adapters={"kaggle": fake},  # type: ignore[dict-item]
                     settings=settings, environ={})
    assert fake.calls == [(ref, "manifest deleted")]
    assert report.terminated and not report.errors


def test_execute_writes_to_the_store_the_terminate_names(tmp_path: Path) -> None:
    folder = RunFolder.for_run(str(tmp_path / "other"), "job", "r1")
    ref = _ref(folder, folder.bump_lease())
    fake = RecordingAdapter(folder)
    settings = Settings(storage=f"file://{tmp_path / 'configured'}")
    execute([Terminate(ref, "moved", store=f"file://{tmp_path / 'other'}")], jobs={},
            adapters={"kaggle": fake}, settings=settings, environ={})  # type: ignore[dict-item]
    assert fake.calls == [(ref, "moved")]
    assert not (tmp_path / "configured").exists()


def test_execute_still_terminates_when_the_store_cannot_be_written(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the store should be")
    ref = WorkerRef("kaggle", "kernel-1", "job", "r1", 3)
    fake = RecordingAdapter()
    with caplog.at_level(logging.WARNING, logger="reconciler"):
        report = execute([Terminate(ref, "manifest deleted")], jobs={}, adapters={"kaggle": fake},  # type: ignore[dict-item]
                         settings=Settings(storage=f"file://{blocker}"), environ={})
    assert fake.calls == [(ref, None)]
    assert report.terminated == [Terminate(ref, "manifest deleted")] and not report.errors
    assert "could not write the stop request" in caplog.text
