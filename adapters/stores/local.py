"""file:// stores: a folder on a local or shared file system.

Atomic replace is a temporary file, fsync and rename; exclusive creation hard-links a complete
temporary file into place (an exclusive open where a mount has no hard links); `swap` compares a
sha256 tag under an flock on a sidecar file, which holds on one host but not across NFS clients
(so `cas_across_hosts` is False and run folders keep their lease log of exclusive creations here).
Temporary files are named after their writer, so a later attempt can remove a killed writer's.
"""

from __future__ import annotations

import builtins
import fcntl
import hashlib
import os
import shutil
import socket
import time
import uuid
from typing import Any

from adapters.stores.base import READ_CHUNK, CorruptCheckpoint, StorageError, Store, fault_point

STALE_TEMP_SECONDS = 600.0
HOST = socket.gethostname().replace("-", "_")


class LocalStore(Store):
    cheap_marks = True
    os_paths = True
    probe_conditional_writes = False  # the kernel's O_EXCL/link and flock: nothing to probe

    def __init__(self, uri: str, storage_options: dict[str, Any] | None = None) -> None:
        super().__init__(uri, storage_options)
        self.root = self.uri[len("file://") :]
        self._marks: dict[str, tuple[int, int]] = {}  # name -> (fd, length last written)

    def os_path(self, name: str = "") -> str:
        return f"{self.root}/{name}" if name else self.root

    def read(self, name: str) -> bytes | None:
        try:
            with open(self.os_path(name), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"cannot read {self.url(name)}: {exc}") from exc

    def read_tagged(self, name: str) -> tuple[bytes | None, str | None]:
        blob = self.read(name)
        return blob, (hashlib.sha256(blob).hexdigest() if blob is not None else None)

    def _write(self, name: str, data: bytes | memoryview) -> None:
        path = self.os_path(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = _durable_temp(path, data)
        try:
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def _create(self, name: str, data: bytes) -> bool:
        path = self.os_path(name)
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        tmp = _durable_temp(path, data)
        try:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            except OSError:
                if not _create_without_links(path, data):
                    return False
            _fsync_dir(directory)
            return True
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def _swap(self, name: str, data: bytes, tag: str | None) -> str | None:
        path = self.os_path(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(f"{path}.lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)  # released on close, and by the kernel if we die
            return self._compare_then_write(name, data, tag)

    def _delete(self, name: str) -> None:
        try:
            os.unlink(self.os_path(name))
        except FileNotFoundError:
            pass

    def _delete_tree(self, name: str) -> None:
        shutil.rmtree(self.os_path(name), ignore_errors=True)

    def _list(self, prefix: str) -> dict[str, int]:
        top = self.os_path(prefix)
        found: dict[str, int] = {}
        for dirpath, _dirs, files in os.walk(top):
            for f in files:
                full = os.path.join(dirpath, f)
                try:
                    found[os.path.relpath(full, top).replace(os.sep, "/")] = os.path.getsize(full)
                except FileNotFoundError:
                    continue
        return found

    def _write_payload(self, name: str, buf: memoryview) -> None:
        path = self.os_path(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(buf)
            fh.flush()
            fault_point()
            os.fsync(fh.fileno())

    def read_payload_into(self, name: str, out: memoryview, hasher: Any = None) -> int:
        out = out.cast("B") if out.format != "B" else out
        return self.read_parts_into(name, [out], hasher)

    def read_parts_into(self, name: str, parts: builtins.list[memoryview], hasher: Any = None) -> int:
        """Straight from the file into each part, chunk by chunk, hashing each chunk as it lands."""
        total = sum(len(p) for p in parts)
        try:
            with open(self.os_path(name), "rb", buffering=0) as fh:
                n = 0
                for part in parts:
                    for i in range(0, len(part), READ_CHUNK):
                        piece = part[i : i + READ_CHUNK]
                        got = fh.readinto(piece) or 0
                        if got and hasher is not None:
                            hasher.update(piece[:got])
                        n += got
                        if got != len(piece):
                            return n
                return total + 1 if fh.read(1) else n
        except FileNotFoundError as exc:
            raise CorruptCheckpoint(f"{self.url(name)} is missing") from exc
        except OSError as exc:
            raise StorageError(f"cannot read {self.url(name)}: {exc}") from exc

    def mark(self, name: str, data: bytes) -> None:
        """An in-place write into a file kept open: no fsync, no rename. It survives the process
        being killed (the page cache is the kernel's) and never leaves a temporary file behind."""
        fd, length = self._marks.get(name, (-1, 0))
        if fd < 0:
            fd = os.open(self.os_path(name), os.O_WRONLY | os.O_CREAT, 0o644)
        os.pwrite(fd, data, 0)
        if len(data) < length:
            os.ftruncate(fd, len(data))
        self._marks[name] = (fd, len(data))

    def close(self) -> None:
        for fd, _ in self._marks.values():
            os.close(fd)
        self._marks = {}

    def remove_stale_temp_files(self, *folders: str) -> builtins.list[str]:
        """A temp file is stale when its writer was on this host and is no longer running, or when
        it is older than STALE_TEMP_SECONDS (a writer on another host sharing the disk)."""
        removed = []
        for folder in folders or ("",):
            top = self.os_path(folder)
            try:
                names = os.listdir(top)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for n in names:
                if ".tmp-" in n and _temp_is_stale(os.path.join(top, n)):
                    try:
                        os.unlink(os.path.join(top, n))
                        removed.append(f"{folder}/{n}" if folder else n)
                    except FileNotFoundError:
                        pass
        return removed


def temp_name(path: str) -> str:
    """`<path>.tmp-<host>-<pid>-<random>`: who wrote it, so a later attempt can tell a dead
    writer's leftover from a file being written right now."""
    return f"{path}.tmp-{HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _durable_temp(path: str, data: bytes | memoryview) -> str:
    """`data` written and fsynced to a fresh temporary name beside `path`, ready to be renamed or
    linked into place (a fault point follows, so the tests can stop a writer right there)."""
    tmp = temp_name(path)
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        fault_point()
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return tmp


def _create_without_links(path: str, data: bytes) -> bool:
    """No hard links here (some FUSE mounts): exclusive open, one write, fsync."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def _temp_is_stale(path: str) -> bool:
    parts = path.rsplit(".tmp-", 1)[-1].split("-")
    if len(parts) == 3 and parts[0] == HOST and parts[1].isdigit():
        return not _pid_alive(int(parts[1]))
    try:
        return time.time() - os.path.getmtime(path) > STALE_TEMP_SECONDS
    except FileNotFoundError:
        return False


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
