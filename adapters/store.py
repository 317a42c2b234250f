"""One folder of a store, as bytes: the layer under `adapters.storage.RunFolder`.

Local disk, S3 (through our own botocore client, see adapters/s3.py) and any other fsspec store:
whole-file reads and atomic writes, exclusive creation, compare-and-swap by ETag (S3) or by a
lock and a rename (local disk), large payloads streamed in chunks, and the probe that refuses a
store which ignores conditional writes (fencing would be void there). Nothing here knows what a
run, a lease or a checkpoint is; `adapters/storage.py` builds those on top.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import signal
import socket
import threading
import time
import uuid
from typing import Any

import fsspec
from fsspec.core import url_to_fs

from adapters.s3 import is_conflict, is_missing, is_precondition_failed, multipart_upload, s3_client

log = logging.getLogger("adapters.storage")

S3_PART_BYTES = 16 << 20
READ_CHUNK = 1 << 20
ALLOW_UNFENCED_ENV = "RECONCILER_ALLOW_UNFENCED_STORE"


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
    import importlib

    protocol = expand_url(url).split("://", 1)[0]
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
_fault_count = 0


def _fault_point() -> None:
    target = os.environ.get("RECONCILER_FAULT_KILL_AT")
    if not target:
        return
    global _fault_count
    with _fault_lock:
        _fault_count += 1
        if _fault_count >= int(target):
            os.kill(os.getpid(), signal.SIGKILL)


# Stores already probed for conditional-write support: key -> enforced?
_probed: dict[str, bool] = {}
_probe_lock = threading.Lock()


class StoreFolder:
    """One folder of a store. Cheap to create; holds no open handles (an S3 client is made lazily)."""

    def __init__(self, uri: str, storage_options: dict[str, Any] | None = None) -> None:
        self.uri = expand_url(uri).rstrip("/")
        options = dict(storage_options or {})
        self.kind = "local" if self.uri.startswith("file://") else "s3" if self.uri.startswith("s3://") else "other"
        if self.kind == "s3":
            options.setdefault("skip_instance_cache", True)
            endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            if endpoint and "endpoint_url" not in options and "endpoint_url" not in options.get("client_kwargs", {}):
                options["endpoint_url"] = endpoint
        self.storage_options = options
        self._fs: fsspec.AbstractFileSystem | None = None
        if self.kind == "s3":  # the S3 path is ours to parse; s3fs is made only if someone asks for .fs
            self.root = self.uri[len("s3://") :]
        else:
            self._fs, self.root = url_to_fs(self.uri, **options)
        self._client_obj: Any = None
        self._unfenced = False

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The fsspec filesystem of this folder (s3fs with skip_instance_cache=True on S3)."""
        if self._fs is None:
            self._fs, _ = url_to_fs(self.uri, **self.storage_options)
        return self._fs

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def url(self, name: str = "") -> str:
        return f"{self.uri}/{name}" if name else self.uri

    # ---- S3 client, used directly for conditional writes and fast transfers ------------------------
    @property
    def _client(self) -> Any:
        if self._client_obj is None:
            o = self.storage_options
            ck = dict(o.get("client_kwargs") or {})
            self._client_obj = s3_client(
                o.get("endpoint_url") or ck.get("endpoint_url"),
                ck.get("region_name") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
                o.get("key"),
                o.get("secret"),
                o.get("token"),
            )
        return self._client_obj

    def _bucket_key(self, name: str) -> tuple[str, str]:
        bucket, _, prefix = self.root.partition("/")
        return bucket, f"{prefix}/{name}" if prefix else name

    # ---- low-level byte operations -------------------------------------------------------------------
    def read_bytes(self, name: str) -> bytes | None:
        """Whole small file, or None when it does not exist."""
        return self.read_with_tag(name)[0]

    def read_with_tag(self, name: str) -> tuple[bytes | None, str | None]:
        """Content and a version tag (the ETag on S3), or (None, None) when missing."""
        try:
            if self.kind == "s3":
                bucket, key = self._bucket_key(name)
                try:
                    resp = self._client.get_object(Bucket=bucket, Key=key)
                except Exception as exc:
                    if is_missing(exc):
                        return None, None
                    raise
                return resp["Body"].read(), resp["ETag"]
            if self.kind == "local":
                try:
                    with open(self.path(name), "rb") as fh:
                        return fh.read(), None
                except FileNotFoundError:
                    return None, None
            try:
                return self.fs.cat_file(self.path(name)), None
            except FileNotFoundError:
                return None, None
        except OSError as exc:
            raise StorageError(f"cannot read {self.url(name)}: {exc}") from exc
        except Exception as exc:
            raise StorageError(f"cannot read {self.url(name)}: {exc}") from exc

    def _local_atomic_write(self, path: str, data: bytes | memoryview) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = _temp_name(path)
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            _fault_point()
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def write_bytes(self, name: str, data: bytes) -> None:
        """Replace a file whole: readers see the old or the new content, never a mix."""
        _fault_point()
        try:
            if self.kind == "local":
                self._local_atomic_write(self.path(name), data)
            elif self.kind == "s3":
                bucket, key = self._bucket_key(name)
                self._client.put_object(Bucket=bucket, Key=key, Body=data)
            else:
                self.fs.makedirs(self.path(name).rsplit("/", 1)[0], exist_ok=True)
                self.fs.pipe_file(self.path(name), data)
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(f"cannot write {self.url(name)}: {exc}") from exc

    def create_exclusive(self, name: str, data: bytes) -> bool:
        """Create `name` with `data` only if it does not exist; False when it already does.

        Local disk writes a temporary file and hard-links it into place, so the file appears
        complete or not at all; S3 uses `If-None-Match: *`; other stores open with mode "xb".
        """
        self.check_conditional_writes()
        _fault_point()
        try:
            if self._unfenced:
                if self.read_bytes(name) is not None:
                    return False
                self.write_bytes(name, data)
                return True
            if self.kind == "local":
                return self._local_create_exclusive(self.path(name), data)
            if self.kind == "s3":
                bucket, key = self._bucket_key(name)
                for attempt in range(8):
                    try:
                        self._client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
                        return True
                    except Exception as exc:
                        if is_precondition_failed(exc):
                            return False
                        if is_conflict(exc) and attempt < 7:
                            time.sleep(0.05 * (attempt + 1))
                            continue
                        raise
                return False
            self.fs.makedirs(self.path(name).rsplit("/", 1)[0], exist_ok=True)
            try:
                with self.fs.open(self.path(name), "xb") as fh:
                    fh.write(data)
                return True
            except FileExistsError:
                return False
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(f"cannot create {self.url(name)}: {exc}") from exc

    def _local_create_exclusive(self, path: str, data: bytes) -> bool:
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        tmp = _temp_name(path)
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            _fault_point()
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            except OSError:
                # No hard links here (some FUSE mounts): exclusive open, one write, fsync.
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    return False
                try:
                    os.write(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            _fsync_dir(directory)
            return True
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def replace_if_match(self, name: str, data: bytes, tag: str | None) -> str | None:
        """S3 only: write `name` if its ETag is still `tag` (absent when None). New ETag, or None."""
        assert self.kind == "s3", "replace_if_match is for S3; other stores use the lease log"
        self.check_conditional_writes()
        _fault_point()
        bucket, key = self._bucket_key(name)
        if self._unfenced:
            _, now = self.read_with_tag(name)
            if now != tag:
                return None
            return str(self._client.put_object(Bucket=bucket, Key=key, Body=data)["ETag"])
        cond = {"IfMatch": tag} if tag else {"IfNoneMatch": "*"}
        try:
            return str(self._client.put_object(Bucket=bucket, Key=key, Body=data, **cond)["ETag"])
        except Exception as exc:
            if is_precondition_failed(exc) or is_conflict(exc) or (tag and is_missing(exc)):
                return None
            raise StorageError(f"cannot write {self.url(name)}: {exc}") from exc

    def read_versioned(self, name: str) -> tuple[bytes | None, str | None]:
        """Content and a version tag for `swap_if_unchanged`: the ETag on S3, a digest elsewhere."""
        blob, etag = self.read_with_tag(name)
        if self.kind == "s3":
            return blob, etag
        return blob, (hashlib.sha256(blob).hexdigest() if blob is not None else None)

    def swap_if_unchanged(self, name: str, data: bytes, tag: str | None) -> bool:
        """Replace `name` only if it is still at `tag` (absent when None), for small records that
        several processes contend for (the leader lease). S3: If-Match / If-None-Match; local disk:
        compare under an flock on a sidecar file, then an atomic rename; other stores compare and
        then write, which is not atomic."""
        if self.kind == "s3":
            return self.replace_if_match(name, data, tag) is not None
        try:
            if self.kind == "local":
                path = self.path(name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(f"{path}.lock", "a+") as fh:
                    fcntl.flock(fh, fcntl.LOCK_EX)  # released on close, and by the kernel if we die
                    if self.read_versioned(name)[1] != tag:
                        return False
                    self._local_atomic_write(path, data)
                    return True
            if self.read_versioned(name)[1] != tag:
                return False
            self.write_bytes(name, data)
            return True
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(f"cannot write {self.url(name)}: {exc}") from exc

    def delete(self, name: str) -> None:
        _fault_point()
        try:
            if self.kind == "local":
                try:
                    os.unlink(self.path(name))
                except FileNotFoundError:
                    pass
            elif self.kind == "s3":
                bucket, key = self._bucket_key(name)
                self._client.delete_object(Bucket=bucket, Key=key)
            else:
                try:
                    self.fs.rm_file(self.path(name))
                except FileNotFoundError:
                    pass
        except Exception as exc:
            raise StorageError(f"cannot delete {self.url(name)}: {exc}") from exc

    def delete_tree(self, name: str) -> None:
        """Remove a folder and everything under it (missing is fine)."""
        _fault_point()
        try:
            if self.kind == "local":
                import shutil

                shutil.rmtree(self.path(name), ignore_errors=True)
            elif self.kind == "s3":
                bucket, key = self._bucket_key(name.rstrip("/") + "/")
                keys = [k for k, _ in self._s3_list(key)]
                for i in range(0, len(keys), 1000):
                    self._client.delete_objects(
                        Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]]}
                    )
            else:
                try:
                    self.fs.rm(self.path(name), recursive=True)
                except FileNotFoundError:
                    pass
        except Exception as exc:
            raise StorageError(f"cannot delete {self.url(name)}: {exc}") from exc

    def _s3_list(self, prefix_key: str) -> list[tuple[str, int]]:
        bucket, _ = self._bucket_key("")
        out: list[tuple[str, int]] = []
        for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix_key):
            out.extend((o["Key"], int(o["Size"])) for o in page.get("Contents", []))
        return out

    def list_files(self, name: str) -> dict[str, int]:
        """Every file under folder `name`, as path relative to it -> size. Empty when missing."""
        base = name.rstrip("/")
        try:
            if self.kind == "local":
                top = self.path(base)
                found: dict[str, int] = {}
                for dirpath, _dirs, files in os.walk(top):
                    for f in files:
                        full = os.path.join(dirpath, f)
                        try:
                            found[os.path.relpath(full, top).replace(os.sep, "/")] = os.path.getsize(full)
                        except FileNotFoundError:
                            continue
                return found
            if self.kind == "s3":
                _, key = self._bucket_key(base + "/" if base else "")
                key = key if key.endswith("/") or not key else key + "/"
                return {k[len(key) :]: size for k, size in self._s3_list(key)}
            top = self.path(base) if base else self.root
            try:
                detail = self.fs.find(top, detail=True)
            except FileNotFoundError:
                return {}
            return {p[len(top) + 1 :]: int(d.get("size") or 0) for p, d in detail.items()}
        except Exception as exc:
            raise StorageError(f"cannot list {self.url(base)}: {exc}") from exc

    # ---- large payload files -------------------------------------------------------------------------
    def write_payload(self, name: str, buf: memoryview) -> None:
        """Upload one large immutable file. S3 uses concurrent multipart uploads above 16 MiB."""
        _fault_point()
        try:
            if self.kind == "local":
                path = self.path(name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as fh:
                    fh.write(buf)
                    fh.flush()
                    _fault_point()
                    os.fsync(fh.fileno())
            elif self.kind == "s3":
                bucket, key = self._bucket_key(name)
                if len(buf) <= S3_PART_BYTES:
                    self._client.put_object(Bucket=bucket, Key=key, Body=bytes(buf))
                else:
                    multipart_upload(self._client, bucket, key, buf, S3_PART_BYTES)
            else:
                self.fs.makedirs(self.path(name).rsplit("/", 1)[0], exist_ok=True)
                self.fs.pipe_file(self.path(name), bytes(buf))
        except Exception as exc:
            raise StorageError(f"cannot upload {self.url(name)}: {exc}") from exc

    def read_payload_into(self, name: str, out: memoryview, digest: Any = None) -> int:
        """Read a whole file into `out` (sized for it); returns bytes read (the file may be shorter).

        With `digest` (a hashlib object), each chunk is hashed right after it lands, while it is
        still in the CPU cache, instead of in a second pass over memory.
        """
        out = out.cast("B") if out.format != "B" else out
        try:
            if self.kind == "local":
                with open(self.path(name), "rb", buffering=0) as fh:
                    n = 0
                    while n < len(out):
                        got = fh.readinto(out[n : n + READ_CHUNK])
                        if not got:
                            break
                        if digest is not None:
                            digest.update(out[n : n + got])
                        n += got
                    if fh.read(1):
                        return len(out) + 1  # longer than recorded
                    return n
            if self.kind == "s3":
                bucket, key = self._bucket_key(name)
                body = self._client.get_object(Bucket=bucket, Key=key)["Body"]
                n = 0
                while True:
                    chunk = body.read(min(S3_PART_BYTES, max(1, len(out) - n + 1)))
                    if not chunk:
                        return n
                    if n + len(chunk) > len(out):
                        return len(out) + 1
                    out[n : n + len(chunk)] = chunk
                    if digest is not None:
                        digest.update(chunk)
                    n += len(chunk)
            data = self.fs.cat_file(self.path(name))
            if len(data) > len(out):
                return len(out) + 1
            out[: len(data)] = data
            if digest is not None:
                digest.update(data)
            return len(data)
        except FileNotFoundError as exc:
            raise CorruptCheckpoint(f"{self.url(name)} is missing") from exc
        except Exception as exc:
            if is_missing(exc):
                raise CorruptCheckpoint(f"{self.url(name)} is missing") from exc
            raise StorageError(f"cannot read {self.url(name)}: {exc}") from exc

    def remove_stale_temp_files(self, *folders: str) -> list[str]:
        """Delete temporary files that a killed writer left behind in `folders` (the folder itself
        when none are named): local disk only, where atomic writes go through `<name>.tmp-*`.

        A temp file is stale when its writer was on this host and is no longer running, or when
        it is older than STALE_TEMP_SECONDS (a writer on another host sharing the disk). Returns
        the names removed.
        """
        if self.kind != "local":
            return []
        removed = []
        for folder in folders or ("",):
            top = self.path(folder) if folder else self.root
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

    # ---- conditional-write probe ----------------------------------------------------------------------
    def check_conditional_writes(self) -> None:
        """Refuse a store that ignores conditional writes (probed once per store and process)."""
        if self.kind == "local":
            return
        key = f"{self.kind}:{self.storage_options.get('endpoint_url', '')}:{self.root.partition('/')[0]}"
        with _probe_lock:
            if key not in _probed:
                _probed[key] = self._probe()
        if not _probed[key]:
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
        name = f".probe-{uuid.uuid4().hex}"
        try:
            if self.kind == "s3":
                bucket, key = self._bucket_key(name)
                etag = self._client.put_object(Bucket=bucket, Key=key, Body=b"1", IfNoneMatch="*")["ETag"]
                try:
                    second_ok = True
                    try:
                        self._client.put_object(Bucket=bucket, Key=key, Body=b"2", IfNoneMatch="*")
                    except Exception as exc:
                        if not is_precondition_failed(exc):
                            raise
                        second_ok = False
                    match_ok = True
                    try:
                        self._client.put_object(Bucket=bucket, Key=key, Body=b"3", IfMatch='"0' + etag[2:])
                    except Exception as exc:
                        if not is_precondition_failed(exc):
                            raise
                        match_ok = False
                    return not second_ok and not match_ok
                finally:
                    self._client.delete_object(Bucket=bucket, Key=key)
            path = self.path(name)
            self.fs.makedirs(self.root, exist_ok=True)
            with self.fs.open(path, "xb") as fh:
                fh.write(b"1")
            try:
                with self.fs.open(path, "xb") as fh:
                    fh.write(b"2")
                return False
            except FileExistsError:
                return True
            finally:
                self.fs.rm_file(path)
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(f"cannot write to {self.uri} (probing conditional writes): {exc}") from exc

    # ---- small JSON helpers ---------------------------------------------------------------------------
    def read_json(self, name: str) -> dict[str, Any] | None:
        blob = self.read_bytes(name)
        if blob is None:
            return None
        try:
            data = json.loads(blob)
        except ValueError as exc:
            raise StorageError(f"cannot read {self.uri}/{name}: {exc}") from exc
        return data if isinstance(data, dict) else None

    def write_json(self, name: str, data: dict[str, Any]) -> None:
        """Write whole-file: readers see the old or the new version, never a mix."""
        self.write_bytes(name, json.dumps(data, sort_keys=True).encode())


STALE_TEMP_SECONDS = 600.0
_HOST = socket.gethostname().replace("-", "_")


def _temp_name(path: str) -> str:
    """`<path>.tmp-<host>-<pid>-<random>`: who wrote it, so a later attempt can tell a dead
    writer's leftover from a file being written right now."""
    return f"{path}.tmp-{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _temp_is_stale(path: str) -> bool:
    parts = path.rsplit(".tmp-", 1)[-1].split("-")
    if len(parts) == 3 and parts[0] == _HOST and parts[1].isdigit():
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
