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
from typing import IO, Any, cast

from adapters import drills
from adapters.compute import ComputeAdapter, ProviderConfigError, WorkerPhase, WorkerRef
from adapters.gitrepo import DESIRED_DIR, STATUS_DIR, TRAILER, GitError, StateRepo, status_branch_for
from adapters.leader import Election, Leadership
from adapters.notify import Notifier
from adapters.registry import make_adapter
from adapters.signatures import Signatures
from adapters.storage import RunFolder, StorageError
from adapters.stores import open_store
from adapters.stores.faults import StoreFault, classify, probe
from desired.models import Provider, Settings
from desired.parse import SETTINGS_FILE, DesiredState, parse_desired, parse_settings
from reconciler.clock import Clock, SystemClock
from reconciler.daemon.asking import Busy, ProviderCall, ProviderCalls
from reconciler.daemon.conditions import Conditions
from reconciler.daemon.execute import execute, store_options
from reconciler.daemon.notices import events, messages, store_messages
from reconciler.daemon.subjects import status_message
from reconciler.planner.dependencies import held_by_dependency
from reconciler.planner.ledger import build_ledger
from reconciler.planner.outlook.deadline import PlacementPolicy, choose
from reconciler.planner.outlook.reliability import RoomWatch
from reconciler.planner.plan import Observed, Plan, RunObservation, apply_results, cancelled_by, confirms_cancel, plan
from reconciler.planner.tick import live
from reconciler.trust.policy import act_on, hold_note
from reconciler.trust.redaction import secret_values
from reconciler.trust.signatures import SignedHistory, with_hold
from status.models import (
    DrillPhase,
    JobStatus,
    ProviderLedger,
    parse_status,
    render_index,
    render_ledger,
    render_status,
)
from status.redact import Redactor, redact_data
from status.room import ROOM_ALONE_SECONDS, ROOM_FILE, parse_room, render_room, room_words
from status.text import one_line

log = logging.getLogger("reconciler")
ROOM_PATH = f"{STATUS_DIR}/{ROOM_FILE}"
ROOM_SUBJECT = "Save what the daemon has seen of each provider's room (status/room.yaml)"

AdapterFactory = Callable[[Provider, str], ComputeAdapter]  # (provider, owner identity)


class AlreadyRunning(Exception):
    pass


class SettingsHold(Exception):
    """reconciler.yaml cannot be read: the tick acts on nothing rather than on defaults."""


@dataclass
class TickReport:
    commit: str = ""  # the desired state acted on: HEAD, or the newest trusted commit while a change is held
    head: str = ""  # the reconciled branch's tip this tick read
    status_commit: str | None = None
    actions: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    statuses: dict[str, JobStatus] = field(default_factory=dict)
    desired: DesiredState | None = None
    standby: Leadership | None = None  # another daemon leads: this tick did nothing
    halted: str | None = None  # the leader lease could not be renewed: this tick did nothing, and says why
    runs: dict[tuple[str, str], RunObservation] = field(default_factory=dict)  # what storage said, (job, run id)
    seconds: float = 0.0  # how long the tick took (measured by the daemon)
    provider_calls: dict[str, ProviderCall] = field(default_factory=dict)  # how each provider's call went

    @property
    def all_terminal(self) -> bool:
        """Every job is finished, or held by a job it runs after that will not succeed as it is:
        neither moves without a new commit, so `run --until-done` stops (and says which failed)."""
        if self.desired is None or not self.desired.jobs:
            return False
        return all(j in self.statuses and (self.statuses[j].phase.terminal or held_by_dependency(self.statuses[j]))
                   for j in self.desired.jobs)


