"""What the status page reads: the statuses recorded in git at HEAD (as the loop reads them), each
job's status history (`git log -- status/<job>.yaml`), and the live heartbeat from run storage.

Statuses in git were redacted when written; everything is masked again here with the secrets the
manifests name (as the daemon's environment holds them), because what comes from storage (a
heartbeat, an attempt's log) never went through the loop's redaction.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from adapters import drills, series
from adapters.artifacts import Artifact
from adapters.gitrepo import STATUS_DIR
from adapters.storage import Progress, RunFolder, StorageError
from desired.parse import DesiredState
from reconciler.daemon.artifacts import locate
from reconciler.daemon.loop import Reconciler
from reconciler.trust.redaction import secret_values
from status.models import JobStatus, parse_status
from status.redact import Redactor, redact_data
from status.room import room_words_of

HISTORY_LIMIT = 100  # status commits read for one job's page (the chart and the commit list)


@dataclass
class Snapshot:
    """Everything at one commit of the state repository."""

    head: str
    desired: DesiredState
    statuses: dict[str, JobStatus]  # redacted
    redactor: Redactor
    names: list[str] = field(default_factory=list)  # recorded or desired, sorted
    slow_providers: list[tuple[str, str]] = field(default_factory=list)  # (provider, how it answers), redacted
    room: dict[str, str] = field(default_factory=dict)  # provider -> its room in words (status/room.yaml), redacted

    def target(self, name: str) -> int | None:
        job = self.desired.jobs.get(name)
        st = self.statuses.get(name)
        return (job.spec.target_steps if job else None) or (st.progress.target if st else None)

    def deadline(self, name: str) -> float | None:
        job = self.desired.jobs.get(name)
        return job.spec.deadline.timestamp() if job and job.spec.deadline else None


@dataclass(frozen=True)
class Version:
    """One status commit of a job."""

    sha: str
    time: float
    subject: str
    status: JobStatus | None  # None: the commit deleted or damaged the file


class PageData:
    """Reads for the page, safe to call from several request threads (one at a time on the repository)."""

    def __init__(self, repo: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> None:
        self.environ = os.environ if environ is None else environ
        self.rec = Reconciler(Path(repo), environ=self.environ)
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._status_at = ""  # the commit the snapshot's statuses were read from
        self._versions: dict[tuple[str, str], JobStatus | None] = {}

    # ---- the whole repository at HEAD ------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """The statuses at HEAD, parsed and redacted once per commit."""
        with self._lock:
            self.rec.configure_repo()  # status may live on a status branch (adapters.gitrepo)
            head = self.rec.repo.head()
            status_at = self.rec.status_source(head)
            if self._snapshot is not None and (self._snapshot.head, self._status_at) == (head, status_at):
                return self._snapshot
            self._status_at = status_at
            desired = self.rec.read_desired(head)
            redactor = Redactor(secret_values(desired, self.environ))
            statuses = {n: redacted(redactor, st) for n, st in self.rec.read_recorded(status_at).items()}
            names = sorted(set(statuses) | set(desired.jobs))
            slow = [(redactor.redact(p), redactor.redact(a)) for p, a in slow_providers(
                self.rec.repo.read_file(status_at, f"{STATUS_DIR}/providers.yaml"))]
            room = {redactor.redact(p): redactor.redact(words) for p, words in room_words_of(
                self.rec.repo.read_file(status_at, f"{STATUS_DIR}/room.yaml")).items()}
            self._snapshot = Snapshot(head, desired, statuses, redactor, names, slow, room)
            return self._snapshot

    def live(self, snap: Snapshot, name: str) -> Progress | None:
        """The worker's last heartbeat for the job's current run; None when there is none or storage
        cannot be read (the page then shows the durable progress of the status)."""
        st = snap.statuses.get(name)
        job = snap.desired.jobs.get(name)
        run_id = st.run_id if st else (job.run_id() if job else "")
        if not run_id or (st is not None and st.phase.terminal):
            return None
        storage = (st.storage if st and st.storage else "") or snap.desired.settings.storage
        try:
            folder = RunFolder.for_run(storage, name, run_id, dict(snap.desired.settings.storage_options))
            return folder.progress(with_reached=False)  # the page shows the heartbeat: one read, not two
        except (StorageError, OSError, ValueError):
            return None

    def attempt_log(self, snap: Snapshot, name: str) -> str:
        """The current attempt's log copy in run storage (written where the provider has no log API),
        redacted; '' when there is none."""
        st = snap.statuses.get(name)
        if st is None or st.current is None or not st.run_id:
            return ""
        storage = st.storage or snap.desired.settings.storage
        try:
            folder = RunFolder.for_run(storage, name, st.run_id, dict(snap.desired.settings.storage_options))
            text = folder.attempt_log(st.current.epoch)
        except (StorageError, OSError, ValueError):
            return ""
        return snap.redactor.redact(text[-8000:])

    def checkpoints(self, snap: Snapshot, name: str) -> list[tuple[float, int]]:
        """(time, step) of the committed checkpoints still in storage (collection keeps the newest few)."""
        st = snap.statuses.get(name)
        if st is None or not st.run_id:
            return []
        storage = st.storage or snap.desired.settings.storage
        out = []
        try:
            folder = RunFolder.for_run(storage, name, st.run_id, dict(snap.desired.settings.storage_options))
            for ckpt in folder.committed_checkpoints()[:50]:  # newest first
                stamp = folder.read_commit(ckpt).get("time")
                if isinstance(stamp, int | float):
                    out.append((float(stamp), ckpt.step))
        except (StorageError, OSError, ValueError):
            return out
        return out

    def reported(self, snap: Snapshot, name: str, run_id: str) -> dict[str, list[tuple[int, float]]]:
        """The metrics the run's workers reported over steps (adapters/series.py), by name; empty
        when there are none or storage cannot be read now."""
        st = snap.statuses.get(name)
        if not run_id:
            return {}
        storage = (st.storage if st and st.storage else "") or snap.desired.settings.storage
        try:
            folder = RunFolder.for_run(storage, name, run_id, dict(snap.desired.settings.storage_options))
            return series.read(folder.store)
        except (StorageError, OSError, ValueError):
            return {}

    def drill(self, snap: Snapshot, name: str) -> drills.Seen | None:
        """The records of the job's newest drill (adapters/drills.py); None when it has none or
        storage cannot be read now."""
        st = snap.statuses.get(name)
        if st is None or st.drill is None:
            return None
        storage = st.storage or snap.desired.settings.storage
        try:
            return drills.read(RunFolder.for_run(storage, name, st.run_id, dict(snap.desired.settings.storage_options)),
                               st.drill.id)
        except (StorageError, OSError, ValueError):
            return None

    def output(self, snap: Snapshot, name: str, path: str) -> tuple[RunFolder, Artifact] | None:
        """The output `path` of the job's succeeded run, as its completion record lists it; None when
        the job has not succeeded or its record lists no such file. StorageError (ArtifactError for a
        malformed record) when run storage cannot be read."""
        if name in snap.desired.sweeps:  # a sweep's outputs are its members', each on its own page
            return None
        found = locate(name, snap.desired, dict(snap.statuses)).found
        return next(((run.folder, item) for run in found for item in run.items if item.path == path), None)

    # ---- one job's history -----------------------------------------------------------------------
    def history(self, snap: Snapshot, name: str, limit: int = HISTORY_LIMIT) -> list[Version]:
        """The job's status commits up to HEAD, newest first, each with the status it recorded."""
        path = f"{STATUS_DIR}/{name}.yaml"
        with self._lock:
            entries = self.rec.repo.history(path, limit, snap.head)
            versions = []
            for sha, stamp, subject in entries:
                key = (sha, path)
                if key not in self._versions:
                    st = parse_status(self.rec.repo.read_file(sha, path) or b"")
                    self._versions[key] = redacted(snap.redactor, st) if st is not None else None
                versions.append(Version(sha, stamp, snap.redactor.redact(subject), self._versions[key]))
        return versions

    def remote_url(self) -> str | None:
        with self._lock:
            return self.rec.repo.remote_url()


def slow_providers(text: bytes | None) -> list[tuple[str, str]]:
    """(provider, how it answers) for the providers the last tick found slow or unresponsive
    (`answers` in status/providers.yaml); none when the file is absent or unreadable."""
    try:
        data = yaml.safe_load(text) if text else None
    except yaml.YAMLError:
        return []
    rows = data.get("providers") if isinstance(data, dict) else None
    return [(str(r["provider"]), str(r["answers"])) for r in rows or []
            if isinstance(r, dict) and r.get("provider") and r.get("answers")] if isinstance(rows, list) else []


def redacted(redactor: Redactor, st: JobStatus) -> JobStatus:
    """A copy with every secret value masked (the same masking the loop applies before it writes)."""
    if not redactor:
        return st
    return JobStatus.model_validate(redact_data(redactor, st.model_dump()))
