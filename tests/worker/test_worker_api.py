"""The SDK's surface: environment handling, heartbeats, and errors that are raised, never lost."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from adapters.storage import CheckpointName, RunFolder, StorageError
from reconciler.worker import RunConfigError, Superseded, open_run

ENV = ["RECONCILER_RUN_URI", "RECONCILER_RUN_ID", "RECONCILER_EPOCH", "RECONCILER_DEADLINE"]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in [*ENV, "RECONCILER_CHECKPOINT_EVERY", "RECONCILER_GRACE", "RECONCILER_HEARTBEAT_INTERVAL"]:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_missing_run_uri_is_one_clear_sentence(clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(RunConfigError, match="RECONCILER_RUN_URI is not set"):
        open_run()


def test_a_bad_number_names_the_variable(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("RECONCILER_RUN_URI", str(tmp_path / "run"))
    clean_env.setenv("RECONCILER_EPOCH", "two")
    with pytest.raises(RunConfigError, match="RECONCILER_EPOCH='two' is not an integer"):
        open_run()


def test_epochs_must_match_the_lease(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    folder = RunFolder(str(tmp_path / "run"))
    folder.bump_lease()
    folder.bump_lease()
    with pytest.raises(Superseded):
        open_run(uri=folder.uri, epoch=1, install_signal_handlers=False)
    with pytest.raises(RunConfigError, match="must bump the lease"):
        open_run(uri=folder.uri, epoch=5, install_signal_handlers=False)


def test_without_an_epoch_a_hand_started_script_takes_the_lease(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("RECONCILER_RUN_URI", str(tmp_path / "run"))
    clean_env.setenv("RECONCILER_CHECKPOINT_EVERY", "5")
    with open_run(install_signal_handlers=False) as run:
        assert run.epoch == 1
        assert run.checkpoint_every == 5
        assert [run.should_checkpoint(s) for s in (4, 5, 10)] == [False, True, True]


def test_heartbeat_reports_epoch_step_target_and_metrics(tmp_path: Path) -> None:
    folder = RunFolder(str(tmp_path / "run"))
    with open_run(uri=folder.uri, target=100, heartbeat_interval=0, install_signal_handlers=False) as run:
        run.heartbeat(7, loss=0.25)
    progress = folder.progress()
    assert progress is not None
    assert (progress.epoch, progress.step, progress.target, progress.metrics) == (1, 7, 100, {"loss": 0.25})


def test_deadline_within_grace_requests_a_stop(tmp_path: Path) -> None:
    import time

    uri = str(tmp_path / "run")
    with open_run(uri=uri, deadline=time.time() + 5, grace=10, install_signal_handlers=False) as run:
        assert run.stop_requested and run.should_checkpoint(3)
    with open_run(uri=uri, deadline=time.time() + 60, grace=10, install_signal_handlers=False) as run:
        assert not run.stop_requested


def test_a_failed_upload_is_raised_at_the_next_save(tmp_path: Path) -> None:
    folder = RunFolder(str(tmp_path / "run"))
    model = torch.nn.Linear(2, 2)
    with open_run(uri=folder.uri, install_signal_handlers=False) as run:
        blocker = Path(folder.store.os_path(f"checkpoints/{CheckpointName(1, run.epoch).dirname}"))
        os.makedirs(blocker.parent, exist_ok=True)
        blocker.write_text("a file where the checkpoint folder should go")
        run.save(1, model=model)  # returns: the upload fails in the background
        with pytest.raises(StorageError, match="cannot upload"):
            run.save(2, model=model)


def test_a_save_fenced_by_a_newer_attempt_raises_superseded(tmp_path: Path) -> None:
    folder = RunFolder(str(tmp_path / "run"))
    model = torch.nn.Linear(2, 2)
    run = open_run(uri=folder.uri, install_signal_handlers=False)
    folder.bump_lease()
    run.save(1, model=model)
    with pytest.raises(Superseded) as info:
        run.wait()
    assert info.value.code == 75
    assert folder.committed_checkpoints() == []
