"""The worker's side of a storage fault (adapters/stores/faults.py): a store that is full,
read-only, refusing access, unavailable or throttling is no reason to end the attempt. Training
goes on; a heartbeat that cannot be written is skipped, a save is tried again with a growing pause,
and the completion record waits for the store. A fence (the attempt was replaced) and every other
error are raised as before.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from adapters.storage import Fenced, StorageError
from adapters.stores.faults import classify

log = logging.getLogger("reconciler.worker")

RETRY_FIRST_SECONDS = 0.5
RETRY_MAX_SECONDS = 30.0
T = TypeVar("T")


class StoreFaults:
    """What this worker has said about run storage: each fault once when it starts, once when it ends."""

    def __init__(self) -> None:
        self._said: str | None = None
        self._lock = threading.Lock()  # the training thread and the upload thread both report
        self.stopped = threading.Event()  # set when the run closes: retries give up

    @property
    def active(self) -> bool:
        return self._said is not None

    def tolerate(self, exc: BaseException, what: str) -> bool:
        """True when `exc` is a storage fault the worker waits out (said once); False to raise it."""
        fault = None if isinstance(exc, Fenced) else classify(exc)
        if fault is None:
            return False
        with self._lock:
            if self._said != fault.describe():
                self._said = fault.describe()
                log.warning("%s: could not %s; training goes on and the store is tried again", self._said, what)
        return True

    def works(self) -> None:
        with self._lock:
            if self._said is not None:
                log.warning("run storage works again (it was: %s)", self._said)
                self._said = None

    def retrying(self, action: Callable[[], T], what: str) -> T:
        """`action()`, tried again with a growing pause while it fails with a storage fault (until
        the run closes)."""
        delay = RETRY_FIRST_SECONDS
        while True:
            try:
                result = action()
            except StorageError as exc:
                if not self.tolerate(exc, what) or self.stopped.is_set():
                    raise
            else:
                self.works()
                return result
            self.stopped.wait(delay)
            delay = min(RETRY_MAX_SECONDS, delay * 2)
