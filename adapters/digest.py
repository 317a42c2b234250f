"""Checksums of checkpoint files: which algorithm, and hashing that runs beside the I/O.

A checkpoint's commit record gives every file's size and its digests, named by algorithm:
``{"size": n, "xxh3_128": "...", "sha256": "..."}``. sha256 is always written, so that any worker can
verify any checkpoint, including one whose run moved to a provider without the `xxhash` package;
xxh3_128 (about ten times faster than sha256 here) is written beside it when `xxhash` is installed,
and a reader that has `xxhash` checks that one alone. Writing both costs hashing time on the
background write, never blocked time. Older checkpoints hold sha256 only. Both catch a truncated,
damaged or swapped file; neither authenticates the writer (whoever can rewrite a file can rewrite
the commit record beside it). RECONCILER_CHECKPOINT_DIGEST=sha256 (or xxh3_128) writes that one
alone: xxh3_128 alone saves the sha256 pass, but only readers with `xxhash` can then restore.

`Overlapped` hashes the chunks handed to it on a thread of its own, in order, so a reader or
writer can go on with the next chunk while the previous one is hashed (hashlib and xxhash release
the GIL on large buffers).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

DIGEST_ENV = "RECONCILER_CHECKPOINT_DIGEST"
ALGORITHMS = ("xxh3_128", "sha256")


class DigestError(ValueError):
    """A commit record names no digest this process can compute."""


def _xxhash() -> Any:
    try:
        import xxhash
    except ImportError:
        return None
    return xxhash


def written() -> tuple[str, ...]:
    """The algorithms new checkpoints record, fastest first."""
    wanted = os.environ.get(DIGEST_ENV, "").strip()
    if wanted:
        if wanted not in ALGORITHMS:
            raise DigestError(f"{DIGEST_ENV}={wanted!r} is not one of {', '.join(ALGORITHMS)}")
        return (wanted,)
    return ("xxh3_128", "sha256") if _xxhash() is not None else ("sha256",)


def preferred() -> str:
    """The fastest algorithm new checkpoints record."""
    return written()[0]


def new(algorithm: str) -> Any:
    """A fresh hashlib-style object (update, hexdigest) for `algorithm`."""
    if algorithm == "sha256":
        return hashlib.sha256()
    if algorithm == "xxh3_128":
        xxhash = _xxhash()
        if xxhash is None:
            raise DigestError(
                "this checkpoint was verified with xxh3_128 when written, and the xxhash package is not "
                "installed here: pip install xxhash (or reconciler[torch])"
            )
        return xxhash.xxh3_128()
    raise DigestError(f"unknown checkpoint digest {algorithm!r} (known: {', '.join(ALGORITHMS)})")


def expected(info: dict[str, Any]) -> tuple[str, str]:
    """(algorithm, hex digest) to check one file by: the fastest one recorded that this process can
    compute; DigestError when the record holds none we know, or only one we cannot compute here."""
    recorded = check_record(info)
    usable = [a for a in recorded if a != "xxh3_128" or _xxhash() is not None]
    algorithm = usable[0] if usable else recorded[0]
    new(algorithm)  # raises, saying what to install, when it cannot be computed here
    return algorithm, str(info[algorithm])


def check_record(info: dict[str, Any]) -> list[str]:
    """The known algorithms a file record holds; DigestError when it holds none."""
    recorded = [a for a in ALGORITHMS if a in info]
    if not recorded:
        raise DigestError(f"the file record {sorted(info)} has no digest (one of {', '.join(ALGORITHMS)})")
    return recorded


def record(size: int, digests: dict[str, str]) -> dict[str, Any]:
    return {"size": size, **digests}


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _hash_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2)),
                                       thread_name_prefix="reconciler-hash")
        return _pool


class Overlapped:
    """Wraps a hashlib-style object: `update` returns at once and the chunk is hashed on a pool
    thread, chunks of one object strictly in order. The caller must not change a chunk's memory
    until `hexdigest()` (which waits for all of them) returns."""

    def __init__(self, hasher: Any) -> None:
        self._hasher = hasher
        self._chunks: deque[Any] = deque()
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._error: BaseException | None = None

    def update(self, chunk: Any) -> None:
        with self._lock:
            self._chunks.append(chunk)
            if not self._idle.is_set():
                return  # the running drain will take it
            self._idle.clear()
        _hash_pool().submit(self._drain)

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._chunks:
                    self._idle.set()
                    return
                chunk = self._chunks.popleft()
            if self._error is None:
                try:
                    self._hasher.update(chunk)
                except BaseException as exc:  # raised by hexdigest in the caller's thread
                    self._error = exc

    def hexdigest(self) -> str:
        self._idle.wait()
        if self._error is not None:
            raise self._error
        return str(self._hasher.hexdigest())
