"""One active daemon per state repository, elected through run storage.

The flock in `.git/` stops two daemons on one clone; it cannot see a second clone of the same
remote (a restarted VM, a second laptop, a copied folder). Both would launch and fence each other's
workers. So the daemons also share a lease, as Kubernetes controllers share a Lease object:

    <storage>/.leader/<key>.json    {"holder": "host:pid:random", "expires": <unix time>, "since": ...}

`key` is the repository's identity (the same for every clone). A daemon takes the lease when it
is absent, expired or already its own, and renews it every tick; the others stand by, say so once,
and take over when it expires. A daemon that stops cleanly lets it expire at once. Every write is a
compare-and-swap (`Store.swap`: S3 If-Match/If-None-Match; local disk an flock and
an atomic rename). Expiry is wall-clock time, so the hosts' clocks must roughly agree (NTP).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from adapters.stores import StorageError, Store, expand_url, open_store
from adapters.stores.faults import classify
from adapters.wire import load_json

log = logging.getLogger(__name__)

LEADER_DIR = ".leader"
# The lease lasts 3 ticks and at least this long (tests shorten it through the environment).
MIN_SECONDS_ENV = "RECONCILER_LEADER_MIN_SECONDS"
MIN_SECONDS = 30.0


@dataclass(frozen=True)
class Leadership:
    leading: bool
    holder: str
    expires: float
    url: str
    # The lease could not be renewed for a storage fault (StoreFault.describe) but the one this
    # daemon last wrote runs until `expires`: it leads until then, and no other daemon can take over.
    fault: str | None = None

    def describe(self) -> str:
        until = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.expires))
        return f"{self.holder} leads until {until} ({self.url})"


def lease_seconds(tick_seconds: float) -> float:
    """Long enough that a slow tick or two does not lose the lease."""
    return max(3 * tick_seconds, float(os.environ.get(MIN_SECONDS_ENV, MIN_SECONDS)))


class Election:
    """This process's side of the election: its holder id and the lease it last took."""

    def __init__(self, tick_seconds: float | None = None, clone: str | None = None) -> None:
        host = socket.gethostname()
        self.holder = f"{host}:{os.getpid()}:{secrets.token_hex(3)}"
        self.tick_seconds = tick_seconds  # the daemon's --tick-seconds, which beats the setting
        # The clone this process holds the .git/ lock of: a lease held from that same clone belongs
        # to a process that has died (the lock would have stopped us otherwise), so it is ours now.
        self.clone = f"{host}:{clone}" if clone else None
        self._lease: tuple[Store, str] | None = None
        self._last: Leadership | None = None
        self._seconds = MIN_SECONDS
        self._written = 0.0  # when we last wrote our lease
        self._lock = threading.Lock()  # the tick and the keep-alive thread both hold leases

    def hold(self, storage: str, options: dict[str, Any], key: str, tick_seconds: float, now: float) -> Leadership:
        """Take or renew the lease; says who leads. Raises StorageError when storage cannot answer
        (then nobody should act: the caller skips the tick)."""
        folder = open_store(f"{expand_url(storage).rstrip('/')}/{LEADER_DIR}", options)
        name = f"{key}.json"
        with self._lock:
            if self._lease is not None and (self._lease[0].uri, self._lease[1]) != (folder.uri, name):
                self._resign(now)  # storage or identity changed: let the old lease go
            self._seconds = lease_seconds(self.tick_seconds or tick_seconds)
            try:
                return self._say(self._hold_at(folder, name, now))
            except StorageError as exc:
                return self._through_fault(exc, folder.url(name), now)

    def _through_fault(self, exc: StorageError, url: str, now: float) -> Leadership:
        """A storage fault kept the lease from being renewed: leading still while the lease last
        written lasts (nobody else can hold it before it expires), else the error is raised and
        this daemon stops acting until the store lets it take the lease again."""
        fault = classify(exc)
        last = self._last
        if fault is None or last is None or not last.leading or now >= last.expires or last.url != url:
            raise exc
        return Leadership(True, self.holder, last.expires, url, fault=fault.describe())

    def keep_alive(self, now: float) -> Leadership | None:
        """Between ticks, so that a tick longer than the lease does not lose it: renew a lease we
        lead with once a third of it has passed. Never takes a lease it does not lead with.
        Returns the lease when it tried to renew it."""
        with self._lock:
            if self._lease is None or self._last is None or not self._last.leading:
                return None
            if now - self._written < self._seconds / 3:
                return None
            try:
                return self._say(self._hold_at(*self._lease, now))
            except StorageError as exc:
                return self._through_fault(exc, self._lease[0].url(self._lease[1]), now)

    def _hold_at(self, folder: Store, name: str, now: float) -> Leadership:
        url = folder.url(name)
        for _ in range(10):
            blob, tag = folder.read_tagged(name)
            record = _record(blob)
            if self._held_by_another(record, now):
                return Leadership(False, str(record["holder"]), float(record["expires"]), url)
            since = record.get("since", now) if record.get("holder") == self.holder else now
            new = {"holder": self.holder, "expires": now + self._seconds, "since": since, "clone": self.clone}
            if folder.swap(name, json.dumps(new, sort_keys=True).encode(), tag) is not None:
                self._lease, self._written = (folder, name), now
                return Leadership(True, self.holder, now + self._seconds, url)
        raise StorageError(f"the leader lease at {url} keeps changing under us")

    def _held_by_another(self, record: dict[str, Any], now: float) -> bool:
        if record.get("holder") in (None, self.holder) or float(record.get("expires", 0)) <= now:
            return False
        return self.clone is None or record.get("clone") != self.clone

    def resign(self, now: float) -> None:
        """Let our lease expire now, so a standby takes over at its next tick (best effort)."""
        with self._lock:
            self._resign(now)

    def _resign(self, now: float) -> None:
        if self._lease is None:
            return
        folder, name = self._lease
        self._lease, self._last = None, None
        try:
            blob, tag = folder.read_tagged(name)
            record = _record(blob)
            if record.get("holder") == self.holder:
                record["expires"] = now
                folder.swap(name, json.dumps(record, sort_keys=True).encode(), tag)
        except StorageError as exc:
            log.warning("could not give up the leader lease %s: %s; it expires by itself", folder.url(name), exc)

    def _say(self, state: Leadership) -> Leadership:
        """Log a change of leadership once, not every tick."""
        last = self._last
        if last is None or last.leading != state.leading or (not state.leading and last.holder != state.holder):
            if state.leading:
                log.info("leading: this daemon (%s) holds the leader lease %s", self.holder, state.url)
            else:
                log.info("standby: %s; this daemon takes over when that lease expires", state.describe())
        self._last = state
        return state


def _record(blob: bytes | None) -> dict[str, Any]:
    """A missing or unreadable record counts as no lease (the swap still protects the write)."""
    if not blob:
        return {}
    try:
        data = load_json(blob)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
