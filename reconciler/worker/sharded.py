"""Sharded checkpoints: every rank writes its own part through `torch.distributed.checkpoint` (DCP).

For state that is not the same on every rank (FSDP, DTensor, or a state dict too big for one
rank), the checkpoint folder holds DCP's files (`.metadata` and one or more `__<rank>_<n>.distcp`
per rank). DCP records each tensor's global shape and each shard's place in it, so the same
checkpoint loads on a different number of ranks. The run-folder protocol is unchanged: after
every rank has written, the ranks hash the files between them, rank 0 writes the one
`COMMIT.json` (with every file's size and sha256) and acknowledges it in the lease. Restore
verifies every file against that record (split between the ranks) before DCP reads any of them.

DCP writes through a file system path, so sharded checkpoints need a run folder on a file system
all ranks share (local disk, NFS, a FUSE mount); an S3 run folder is refused with a clear error.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

from adapters.storage import CheckpointName, CorruptCheckpoint, RunFolder
from adapters.stores import fault_point
from reconciler.worker.dist import Group

FORMAT = "dcp-1"
HASH_CHUNK = 4 << 20


def check_folder(folder: RunFolder) -> None:
    if not folder.store.os_paths:
        raise ValueError(
            f"sharded checkpoints are written by torch.distributed.checkpoint to a shared file system; "
            f"{folder.uri} is not one: use a file:// run folder on storage every rank can reach"
        )


def _sha256(path: str) -> dict[str, Any]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb", buffering=0) as fh:
        while chunk := fh.read(HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": digest.hexdigest()}


def _hash_share(base: str, names: list[str], group: Group) -> dict[str, dict[str, Any]]:
    """This rank's share of the files' digests (file i is hashed by rank i mod world)."""
    mine = {}
    for name in names[group.rank :: group.world]:
        mine[name] = _sha256(os.path.join(base, name))
        fault_point()
    return mine


def write(
    folder: RunFolder, epoch: int, step: int, objects: dict[str, Any], group: Group, parent: str | None
) -> CheckpointName | None:
    """Collective: every rank writes its shards, then rank 0 commits. Returns the checkpoint on
    rank 0 (None elsewhere); raises on rank 0 what the commit raised (Fenced when replaced)."""
    import torch.distributed.checkpoint as dcp

    ckpt = CheckpointName(step, epoch)
    base = folder.store.os_path(f"checkpoints/{ckpt.dirname}")
    dcp.save(dict(objects), checkpoint_id=base, process_group=group.pg)
    group.barrier()  # every rank's files and the .metadata are in place
    names = sorted(os.listdir(base)) if group.main else None
    names = group.broadcast(names)
    shares = group.gather(_hash_share(base, names, group))
    if not group.main:
        return None
    files: dict[str, Any] = {}
    for share in shares or []:
        files.update(share)
    record = {"format": FORMAT, "step": step, "epoch": epoch, "parent": parent, "time": time.time(),
              "world_size": group.world, "files": files}
    folder.commit_checkpoint(epoch, ckpt, record)
    return ckpt


def verify(folder: RunFolder, ckpt: CheckpointName, record: dict[str, Any], group: Group) -> str | None:
    """This rank's share of the verification: None when its files match the record, else why not."""
    base = folder.store.os_path(f"checkpoints/{ckpt.dirname}")
    names = sorted(record["files"])
    for name in names[group.rank :: group.world]:
        want = record["files"][name]
        try:
            got = _sha256(os.path.join(base, name))
        except FileNotFoundError:
            return f"{folder.url(f'checkpoints/{ckpt.dirname}/{name}')} is missing"
        if got != {"size": int(want["size"]), "sha256": str(want["sha256"])}:
            return f"{folder.url(f'checkpoints/{ckpt.dirname}/{name}')} does not match its commit record"
    return None


def load(folder: RunFolder, ckpt: CheckpointName, objects: dict[str, Any], group: Group) -> None:
    """Collective: load the verified checkpoint into `objects` in place (any world size)."""
    import torch.distributed.checkpoint as dcp

    try:
        dcp.load(objects, checkpoint_id=folder.store.os_path(f"checkpoints/{ckpt.dirname}"), process_group=group.pg)
    except KeyError as exc:
        raise KeyError(f"checkpoint {folder.url('checkpoints/' + ckpt.dirname)} has no {exc}") from None


def is_sharded(record: dict[str, Any]) -> bool:
    return record.get("format") == FORMAT


__all__ = ["FORMAT", "CorruptCheckpoint", "check_folder", "is_sharded", "load", "verify", "write"]
