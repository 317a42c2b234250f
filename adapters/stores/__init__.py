"""Stores: one folder of storage as named files of bytes, with the conditional writes fencing needs.

`open_store(url, storage_options)` picks the backend by the URL's scheme: file:// (and plain
paths) `LocalStore`, s3:// `S3Store`, memory:// `MemoryStore`, any other fsspec protocol
`FsspecStore`. Every backend passes tests/worker/test_store_contract.py.
"""

from __future__ import annotations

from typing import Any

from adapters.stores.base import (
    ALLOW_UNFENCED_ENV,
    READ_CHUNK,
    CorruptCheckpoint,
    StorageError,
    Store,
    UnsafeStoreError,
    check_backend,
    expand_url,
    fault_point,
)


def open_store(url: str, storage_options: dict[str, Any] | None = None) -> Store:
    """The store of the folder at `url` (`~/x` and plain paths are local folders)."""
    uri = expand_url(url).rstrip("/")
    scheme = uri.split("://", 1)[0]
    if scheme == "file":
        from adapters.stores.local import LocalStore

        return LocalStore(uri, storage_options)
    if scheme == "s3":
        from adapters.stores.s3 import S3Store

        return S3Store(uri, storage_options)
    if scheme == "memory":
        from adapters.stores.memory import MemoryStore

        return MemoryStore(uri, storage_options)
    from adapters.stores.fsspec import FsspecStore

    return FsspecStore(uri, storage_options)


__all__ = [
    "ALLOW_UNFENCED_ENV",
    "READ_CHUNK",
    "CorruptCheckpoint",
    "StorageError",
    "Store",
    "UnsafeStoreError",
    "check_backend",
    "expand_url",
    "fault_point",
    "open_store",
]
