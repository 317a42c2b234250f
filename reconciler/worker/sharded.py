"""Sharded checkpoints: every rank writes its own part through `torch.distributed.checkpoint` (DCP).

For state that is not the same on every rank (FSDP, DTensor, or a state dict too big for one
rank), the checkpoint folder holds DCP's files (`.metadata` and one or more `__<rank>_<n>.distcp`
per rank). DCP records each tensor's global shape and each shard's place in it, so the same
checkpoint loads on a different number of ranks. The run-folder protocol is unchanged: after
every rank has written, the ranks hash the files between them, rank 0 writes the one
`COMMIT.json` (every file's size and digests, as adapters/digest.py records them) and
acknowledges it in the lease. Restore verifies every file against that record (split between the
ranks) before DCP reads any of them.

A save runs in the background: `begin` copies the state to host memory (DCP's staging) and hands
the write to DCP's `async_save` thread; `finish`, run on a thread of the SDK's, waits for the
write, hashes and commits. Both threads coordinate over a gloo group of their own, so their
collectives never interleave with the training's or the SDK's per-step ones.

The files go to local disk (or any file system every rank mounts: NFS, a FUSE mount) through
DCP's file-system writer, and to S3 (or another fsspec store) through DCP's fsspec writer, with
the run folder's storage options (endpoint, credentials); hashing and verifying read them back
through the same store.
"""

from __future__ import annotations

import importlib
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from adapters import digest
from adapters.storage import CheckpointName, CorruptCheckpoint, RunFolder, StorageError
from adapters.stores import fault_point
from adapters.stores.memory import MemoryStore
from reconciler.worker.dist import Group

FORMAT = "dcp-1"
HASH_CHUNK = 4 << 20


@dataclass(frozen=True)
class Place:
    """Where a run folder's sharded checkpoints live: a local path, or a URL with its fsspec options."""

    local: bool
    base: str  # the checkpoints folder: a path on local disk, else the store's URL
    options: dict[str, Any]

    def dir(self, ckpt: CheckpointName) -> str:
        return f"{self.base}/{ckpt.dirname}"

    def fs(self) -> Any:
        from fsspec.core import url_to_fs

        return url_to_fs(self.base, **({} if self.local else self.options))[0]


def place(folder: RunFolder) -> Place:
    """The one place that tells a file system from the other stores (DCP writes through fsspec there)."""
    store = folder.store
    if store.os_paths:
        return Place(True, store.os_path("checkpoints"), {})
    return Place(False, store.url("checkpoints"), dict(store.storage_options))


def check_folder(folder: RunFolder) -> None:
    """Refuse, in one sentence, a run folder DCP cannot write to from every rank: an in-process
    memory store (other processes cannot see it), or a store whose fsspec backend is missing."""
    if isinstance(folder.store, MemoryStore):
        raise ValueError(f"sharded checkpoints need a store every rank can reach; {folder.uri} lives in "
                         "one process's memory: use a file:// or s3:// run folder")
    where = place(folder)
    try:
        where.fs()
    except (ImportError, ValueError) as exc:
        raise ValueError(f"sharded checkpoints cannot be written to {folder.uri}: {exc}") from exc
    if not where.local:
        try:  # a private module of torch's: a later release may move it
            importlib.import_module("torch.distributed.checkpoint._fsspec_filesystem")
        except ImportError as exc:
            raise ValueError(f"sharded checkpoints to {folder.uri} need torch.distributed.checkpoint's fsspec "
                             f"writer, which this torch ({_torch_version()}) lacks: use a file:// run folder "
                             "on storage every rank shares") from exc


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _writer(where: Place, ckpt: CheckpointName) -> Any:
    from torch.distributed.checkpoint import FileSystemWriter

    if where.local:
        return FileSystemWriter(where.dir(ckpt))
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    return FsspecWriter(where.dir(ckpt), **where.options)


def _reader(where: Place, ckpt: CheckpointName) -> Any:
    from torch.distributed.checkpoint import FileSystemReader

    if where.local:
        return FileSystemReader(where.dir(ckpt))
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    return FsspecReader(where.dir(ckpt), **where.options)