class Reconciler:
    def __init__(self, repo: str | os.PathLike[str] | StateRepo, *, clock: Clock | None = None,
                 adapter_factory: AdapterFactory = make_adapter, environ: Mapping[str, str] | None = None,
                 storage_override: str | None = None, remote: str | None = None,
                 placement_policy: PlacementPolicy | None = None, provider_calls: ProviderCalls | None = None) -> None:
        # A StateRepo-like object may be passed in (the simulator's in-memory repository).
        self.repo = StateRepo(repo) if isinstance(repo, str | os.PathLike) else repo
        self.clock = clock or SystemClock()
        self.adapter_factory = adapter_factory
        self.environ = os.environ if environ is None else environ
        self.storage_override = storage_override
        self.remote = remote
        if remote is not None:  # known before the first settings are read (a clone of a URL)
            self.repo.remote = remote
        self.placement_policy = placement_policy or choose  # benchmarks pass baselines
        self._adapters: dict[str, tuple[str, ComputeAdapter]] = {}
        self.provider_calls = provider_calls or ProviderCalls()
        self._root_identity: str | None = None
        self._foreign_seen: dict[str, int] = {}
        self.conditions = Conditions(log)  # tick errors and warnings: said when they start and end
        self._lock: IO[str] | None = None
        self._heartbeats: dict[tuple[str, str], tuple[object, float, int]] = {}
        self.room = RoomWatch()  # how long each provider stays without room (the deadline policy's lookahead)
        self._room_blob: bytes | None = None  # status/room.yaml as last read from git
        self._room_read: bytes | None = None  # the one last taken up (or found unreadable)
        self._room_written: float | None = None  # the last look saved to git (or the first look)
        # Status commits a push did not deliver go out with the next push, even in a tick that
        # changes nothing; a new process pushes once, for what an earlier one left unpushed.
        self._push_pending = True
        self._desired_cache: tuple[tuple[str | None, bytes | None], DesiredState] | None = None
        self._status_cache: dict[bytes, JobStatus | None] = {}
        # Secret values never reach git; the log filter of the CLI reads this too.
        self._secret_values = secret_values(None, self.environ)
        self.redactor = Redactor(self._secret_values)
        # Set by the daemon and `run --once`: act only while holding the leader lease in storage.
        self.election: Election | None = None
        # Set by `reconciler run`: sends the events of each committed status change (reconciler.daemon.notices).
        self.notifier: Notifier | None = None
        # reconciler.yaml's `signatures:` (adapters/signatures.py); not for in-memory repositories.
        self.signed = (SignedHistory(Signatures(self.repo.repo), self.repo.subdir) if isinstance(self.repo, StateRepo)
                       else None)
        self.store_fault: StoreFault | None = None  # what the last probe of run storage found wrong

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

    # ---- one active daemon across clones (adapters/leader.py) ---------------------------------------
    def leadership(self) -> Leadership | None:
        """Take or renew the leader lease; None when no election is set (tests, the simulator)."""
        if self.election is None:
            return None
        settings = self.settings_at(self.repo.head())
        return self.election.hold(settings.storage, dict(settings.storage_options),
                                  self.repository_key(settings.identity), settings.tick_seconds, self.clock.now())

    def settings_at(self, commit: str) -> Settings:
        """reconciler.yaml at `commit`, its storage resolved as every tick resolves it."""
        return self.resolved(parse_settings(self.repo.read_settings(commit))[0])

    def resolved(self, settings: Settings) -> Settings:
        """`storage` as this daemon uses it: the override it was started with, else the setting, else
        a folder of this repository's own (desired.models.REPOSITORY_STORAGE)."""
        if self.storage_override:
            return settings.model_copy(update={"storage": self.storage_override})
        return settings.for_repository(self.repository_key(settings.identity))

    def repository_key(self, identity: str | None) -> str:
        """The same for every clone: the identity setting, else derived from the first commit."""
        if identity:
            return identity
        if self._root_identity is None:
            self._root_identity = repository_identity(self.repo.root_commit())
        return self._root_identity

    def lease_fault(self, exc: Exception) -> str:
        """The leader lease cannot be renewed: this daemon stops acting (no launch, no stop, no status
        commit) until it can, and says so once."""
        fault = classify(exc)  # its words, without the temporary names that change on every try
        message = (f"not acting: cannot renew the leader lease ({fault.describe() if fault else exc}); "
                   "acting again once it is renewed")
        self.conditions.holds("lease", message)
        return message

    def lease_held(self, leader: Leadership | None) -> None:
        if leader is not None and leader.fault is not None:
            self.conditions.holds("lease", f"cannot renew the leader lease: {leader.fault}; leading until it "
                                           f"expires, launching nothing")
        else:
            self.conditions.ended("lease", "the leader lease is renewed again; acting again")

    def resign(self) -> None:
        if self.election is not None:
            self.election.resign(self.clock.now())

    # ---- reading the world ------------------------------------------------------------------------
    def read_desired(self, commit: str, cache: bool = True) -> DesiredState:
        """Parsed once per distinct desired/ tree and settings file: most ticks reuse it."""
        settings_text = self.repo.read_settings(commit)
        key = (self.repo.tree_id(commit, DESIRED_DIR), settings_text)
        if self._desired_cache is not None and self._desired_cache[0] == key and key[0] is not None:
            desired = self._desired_cache[1]
        else:
            desired = parse_desired(self.repo.read_files(commit, DESIRED_DIR), settings_text)
            if cache:
                self._desired_cache = (key, desired)
        desired.settings = self.resolved(desired.settings)
        return desired

    def read_recorded(self, commit: str) -> dict[str, JobStatus]:
        recorded: dict[str, JobStatus] = {}
        cache: dict[bytes, JobStatus | None] = {}
        for path, blob in self.repo.read_files(commit, STATUS_DIR).items():
            if not path.endswith(".yaml"):
                continue
            if path == ROOM_PATH:
                self._room_blob = blob
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
        return self.repository_key(desired.settings.identity)

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
        """Providers are asked all at once, each within the deadline (reconciler.daemon.asking); one that
        does not answer in time is unreachable this tick, and in `adapters` a `Busy` stands in for it
        while its call is still out, so that nothing else uses it meanwhile."""
        observed = Observed()
        self.provider_calls.deadline = desired.settings.provider_deadline_seconds
        present = {name: adapters[name] for name in desired.providers if name in adapters}
        for name in desired.providers.keys() - present.keys():
            observed.unreachable[name] = "adapter could not be built"
        with_capacity = {name for name in present if desired.providers[name].spec.resources is None}
        for name, answer in self.provider_calls.ask(present, with_capacity).items():
            if isinstance(answer, str):  # any failure to ask is "unknown", never "gone"
                observed.unreachable[name] = answer
                errors.append(f"cannot observe provider {name}: {answer}")
                continue
            observed.workers.update(answer.workers)
            if answer.capacity is not None:
                observed.capacity[name] = answer.capacity
            if answer.allowance is not None:
                observed.allowances[name] = answer.allowance
            if answer.free_slots is not None:
                observed.free_slots[name] = answer.free_slots
                ours = any(ref.provider == name and live(state) for ref, state in answer.workers.items())
                self.room.see(name, self.clock.now(), answer.free_slots > 0 or ours)
            self._note_foreign(name, answer.foreign)
        for name, age in self.provider_calls.busy().items():
            adapters[name] = cast(ComputeAdapter, Busy(name, age))
        runs = {(name, job.run_id()) for name, job in desired.jobs.items()}
        runs |= {(st.job, st.run_id) for st in recorded.values() if st.run_id and not st.phase.terminal}
        observed.room_waits, observed.room_shapes = self.room.waits(), self.room.shapes()
        settings = desired.settings
        # A run is read where its status says its folder is (a changed `storage:` moves it later).
        observed.run_storage = {(st.job, st.run_id): st.storage for st in recorded.values() if st.storage}
        drilling = {(st.job, st.run_id): st.drill.id for st in recorded.values()
                    if st.drill is not None and st.drill.phase != DrillPhase.DONE}
        for job, run_id in sorted(runs):
            store = observed.run_storage.get((job, run_id), settings.storage)
            run = read_run(store, job, run_id, store_options(store, settings), drilling.get((job, run_id)))
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
                    observed.logs[ref] = adapters[ref.provider].logs(ref, 40) or self._stored_log(
                        observed.run_storage.get((st.job, st.run_id), settings.storage), ref, settings)
                except Exception as exc:
                    observed.logs[ref] = f"(log unavailable: {exc})"
        return observed

    @staticmethod
    def _stored_log(store: str, ref: WorkerRef, settings: Settings, lines: int = 40) -> str:
        """The tail a hosted bootstrap copied into the run folder, for providers with no log API."""
        text = RunFolder.for_run(store, ref.job, ref.run_id, store_options(store, settings)).attempt_log(ref.epoch)
        return "\n".join(text.splitlines()[-lines:])

    def _recall_room(self, now: float) -> None:
        """Takes up status/room.yaml where it is newer than this process's own looks: after a
        restart, or after another daemon led for a while."""
        blob = self._room_blob
        if blob is None or blob == self._room_read:
            return
        self._room_read = blob
        try:
            saved = parse_room(blob)
        except ValueError as exc:
            log.warning("%s cannot be read: %s; the deadline policy learns each provider's room afresh, and the "
                        "next status commit rewrites the file", ROOM_PATH, exc)
            return
        newest = max((ev.seen_at for ev in saved.values()), default=None)
        latest = self.room.latest()
        if newest is not None and (latest is None or newest > latest):
            self.room = RoomWatch.recalled(saved, now)
            self._room_written = newest

    def _room_file(self, with_status: bool) -> tuple[str, float] | None:
        """status/room.yaml and the look it holds, when it is to be written: with every status
        change, and alone when the last one written is ROOM_ALONE_SECONDS old (a week of watching
        survives a restart). It counts as written once its commit is made (`_room_committed`)."""
        latest = self.room.latest()
        if latest is None:
            return None
        if self._room_written is None:
            self._room_written = latest
        if not with_status and latest - self._room_written < ROOM_ALONE_SECONDS:
            return None
        return self.redactor.redact(render_room(self.room.evidence())), latest

    def _room_committed(self, room: tuple[str, float] | None, committed: bool) -> None:
        """A commit that failed leaves the file due: the next tick tries again, not six hours later."""
        if room is not None and committed:
            self._room_written = room[1]

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

    def retired_providers(self, desired: DesiredState, recorded: dict[str, JobStatus]) -> dict[str, Provider]:
        """Providers that live attempts ran on but that desired/ no longer defines, as the newest
        earlier state of desired/ defined them (looked up only when one is missing)."""
        out: dict[str, Provider] = {}
        lost: list[str] = []
        for st in recorded.values():
            att = st.current
            if att is None or att.provider in desired.providers or att.provider in out or not st.desired_commit:
                continue
            found = self._last_definition(att.provider, st.desired_commit)
            if found is None:
                lost.append(f"{st.job}: provider {att.provider} is defined in no recent commit; its worker "
                            f"{att.worker} cannot be stopped from here")
            else:
                out[att.provider] = found
        self.conditions.exactly("retired", lost)
        return out

    def _last_definition(self, provider: str, commit: str, depth: int = 50) -> Provider | None:
        at: str | None = commit
        for _ in range(depth):
            if at is None:
                return None
            try:
                then = self.read_desired(at, cache=False)
                if provider in then.providers:
                    return then.providers[provider]
                at = self.repo.last_change(f"{at}^", [DESIRED_DIR])
            except (GitError, ValueError, KeyError):
                return None
        return None

    def _cancel_confirmed(self, commit: str, desired: DesiredState, recorded: dict[str, JobStatus]) -> bool:
        """A commit from the newest one that changed the manifests of the jobs this state would
        cancel, up to `commit`, carries the trailer that confirms it. Read from git on every tick, so
        a held change stays held across ticks, restarts and leader changes; a later delete without
        the trailer is held again, whatever was confirmed before it."""
        doomed = cancelled_by(desired, recorded)
        if not doomed:
            return False
        paths = sorted({st.manifest for st in doomed if st.manifest}) or [DESIRED_DIR]
        since = self.repo.last_change(commit, paths) or commit
        return any(confirms_cancel(m) for m in self.repo.messages_since(commit, since))

    # ---- the tick ------------------------------------------------------------------------------
    def configure_repo(self) -> None:
        """Remote, commit identity and status branch come from reconciler.yaml (the remote may be
        overridden by the constructor); read before pulling."""
        try:
            settings, _ = parse_settings(self.repo.read_settings(self.repo.head()))
        except GitError:
            return
        self.repo.remote = self.remote if self.remote is not None else settings.remote
        self.repo.name, self.repo.email = settings.commit_name, settings.commit_email
        if isinstance(self.repo, StateRepo):  # the simulator's in-memory repository keeps status on its branch
            self.repo.status_branch = status_branch_for(settings.status_branch, self.repo.remote)

    def status_source(self, commit: str) -> str:
        """The commit recorded status is read from: the status branch's newest, when status has one
        and it exists (locally or as the remote's copy), else `commit` itself."""
        tip = self.repo.status_tip() if isinstance(self.repo, StateRepo) else None
        return tip or commit

    def fresh_status(self, fetch: bool) -> str:
        """For `reconciler status`: the commit to read recorded status from, after fetching first
        when asked (a clone the daemon keeps for a URL); a fetch that fails reads what is here."""
        self.configure_repo()
        if fetch:
            try:
                self.repo.pull()
            except GitError as exc:
                log.warning("%s; showing the status last fetched", exc)
        return self.status_source(self.repo.head())

    def _status_message(self, message: str, commit: str) -> str:
        """On a status branch each commit says which desired commit it was computed from."""
        if isinstance(self.repo, StateRepo) and self.repo.status_branch:
            return f"{message}\n\n{TRAILER}: {commit}\n"
        return message

    def _look_and_plan(self, report: TickReport, probe_store: bool = False) -> tuple[
            Plan, DesiredState, dict[str, JobStatus], dict[str, ComputeAdapter], Observed, float]:
        """Read git, storage and providers at HEAD and plan: the part a preview and a tick share."""
        head = self.repo.head()
        trust = self.signed.trust(head) if self.signed is not None else None
        commit = act_on(head, trust) if trust is not None else head  # an unverified change is held
        report.commit, report.head = commit, head
        desired = self.read_desired(commit)
        self._learn_secrets(desired)  # before anything of this tick is logged
        report.errors.extend(str(e) for e in desired.errors)
        if any(e.file == SETTINGS_FILE for e in desired.errors):
            report.desired = desired  # its errors are what `plan` and `validate` report
            # Defaults in place of broken settings would point at another store and providers.
            raise SettingsHold(f"{SETTINGS_FILE} has errors: every job is held as it is (nothing launched, "
                               "stopped or committed) until they are fixed")
        if self.signed is None and desired.settings.signatures is not None:
            report.desired = desired
            raise SettingsHold(f"{SETTINGS_FILE} asks for signed changes, but this state is not in a git repository, "
                               "so no signature can be checked: nothing is launched, stopped or committed")
        held = hold_note(trust) if trust is not None else None
        desired = with_hold(desired, held, report.errors)
        report.desired = desired
        recorded = self.read_recorded(self.status_source(head))
        retired = self.retired_providers(desired, recorded)
        # Providers gone from desired/ are still asked, so their workers can be stopped and billed.
        view = replace(desired, providers={**retired, **desired.providers})
        adapters = self.adapters_for(view, report.errors)
        now = self.clock.now()
        self._recall_room(now)
        observed = self.observe(view, recorded, adapters, report.errors, now)
        report.provider_calls = dict(self.provider_calls.calls)
        observed.retired = retired
        observed.store_fault = self._probe_store(desired.settings, recorded) if probe_store else self.store_fault
        confirmed = self._cancel_confirmed(commit, desired, recorded)
        the_plan = plan(desired, observed, recorded, now, commit, confirm_cancel=confirmed,
                        policy=self.placement_policy)
        if held is not None:  # the signature check's hold; else each status keeps the planner's (a held cancel)
            the_plan.statuses = {name: st if st.held == held else st.model_copy(update={"held": held}, deep=True)
                                 for name, st in the_plan.statuses.items()}
        report.errors.extend(the_plan.notes)
        report.actions = [_describe(a) for a in the_plan.actions]
        report.statuses = the_plan.statuses
        report.runs = observed.runs
        return the_plan, desired, recorded, adapters, observed, now

    def preview(self) -> tuple[Plan, TickReport]:
        """What the next tick would do, without doing it (no launch, no commit, no pull)."""
        report = TickReport()
        self.configure_repo()
        try:
            the_plan = self._look_and_plan(report)[0]
        except SettingsHold as exc:
            report.errors.append(str(exc))
            return Plan(), report
        return the_plan, report

    def tick(self) -> TickReport:
        report = TickReport()
        self.configure_repo()
        try:
            self.repo.pull()
        except GitError as exc:
            report.errors.append(str(exc))
        try:
            leader = self.leadership()
        except StorageError as exc:
            report.halted = self.lease_fault(exc)
            return report
        self.lease_held(leader)
        if leader is not None and not leader.leading:
            report.standby = leader  # another daemon acts on this repository; this one waits
            return report
        try:
            the_plan, desired, recorded, adapters, observed, now = self._look_and_plan(report, probe_store=True)
        except SettingsHold as exc:
            report.errors.append(str(exc))
            self.conditions.exactly("tick", report.errors)
            return report
        commit = report.commit
        result = execute(the_plan.actions, jobs=desired.jobs, adapters=adapters, settings=desired.settings,
                         environ=self.environ)
        report.errors.extend(result.errors)
        durable = {k: v.durable_step for k, v in observed.runs.items()}
        apply_results(the_plan, result.launches, now, durable, result.moves)
        ledger = build_ledger(desired.providers, the_plan.statuses.values(), desired.jobs, observed.allowances, now,
                              {n: c.words() for n, c in report.provider_calls.items() if c.slow})
        self._commit(the_plan, recorded, desired, commit, report, ledger, observed.store_fault)
        self._notify(recorded, desired, report)
        self._notify_store(observed.store_fault, desired)
        self.conditions.exactly("tick", report.errors)  # a fetch error, a held change: once, not every tick
        return report

    def _commit(self, the_plan: Plan, recorded: dict[str, JobStatus], desired: DesiredState, commit: str,
                report: TickReport, ledger: list[ProviderLedger] | None = None,
                store_fault: StoreFault | None = None) -> None:
        """Writes the changed job statuses, the index and the provider ledger (which rides along with
        a status change, never commits alone: its figures move every tick)."""
        self._learn_secrets(desired)
        files: dict[str, str | None] = {}
        changes = []
        changed: list[tuple[JobStatus | None, JobStatus]] = []
        desired_commit = self.repo.last_change(commit, [DESIRED_DIR, "reconciler.yaml"]) or commit
        status_at = self.status_source(report.head or commit)  # where `recorded` was read
        for name, st in sorted(the_plan.statuses.items()):
            old = recorded.get(name)
            if old is not None and old == st:
                continue  # unchanged: no need to render it to find out
            text = self._render_redacted(st)
            old_text = self.repo.read_file(status_at, f"{STATUS_DIR}/{name}.yaml")
            if old_text is not None and old_text.decode() == text:
                continue
            st.desired_commit = desired_commit[:12]
            text = self._render_redacted(st)
            files[f"{STATUS_DIR}/{name}.yaml"] = text
            changes.append(one_line(self.redactor.redact(_change_line(old, st))))  # a commit message line
            changed.append((old, st))
        room = self._room_file(with_status=bool(files))
        if not files:
            if room is not None:
                committed = self._commit_files({ROOM_PATH: room[0]}, self._status_message(ROOM_SUBJECT, commit),
                                               report)
                self._room_committed(room, committed)
            elif self._push_pending:
                try:
                    self.repo.push()
                    self._push_pending = False
                except GitError as exc:
                    report.errors.append(str(exc))
            return
        if room is not None:
            files[ROOM_PATH] = room[0]
        deadlines = {name: job.spec.deadline.timestamp() for name, job in desired.jobs.items() if job.spec.deadline}
        index = render_index([self._redacted(st) for st in the_plan.statuses.values()],
                             [str(e) for e in desired.errors], ledger or [], deadlines,
                             store_fault.describe() if store_fault else None,
                             {name: room_words(ev) for name, ev in self.room.evidence().items()})
        if ledger:
            files[f"{STATUS_DIR}/providers.yaml"] = self.redactor.redact(render_ledger(ledger))
        files[f"{STATUS_DIR}/README.md"] = self.redactor.redact(index)
        report.changed = changes
        message = status_message(changes, changed, [one_line(self.redactor.redact(new.message)) for _, new in changed])
        self._room_committed(room, self._commit_files(files, self._status_message(message, commit), report))

    def _commit_files(self, files: dict[str, str | None], message: str, report: TickReport) -> bool:
        """Commits and pushes `files`; False where the commit could not be made (a push that fails
        is tried again next tick, the commit kept)."""
        try:
            report.status_commit = self.repo.commit_status(files, message)
        except GitError as exc:
            self._push_pending = True
            report.errors.append(str(exc))
            return False
        try:
            self.repo.push()
            self._push_pending = False
        except GitError as exc:
            self._push_pending = True
            report.errors.append(str(exc))
        return True


    def _notify(self, recorded: dict[str, JobStatus], desired: DesiredState, report: TickReport) -> None:
        """Hands the events of the status this tick committed to the notifier (it never waits for it)."""
        rules = desired.settings.notifications
        if self.notifier is None or report.status_commit is None or not rules.targets:
            return
        budgets = {name: job.spec.budget_usd for name, job in desired.jobs.items()}
        for msg in messages(events(recorded, report.statuses, budgets, rules), rules):
            self.notifier.submit(msg.url_env, self.redactor.redact(msg.title), self.redactor.redact(msg.body),
                                 msg.level)

    def _probe_store(self, settings: Settings, recorded: dict[str, JobStatus]) -> StoreFault | None:
        """One small write, read and delete in run storage per tick: what is wrong with it, if
        anything. Said once when a fault starts (or changes) and once when it ends."""
        ran_here = any(st.attempts and not st.phase.terminal and (st.storage or settings.storage) == settings.storage
                       for st in recorded.values())  # an unfinished run's data should be there
        try:
            fault = probe(open_store(settings.storage, store_options(settings.storage, settings)), ran_here)
        except StorageError as exc:  # the store cannot even be opened (a bad URL): not a fault of it
            log.debug("run storage not probed: %s", exc)
            fault = None
        if fault is not None:
            self.conditions.holds("store", f"{fault.describe()}: nothing is charged or launched until it is back")
        else:
            self.conditions.ended("store", "run storage works again; jobs carry on from their durable progress")
        return fault

    def _notify_store(self, fault: StoreFault | None, desired: DesiredState) -> None:
        """One notification when run storage's fault starts, changes or ends (this process's view)."""
        before = self.store_fault.describe() if self.store_fault else None
        self.store_fault = fault
        if self.notifier is None:
            return
        for msg in store_messages(before, fault.describe() if fault else None, desired.settings.notifications):
            self.notifier.submit(msg.url_env, self.redactor.redact(msg.title), self.redactor.redact(msg.body),
                                 msg.level)

    def _learn_secrets(self, desired: DesiredState) -> None:
        """The values to mask: those named by the manifests, as the daemon's environment holds them."""
        values = secret_values(desired, self.environ)
        if values != self._secret_values:
            self._secret_values, self.redactor = values, Redactor(values)

    def _redacted(self, st: JobStatus) -> JobStatus:
        """A copy with secret values masked in every field, before any rendering can escape or
        fold them; `st` itself (the planner's) keeps what it holds."""
        if not self.redactor:
            return st
        return JobStatus.model_validate(redact_data(self.redactor, st.model_dump()))

    def _render_redacted(self, st: JobStatus) -> str:
        return self.redactor.redact(render_status(self._redacted(st)))


