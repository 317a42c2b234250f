"""Asking every provider at once, each within a deadline: one slow provider delays only its own jobs.

The observe step used to ask providers one after another, so one provider answering in 28 s held
the whole tick (and every other provider's launches and stops) for 28 s. Now each provider is
asked on a thread of its own; the tick waits at most `deadline` seconds for all of them together.
A provider that has not answered by then "cannot be asked" this tick: its jobs keep their last
view (the planner never takes an unanswered provider's silence for a lost worker) and nothing is
launched there. Its call goes on in the background and its late answer is dropped (it describes
a moment already past); no second call is made to it while the first is still out, so a hung
provider holds one thread, not one per tick, and its adapter is never used by two threads at once.

How long each provider took is kept (`calls`) for the status page and the metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import NoReturn, TypeVar

from adapters.compute import Allowance, ComputeAdapter, ProviderUnavailable, WorkerRef, WorkerState
from desired.models import Capacity

log = logging.getLogger("reconciler")

T = TypeVar("T")
SLOW_SHARE = 0.5  # a provider that takes over half its deadline is shown as slow


@dataclass
class ProviderAnswer:
    """Everything one provider said in one call of the observe step."""

    workers: dict[WorkerRef, WorkerState]
    capacity: Capacity | None = None
    allowance: Allowance | None = None
    free_slots: int | None = None
    foreign: int = 0


@dataclass(frozen=True)
class ProviderCall:
    """How one provider's call went this tick: `seconds` it took (or had taken when the tick gave
    up on it), and whether it answered within the deadline."""

    seconds: float
    answered: bool
    deadline: float

    @property
    def slow(self) -> bool:
        return not self.answered or self.seconds > self.deadline * SLOW_SHARE

    def words(self) -> str:
        """One phrase for the status page and the ledger; the same from tick to tick while the
        provider stays slow (the exact seconds are in the metrics), so it commits nothing new."""
        if not self.answered:
            return f"no answer within {self.deadline:g} s: its jobs keep their last view"
        return f"slow: took over {self.deadline * SLOW_SHARE:g} s to answer (deadline {self.deadline:g} s)"


@dataclass
class _Out:
    future: Future[ProviderAnswer]
    started: float
    ended: float | None = None


def ask_one(name: str, adapter: ComputeAdapter, with_capacity: bool) -> ProviderAnswer:
    """One provider's whole answer; only `observe` failing makes the provider unreachable."""
    answer = ProviderAnswer(workers=adapter.observe())
    if with_capacity:
        answer.capacity = _optional(name, "capacity", getattr(adapter, "capacity", None), Capacity)
    answer.allowance = _optional(name, "quota or credits", getattr(adapter, "allowance", None), Allowance)
    answer.free_slots = _optional(name, "free slots", getattr(adapter, "free_slots", None), int)
    answer.foreign = int(getattr(adapter, "foreign_workers", 0) or 0)
    return answer


def _optional(name: str, what: str, ask: object, kind: type[T]) -> T | None:
    """What the adapter says, when it can tell; unknown (and placement goes on) when it cannot."""
    try:
        found = ask() if callable(ask) else None
    except Exception as exc:  # noqa: BLE001 - an unknown figure never stops the tick
        log.info("provider %s could not report its %s: %s", name, what, exc)
        return None
    return found if isinstance(found, kind) and not isinstance(found, bool) else None


@dataclass
class ProviderCalls:
    """Asks providers concurrently within `deadline` seconds; keeps the calls still out."""

    deadline: float = 20.0
    clock: Callable[[], float] = time.monotonic
    threads: bool = True  # False: one after another, in the caller's thread (the seeded simulator)
    calls: dict[str, ProviderCall] = field(default_factory=dict)  # the last tick's, by provider
    _out: dict[str, _Out] = field(default_factory=dict)

    def ask(self, adapters: Mapping[str, ComputeAdapter], with_capacity: set[str]
            ) -> dict[str, ProviderAnswer | str]:
        """Each provider's answer, or the one-line reason it cannot be asked this tick."""
        results: dict[str, ProviderAnswer | str] = {}
        started = self.clock()
        asked: dict[str, _Out] = {}
        if not self.threads:
            return {name: self._inline(name, adapter, name in with_capacity) for name, adapter in adapters.items()}
        for name, adapter in adapters.items():
            earlier = self._out.get(name)
            if earlier is not None and not earlier.future.done():
                waited = started - earlier.started
                results[name] = f"still answering a call made {waited:.0f} s ago (deadline {self.deadline:g} s)"
                self.calls[name] = ProviderCall(waited, False, self.deadline)
                continue
            asked[name] = self._out[name] = self._start(name, adapter, name in with_capacity, started)
        wait([out.future for out in asked.values()], timeout=self.deadline)
        for name, out in asked.items():
            results[name] = self._result(name, out)
        self.calls = {name: call for name, call in self.calls.items() if name in adapters}
        return results

    def _inline(self, name: str, adapter: ComputeAdapter, with_capacity: bool) -> ProviderAnswer | str:
        try:
            return ask_one(name, adapter, with_capacity)
        except Exception as exc:  # noqa: BLE001 - any failure to ask is "unknown", never "gone"
            return str(exc) or type(exc).__name__

    def busy(self) -> dict[str, float]:
        """Providers whose call is still out, with its age in seconds: nothing else may use their adapter now."""
        now = self.clock()
        return {name: now - out.started for name, out in self._out.items() if not out.future.done()}

    def _start(self, name: str, adapter: ComputeAdapter, with_capacity: bool, started: float) -> _Out:
        """The call on a daemon thread of its own (a hung provider must not keep the daemon from exiting)."""
        out = _Out(Future(), started)

        def run() -> None:
            try:
                answer = ask_one(name, adapter, with_capacity)
            except BaseException as exc:  # noqa: BLE001 - any failure to ask is "unknown", never "gone"
                out.ended = self.clock()
                out.future.set_exception(exc)
            else:
                out.ended = self.clock()
                out.future.set_result(answer)

        threading.Thread(target=run, name=f"ask-{name}", daemon=True).start()
        return out

    def _result(self, name: str, out: _Out) -> ProviderAnswer | str:
        if not out.future.done():
            self.calls[name] = ProviderCall(self.clock() - out.started, False, self.deadline)
            log.warning("provider %s did not answer within %g s: its jobs keep their last view this tick",
                        name, self.deadline)
            return f"no answer within {self.deadline:g} s"
        exc = out.future.exception()
        self.calls[name] = ProviderCall((out.ended or out.started) - out.started, True, self.deadline)
        if exc is not None:
            return str(exc) or type(exc).__name__
        return out.future.result()


class Busy:
    """Stands in for an adapter whose call is still out: every request to it is refused as
    "unavailable" (tried again next tick), so that no two threads use one adapter at once."""

    foreign_workers = 0

    def __init__(self, name: str, since: float) -> None:
        self.name, self.since = name, since

    def _refuse(self, *_args: object, **_kw: object) -> NoReturn:
        raise ProviderUnavailable(f"provider {self.name} is still answering a call made {self.since:.0f} s ago; "
                                  "it is asked again next tick")

    observe = launch = terminate = logs = free_slots = _refuse
