"""Run data in storage over fsspec: the contract between the reconciler and its workers.

Layout of one run (DESIGN.md §3)::

    <storage>/<job>/<run-id>/lease.json
    <storage>/<job>/<run-id>/progress.json
    <storage>/<job>/<run-id>/checkpoints/<step>-e<epoch>/COMMIT.json   (written last)
    <storage>/<job>/<run-id>/done.json

This module holds what the reconciler reads and the lease it bumps; the worker SDK writes the
rest through the same `RunFolder`.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.core import url_to_fs

CHECKPOINT_DIR = re.compile(r"^(?P<step>\d+)-e(?P<epoch>\d+)$")


class StorageError(Exception):
    """Storage could not be read or written; says which URL."""


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


def expand_url(url: str) -> str:
    """`file://~/x` and `~/x` become absolute local paths; other URLs pass through."""
    if url.startswith("file://"):
        return "file://" + os.path.expanduser(url[len("file://") :])
    if "://" not in url:
        return "file://" + os.path.abspath(os.path.expanduser(url))
    return url


class RunFolder:
    """One run's folder. Cheap to create; holds no open handles."""

    def __init__(self, uri: str, storage_options: dict[str, Any] | None = None) -> None:
        self.uri = expand_url(uri).rstrip("/")
        options = dict(storage_options or {})
        if self.uri.startswith("s3://"):
            options.setdefault("skip_instance_cache", True)
        self.fs: fsspec.AbstractFileSystem
        self.fs, self.root = url_to_fs(self.uri, **options)

    @classmethod
    def for_run(
        cls, storage: str, job: str, run_id: str, storage_options: dict[str, Any] | None = None
    ) -> RunFolder:
        return cls(f"{expand_url(storage).rstrip('/')}/{job}/{run_id}", storage_options)

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    # ---- small JSON helpers ---------------------------------------------------------------
    def read_json(self, name: str) -> dict[str, Any] | None:
        path = self.path(name)
        try:
            with self.fs.open(path, "rb") as fh:
                data = json.loads(fh.read())
        except FileNotFoundError:
            return None
        except (ValueError, OSError) as exc:
            raise StorageError(f"cannot read {self.uri}/{name}: {exc}") from exc
        return data if isinstance(data, dict) else None

    def write_json(self, name: str, data: dict[str, Any]) -> None:
        """Write whole-file: to a temporary name, then move over, where the store allows it."""
        path = self.path(name)
        blob = json.dumps(data, sort_keys=True).encode()
        try:
            self.fs.makedirs(self.root, exist_ok=True)
            if self.fs.protocol in ("file", ("file", "local")) or "file" in self.fs.protocol:
                tmp = f"{path}.tmp-{os.getpid()}"
                with open(tmp, "wb") as fh:
                    fh.write(blob)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, path)
            else:
                with self.fs.open(path, "wb") as fh:
                    fh.write(blob)
        except OSError as exc:
            raise StorageError(f"cannot write {self.uri}/{name}: {exc}") from exc

    # ---- what the reconciler reads ------------------------------------------------------------
    def lease_epoch(self) -> int:
        data = self.read_json("lease.json")
        return int(data["epoch"]) if data and "epoch" in data else 0

    def bump_lease(self, holder: str = "reconciler") -> int:
        """Move the lease to a new epoch BEFORE launching the attempt that will carry it."""
        epoch = self.lease_epoch() + 1
        self.write_json("lease.json", {"epoch": epoch, "holder": holder})
        return epoch

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

    def done(self) -> dict[str, Any] | None:
        return self.read_json("done.json")

    def committed_checkpoints(self) -> list[CheckpointName]:
        """Checkpoints whose COMMIT.json exists, newest first (digests are the worker's to verify)."""
        base = self.path("checkpoints")
        try:
            entries = self.fs.ls(base, detail=False)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StorageError(f"cannot list {self.uri}/checkpoints: {exc}") from exc
        found: list[CheckpointName] = []
        for entry in entries:
            m = CHECKPOINT_DIR.match(entry.rstrip("/").rsplit("/", 1)[-1])
            if m and self.fs.exists(f"{entry.rstrip('/')}/COMMIT.json"):
                found.append(CheckpointName(int(m["step"]), int(m["epoch"])))
        return sorted(found, key=lambda c: (c.step, c.epoch), reverse=True)

    def durable_step(self) -> int:
        ckpts = self.committed_checkpoints()
        return ckpts[0].step if ckpts else 0
