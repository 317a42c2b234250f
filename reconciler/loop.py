"""One tick of the loop, level-triggered: rebuild the whole view from git, storage and providers,
plan, execute, and commit the status that changed.

A tick keeps no memory of its own between runs: whatever it must remember (attempts, when a
worker was last seen, backoff) is in the status files it commits, so a reconciler killed at any
point and started again carries on from git and storage alone.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

from adapters.compute import ComputeAdapter, ProviderConfigError, WorkerPhase, WorkerRef
from adapters.gitrepo import DESIRED_DIR, STATUS_DIR, GitError, StateRepo
from adapters.registry import make_adapter
from adapters.storage import RunFolder, StorageError
from desired.models import Provider
from desired.parse import DesiredState, parse_desired, parse_settings
from reconciler.clock import Clock, SystemClock
from reconciler.execute import execute
from reconciler.plan import Observed, Plan, RunObservation, apply_results, plan
from status.models import JobStatus, parse_status, render_index, render_status

log = logging.getLogger("reconciler")

AdapterFactory = Callable[[Provider, str], ComputeAdapter]  # (provider, owner identity)


class AlreadyRunning(Exception):
    pass


@dataclass
class TickReport:
    commit: str = ""
    status_commit: str | None = None
    actions: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    statuses: dict[str, JobStatus] = field(default_factory=dict)
    desired: DesiredState | None = None

    @property
    def all_terminal(self) -> bool:
        if self.desired is None or not self.desired.jobs:
            return False
        return all(self.statuses[j].phase.terminal for j in self.desired.jobs if j in self.statuses)


class Reconciler:
    def __init__(self, repo: str | os.PathLike[str] | StateRepo, *, clock: Clock | None = None,
                 adapter_factory: AdapterFactory = make_adapter, environ: Mapping[str, str] | None = None,
                 storage_override: str | None = None, remote: str | None = None) -> None:
        # A StateRepo-like object may be passed in (the simulator's in-memory repository).
        self.repo = StateRepo(repo) if isinstance(repo, str | os.PathLike) else repo
        self.clock = clock or SystemClock()
        self.adapter_factory = adapter_factory
        self.environ = os.environ if environ is None else environ
        self.storage_override = storage_override
        self.remote = remote
        self._adapters: dict[str, tuple[str, ComputeAdapter]] = {}
        self._root_identity: str | None = None
        self._foreign_seen: dict[str, int] = {}
        self._lock: IO[str] | None = None
        self._heartbeats: dict[tuple[str, str], tuple[object, float, int]] = {}
        # Status commits a push did not deliver go out with the next push, even in a tick that
        # changes nothing; a new process pushes once, for what an earlier one left unpushed.
        self._push_pending = True
        self._desired_cache: tuple[tuple[str | None, bytes | None], DesiredState] | None = None
        self._status_cache: dict[bytes, JobStatus | None] = {}

    # ---- one daemon per repository ---------------------------------------------------------------
    def acquire_lock(self) -> None:
        path = Path(self.repo.repo.git_dir) / "reconciler.lock"
        fh = open(path, "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            fh.close()
            raise AlreadyRunning(f"another reconciler is already running on {self.repo.path}; "
                                 "stop it first (only one may act on a repository)") from exc
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        self._lock = fh

    def release_lock(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    # ---- reading the world ------------------------------------------------------------------------
    def read_desired(self, commit: str) -> DesiredState:
        """Parsed once per distinct desired/ tree and settings file: most ticks reuse it."""
        settings_text = self.repo.read_settings(commit)
        key = (self.repo.tree_id(commit, DESIRED_DIR), settings_text)
        if self._desired_cache is not None and self._desired_cache[0] == key and key[0] is not None:
            desired = self._desired_cache[1]
        else:
            desired = parse_desired(self.repo.read_files(commit, DESIRED_DIR), settings_text)
            self._desired_cache = (key, desired)
        if self.storage_override:
            desired.settings = desired.settings.model_copy(update={"storage": self.storage_override})
        return desired

    def read_recorded(self, commit: str) -> dict[str, JobStatus]:
        recorded: dict[str, JobStatus] = {}
        cache: dict[bytes, JobStatus | None] = {}
        for path, blob in self.repo.read_files(commit, STATUS_DIR).items():
            if not path.endswith(".yaml"):
                continue
            st = self._status_cache[blob] if blob in self._status_cache else parse_status(blob)
            cache[blob] = st  # shared with the planner, which copies before it changes anything
            if st is not None and path == f"{STATUS_DIR}/{st.job}.yaml":
                recorded[st.job] = st
        self._status_cache = cache
        return recorded

    def identity(self, desired: DesiredState) -> str:
        """The state repository's identity, put on every worker: `identity` of reconciler.yaml, else
        derived from the repository's first commit (the same in every clone)."""
        if desired.settings.identity:
            return desired.settings.identity
        if self._root_identity is None:
            self._root_identity = repository_identity(self.repo.root_commit())
        return self._root_identity

    def adapters_for(self, desired: DesiredState, errors: list[str]) -> dict[str, ComputeAdapter]:
        """Adapters are kept between ticks and rebuilt only when their provider's spec (or the
        repository's identity) changes."""
        out: dict[str, ComputeAdapter] = {}
        owner = self.identity(desired)
        for name, provider in desired.providers.items():
            key = f"{owner}:{provider.model_dump_json()}"
            cached = self._adapters.get(name)
            if cached is not None and cached[0] == key:
                out[name] = cached[1]
                continue
            try:
                adapter = self.adapter_factory(provider, owner)
            except ProviderConfigError as exc:
                errors.append(str(exc))
                continue
            self._adapters[name] = (key, adapter)
            out[name] = adapter
        return out

    def observe(self, desired: DesiredState, recorded: dict[str, JobStatus],
                adapters: dict[str, ComputeAdapter], errors: list[str], now: float) -> Observed:
        observed = Observed()
        for name in desired.providers:
            adapter = adapters.get(name)
            if adapter is None:
                observed.unreachable[name] = "adapter could not be built"
                continue
            try:
                workers = adapter.observe()
            except Exception as exc:  # any failure to ask is "unknown", never "gone"
                observed.unreachable[name] = str(exc) or type(exc).__name__
                errors.append(f"cannot observe provider {name}: {exc}")
                continue
            observed.workers.update(workers)
            self._note_foreign(name, getattr(adapter, "foreign_workers", 0))
        runs = {(name, job.run_id()) for name, job in desired.jobs.items()}
        runs |= {(st.job, st.run_id) for st in recorded.values() if st.run_id and not st.phase.terminal}
        settings = desired.settings
        for job, run_id in sorted(runs):
            run = read_run(settings.storage, job, run_id, dict(settings.storage_options))
            observed.runs[(job, run_id)] = self._remember_heartbeat((job, run_id), run, now)
        self._heartbeats = {k: v for k, v in self._heartbeats.items() if k in runs}
        # Logs of current attempts that failed, found through one index of the failed exits (a
        # scan of every worker for every job made this quadratic: 26 % of a 1,000-job tick).
        failed: dict[tuple[str, str, int], list[WorkerRef]] = {}
        for ref, state in observed.workers.items():
            if state.phase == WorkerPhase.EXITED and state.exit_code not in (0, 75):
                failed.setdefault((ref.job, ref.run_id, ref.epoch), []).append(ref)
        for st in recorded.values():
            att = st.current
            if att is None:
                continue
            for ref in failed.get((st.job, st.run_id, att.epoch), ()):
                try:
                    observed.logs[ref] = adapters[ref.provider].logs(ref, 40)
                except Exception as exc:
                    observed.logs[ref] = f"(log unavailable: {exc})"
        return observed

    def _note_foreign(self, provider: str, count: int) -> None:
        """One log line when the number of other repositories' workers on a provider changes."""
        if count and self._foreign_seen.get(provider) != count:
            log.info("provider %s: %d workers of other state repositories seen, left alone", provider, count)
        self._foreign_seen[provider] = count

    def _remember_heartbeat(self, key: tuple[str, str], run: RunObservation, now: float) -> RunObservation:
        """Stall detection times heartbeats by this process's own observations (kept in memory
        only: after a restart the window starts afresh, which can only delay a stall verdict)."""
        if run.error:
            return run
        value = (run.heartbeat_epoch, run.heartbeat_step, run.heartbeat_time)
        previous = self._heartbeats.get(key)
        if previous is None or previous[0] != value:
            seen = (value, now, 1)
        else:
            seen = (value, previous[1], previous[2] + 1)
        self._heartbeats[key] = seen
        return replace(run, heartbeat_unchanged_since=seen[1], heartbeat_unchanged_ticks=seen[2],
                       heartbeat_first_observation=previous is None)

    # ---- the tick ------------------------------------------------------------------------------
    def _configure_repo(self) -> None:
        """Remote and commit identity come from reconciler.yaml (the remote may be overridden by
        the constructor); read before pulling."""
        try:
            settings, _ = parse_settings(self.repo.read_settings(self.repo.head()))
        except GitError:
            return
        self.repo.remote = self.remote if self.remote is not None else settings.remote
        self.repo.name, self.repo.email = settings.commit_name, settings.commit_email

    def _look_and_plan(self, report: TickReport) -> tuple[Plan, DesiredState, dict[str, JobStatus],
                                                           dict[str, ComputeAdapter], Observed, float]:
        """Read git, storage and providers at HEAD and plan: the part a preview and a tick share."""
        commit = self.repo.head()
        report.commit = commit
        desired = self.read_desired(commit)
        report.desired = desired
        report.errors.extend(str(e) for e in desired.errors)
        recorded = self.read_recorded(commit)
        adapters = self.adapters_for(desired, report.errors)
        now = self.clock.now()
        observed = self.observe(desired, recorded, adapters, report.errors, now)
        the_plan = plan(desired, observed, recorded, now, commit)
        report.actions = [_describe(a) for a in the_plan.actions]
        report.statuses = the_plan.statuses
        return the_plan, desired, recorded, adapters, observed, now

    def preview(self) -> tuple[Plan, TickReport]:
        """What the next tick would do, without doing it (no launch, no commit, no pull)."""
        report = TickReport()
        the_plan = self._look_and_plan(report)[0]
        return the_plan, report

    def tick(self) -> TickReport:
        report = TickReport()
        self._configure_repo()
        try:
            self.repo.pull()
        except GitError as exc:
            report.errors.append(str(exc))
        the_plan, desired, recorded, adapters, observed, now = self._look_and_plan(report)
        commit = report.commit
        result = execute(the_plan.actions, jobs=desired.jobs, adapters=adapters, settings=desired.settings,
                         environ=self.environ)
        report.errors.extend(result.errors)
        durable = {k: v.durable_step for k, v in observed.runs.items()}
        apply_results(the_plan, result.launches, now, durable)
        self._commit(the_plan, recorded, desired, commit, report)
        for err in report.errors:
            log.warning("%s", err)
        return report

    def _commit(self, the_plan: Plan, recorded: dict[str, JobStatus], desired: DesiredState, commit: str,
                report: TickReport) -> None:
        files: dict[str, str | None] = {}
        changes = []
        desired_commit = self.repo.last_change(commit, [DESIRED_DIR, "reconciler.yaml"]) or commit
        for name, st in sorted(the_plan.statuses.items()):
            old = recorded.get(name)
            if old is not None and old == st:
                continue  # unchanged: no need to render it to find out
            text = render_status(st)
            old_text = self.repo.read_file(commit, f"{STATUS_DIR}/{name}.yaml")
            if old_text is not None and old_text.decode() == text:
                continue
            st.desired_commit = desired_commit[:12]
            text = render_status(st)
            files[f"{STATUS_DIR}/{name}.yaml"] = text
            changes.append(_change_line(old, st))
        if not files:
            if self._push_pending:
                try:
                    self.repo.push()
                    self._push_pending = False
                except GitError as exc:
                    report.errors.append(str(exc))
            return
        index = render_index(list(the_plan.statuses.values()), [str(e) for e in desired.errors])
        files[f"{STATUS_DIR}/README.md"] = index
        report.changed = changes
        subject = changes[0] if len(changes) == 1 else f"status: {len(changes)} jobs changed"
        message = subject + ("\n\n" + "\n".join(f"- {c}" for c in changes) if len(changes) > 1 else "")
        try:
            report.status_commit = self.repo.commit_status(files, message)
            self.repo.push()
            self._push_pending = False
        except GitError as exc:
            self._push_pending = True
            report.errors.append(str(exc))


