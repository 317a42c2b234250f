"""Storage faults: the store itself is full, read-only, refusing us, unavailable, throttling or
gone. Such a fault is the store's, never a job's: the daemon probes its store once per tick and the
planner charges nothing, launches nothing and waits while one holds; the worker SDK keeps training
and retries its saves. Anything else a store raises (a missing file, a corrupt checkpoint, a fence)
is not a fault of the store and is left to whoever asked.
"""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass
from typing import Literal

from adapters.stores.base import CorruptCheckpoint, StorageError, Store, UnsafeStoreError

FaultKind = Literal["full", "read_only", "permission", "unavailable", "throttled", "gone"]

WORDS: dict[str, str] = {
    "full": "full",
    "read_only": "read-only",
    "permission": "refusing access",
    "unavailable": "unavailable",
    "throttled": "throttling requests",
    "gone": "gone",
}
_ERRNO: dict[int, FaultKind] = {
    errno.ENOSPC: "full", errno.EDQUOT: "full", errno.EFBIG: "full",
    errno.EROFS: "read_only",
    errno.EACCES: "permission", errno.EPERM: "permission",
    errno.EIO: "unavailable", errno.ENOTCONN: "unavailable", errno.ETIMEDOUT: "unavailable",
    errno.EHOSTUNREACH: "unavailable", errno.ECONNREFUSED: "unavailable", errno.ESTALE: "gone",
    errno.ENODEV: "gone", errno.ENXIO: "gone",
}
_S3_CODES: dict[str, FaultKind] = {
    "SlowDown": "throttled", "Throttling": "throttled", "ThrottlingException": "throttled",
    "RequestLimitExceeded": "throttled", "TooManyRequests": "throttled",
    "ServiceUnavailable": "unavailable", "InternalError": "unavailable", "RequestTimeout": "unavailable",
    "AccessDenied": "permission", "AllAccessDisabled": "permission", "InvalidAccessKeyId": "permission",
    "SignatureDoesNotMatch": "permission", "ExpiredToken": "permission",
    "NoSuchBucket": "gone", "QuotaExceeded": "full", "EntityTooLarge": "full",
}


@dataclass(frozen=True)
class StoreFault:
    """What is wrong with a store, in a kind the planner acts on and the words of the error."""

    kind: FaultKind
    detail: str  # the error's own words, stable from one failure to the next (no temporary names)
    url: str = ""

    def describe(self) -> str:
        where = f"run storage {self.url}" if self.url else "run storage"
        return f"{where} is {WORDS[self.kind]} ({self.detail})"


def classify(exc: BaseException, url: str = "") -> StoreFault | None:
    """The storage fault behind `exc` (an OSError's errno, an S3 error's code or status, a
    connection that failed), or None when it is not the store's fault."""
    if isinstance(exc, CorruptCheckpoint | UnsafeStoreError):
        return None
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        kind = _kind(cause)
        if kind is not None:
            return StoreFault(kind, _detail(cause), url)
        cause = cause.__cause__ or cause.__context__
    return None


def _detail(exc: BaseException) -> str:
    """The words of the error without the file names in it, which change from one try to the next."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = str(response.get("Error", {}).get("Code", ""))
        status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        return " ".join(x for x in (f"HTTP {status}" if status else "", code) if x) or type(exc).__name__
    return type(exc).__name__


def _kind(exc: BaseException) -> FaultKind | None:
    if isinstance(exc, OSError) and exc.errno in _ERRNO:
        return _ERRNO[exc.errno]
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore's ClientError
        code = str(response.get("Error", {}).get("Code", ""))
        status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in _S3_CODES:
            return _S3_CODES[code]
        if status in (429, 503):
            return "throttled" if status == 429 or code == "SlowDown" else "unavailable"
        if status >= 500:
            return "unavailable"
        if status == 403:
            return "permission"
        return None
    name = type(exc).__name__
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError"):
        return "unavailable"
    return None


MARKER = ".reconciler-store"  # written once the store holds run data: its absence then means the store is gone
OWN = (".health/", ".leader/", MARKER)


def probe(store: Store, holds_runs: bool = False) -> StoreFault | None:
    """One small write, read and delete in `store`: None when all three work, else the fault.
    `holds_runs`: jobs have run in this store, so a store with no run data at all (an unmounted
    disk, a deleted folder or prefix) is gone rather than new. A failure that is not a storage
    fault is not this probe's business (the caller's own reads report it)."""
    name = f".health/{socket.gethostname()}-{os.getpid()}"
    data = os.urandom(16)
    try:
        if holds_runs and store.read(MARKER) is None:  # before the write, which would make the folder
            if not any(not k.startswith(OWN) for k in store.list()):
                return StoreFault("gone", f"it holds no run data, though jobs have run there; if it was emptied on "
                                          f"purpose, create {store.url(MARKER)} to start afresh", store.uri)
            store.write(MARKER, b"reconciler run storage\n")
        store.write(name, data)
        back = store.read(name)
        store.delete(name)
    except (StorageError, OSError) as exc:
        return classify(exc, store.uri)
    if back != data:
        return StoreFault("unavailable", "a probe read back other bytes than were written", store.uri)
    return None
