"""The conditional-write store interface that run folders are built on, and what every backend shares.

A `Store` is one folder of some storage (local disk, S3, memory, any fsspec filesystem) seen as
named files of bytes. Beyond plain reads and writes it offers the two conditional writes that
fencing needs: exclusive creation (`create`) and compare-and-swap on a version tag (`swap`). A
store that silently ignores those would void fencing, so the first conditional write probes the
store once per process (`check_conditional_writes`), here and not per backend.

Nothing here knows what a run, a lease or a checkpoint is: `adapters/storage.py` builds those on top.
"""

from __future__ import annotations

import builtins
import hashlib
import importlib
import logging
import os
import signal
import threading
import uuid
from abc import ABC, abstractmethod
from typing import Any

import fsspec

log = logging.getLogger("adapters.storage")

READ_CHUNK = 1 << 20
ALLOW_UNFENCED_ENV = "RECONCILER_ALLOW_UNFENCED_STORE"
# A version tag no store hands out: the probe's swap must be refused with it.
_WRONG_TAG = '"ffffffffffffffffffffffffffffffff"'


class StorageError(Exception):
    """Storage could not be read or written; says which URL."""


class UnsafeStoreError(StorageError):
    """The store accepted a write it should have refused, so fencing cannot be trusted."""


class CorruptCheckpoint(StorageError):
    """A checkpoint file does not match its commit record."""


def expand_url(url: str) -> str:
    """`file://~/x` and `~/x` become absolute local paths; other URLs pass through."""
    if url.startswith("file://"):
        return "file://" + os.path.expanduser(url[len("file://") :])
    if "://" not in url:
        return "file://" + os.path.abspath(os.path.expanduser(url))
    return url


# What each storage protocol needs beyond fsspec's own backend, and how to install it.
_S3_NEEDS = (("s3fs", "pip install 'reconciler[s3]'"), ("botocore", "pip install 'reconciler[s3]'"))
_BACKEND_NEEDS = {"s3": _S3_NEEDS, "s3a": _S3_NEEDS}


def check_backend(url: str) -> None:
    """Raise StorageError, in one sentence naming what to install, when the backend of a storage
    URL cannot be imported: checked at start-up so that a missing module is not a job that sits
    Pending with "No module named ..." while every command exits 0."""
    protocol = expand_url(url).split("://", 1)[0]
    if protocol == "memory":
        raise StorageError(f"storage {url} lives in the memory of one process, which workers cannot reach: "
                           "use a folder (file://) or a bucket (s3://)")
    try:
        fsspec.get_filesystem_class(protocol)
    except ValueError as exc:
        raise StorageError(f"storage {url}: fsspec does not know the protocol {protocol!r}") from exc
    except ImportError as exc:
        raise StorageError(f"storage {url} needs a package that is not installed ({exc}); "
                           f"install the backend of {protocol}:// (for s3:// `pip install 'reconciler[s3]'`)") from exc
    for module, how in _BACKEND_NEEDS.get(protocol, ()):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise StorageError(f"storage {url} needs the Python package {module}, which is not installed: "
                               f"install it with `{how}`") from exc


# ---- fault injection for the kill-during-save tests --------------------------------------------
# RECONCILER_FAULT_KILL_AT=N makes the process SIGKILL itself at the N-th write point, so the tests
# can stop a save at every stage without racing a timer. Unset (always in production) it costs one
# dict lookup per write.
_fault_lock = threading.Lock()
fault_count = 0


def fault_point() -> None:
    """One write point: the process kills itself here when RECONCILER_FAULT_KILL_AT says so."""
    target = os.environ.get("RECONCILER_FAULT_KILL_AT")
    if not target:
        return
    global fault_count
    with _fault_lock:
        fault_count += 1
        if fault_count >= int(target):
            os.kill(os.getpid(), signal.SIGKILL)


# Stores already probed for conditional-write support: probe key -> enforced?
_probed: dict[str, bool] = {}
_probe_lock = threading.Lock()


