"""Moving a run's folder to another store when `storage:` changes (e.g. `file://` to `s3://`),
so that a run keeps its checkpoints, its lease epoch and its completion record.

Files are copied one at a time (checkpoint payloads first, the lease last, so that a copy cut
short is never mistaken for a run) and every file is read back and compared by sha256; the move
counts only when the copy's durable step, lease epoch and completion record equal the source's.
The source is left as it is: removing it is the user's decision.
"""

from __future__ import annotations

import hashlib
from typing import Any

from adapters.storage import LEASE_FILE, LEASE_LOG, RunFolder, StorageError


class MigrationError(StorageError):
    pass


def _order(name: str) -> tuple[int, str]:
    if name == LEASE_FILE:
        return 3, name
    if name.startswith(LEASE_LOG + "/"):
        return 2, name
    return (0 if name.startswith("checkpoints/") else 1), name


def migrate_run(source: RunFolder, target: RunFolder) -> int:
    """Copies `source` into `target` and verifies it; returns the number of files copied."""
    if target.lease_epoch() > source.lease_epoch():
        raise MigrationError(f"{target.url()} already holds this run at a later epoch "
                             f"({target.lease_epoch()} > {source.lease_epoch()}); move it aside first")
    names = sorted(source.store.list(""), key=_order)
    for name in names:
        data = source.store.read(name)
        if data is None:
            continue  # removed since the listing (collection of an old checkpoint)
        target.store.write(name, data)
        if _digest(target.store.read(name)) != _digest(data):
            raise MigrationError(f"{target.url(name)} does not read back as written")
    _verify(source, target)
    return len(names)


def _digest(data: bytes | None) -> str:
    return hashlib.sha256(data or b"").hexdigest()


def _verify(source: RunFolder, target: RunFolder) -> None:
    checks: list[tuple[str, Any, Any]] = [
        ("lease epoch", source.lease_epoch(), target.lease_epoch()),
        ("durable step", source.durable_step(), target.durable_step()),
        ("completion", source.done() is not None, target.done() is not None),
    ]
    for what, want, got in checks:
        if want != got:
            raise MigrationError(f"moved run at {target.url()} has {what} {got!r}, the source {want!r}")
