"""The metrics a worker reports (issue 27 item 3): kept per attempt in the run folder, over steps,
bounded, finite numbers under plain names only; a resumed attempt's steps replace the ones it redid."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import torch

from adapters import series
from adapters.storage import RunFolder
from reconciler.worker import open_run


def test_a_loss_given_to_heartbeat_is_kept_over_steps_in_the_run_folder(tmp_path: Path) -> None:
    folder = RunFolder(str(tmp_path / "run"))
    with open_run(uri=folder.uri, target=100, heartbeat_interval=0, install_signal_handlers=False) as run:
        for step in range(1, 6):
            run.heartbeat(step, loss=torch.tensor(1.0 / step), accuracy=0.1 * step)
    found = series.read(folder.store)
    assert [s for s, _ in found["loss"]] == [1, 2, 3, 4, 5]
    assert found["loss"][-1][1] == pytest.approx(0.2) and found["accuracy"][-1][1] == pytest.approx(0.5)
    progress = folder.progress()
    assert progress is not None and set(progress.metrics) == {"loss", "accuracy"}


def test_metrics_that_cannot_be_kept_are_left_out_and_said_once(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="reconciler.worker")
    folder = RunFolder(str(tmp_path / "run"))
    with open_run(uri=folder.uri, heartbeat_interval=0, install_signal_handlers=False) as run:
        for step in range(1, 4):
            run.heartbeat(step, **{"loss": math.nan if step == 2 else 1.0, "bad name!": 1.0, "note": "warm"})
    found = series.read(folder.store)
    assert list(found) == ["loss"] and [s for s, _ in found["loss"]] == [1, 3]  # the NaN step left out
    said = [r.getMessage() for r in caplog.records]
    assert len([m for m in said if "bad name!" in m]) == 1 and len([m for m in said if "note" in m]) == 1
    assert len([m for m in said if "nan" in m]) == 1


def test_an_attempts_series_stays_bounded_over_the_whole_attempt() -> None:
    kept = series.Series(max_points=50)
    for step in range(1, 10_001):
        kept.add(step, {"loss": 1.0 / step})
    steps = [s for s, _ in kept.kept()]
    assert len(steps) <= 51 and steps[0] == 1 and steps[-2] > 9_000  # spread over all of it
    assert steps[-1] == 10_000  # and ending where the attempt is


def test_a_resumed_attempts_steps_replace_those_its_predecessor_redid(tmp_path: Path) -> None:
    folder = RunFolder(str(tmp_path / "run"))
    first, second = series.Series(), series.Series()
    for step in (10, 20, 30, 40):
        first.add(step, {"loss": 5.0})
    for step in (30, 40, 50):  # resumed from the checkpoint at step 20
        second.add(step, {"loss": 1.0})
    series.write(folder.store, 1, first)
    series.write(folder.store, 2, second)
    assert series.read(folder.store)["loss"] == [(10, 5.0), (20, 5.0), (30, 1.0), (40, 1.0), (50, 1.0)]
