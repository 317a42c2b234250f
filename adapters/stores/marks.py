"""Marks written every step without costing the step: straight through where the store's marks are
cheap (local disk), else coalesced by a daemon thread that writes the newest value of each mark at
most once per interval, so a training loop never waits on a request."""

from __future__ import annotations

import logging
import threading

from adapters.stores.base import StorageError, Store

log = logging.getLogger("adapters.storage")

INTERVAL_SECONDS = 1.0


class Marks:
    def __init__(self, store: Store, interval: float = INTERVAL_SECONDS) -> None:
        self.store = store
        self.interval = interval
        self._pending: dict[str, bytes] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def post(self, name: str, data: bytes) -> None:
        """Record `data` as the newest value of mark `name`; never waits on the store."""
        if self.store.cheap_marks:
            self.store.mark(name, data)
            return
        with self._cond:
            self._pending[name] = data
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="reconciler-marks", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closed)
                if not self._pending:
                    return
                batch, self._pending = self._pending, {}
            for name, data in batch.items():
                try:
                    self.store.mark(name, data)
                except (StorageError, OSError) as exc:
                    log.debug("could not write the mark %s: %s", self.store.url(name), exc)
            with self._cond:
                self._cond.wait_for(lambda: self._closed, timeout=self.interval)

    def close(self, timeout: float = 5.0) -> None:
        """Write what is pending (waiting at most `timeout` seconds) and release the store's handles."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.store.close()
