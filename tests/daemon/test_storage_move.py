"""A commit that changes `storage:` (e.g. file:// to s3://) with real workers: a live attempt
finishes on the store it writes to, a run between attempts is moved (verified) and resumes from
its checkpoint in the new store, and no worker or epoch is reused across the two stores."""

from __future__ import annotations

from pathlib import Path

from adapters.storage import RunFolder
from reconciler.daemon.loop import Reconciler
from status.models import Phase
from tests.conftest import StateRepoFixture
from tests.daemon.test_loop_local import counter, job, tick_until


def _settings(state_repo: StateRepoFixture, store: Path) -> None:
    state_repo.write("reconciler.yaml", f"storage: file://{store}\ntick_seconds: 0.5\n")


def test_a_storage_change_never_charges_a_live_run_nor_loses_a_paused_ones_progress(
        state_repo: StateRepoFixture, tmp_path: Path) -> None:
    state_repo.write("desired/live.yaml", job("live", counter(0.5)))
    state_repo.write("desired/paused.yaml", job("paused", counter(0.05)))
    state_repo.commit("two jobs")
    rec = Reconciler(state_repo.path)
    old = state_repo.storage

    run_id = rec.read_desired(state_repo.git("rev-parse", "HEAD").strip()).jobs["paused"].run_id()
    old_folder = RunFolder.for_run(f"file://{old}", "paused", run_id)

    def paused_checkpointed(_report: object) -> bool:
        return old_folder.durable_step() >= 20

    tick_until(rec, paused_checkpointed, timeout=60)
    state_repo.write("desired/paused.yaml", job("paused", counter(0.05), "suspend: true"))
    state_repo.commit("pause")
    tick_until(rec, lambda r: r.statuses["paused"].phase == Phase.SUSPENDED
               and r.statuses["live"].phase == Phase.RUNNING)

    new = tmp_path / "new-store"
    _settings(state_repo, new)
    state_repo.write("desired/paused.yaml", job("paused", counter(0.05)))
    state_repo.commit("move run data and resume")
    held = rec.tick()
    assert any("storage change to" in e and "held while attempt" in e for e in held.errors)
    final = tick_until(rec, lambda r: all(r.statuses[j].phase.terminal for j in ("live", "paused")), timeout=90)
    for name in ("live", "paused"):
        st = final.statuses[name]
        assert st.phase == Phase.SUCCEEDED, st.message
        assert st.failures == 0
    live, paused = final.statuses["live"], final.statuses["paused"]
    assert live.storage == f"file://{old}" and live.total_attempts == 1  # finished where it ran
    assert paused.storage == f"file://{new}"
    moved = RunFolder.for_run(f"file://{new}", "paused", paused.run_id)
    assert moved.done() is not None
    assert paused.attempts[-1].epoch == 2 and paused.attempts[-1].step_start >= 20  # resumed, not restarted
