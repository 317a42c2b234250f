"""reconciler.daemon.asking: providers asked at once, each within the deadline, one call out at a time."""

from __future__ import annotations

import threading

import pytest

from adapters.compute import ProviderUnavailable, WorkerPhase, WorkerRef, WorkerState
from reconciler.daemon.asking import Busy, ProviderCalls

REF = WorkerRef("fast", "w1", "job", "r1", 1)


class Held:
    """An adapter whose observe waits until `release` is set (a provider that does not answer)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def observe(self) -> dict[WorkerRef, WorkerState]:
        self.calls += 1
        self.release.wait(30)
        return {}


class Fast:
    foreign_workers = 2

    def observe(self) -> dict[WorkerRef, WorkerState]:
        return {REF: WorkerState(WorkerPhase.RUNNING)}

    def free_slots(self) -> int:
        return 3


class Broken:
    def observe(self) -> dict[WorkerRef, WorkerState]:
        raise ProviderUnavailable("broken is unavailable: HTTP 503")


def test_a_held_provider_is_unanswered_asked_once_and_heard_again_once_it_answers() -> None:
    held = Held()
    calls = ProviderCalls(deadline=0.2)
    try:
        first = calls.ask({"held": held, "fast": Fast(), "broken": Broken()}, set())  # type: ignore[dict-item]
        assert first["held"] == "no answer within 0.2 s"
        assert first["broken"] == "broken is unavailable: HTTP 503"
        fast = first["fast"]
        assert not isinstance(fast, str) and fast.workers == {REF: WorkerState(WorkerPhase.RUNNING)}
        assert (fast.free_slots, fast.foreign) == (3, 2)
        assert [calls.calls[n].answered for n in ("held", "fast", "broken")] == [False, True, True]
        assert calls.calls["held"].words() == "no answer within 0.2 s: its jobs keep their last view"
        assert set(calls.busy()) == {"held"}

        second = calls.ask({"held": held, "fast": Fast()}, set())  # type: ignore[dict-item]
        assert str(second["held"]).startswith("still answering a call made ")
        assert held.calls == 1 and set(calls.calls) == {"held", "fast"}
    finally:
        held.release.set()
    for _ in range(100):
        if not calls.busy():
            break
        threading.Event().wait(0.05)
    third = calls.ask({"held": held}, set())  # type: ignore[dict-item]
    assert not isinstance(third["held"], str) and calls.calls["held"].answered and held.calls == 2


def test_a_busy_provider_refuses_every_request_as_unavailable() -> None:
    busy = Busy("spot", 41.6)
    for call in (busy.observe, lambda: busy.launch(None), lambda: busy.terminate(REF), busy.free_slots):
        with pytest.raises(ProviderUnavailable, match="provider spot is still answering a call made 42 s ago"):
            call()


def test_without_threads_providers_are_asked_in_order_in_the_callers_thread() -> None:
    seen: list[str] = []

    class Named(Fast):
        def __init__(self, name: str) -> None:
            self.name = name

        def observe(self) -> dict[WorkerRef, WorkerState]:
            seen.append(f"{self.name}@{threading.current_thread().name}")
            return {}

    ProviderCalls(threads=False).ask({"a": Named("a"), "b": Named("b")}, set())  # type: ignore[dict-item]
    here = threading.current_thread().name
    assert seen == [f"a@{here}", f"b@{here}"]