class Store(ABC):
    """One folder of a store, as named files of bytes (`name` is a '/'-separated relative path).

    Backends implement the underscored primitives; the public methods add the fault points and
    the conditional-write checks once for all of them. Cheap to create.
    """

    # Capabilities, instead of asking which backend this is:
    cas_across_hosts = False  # `swap` is atomic for writers on different hosts (an flock on NFS is not)
    cheap_marks = False  # `mark` costs no request: it may be called every step
    os_paths = False  # every file has a path the operating system can open (`os_path`)
    probe_conditional_writes = True  # conditional writes need checking once (check_conditional_writes)
    part_bytes = 16 << 20  # large payloads are moved in parts this big (where the backend has parts)

    def __init__(self, uri: str, storage_options: dict[str, Any] | None = None) -> None:
        self.uri = uri.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self._unfenced = False

    def url(self, name: str = "") -> str:
        return f"{self.uri}/{name}" if name else self.uri

    def os_path(self, name: str = "") -> str:
        """A path the operating system can open for `name`, on stores that are file systems."""
        raise StorageError(f"{self.url(name)} is not on a file system this machine can open")

    def probe_key(self) -> str:
        """Which stores one probe answers for (all folders of one bucket or file system)."""
        return self.uri

    def worker_env(self) -> dict[str, str]:
        """Environment a worker on another machine needs to reach this store (beyond its credentials)."""
        return {}

    # ---- whole small files -------------------------------------------------------------------------
    def read(self, name: str) -> bytes | None:
        """The whole file, or None when it does not exist."""
        return self.read_tagged(name)[0]

    @abstractmethod
    def read_tagged(self, name: str) -> tuple[bytes | None, str | None]:
        """Content and its version tag for `swap`, or (None, None) when the file does not exist."""

    def write(self, name: str, data: bytes) -> None:
        """Replace a file whole: readers see the old or the new content, never a mix."""
        fault_point()
        self._guard("write", name, self._write, name, data)

    def create(self, name: str, data: bytes) -> bool:
        """Create `name` with `data` only if it does not exist: True for exactly one of any number
        of concurrent callers, False when the file already exists. The file appears whole or not at all."""
        self.check_conditional_writes()
        fault_point()
        if self._unfenced:
            if self.read(name) is not None:
                return False
            self._guard("write", name, self._write, name, data)
            return True
        return bool(self._guard("create", name, self._create, name, data))

    def swap(self, name: str, data: bytes, tag: str | None) -> str | None:
        """Replace `name` only if its version tag is still `tag` (None: only if it does not exist).
        Returns the new tag, or None when the file had changed (nothing is written then). Atomic
        across hosts only where `cas_across_hosts`."""
        self.check_conditional_writes()
        fault_point()
        if self._unfenced:
            if self.read_tagged(name)[1] != tag:
                return None
            self._guard("write", name, self._write, name, data)
            return self.read_tagged(name)[1]
        result = self._guard("write", name, self._swap, name, data, tag)
        return None if result is None else str(result)

    def delete(self, name: str) -> None:
        """Remove a file (a missing one is fine)."""
        fault_point()
        self._guard("delete", name, self._delete, name)

    def delete_tree(self, name: str) -> None:
        """Remove a folder and everything under it (a missing one is fine)."""
        fault_point()
        self._guard("delete", name, self._delete_tree, name.rstrip("/"))

    def list(self, prefix: str = "") -> dict[str, int]:
        """Every file under folder `prefix` ('' = this store's folder), as path relative to it ->
        size. Empty when the folder does not exist."""
        return dict(self._guard("list", prefix, self._list, prefix.rstrip("/")))

    # ---- large payloads ----------------------------------------------------------------------------
    def write_payload(self, name: str, buf: memoryview) -> None:
        """Write one large immutable file straight from memory."""
        fault_point()
        self._guard("upload", name, self._write_payload, name, buf)

    def read_payload_into(self, name: str, out: memoryview, hasher: Any = None) -> int:
        """Read a whole file into `out` (sized for it), feeding each chunk to `hasher` (anything
        with `update`) as it lands. Returns the bytes read: fewer when the file is shorter, more
        than len(out) when it is longer. CorruptCheckpoint when the file is missing.

        This default reads the file whole (stores held in memory); disk and S3 stream it in chunks."""
        out = out.cast("B") if out.format != "B" else out
        data = self.read(name)
        if data is None:
            raise CorruptCheckpoint(f"{self.url(name)} is missing")
        if len(data) > len(out):
            return len(out) + 1
        out[: len(data)] = data
        if hasher is not None:
            hasher.update(data)
        return len(data)

    def read_parts_into(self, name: str, parts: builtins.list[memoryview], hasher: Any = None) -> int:
        """Read a file into `parts` one after the other (a scatter read); as `read_payload_into`."""
        total = sum(len(p) for p in parts)
        whole = memoryview(bytearray(total))
        got = self.read_payload_into(name, whole, hasher)
        offset = 0
        for part in parts:
            part[:] = whole[offset : offset + len(part)]
            offset += len(part)
        return got

    # ---- cheap marks and housekeeping --------------------------------------------------------------
    def mark(self, name: str, data: bytes) -> None:
        """Overwrite a small file that only its one writer updates, as cheaply as the store allows;
        not atomic where `cheap_marks` (callers write the same length every time). No fault point:
        marks may be written from a background thread."""
        self._guard("write", name, self._write, name, data)

    def close(self) -> None:  # noqa: B027 - nothing to release unless a backend's marks hold handles
        """Release what `mark` holds open."""

    def remove_stale_temp_files(self, *folders: str) -> builtins.list[str]:
        """Delete temporary files that killed writers left in `folders`; the names removed."""
        return []

    # ---- conditional-write probe -------------------------------------------------------------------
    def check_conditional_writes(self) -> None:
        """Refuse a store that ignores conditional writes (probed once per store and process), unless
        RECONCILER_ALLOW_UNFENCED_STORE=1: then create and swap fall back to read-then-write."""
        if not self.probe_conditional_writes:
            return
        key = f"{type(self).__name__}:{self.probe_key()}"
        with _probe_lock:
            if key not in _probed:
                _probed[key] = self._probe()
        if _probed[key]:
            return
        if os.environ.get(ALLOW_UNFENCED_ENV) == "1":
            if not self._unfenced:
                log.warning("%s ignores conditional writes; fencing relies on epoch-named paths", self.uri)
            self._unfenced = True
            return
        raise UnsafeStoreError(
            f"storage at {self.uri} ignores conditional writes (If-None-Match/If-Match), so a replaced "
            f"worker could overwrite the run: use a store that enforces them, or set "
            f"{ALLOW_UNFENCED_ENV}=1 to accept weaker fencing"
        )

    def _probe(self) -> bool:
        """Create one file twice and swap it with a wrong tag: both must be refused."""
        name = f".probe-{uuid.uuid4().hex}"
        try:
            if not self._create(name, b"1"):
                raise StorageError(f"cannot create {self.url(name)}: a fresh name already exists")
            try:
                second = self._create(name, b"2")
                swapped = self._swap(name, b"3", _WRONG_TAG)
                return not second and swapped is None
            finally:
                self._delete(name)
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(f"cannot write to {self.uri} (probing conditional writes): {exc}") from exc

    # ---- what each backend implements --------------------------------------------------------------
    @abstractmethod
    def _write(self, name: str, data: bytes) -> None: ...

    @abstractmethod
    def _create(self, name: str, data: bytes) -> bool: ...

    @abstractmethod
    def _swap(self, name: str, data: bytes, tag: str | None) -> str | None: ...

    @abstractmethod
    def _delete(self, name: str) -> None: ...

    def _compare_then_write(self, name: str, data: bytes, tag: str | None) -> str | None:
        """`_swap` for a backend whose tag is the sha256 of the content: `data` written when the
        file's tag is still `tag` (the new tag returned), else None. Atomic only under the caller's lock."""
        if self.read_tagged(name)[1] != tag:
            return None
        self._write(name, data)
        return hashlib.sha256(data).hexdigest()

    @abstractmethod
    def _delete_tree(self, name: str) -> None: ...

    @abstractmethod
    def _list(self, prefix: str) -> dict[str, int]: ...

    def _write_payload(self, name: str, buf: memoryview) -> None:
        self._write(name, bytes(buf))

    def _guard(self, what: str, name: str, fn: Any, *args: Any) -> Any:
        """Call a primitive; any failure but our own errors becomes a StorageError naming the URL."""
        try:
            return fn(*args)
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(f"cannot {what} {self.url(name)}: {exc}") from exc