def _hash(fs: Any, path: str, algorithms: tuple[str, ...]) -> dict[str, Any]:
    """A file's size and digests, read through its store in chunks (hashed beside the reads)."""
    hashers = {a: digest.Overlapped(digest.new(a)) for a in algorithms}
    size = 0
    with fs.open(path, "rb", block_size=HASH_CHUNK) as fh:
        while chunk := fh.read(HASH_CHUNK):  # a fresh bytes object per chunk: safe to hash later
            for hasher in hashers.values():
                hasher.update(chunk)
            size += len(chunk)
    return digest.record(size, {a: h.hexdigest() for a, h in hashers.items()})


def _hash_share(where: Place, ckpt: CheckpointName, names: list[str], group: Group) -> dict[str, dict[str, Any]]:
    """This rank's share of the files' records (file i is hashed by rank i mod world)."""
    fs, algorithms = where.fs(), digest.written()
    mine = {}
    for name in names[group.rank :: group.world]:
        mine[name] = _hash(fs, f"{where.dir(ckpt)}/{name}", algorithms)
        fault_point()
    return mine


def _listing(where: Place, ckpt: CheckpointName) -> list[str]:
    fs = where.fs()
    fs.invalidate_cache()
    return sorted(str(p).rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(where.dir(ckpt), detail=False))


def begin(folder: RunFolder, epoch: int, step: int, objects: dict[str, Any], io: Group) -> Future[Any]:
    """Collective: copy this rank's state to host memory and start writing it (DCP's async_save,
    over the `io` group). Returns once the copy is made: the training may change `objects` then."""
    import torch.distributed.checkpoint as dcp

    ckpt = CheckpointName(step, epoch)
    future = dcp.async_save(dict(objects), storage_writer=_writer(place(folder), ckpt), process_group=io.pg)
    return future if isinstance(future, Future) else future.upload_completion


def finish(
    folder: RunFolder, epoch: int, step: int, written: Future[Any], io: Group, parent: str | None
) -> CheckpointName | None:
    """Collective over `io`, on a background thread: wait for the write, hash the files between the
    ranks, and commit on rank 0. Returns the checkpoint on rank 0 (None elsewhere); raises what the
    write or the commit raised (Fenced when the lease moved on)."""
    ckpt = CheckpointName(step, epoch)
    where = place(folder)
    written.result()
    io.barrier()  # every rank's files and the .metadata are in place
    names = io.broadcast(_listing(where, ckpt) if io.main else None)
    shares = io.gather(_hash_share(where, ckpt, names, io))
    if not io.main:
        return None
    files: dict[str, Any] = {}
    for share in shares or []:
        files.update(share)
    record = {"format": FORMAT, "step": step, "epoch": epoch, "parent": parent, "time": time.time(),
              "world_size": io.world, "files": files}
    folder.commit_checkpoint(epoch, ckpt, record)
    return ckpt


def verify(folder: RunFolder, ckpt: CheckpointName, record: dict[str, Any], group: Group) -> str | None:
    """This rank's share of the verification: None when its files match the record, else why not."""
    where = place(folder)
    fs = where.fs()
    names = sorted(record["files"])
    for name in names[group.rank :: group.world]:
        want = record["files"][name]
        url = folder.url(f"checkpoints/{ckpt.dirname}/{name}")
        try:
            algorithm, expected = digest.expected(want)
        except digest.DigestError as exc:
            raise StorageError(f"cannot verify {url}: {exc}") from exc
        try:
            got = _hash(fs, f"{where.dir(ckpt)}/{name}", (algorithm,))
        except FileNotFoundError:
            return f"{url} is missing"
        if got["size"] != int(want["size"]) or got[algorithm] != expected:
            return f"{url} does not match its commit record"
    return None


def load(folder: RunFolder, ckpt: CheckpointName, objects: dict[str, Any], group: Group) -> None:
    """Collective: load the verified checkpoint into `objects` in place (any world size)."""
    import torch.distributed.checkpoint as dcp

    try:
        dcp.load(objects, storage_reader=_reader(place(folder), ckpt), process_group=group.pg)
    except KeyError as exc:
        raise KeyError(f"checkpoint {folder.url('checkpoints/' + ckpt.dirname)} has no {exc}") from None


def is_sharded(record: dict[str, Any]) -> bool:
    return record.get("format") == FORMAT


__all__ = ["FORMAT", "CorruptCheckpoint", "begin", "check_folder", "finish", "is_sharded", "load", "verify"]
