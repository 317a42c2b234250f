"""Run data in storage over fsspec: the contract between the reconciler and its workers.

Layout of one run (DESIGN.md §3)::

    <storage>/<job>/<run-id>/lease.json                      the lease: epoch, acknowledged checkpoints, done
    <storage>/<job>/<run-id>/progress.json                   heartbeat of the live attempt
    <storage>/<job>/<run-id>/checkpoints/<step>-e<epoch>/... payload, then COMMIT.json (written last)
    <storage>/<job>/<run-id>/done.json                       completion record, created once
    <storage>/<job>/<run-id>/stop.json                       the reconciler's stop request (epoch, reason)

Fencing. The lease is changed only by compare-and-swap: on S3 by `If-Match` on the object's
ETag (and `If-None-Match: *` to create it); on local disk and other stores by exclusive creation
of the next numbered version in `.lease/` (the newest version is the lease; `lease.json` is a
mirror for people and is not trusted). The reconciler's bump and the worker's commit are both
CASes on that one record, so a worker that was replaced cannot commit anything afterwards: its
swap fails. A checkpoint is *accepted* only if its `COMMIT.json` exists and either its epoch is
the lease's current epoch or the lease lists it as acknowledged; `bump_lease` seals the outgoing
epoch by acknowledging what it had committed at that moment, so a zombie's later commits are
never accepted. Completion goes through the same swap before `done.json` is created, so a zombie
cannot complete a run.

Heartbeats: on S3, progress.json is written with `If-Match` on the ETag this attempt wrote last,
so a replaced worker cannot overwrite its successor's heartbeat; elsewhere the lease is checked
just before the write (a worker frozen inside that window may land one stale heartbeat, which
carries its old epoch; readers compare `Progress.epoch` with the lease).

A store that silently ignores conditional writes would void all of this, so the first
conditional write on a store probes it, and an ignoring store is refused with a clear error
unless RECONCILER_ALLOW_UNFENCED_STORE=1 (then only epoch-named paths protect the run).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import random
import re
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.core import url_to_fs

from adapters.s3 import is_conflict, is_missing, is_precondition_failed, multipart_upload, s3_client

log = logging.getLogger(__name__)

CHECKPOINT_DIR = re.compile(r"^(?P<step>\d+)-e(?P<epoch>\d+)$")
COMMIT_FILE = "COMMIT.json"
LEASE_FILE = "lease.json"
STOP_FILE = "stop.json"
LEASE_LOG = ".lease"
# How many acknowledged checkpoint names the lease remembers (collection keeps far fewer).
LEASE_REMEMBERS = 32
LEASE_LOG_KEEP = 16
S3_PART_BYTES = 16 << 20
READ_CHUNK = 1 << 20
ALLOW_UNFENCED_ENV = "RECONCILER_ALLOW_UNFENCED_STORE"


class StorageError(Exception):
    """Storage could not be read or written; says which URL."""


class Fenced(StorageError):
    """The lease has moved to a newer epoch: this attempt may no longer write."""


class LeaseConflict(StorageError):
    """The lease was not at the epoch the caller expected."""


class UnsafeStoreError(StorageError):
    """The store accepted a write it should have refused, so fencing cannot be trusted."""


class CorruptCheckpoint(StorageError):
    """A checkpoint file does not match its commit record."""


@dataclass(frozen=True)
class Progress:
    epoch: int
    step: int
    target: int | None
    time: float
    metrics: dict[str, float]


@dataclass(frozen=True)
class CheckpointName:
    step: int
    epoch: int

    @property
    def dirname(self) -> str:
        return f"{self.step:012d}-e{self.epoch}"

    @classmethod
    def parse(cls, name: str) -> CheckpointName | None:
        m = CHECKPOINT_DIR.match(name.rstrip("/").rsplit("/", 1)[-1])
        return cls(int(m["step"]), int(m["epoch"])) if m else None


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


class RunFolder:
    """One run's folder. Cheap to create; holds no open handles (an S3 client is made lazily)."""

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

    @classmethod
    def for_run(cls, storage: str, job: str, run_id: str, storage_options: dict[str, Any] | None = None) -> RunFolder:
        return cls(f"{expand_url(storage).rstrip('/')}/{job}/{run_id}", storage_options)

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
        tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
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
        tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
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

    # ---- the lease: compare-and-swap on one record ----------------------------------------------------
    def _lease_read(self) -> tuple[dict[str, Any], Any]:
        """The lease record and a token for `_lease_cas` (ETag on S3, version number elsewhere)."""
        if self.kind == "s3":
            blob, etag = self.read_with_tag(LEASE_FILE)
            return (_loads(blob, self.url(LEASE_FILE)) if blob else {}), etag
        for _ in range(10):
            versions = self._lease_versions()
            if not versions:
                return (self.read_json(LEASE_FILE) or {}), 0
            blob = self.read_bytes(f"{LEASE_LOG}/{versions[-1]:012d}.json")
            if blob is not None:
                return _loads(blob, self.url(LEASE_LOG)), versions[-1]
        raise StorageError(f"cannot read the lease at {self.url(LEASE_LOG)}: it keeps changing")

    def _lease_versions(self) -> list[int]:
        if self.kind == "local":
            try:
                names = os.listdir(self.path(LEASE_LOG))
            except FileNotFoundError:
                return []
        else:
            names = list(self.list_files(LEASE_LOG))
        return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())

    def _lease_cas(self, token: Any, record: dict[str, Any]) -> bool:
        blob = json.dumps(record, sort_keys=True).encode()
        if self.kind == "s3":
            return self.replace_if_match(LEASE_FILE, blob, token) is not None
        version = int(token) + 1
        if not self.create_exclusive(f"{LEASE_LOG}/{version:012d}.json", blob):
            return False
        try:  # the mirror and the pruning are for people and disk space; the log is the truth
            self.write_bytes(LEASE_FILE, blob)
            versions = self._lease_versions()
            if versions and versions[-1] > version:  # a newer lease landed meanwhile: mirror that one
                newest = self.read_bytes(f"{LEASE_LOG}/{versions[-1]:012d}.json")
                if newest is not None:
                    self.write_bytes(LEASE_FILE, newest)
            for old in versions:
                if old <= version - LEASE_LOG_KEEP:
                    self.delete(f"{LEASE_LOG}/{old:012d}.json")
        except StorageError as exc:
            log.debug("lease mirror/prune failed: %s", exc)
        return True

    def lease(self) -> dict[str, Any]:
        """The current lease record: epoch, holder, acknowledged checkpoints, done."""
        return self._lease_read()[0]

    def lease_epoch(self) -> int:
        data = self.lease()
        return int(data["epoch"]) if "epoch" in data else 0

    def bump_lease(self, holder: str = "reconciler", expected: int | None = None) -> int:
        """Move the lease to a new epoch BEFORE launching the attempt that will carry it.

        Safe against concurrent bumps and commits (compare-and-swap; each caller gets its own
        epoch). With `expected`, raises LeaseConflict unless the lease is still at that epoch.
        Seals the outgoing epoch: its checkpoints committed by now stay accepted, later ones not.
        """
        for attempt in range(50):
            record, token = self._lease_read()
            current = int(record.get("epoch", 0))
            if expected is not None and current != expected:
                raise LeaseConflict(
                    f"lease at {self.url(LEASE_FILE)} is at epoch {current}, not {expected}: "
                    "another reconciler acted on this run"
                )
            acked = list(record.get("committed") or [])
            for c in self._committed_dirs():
                if c.epoch == current and c.dirname not in acked:
                    acked.append(c.dirname)
            new = {
                "epoch": current + 1,
                "holder": holder,
                "time": time.time(),
                "committed": _newest_names(acked),
            }
            if record.get("done"):
                new["done"] = record["done"]
            if self._lease_cas(token, new):
                return current + 1
            time.sleep(random.uniform(0.001, 0.01 * (attempt + 1)))
        raise StorageError(f"cannot bump the lease at {self.url(LEASE_FILE)}: it keeps changing under us")

    def _update_own_lease(self, epoch: int, change: Any) -> dict[str, Any]:
        """CAS the lease as the holder of `epoch`; raises Fenced once the lease has moved on."""
        for attempt in range(50):
            record, token = self._lease_read()
            if int(record.get("epoch", 0)) != epoch:
                raise Fenced(
                    f"lease at {self.url(LEASE_FILE)} is at epoch {record.get('epoch', 0)}, "
                    f"this attempt holds epoch {epoch}: it was replaced"
                )
            new = change(dict(record))
            if self._lease_cas(token, new):
                return new
            time.sleep(random.uniform(0.001, 0.01 * (attempt + 1)))
        raise StorageError(f"cannot update the lease at {self.url(LEASE_FILE)}: it keeps changing under us")

    def check_epoch(self, epoch: int) -> None:
        """Raise Fenced unless `epoch` still holds the lease."""
        current = self.lease_epoch()
        if current != epoch:
            raise Fenced(
                f"lease at {self.url(LEASE_FILE)} is at epoch {current}, "
                f"this attempt holds epoch {epoch}: it was replaced"
            )

    # ---- heartbeat --------------------------------------------------------------------------------------
    def write_progress(self, epoch: int, record: dict[str, Any], tag: str | None = None) -> str | None:
        """Write progress.json as the holder of `epoch`; returns a tag to pass next time.

        Raises Fenced when the lease or a newer heartbeat shows this attempt was replaced. On S3
        the write is conditional on the heartbeat this attempt last wrote, so a replaced worker
        that wakes up cannot overwrite its successor's heartbeat.
        """
        self.check_epoch(epoch)
        blob = json.dumps(record, sort_keys=True).encode()
        if self.kind != "s3":
            self.write_bytes("progress.json", blob)
            return None
        for _ in range(5):
            if tag is None:
                current, tag = self.read_with_tag("progress.json")
                if current is not None and int(_loads(current, "progress").get("epoch", 0)) > epoch:
                    raise Fenced(f"{self.url('progress.json')} is written by a newer attempt: this one was replaced")
            new_tag = self.replace_if_match("progress.json", blob, tag)
            if new_tag is not None:
                return new_tag
            tag = None  # someone else wrote it: look at who, then retry or stop
        raise StorageError(f"cannot write {self.url('progress.json')}: it keeps changing under us")

    def progress(self) -> Progress | None:
        data = self.read_json("progress.json")
        if not data:
            return None
        try:
            return Progress(
                epoch=int(data.get("epoch", 0)),
                step=int(data.get("step", 0)),
                target=int(data["target"]) if data.get("target") is not None else None,
                time=float(data.get("time", 0.0)),
                metrics={k: float(v) for k, v in (data.get("metrics") or {}).items()},
            )
        except (TypeError, ValueError):
            return None

    # ---- stop requests ------------------------------------------------------------------------------------
    def request_stop(self, epoch: int, reason: str) -> None:
        """Ask every attempt up to `epoch` to stop at its next heartbeat (final checkpoint, exit 75).

        The only stop a provider without a cancel API (Kaggle) has, and a clean one for the others.
        Not fenced: the reconciler writes it, and a later attempt (a higher epoch) is not affected
        by it. A request that already covers `epoch` is left alone, so stopping an old zombie does
        not withdraw the stop of the attempt after it.
        """
        if self.stop_request(epoch) is not None:
            return
        self.write_json(STOP_FILE, {"epoch": int(epoch), "reason": reason, "time": time.time()})

    def stop_request(self, epoch: int) -> str | None:
        """The reason of a stop request that applies to `epoch`, else None; one small read.

        A torn or foreign stop.json reads as no request: a bad file must never end training.
        Raises StorageError only when the store cannot be read (the caller decides what that means).
        """
        blob = self.read_bytes(STOP_FILE)
        if blob is None:
            return None
        try:
            data = json.loads(blob)
            applies = int(data["epoch"]) >= epoch
            reason = str(data.get("reason") or "no reason given")
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        return reason if applies else None

    # ---- attempt logs ------------------------------------------------------------------------------------
    def write_attempt_log(self, epoch: int, text: str) -> None:
        """The tail of attempt `epoch`'s output, for providers without a log API (RunPod): written by
        the hosted bootstrap, read by the reconciler for the status of a failed attempt. Not fenced:
        each attempt writes only its own file."""
        self.write_bytes(f"logs/e{int(epoch)}.log", text.encode())

    def attempt_log(self, epoch: int) -> str:
        """What `write_attempt_log` wrote for `epoch`, or '' (never raises for a missing file)."""
        blob = self.read_bytes(f"logs/e{int(epoch)}.log")
        return blob.decode(errors="replace") if blob else ""

    # ---- completion ---------------------------------------------------------------------------------------
    def mark_done(self, epoch: int, record: dict[str, Any]) -> dict[str, Any]:
        """Complete the run as the holder of `epoch`: lease first (fenced), then done.json once.

        Returns the done record in force (an earlier one of this epoch if called twice).
        """
        record = {**record, "epoch": epoch}

        def change(lease: dict[str, Any]) -> dict[str, Any]:
            if not lease.get("done"):
                lease["done"] = record
            return lease

        lease = self._update_own_lease(epoch, change)
        final = lease["done"]
        if not self.create_exclusive("done.json", json.dumps(final, sort_keys=True).encode()):
            existing = self.read_json("done.json") or {}
            if int(existing.get("epoch", -1)) != int(final.get("epoch", -2)):
                raise StorageError(
                    f"{self.url('done.json')} already exists from epoch {existing.get('epoch')}: "
                    "the run was completed by another attempt"
                )
        return dict(final)

    def done(self) -> dict[str, Any] | None:
        """The completion record: done.json, or the lease's record if done.json was not created yet."""
        data = self.read_json("done.json")
        if data is not None:
            return data
        lease_done = self.lease().get("done")
        return dict(lease_done) if isinstance(lease_done, dict) else None

    # ---- checkpoints ---------------------------------------------------------------------------
    def _checkpoint_dirs(self) -> dict[CheckpointName, set[str]]:
        """Every checkpoint folder (complete or not) with the files it holds."""
        out: dict[CheckpointName, set[str]] = {}
        if self.kind == "local":
            base = self.path("checkpoints")
            try:
                names = os.listdir(base)
            except FileNotFoundError:
                return {}
            for n in names:
                c = CheckpointName.parse(n)
                if c is not None:
                    try:
                        out[c] = set(os.listdir(os.path.join(base, n)))
                    except (FileNotFoundError, NotADirectoryError):
                        continue
            return out
        for rel in self.list_files("checkpoints"):
            head, _, tail = rel.partition("/")
            c = CheckpointName.parse(head)
            if c is not None and tail:
                out.setdefault(c, set()).add(tail)
        return out

    def _committed_dirs(self) -> list[CheckpointName]:
        return [c for c, files in self._checkpoint_dirs().items() if COMMIT_FILE in files]

    def accepted_checkpoints(self, lease: dict[str, Any] | None = None) -> list[CheckpointName]:
        """Checkpoints a restore may use, newest first (digests are verified at restore).

        Accepted = COMMIT.json exists and the checkpoint belongs to the current epoch or was
        acknowledged in the lease before that epoch ended; a replaced worker's later commits
        are therefore never accepted.
        """
        lease = self.lease() if lease is None else lease
        current = int(lease.get("epoch", 0))
        acked = set(lease.get("committed") or [])
        found = [c for c in self._committed_dirs() if c.epoch >= current or c.dirname in acked]
        return sorted(found, key=lambda c: (c.step, c.epoch), reverse=True)

    def committed_checkpoints(self) -> list[CheckpointName]:
        """Accepted checkpoints, newest first (what the reconciler counts as durable)."""
        return self.accepted_checkpoints()

    def durable_step(self) -> int:
        ckpts = self.committed_checkpoints()
        return ckpts[0].step if ckpts else 0

    def read_commit(self, ckpt: CheckpointName) -> dict[str, Any]:
        """The commit record of a checkpoint; CorruptCheckpoint when missing or unreadable."""
        name = f"checkpoints/{ckpt.dirname}/{COMMIT_FILE}"
        blob = self.read_bytes(name)
        if blob is None:
            raise CorruptCheckpoint(f"{self.url(name)} is missing")
        try:
            record = json.loads(blob)
            files = record["files"]
            assert isinstance(files, dict)
            for meta in files.values():
                int(meta["size"]), str(meta["sha256"])
        except Exception as exc:
            raise CorruptCheckpoint(f"{self.url(name)} is not a valid commit record: {exc}") from exc
        return dict(record)

    def read_verified(self, ckpt: CheckpointName, fname: str, size: int, sha256: str, out: memoryview) -> None:
        """Fill `out` with a checkpoint file, or raise CorruptCheckpoint if size or digest differ."""
        name = f"checkpoints/{ckpt.dirname}/{fname}"
        digest = hashlib.sha256()
        got = self.read_payload_into(name, out, digest)
        if got != size:
            raise CorruptCheckpoint(f"{self.url(name)} has {got} bytes, its commit record says {size}")
        if digest.hexdigest() != sha256:
            raise CorruptCheckpoint(f"{self.url(name)} does not match its sha256 in the commit record")

    def commit_checkpoint(self, epoch: int, ckpt: CheckpointName, record: dict[str, Any]) -> None:
        """Make a fully uploaded checkpoint visible: COMMIT.json (exclusive), then the lease ack.

        Raises Fenced when the lease moved on: the checkpoint then stays unaccepted garbage (the
        lease swap, not an earlier read, is the fence, so there is no window to slip through).
        """
        name = f"checkpoints/{ckpt.dirname}/{COMMIT_FILE}"
        if not self.create_exclusive(name, json.dumps(record, sort_keys=True).encode()):
            raise StorageError(f"{self.url(name)} already exists: checkpoint folders are never reused")

        def ack(lease: dict[str, Any]) -> dict[str, Any]:
            lease["committed"] = _newest_names([ckpt.dirname, *(lease.get("committed") or [])])
            return lease

        self._update_own_lease(epoch, ack)

    def discard_checkpoint(self, epoch: int, ckpt: CheckpointName) -> None:
        """Withdraw a checkpoint found corrupt, so nothing counts it as durable any more."""
        self.check_epoch(epoch)

        def drop(lease: dict[str, Any]) -> dict[str, Any]:
            lease["committed"] = [n for n in lease.get("committed") or [] if n != ckpt.dirname]
            return lease

        self._update_own_lease(epoch, drop)
        self.delete(f"checkpoints/{ckpt.dirname}/{COMMIT_FILE}")

    def collect(self, epoch: int, keep: int = 2, protect: frozenset[str] = frozenset()) -> list[str]:
        """Delete checkpoints beyond the `keep` newest accepted ones, and abandoned partial folders.

        Only the lease holder collects, and never a folder of a newer epoch (one being written).
        Returns the folders removed.
        """
        lease = self.lease()
        if int(lease.get("epoch", 0)) != epoch:
            raise Fenced(f"lease at {self.url(LEASE_FILE)} moved past epoch {epoch}: not collecting")
        accepted = self.accepted_checkpoints(lease)
        keep_set = {c.dirname for c in accepted[: max(keep, 1)]} | set(protect)
        removed = []
        for c in sorted(self._checkpoint_dirs(), key=lambda c: (c.step, c.epoch)):
            if c.dirname in keep_set or c.epoch > epoch:
                continue
            self.delete_tree(f"checkpoints/{c.dirname}")
            removed.append(c.dirname)
        return removed


def _loads(blob: bytes, where: str) -> dict[str, Any]:
    try:
        data = json.loads(blob)
    except ValueError as exc:
        raise StorageError(f"cannot read {where}: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _newest_names(names: list[str]) -> list[str]:
    parsed = {n: CheckpointName.parse(n) for n in set(names)}
    valid = [n for n, c in parsed.items() if c is not None]
    valid.sort(key=lambda n: (parsed[n].step, parsed[n].epoch), reverse=True)  # type: ignore[union-attr]
    return valid[:LEASE_REMEMBERS]


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
