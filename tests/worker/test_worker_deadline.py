"""A known end (RECONCILER_DEADLINE) is honoured ahead of time: the SDK stops a margin before it
(time for one more save) with a final checkpoint and exit 75, and the run resumes bit-identical
to an uninterrupted one.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from adapters.storage import RunFolder
from reconciler.worker import open_run
from reconciler.worker.run import MAX_DEADLINE_MARGIN, deadline_margin
from tests.worker.harness import Store, assert_same, attempt, load

QUIET = {"RECONCILER_HEARTBEAT_INTERVAL": 1000}


@pytest.mark.parametrize(
    ("save_seconds", "floor", "expected"),
    [
        (None, 30.0, 30.0),  # nothing measured yet: the floor
        (5.0, 30.0, 30.0),  # a quick save: the floor
        (40.0, 30.0, 80.0),  # a slow save: twice its duration
        (5000.0, 30.0, MAX_DEADLINE_MARGIN),  # a pathological save is capped
        (5000.0, 3600.0, 3600.0),  # a floor set by the user is kept
    ],
)
def test_the_deadline_margin_is_twice_the_last_save_at_least_the_grace(
    save_seconds: float | None, floor: float, expected: float
) -> None:
    assert deadline_margin(save_seconds, floor) == expected


def test_the_margin_grows_with_the_measured_save(tmp_path: Path) -> None:
    folder = RunFolder(str(tmp_path / "run"))
    with open_run(uri=folder.uri, grace=0, deadline=time.time() + 3600, install_signal_handlers=False) as run:
        assert run.deadline_margin == 0
        run.save(1, state={"w": list(range(1000))})
        run.wait()
        assert run.deadline_margin > 0
        assert not run.stop_requested


def test_a_deadline_a_few_seconds_ahead_ends_with_a_final_checkpoint_and_75(store: Store, tmp_path: Path) -> None:
    steps, seed, margin = 300, 4, 8.0  # the margin leaves a slow S3 server time for the final save
    folder = store.folder()
    env = store.env(folder, folder.bump_lease(), RECONCILER_CHECKPOINT_EVERY=10**6, **QUIET)
    assert attempt(env, {"steps": steps, "seed": seed, "out": str(tmp_path / "ref.pt")}) == 0
    expected = load(str(tmp_path / "ref.pt"))

    folder = store.folder()
    deadline = time.time() + margin + 3.0
    env = store.env(
        folder,
        folder.bump_lease(),
        RECONCILER_CHECKPOINT_EVERY=10**6,
        RECONCILER_GRACE=margin,
        RECONCILER_DEADLINE=deadline,
        **QUIET,
    )
    assert attempt(env, {"steps": steps, "seed": seed, "sleep": 0.01}) == 75
    assert time.time() >= deadline - margin, "stopped before the margin"
    progress = folder.progress()
    assert progress is not None
    assert 1 <= folder.durable_step() == progress.step < steps, "the final checkpoint is the last step reached"
    assert progress.stopping == "deadline"  # the last beat tells the reconciler this was a session's end
    assert progress.save_seconds is not None and progress.save_seconds >= 0  # the forecast's final save

    log = tmp_path / "next.log"
    env = store.env(folder, folder.bump_lease(), RECONCILER_CHECKPOINT_EVERY=10**6, **QUIET)
    assert attempt(env, {"steps": steps, "seed": seed, "out": str(tmp_path / "out.pt"), "log": str(log)}) == 0
    assert log.read_text().splitlines()[0] == f"restored {progress.step}"
    assert_same(expected, load(str(tmp_path / "out.pt")))
