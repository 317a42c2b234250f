"""The daemon's side of `watch_endings` (adapters.compute.WatchesEndings), in process on a real
state repository with an hourly tick: a provider's watch runs while the provider is in desired/,
its word starts a tick at once, and removing the provider stops the watch. The adapters' own
watches are tested against the real sshd and Slurm in tests/adapters/test_endings.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import yaml

from adapters.compute import LaunchSpec, ProviderUnavailable, WorkerRef, WorkerState
from reconciler.daemon.loop import Reconciler, TickReport
from reconciler.daemon.service import Daemon
from tests.conftest import StateRepoFixture


class Watching:
    """A provider with no workers whose watch reports an ending when the test asks for one."""

    built: list[Watching] = []

    def __init__(self, name: str, owner: str) -> None:
        self.name, self.owner, self.foreign_workers = name, owner, 0
        self.end_one = threading.Event()
        self.watching = threading.Event()
        self.stopped = threading.Event()
        Watching.built.append(self)

    def launch(self, spec: LaunchSpec) -> WorkerRef:
        raise ProviderUnavailable("no capacity in this test")

    def observe(self) -> dict[WorkerRef, WorkerState]:
        return {}

    def terminate(self, ref: WorkerRef) -> None:
        pass

    def logs(self, ref: WorkerRef, tail: int = 50) -> str:
        return ""

    def free_slots(self) -> int | None:
        return None

    def capacity(self) -> None:
        return None

    def watch_endings(self, stop: threading.Event, notify: Callable[[], None]) -> None:
        self.watching.set()
        while not stop.wait(0.05):
            if self.end_one.is_set():
                self.end_one.clear()
                notify()
        self.stopped.set()


def provider(name: str) -> str:
    return yaml.safe_dump({"apiVersion": "reconciler.dev/v1", "kind": "Provider", "metadata": {"name": name},
                           "spec": {"settings": {"type": "local"}}})


def wait(what: str, cond: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_watched_ending_ticks_at_once_and_a_removed_provider_s_watch_stops(state_repo: StateRepoFixture) -> None:
    Watching.built.clear()
    state_repo.write("desired/box.yaml", provider("box"))
    state_repo.commit("a provider whose adapter can watch")
    ticks: list[TickReport] = []
    rec = Reconciler(state_repo.path, adapter_factory=lambda p, owner: Watching(p.name, owner))  # type: ignore
    daemon = Daemon(rec, tick_seconds=3600, on_tick=ticks.append)
    runner = threading.Thread(target=daemon.run, daemon=True)
    runner.start()
    try:
        wait("the first tick and the watch", lambda: bool(ticks) and bool(Watching.built)
             and Watching.built[0].watching.is_set())
        box = Watching.built[0]
        time.sleep(1.5)
        before = len(ticks)
        assert before == 1, "nothing ended: no tick but the first within the hour"
        box.end_one.set()
        wait("the tick the ending asks for", lambda: len(ticks) > before, timeout=5)

        state_repo.remove("desired/box.yaml")
        state_repo.commit("the provider is gone")
        wait("the watch of the removed provider to stop", box.stopped.is_set)
        assert "box" not in daemon._endings
    finally:
        daemon.stop_event.set()
        runner.join(30)
    assert not runner.is_alive()