def repository_identity(root_commit: str) -> str:
    """`r` + the first 12 hex digits of the root commit: a valid identity for any repository."""
    return f"r{root_commit[:12]}"


def read_run(storage: str, job: str, run_id: str, options: dict[str, str],
             drill_id: str | None = None) -> RunObservation:
    """What storage says about one run; `drill_id`: also the records of that drill, under way."""
    try:
        folder = RunFolder.for_run(storage, job, run_id, options)
        progress = folder.progress()
        done = folder.done()
        return RunObservation(
            lease_epoch=folder.lease_epoch(),
            durable_step=folder.durable_step(),
            heartbeat_step=progress.step if progress else None,
            heartbeat_epoch=progress.epoch if progress else None,
            heartbeat_time=progress.time if progress else None,
            heartbeat_stopping=progress.stopping if progress else None,
            heartbeat_save_seconds=progress.save_seconds if progress else None,
            heartbeat_save_every_seconds=progress.save_every_seconds if progress else None,
            heartbeat_metrics=dict(progress.metrics) if progress else {},
            reached_step=progress.reached if progress else None,
            done=done is not None,
            done_time=_number(done.get("time")) if done else None,
            done_step=int(step) if done and isinstance(step := done.get("step"), int) else None,
            outputs=_listed_outputs(done),
            drill=drills.read(folder, drill_id) if drill_id else None,
        )
    except (StorageError, OSError, ValueError) as exc:
        return RunObservation(error=str(exc))


