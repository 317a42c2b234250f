"""A replaced worker that wakes up changes nothing and exits by itself; a preemption notice
(SIGTERM or Slurm's SIGUSR1) ends the attempt with a final checkpoint and exit 75.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.worker.harness import Store, assert_same, attempt, join, load, start

QUIET = {"RECONCILER_HEARTBEAT_INTERVAL": 1000}


def wait_for(predicate: Any, timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def saved_steps(log: Path) -> list[int]:
    if not log.exists():
        return []
    return [int(line.split()[1]) for line in log.read_text().splitlines() if line.startswith("saved ")]


def reference(store: Store, tmp_path: Path, steps: int, seed: int) -> Any:
    folder = store.folder()
    env = store.env(folder, folder.bump_lease(), RECONCILER_CHECKPOINT_EVERY=10**6, **QUIET)
    assert attempt(env, {"steps": steps, "seed": seed, "out": str(tmp_path / "ref.pt")}) == 0
    return load(str(tmp_path / "ref.pt"))


def test_zombie_paused_past_its_replacement_writes_nothing_that_counts_and_exits(store: Store, tmp_path: Path) -> None:
    steps, seed = 60, 3
    expected = reference(store, tmp_path, steps, seed)
    folder = store.folder()
    old = folder.bump_lease()
    zombie_log = tmp_path / "zombie.log"
    env = store.env(folder, old, RECONCILER_CHECKPOINT_EVERY=5)
    zombie = start(env, {"steps": steps, "seed": seed, "sleep": 0.03, "log": str(zombie_log)})
    try:
        wait_for(lambda: len(saved_steps(zombie_log)) >= 2, what="the first worker to checkpoint")
        os.kill(zombie.pid, signal.SIGSTOP)
        accepted_before = set(folder.committed_checkpoints())

        new = folder.bump_lease()  # the reconciler replaces the silent worker
        log = tmp_path / "new.log"
        env = store.env(folder, new, RECONCILER_CHECKPOINT_EVERY=5)
        current = start(
            env, {"steps": steps, "seed": seed, "sleep": 0.03, "out": str(tmp_path / "out.pt"), "log": str(log)}
        )
        wait_for(lambda: len(saved_steps(log)) >= 1, what="the new attempt to checkpoint")

        os.kill(zombie.pid, signal.SIGCONT)
        zombie.join(60)
        assert zombie.exitcode == 75, "the zombie must notice it was replaced and exit on its own"
        current.join(120)
        assert current.exitcode == 0
    finally:
        for proc in (zombie,):
            if proc.exitcode is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()

    for ckpt in folder.committed_checkpoints():
        assert ckpt.epoch == new or ckpt in accepted_before, f"{ckpt} was written by the zombie after it was replaced"
    done = folder.done()
    assert done is not None and done["epoch"] == new
    progress = folder.progress()
    assert progress is not None and progress.epoch == new and progress.step == steps
    assert folder.lease_epoch() == new
    assert_same(expected, load(str(tmp_path / "out.pt")))


@pytest.mark.parametrize("notice", ["SIGTERM", "SIGUSR1"])
def test_preemption_notice_takes_a_final_checkpoint_within_grace_and_loses_no_step(
    store: Store, tmp_path: Path, notice: str
) -> None:
    steps, seed, grace = 300, 4, 20.0
    expected = reference(store, tmp_path, steps, seed)
    folder = store.folder()
    extra: dict[str, Any] = {"RECONCILER_CHECKPOINT_EVERY": 10**6, "RECONCILER_GRACE": grace}
    env = store.env(folder, folder.bump_lease(), **extra)
    worker = start(env, {"steps": steps, "seed": seed, "sleep": 0.01})
    try:
        wait_for(lambda: (p := folder.progress()) is not None and p.step >= 10, what="progress")
        sent = time.monotonic()
        os.kill(worker.pid, getattr(signal, notice))
        code = join(worker, grace)
        assert code == 75, f"exit code {code} after {notice}"
        assert time.monotonic() - sent <= grace
    finally:
        if worker.exitcode is None:
            worker.kill()
    progress = folder.progress()
    assert progress is not None
    assert 10 <= folder.durable_step() == progress.step < steps, "the final checkpoint is the last step reached"
    log = tmp_path / "next.log"
    env = store.env(folder, folder.bump_lease(), RECONCILER_CHECKPOINT_EVERY=10**6, **QUIET)
    assert attempt(env, {"steps": steps, "seed": seed, "out": str(tmp_path / "out.pt"), "log": str(log)}) == 0
    assert log.read_text().splitlines()[0] == f"restored {progress.step}"
    assert_same(expected, load(str(tmp_path / "out.pt")))
