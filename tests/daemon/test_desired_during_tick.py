"""A commit to desired/ that lands while a tick runs, in process on a real state repository with an
hourly tick: a watching daemon ticks again at once (the watch event may have come and gone during
the tick); one started with --no-watch waits for its interval or a webhook, as asked."""

from __future__ import annotations

import threading
import time

import pytest

from reconciler.daemon.loop import Reconciler, TickReport
from reconciler.daemon.service import Daemon
from tests.conftest import StateRepoFixture
from tests.daemon.test_daemon_endings import provider, wait


class CommitDuringFirstTick(Reconciler):
    """Commits a new provider manifest in the middle of its first tick."""

    def __init__(self, state_repo: StateRepoFixture) -> None:
        super().__init__(state_repo.path)
        self.state_repo = state_repo
        self.ticks = 0

    def tick(self) -> TickReport:
        self.ticks += 1
        if self.ticks == 1:
            self.state_repo.write("desired/late.yaml", provider("late"))
            self.state_repo.commit("a provider committed during the first tick")
        return super().tick()


@pytest.mark.parametrize("watch", [True, False])
def test_a_commit_during_a_tick_is_acted_on_at_once_only_by_a_watching_daemon(
        state_repo: StateRepoFixture, watch: bool) -> None:
    state_repo.write("desired/box.yaml", provider("box"))
    state_repo.commit("a provider")
    rec = CommitDuringFirstTick(state_repo)
    ticks: list[TickReport] = []
    daemon = Daemon(rec, tick_seconds=3600, on_tick=ticks.append, watch=watch, nudge=False)
    runner = threading.Thread(target=daemon.run, daemon=True)
    runner.start()
    try:
        wait("the first tick", lambda: bool(ticks))
        if watch:
            wait("a second tick for the commit made during the first", lambda: len(ticks) >= 2, timeout=30)
        else:
            time.sleep(2)
            assert len(ticks) == 1, "a --no-watch daemon ticks on its interval or a webhook only"
    finally:
        daemon.stop_event.set()
        runner.join(30)
    assert not runner.is_alive()
