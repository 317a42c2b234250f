"""Run data in a store: the contract between the reconciler and its workers.

Layout of one run (DESIGN.md §3)::

    <storage>/<job>/<run-id>/lease.json                      the lease: epoch, acknowledged checkpoints, done
    <storage>/<job>/<run-id>/progress.json                   heartbeat of the live attempt
    <storage>/<job>/<run-id>/reached-e<epoch>                 the highest step an attempt finished
    <storage>/<job>/<run-id>/checkpoints/<step>-e<epoch>/... payload, then COMMIT.json (written last)
    <storage>/<job>/<run-id>/outputs/e<epoch>/...            the completing attempt's outputs (adapters/artifacts.py)
    <storage>/<job>/<run-id>/inputs-e<epoch>.json            where that attempt's inputs are (a job with `after`)
    <storage>/<job>/<run-id>/done.json                       completion record, created once, listing the outputs
    <storage>/<job>/<run-id>/stop.json                       the reconciler's stop request (epoch, reason)

The folder is a `Store` (adapters/stores/): RunFolder holds one and asks only its capabilities,
never which backend it is.

Fencing. The lease is changed only by compare-and-swap: where the store's swap is atomic across
hosts (S3's `If-Match` on the ETag, memory) by `swap` on `lease.json`; elsewhere (local disk,
NFS, generic fsspec) by exclusive creation of the next numbered version in `.lease/` (the
newest version is the lease; `lease.json` is a mirror for people and is not trusted). The
reconciler's bump and the worker's commit are both CASes on that one record, so a worker
that was replaced cannot commit anything afterwards: its swap fails. A checkpoint is
*accepted* only if its `COMMIT.json` exists and either its epoch is the lease's current epoch
or the lease lists it as acknowledged; `bump_lease` seals the outgoing epoch by acknowledging
what it had committed at that moment, so a zombie's later commits are never accepted.
Completion goes through the same swap before `done.json` is created, so a zombie cannot
complete a run.

Heartbeats: where swaps are atomic across hosts, progress.json is swapped on the tag this
attempt wrote last, so a replaced worker cannot overwrite its successor's heartbeat; elsewhere
the lease is checked just before the write (a worker frozen inside that window may land one
stale heartbeat, which carries its old epoch; readers compare `Progress.epoch` with the lease).

A store that silently ignores conditional writes would void all of this, so the first
conditional write on a store probes it, and an ignoring store is refused with a clear error
unless RECONCILER_ALLOW_UNFENCED_STORE=1 (then only epoch-named paths protect the run).
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
from dataclasses import dataclass
from typing import Any

from adapters import digest
from adapters.stores import (  # noqa: F401 - the stores' errors and helpers are part of this module's API
    CorruptCheckpoint,
    StorageError,
    Store,
    UnsafeStoreError,
    check_backend,
    expand_url,
    open_store,
)
from adapters.stores.marks import Marks
from adapters.wire import is_decimal, load_json

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
# The pause between lease swaps that lost a race. A generator of its own: a worker's upload thread
# commits through the lease, and a draw from the `random` module's global generator there would
# move the training script's Python random stream, so a run would no longer resume bit-identically.
_jitter = random.Random()


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
    save_seconds: float | None = None  # the worker's last save, until durable: what its final save costs
    save_every_seconds: float | None = None  # from one save's start to the next (none when a step count pins them)


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


class RunFolder:
    """One run's folder: its lease, heartbeat, stop request, attempt logs, completion and checkpoints,
    on top of a `Store` (`self.store`)."""

    def __init__(self, uri: str, storage_options: dict[str, Any] | None = None, store: Store | None = None) -> None:
        self.store = store if store is not None else open_store(uri, storage_options)
        self.uri = self.store.uri
        self._marks = Marks(self.store)

    def url(self, name: str = "") -> str:
        return self.store.url(name)

    def read_json(self, name: str) -> dict[str, Any] | None:
        """A small JSON object, or None when the file is missing (or holds no object)."""
        blob = self.store.read(name)
        if blob is None:
            return None
        try:
            data = load_json(blob)
        except ValueError as exc:
            raise StorageError(f"cannot read {self.url(name)}: {exc}") from exc
        return data if isinstance(data, dict) else None

    def write_json(self, name: str, data: dict[str, Any]) -> None:
        """Write whole-file: readers see the old or the new version, never a mix."""
        self.store.write(name, json.dumps(data, sort_keys=True).encode())

    @classmethod
    def for_run(cls, storage: str, job: str, run_id: str, storage_options: dict[str, Any] | None = None) -> RunFolder:
        return cls(f"{expand_url(storage).rstrip('/')}/{job}/{run_id}", storage_options)

    # ---- the lease: compare-and-swap on one record ----------------------------------------------------
    def _lease_read(self) -> tuple[dict[str, Any], Any]:
        """The lease record and a token for `_lease_cas` (the store's tag where swaps are atomic
        across hosts, the lease log's version number elsewhere)."""
        if self.store.cas_across_hosts:
            blob, tag = self.store.read_tagged(LEASE_FILE)
            return (_loads(blob, self.url(LEASE_FILE)) if blob else {}), tag
        for _ in range(10):
            versions = self._lease_versions()
            if not versions:
                return (self.read_json(LEASE_FILE) or {}), 0
            blob = self.store.read(f"{LEASE_LOG}/{versions[-1]:012d}.json")
            if blob is not None:
                return _loads(blob, self.url(LEASE_LOG)), versions[-1]
        raise StorageError(f"cannot read the lease at {self.url(LEASE_LOG)}: it keeps changing")

    def _lease_versions(self) -> list[int]:
        names = self.store.list(LEASE_LOG)
        return sorted(int(n[:-5]) for n in names if n.endswith(".json") and is_decimal(n[:-5]))

    def _lease_cas(self, token: Any, record: dict[str, Any]) -> bool:
        blob = json.dumps(record, sort_keys=True).encode()
        if self.store.cas_across_hosts:
            return self.store.swap(LEASE_FILE, blob, token) is not None
        version = int(token) + 1
        if not self.store.create(f"{LEASE_LOG}/{version:012d}.json", blob):
            return False
        try:  # the mirror and the pruning are for people and disk space; the log is the truth
            self.store.write(LEASE_FILE, blob)
            versions = self._lease_versions()
            if versions and versions[-1] > version:  # a newer lease landed meanwhile: mirror that one
                newest = self.store.read(f"{LEASE_LOG}/{versions[-1]:012d}.json")
                if newest is not None:
                    self.store.write(LEASE_FILE, newest)
            for old in versions:
                if old <= version - LEASE_LOG_KEEP:
                    self.store.delete(f"{LEASE_LOG}/{old:012d}.json")
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
        An epoch left unclaimed (`release_unstarted`: no worker ever held it) is taken again.
        """
        for attempt in range(50):
            record, token = self._lease_read()
            current = int(record.get("epoch", 0))
            epoch = current if record.get("unclaimed") else current + 1
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
                "epoch": epoch,
                "holder": holder,
                "time": time.time(),
                "committed": _newest_names(acked),
            }
            if record.get("done"):
                new["done"] = record["done"]
            if self._lease_cas(token, new):
                return epoch
            time.sleep(_jitter.uniform(0.001, 0.01 * (attempt + 1)))
        raise StorageError(f"cannot bump the lease at {self.url(LEASE_FILE)}: it keeps changing under us")

    def release_unstarted(self, epoch: int) -> None:
        """The provider refused the launch that took `epoch`, so no worker ever held it: the next
        bump_lease takes the same epoch again (attempt numbers count attempts, not refusals). Older
        epochs stay fenced. Does nothing once the lease has moved on."""
        try:
            self._update_own_lease(epoch, lambda record: {**record, "unclaimed": True})
        except Fenced:
            pass

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
            time.sleep(_jitter.uniform(0.001, 0.01 * (attempt + 1)))
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

        Raises Fenced when the lease or a newer heartbeat shows this attempt was replaced. Where
        swaps are atomic across hosts the write is conditional on the heartbeat this attempt last
        wrote, so a replaced worker that wakes up cannot overwrite its successor's heartbeat.
        """
        self.check_epoch(epoch)
        blob = json.dumps(record, sort_keys=True).encode()
        if not self.store.cas_across_hosts:
            self.store.write("progress.json", blob)
            return None
        for _ in range(5):
            if tag is None:
                current, tag = self.store.read_tagged("progress.json")
                if current is not None and int(_loads(current, "progress").get("epoch", 0)) > epoch:
                    raise Fenced(f"{self.url('progress.json')} is written by a newer attempt: this one was replaced")
            new_tag = self.store.swap("progress.json", blob, tag)
            if new_tag is not None:
                return new_tag
            tag = None  # someone else wrote it: look at who, then retry or stop
        raise StorageError(f"cannot write {self.url('progress.json')}: it keeps changing under us")

    def progress(self, with_reached: bool = True) -> Progress | None:
        """The last heartbeat; with `with_reached`, also the step reached since (one more read:
        the reconciler needs it to count lost work, a page showing progress does not)."""
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
                save_seconds=float(data["save_seconds"]) if data.get("save_seconds") is not None else None,
                save_every_seconds=(float(data["save_every_seconds"])
                                    if data.get("save_every_seconds") is not None else None),
                reached=max(int(data.get("step", 0)),
                            (self.reached(int(data.get("epoch", 0))) if with_reached else None) or 0),
            )
        except (TypeError, ValueError):
            return None

    # ---- the step reached, between heartbeats ------------------------------------------------------------
    def mark_reached(self, epoch: int, step: int) -> None:
        """Record that attempt `epoch` finished `step`, never making the step wait: on local disk an
        in-place write of a few bytes into `reached-e<epoch>` every step; on other stores the newest
        step is written by a background thread at most about once a second. So the steps a killed
        attempt did after its last heartbeat are counted as lost (on local disk all of them, else
        all but about a second's worth). Not fenced: each epoch has its own file.
        """
        self._marks.post(REACHED_FILE.format(epoch=int(epoch)), f"{int(step):019d}\n".encode())

    def reached(self, epoch: int) -> int | None:
        """What `mark_reached` last recorded for `epoch`, or None."""
        blob = self.store.read(REACHED_FILE.format(epoch=int(epoch)))
        try:
            return int(blob) if blob else None
        except ValueError:
            return None

    def forget_reached(self, before_epoch: int) -> None:
        """Delete the marks of epochs older than `before_epoch` (the reconciler has judged them)."""
        for n in self.store.list(""):
            m = REACHED_NAME.match(n)
            if m and int(m["epoch"]) < before_epoch:
                self.store.delete(n)

    def close_marks(self) -> None:
        """Write the last mark (waiting a few seconds at most) and release the store's handles."""
        self._marks.close()
        self._marks = Marks(self.store)

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
        blob = self.store.read(STOP_FILE)
        if blob is None:
            return None
        try:
            data = load_json(blob)
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
        self.store.write(f"logs/e{int(epoch)}.log", text.encode())

    def attempt_log(self, epoch: int) -> str:
        """What `write_attempt_log` wrote for `epoch`, or '' (never raises for a missing file)."""
        blob = self.store.read(f"logs/e{int(epoch)}.log")
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
        if not self.store.create("done.json", json.dumps(final, sort_keys=True).encode()):
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
        for rel in self.store.list("checkpoints"):
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
        blob = self.store.read(name)
        if blob is None:
            raise CorruptCheckpoint(f"{self.url(name)} is missing")
        try:
            record = load_json(blob)
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
            got = self.store.read_parts_into(name, out, hasher)
        else:
            got = self.store.read_payload_into(name, out, hasher)
        found = hasher.hexdigest()
        if got != size:
            raise CorruptCheckpoint(f"{self.url(name)} has {got} bytes, its commit record says {size}")
        if found != want:
            raise CorruptCheckpoint(f"{self.url(name)} does not match its {algorithm} in the commit record")

    def commit_checkpoint(self, epoch: int, ckpt: CheckpointName, record: dict[str, Any]) -> None:
        """Make a fully uploaded checkpoint visible: COMMIT.json (exclusive), then the lease ack.

        Raises Fenced when the lease moved on: the checkpoint then stays unaccepted garbage (the
        lease swap, not an earlier read, is the fence, so there is no window to slip through).
        """
        name = f"checkpoints/{ckpt.dirname}/{COMMIT_FILE}"
        if not self.store.create(name, json.dumps(record, sort_keys=True).encode()):
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
        self.store.delete(f"checkpoints/{ckpt.dirname}/{COMMIT_FILE}")

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
            self.store.delete_tree(f"checkpoints/{c.dirname}")
            removed.append(c.dirname)
        return removed


def _loads(blob: bytes, where: str) -> dict[str, Any]:
    try:
        data = load_json(blob)
    except ValueError as exc:
        raise StorageError(f"cannot read {where}: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _newest_names(names: list[str]) -> list[str]:
    parsed = {n: CheckpointName.parse(n) for n in set(names)}
    valid = [n for n, c in parsed.items() if c is not None]
    valid.sort(key=lambda n: (parsed[n].step, parsed[n].epoch), reverse=True)  # type: ignore[union-attr]
    return valid[:LEASE_REMEMBERS]