def _listed_outputs(done: dict[str, Any] | None) -> tuple[tuple[str, int], ...]:
    """(path, bytes) of each output the completion record lists; a malformed list shows as none here
    (`reconciler artifacts` says what is wrong with it)."""
    files = ((done or {}).get("outputs") or {}).get("files")
    if not isinstance(files, dict):
        return ()
    return tuple(sorted((str(k), int(v["size"])) for k, v in files.items()
                        if isinstance(v, dict) and isinstance(v.get("size"), int)))


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _describe(action: object) -> str:
    from reconciler.planner.plan import ArmDrill, Launch, MoveRunData, RequestStop, Terminate

    if isinstance(action, Launch):
        return f"launch {action.job} ({action.run_id}) on {action.provider}: {action.reason}"
    if isinstance(action, Terminate):
        return f"terminate {action.ref.id} on {action.ref.provider}: {action.reason}"
    if isinstance(action, ArmDrill):
        return f"ask {action.ref.id} on {action.ref.provider} to drill ({action.drill_id})"
    if isinstance(action, RequestStop):
        return f"ask {action.ref.id} on {action.ref.provider} to save and stop: {action.reason}"
    if isinstance(action, MoveRunData):
        return f"move the data of {action.job} ({action.run_id}) from {action.source} to {action.target}"
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
