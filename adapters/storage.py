"""Run data in storage over fsspec: the contract between the reconciler and its workers.

Layout of one run (DESIGN.md §3)::

    <storage>/<job>/<run-id>/lease.json                      the lease: epoch, acknowledged checkpoints, done
    <storage>/<job>/<run-id>/progress.json                   heartbeat of the live attempt
    <storage>/<job>/<run-id>/reached-e<epoch>                 the highest step an attempt finished (local disk)
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

import json
import logging
import os
import random
import re
import time
from dataclasses import dataclass
from typing import Any

from adapters import digest
from adapters.store import (  # noqa: F401 - StoreFolder's errors and helpers are part of this module's API
    ALLOW_UNFENCED_ENV,
    READ_CHUNK,
    CorruptCheckpoint,
    StorageError,
    StoreFolder,
    UnsafeStoreError,
    check_backend,
    expand_url,
)

log = logging.getLogger(__name__)
CHECKPOINT_DIR = re.compile(r"^(?P<step>\d+)-e(?P<epoch>\d+)$")
COMMIT_FILE = "COMMIT.json"
LEASE_FILE = "lease.json"
STOP_FILE = "stop.json"
REACHED_FILE = "reached-e{epoch}"
REACHED_NAME = re.compile(r"^reached-e(?P<epoch>\d+)$")
LEASE_LOG = ".lease"
# How many acknowledged checkpoint names the lease remembers (collection keeps far fewer).
LEASE_REMEMBERS = 32
LEASE_LOG_KEEP = 16


class Fenced(StorageError):
    """The lease has moved to a newer epoch: this attempt may no longer write."""


class LeaseConflict(StorageError):
    """The lease was not at the epoch the caller expected."""


@dataclass(frozen=True)
class Progress:
    epoch: int
    step: int
    target: int | None
    time: float
    metrics: dict[str, float]
    stopping: str | None = None  # the worker's last beat before a stop: "deadline", "signal" or "request"
    reached: int | None = None  # the highest step this epoch is known to have passed (>= step)


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


class RunFolder(StoreFolder):
    """One run's folder: its lease, heartbeat, stop request, attempt logs, completion and checkpoints."""

    def __init__(self, uri: str, storage_options: dict[str, Any] | None = None) -> None:
        super().__init__(uri, storage_options)
        self._reached_fds: dict[int, int] = {}

    @classmethod
    def for_run(cls, storage: str, job: str, run_id: str, storage_options: dict[str, Any] | None = None) -> RunFolder:
        return cls(f"{expand_url(storage).rstrip('/')}/{job}/{run_id}", storage_options)

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
                stopping=str(data["stopping"]) if data.get("stopping") else None,
                reached=max(int(data.get("step", 0)), self.reached(int(data.get("epoch", 0))) or 0),
            )
        except (TypeError, ValueError):
            return None

    # ---- the step reached, between heartbeats ------------------------------------------------------------
    def mark_reached(self, epoch: int, step: int) -> None:
        """Record cheaply that attempt `epoch` finished `step`: on local disk an in-place write of a
        few bytes into `reached-e<epoch>` (no fsync, no rename: it survives the process being
        killed, and a kill leaves nothing half-written behind), so the steps a killed attempt did
        after its last heartbeat are counted as lost. Other stores rely on the heartbeat alone
        (one request per step would cost more than it tells). Not fenced: each epoch has its own file.
        """
        if self.kind != "local":
            return
        fd = self._reached_fds.get(epoch)
        if fd is None:
            fd = os.open(self.path(REACHED_FILE.format(epoch=int(epoch))), os.O_WRONLY | os.O_CREAT, 0o644)
            self._reached_fds[epoch] = fd
        os.pwrite(fd, f"{int(step):019d}\n".encode(), 0)

    def reached(self, epoch: int) -> int | None:
        """What `mark_reached` last recorded for `epoch`, or None."""
        if self.kind != "local":
            return None
        blob = self.read_bytes(REACHED_FILE.format(epoch=int(epoch)))
        try:
            return int(blob) if blob else None
        except ValueError:
            return None

    def forget_reached(self, before_epoch: int) -> None:
        """Delete the marks of epochs older than `before_epoch` (the reconciler has judged them)."""
        if self.kind != "local":
            return
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return
        for n in names:
            m = REACHED_NAME.match(n)
            if m and int(m["epoch"]) < before_epoch:
                self.delete(n)

    def close_marks(self) -> None:
        for fd in self._reached_fds.values():
            os.close(fd)
        self._reached_fds = {}

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
                int(meta["size"]), digest.check_record(meta)
        except Exception as exc:
            raise CorruptCheckpoint(f"{self.url(name)} is not a valid commit record: {exc}") from exc
        return dict(record)

    def read_verified(
        self, ckpt: CheckpointName, fname: str, info: dict[str, Any], out: memoryview | list[memoryview]
    ) -> None:
        """Fill `out` (one buffer, or several filled in order) with a checkpoint file, or raise
        CorruptCheckpoint if its size or digest differ from `info` (its entry in the commit record).
        Chunks are hashed on another thread while the next ones are read."""
        name = f"checkpoints/{ckpt.dirname}/{fname}"
        size = int(info["size"])
        try:
            algorithm, want = digest.expected(info)
            hasher = digest.Overlapped(digest.new(algorithm))
        except digest.DigestError as exc:
            raise StorageError(f"cannot verify {self.url(name)}: {exc}") from exc
        if isinstance(out, list):
            got = self._read_parts(name, out, hasher)
        else:
            got = self.read_payload_into(name, out, hasher)
        found = hasher.hexdigest()
        if got != size:
            raise CorruptCheckpoint(f"{self.url(name)} has {got} bytes, its commit record says {size}")
        if found != want:
            raise CorruptCheckpoint(f"{self.url(name)} does not match its {algorithm} in the commit record")

    def _read_parts(self, name: str, parts: list[memoryview], hasher: Any) -> int:
        """Read a file into `parts` one after the other (a scatter read); returns its size, or
        more than the parts hold when it is longer."""
        total = sum(len(p) for p in parts)
        if self.kind != "local":
            whole = memoryview(bytearray(total))
            got = self.read_payload_into(name, whole, hasher)
            offset = 0
            for part in parts:
                part[:] = whole[offset : offset + len(part)]
                offset += len(part)
            return got
        try:
            with open(self.path(name), "rb", buffering=0) as fh:
                n = 0
                for part in parts:
                    for i in range(0, len(part), READ_CHUNK):
                        piece = part[i : i + READ_CHUNK]
                        got = fh.readinto(piece)
                        if got:
                            hasher.update(piece[:got])
                            n += got
                        if got != len(piece):
                            return n
                return total + 1 if fh.read(1) else n
        except FileNotFoundError as exc:
            raise CorruptCheckpoint(f"{self.url(name)} is missing") from exc
        except OSError as exc:
            raise StorageError(f"cannot read {self.url(name)}: {exc}") from exc

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