def repository_identity(root_commit: str) -> str:
    """`r` + the first 12 hex digits of the root commit: a valid identity for any repository."""
    return f"r{root_commit[:12]}"


def read_run(storage: str, job: str, run_id: str, options: dict[str, str]) -> RunObservation:
    try:
        folder = RunFolder.for_run(storage, job, run_id, options)
        progress = folder.progress()
        return RunObservation(
            lease_epoch=folder.lease_epoch(),
            durable_step=folder.durable_step(),
            heartbeat_step=progress.step if progress else None,
            heartbeat_epoch=progress.epoch if progress else None,
            heartbeat_time=progress.time if progress else None,
            done=folder.done() is not None,
        )
    except (StorageError, OSError, ValueError) as exc:
        return RunObservation(error=str(exc))


def _describe(action: object) -> str:
    from reconciler.plan import Launch, Terminate

    if isinstance(action, Launch):
        return f"launch {action.job} ({action.run_id}) on {action.provider}: {action.reason}"
    if isinstance(action, Terminate):
        return f"terminate {action.ref.id} on {action.ref.provider}: {action.reason}"
    return str(action)


def _change_line(old: JobStatus | None, new: JobStatus) -> str:
    if old is None:
        return f"{new.job}: {new.phase.value} ({new.message})"
    if old.phase != new.phase:
        return f"{new.job}: {old.phase.value} -> {new.phase.value} ({new.message})"
    if old.progress.step != new.progress.step and old.message == new.message:
        pct = new.progress.percent()
        share = f" ({pct:.0f}%)" if pct is not None else ""
        return f"{new.job}: {new.phase.value}, checkpointed step {new.progress.step}{share}"
    return f"{new.job}: {new.phase.value} ({new.message})"
