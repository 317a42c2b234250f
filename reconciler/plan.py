"""The planner: every decision of the loop, as a pure function of what is wanted and what is seen.

`plan(desired, observed, recorded, now)` returns the actions to take and the status each job
would have if they succeed; `apply_results` folds in what the executor reports. Nothing here
does I/O or reads the clock, so every rule is tested with tables of inputs and expected actions.

Each job goes through the same named steps in a fixed order (as Flux's reconcilers run their
guards): identify the run -> fence workers that must not run -> read storage -> adopt an
unrecorded worker -> stop on policy (suspend, deadline, budget) -> judge the live attempt ->
finish -> hold a finished job -> decide the next launch. A step either passes the job on or
settles its status for this tick. How attempts end is judged in `reconciler.judge`; where the
next one goes, in `reconciler.placement`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from adapters.compute import Allowance, WorkerPhase, WorkerRef, WorkerState
from desired.models import Capacity, Job, Provider
from desired.parse import DesiredState
from reconciler.deadline import PlacementPolicy, choose
from reconciler.forecast import Reliability, reliabilities
from reconciler.judge import EXIT_INTERRUPTED, classify, close, end_time, record_close
from reconciler.ledger import WEEK, build_ledger
from reconciler.outlook import Outlook, forecast, outlook, over_budget
from reconciler.placement import PROVIDER_COOLDOWN_SECONDS, Placement, place
from status.models import LOG_TAIL_CHARS, MAX_ATTEMPTS_KEPT, Attempt, JobStatus, Outcome, Phase, Progress, iso

__all__ = ["EXIT_INTERRUPTED", "PROVIDER_COOLDOWN_SECONDS"]

LOST_AFTER_SECONDS = 60.0  # a worker missing from observations this long is lost
PENDING_TIMEOUT_SECONDS = 1800.0  # a launch the provider never starts is given up on
UNAVAILABLE_BACKOFF_SECONDS = 120.0  # a provider that refused a launch is skipped this long
HOST_COOLDOWN_SECONDS = 6 * 3600.0  # a machine that lost a worker of ours is avoided this long
STORAGE_UNREACHABLE_BACKOFF_SECONDS = 3600.0  # a provider whose worker could not reach run storage
STALL_MIN_OBSERVATIONS = 3  # a stall needs this many observations of the same heartbeat
STALE_BY_WORKER_CLOCK = 3  # without observations of our own, a heartbeat this many timeouts old is a stall
DEFAULT_STALL_SECONDS = 300.0  # stall timeout of an instrumented worker when the job sets none
FINISHED_GRACE_SECONDS = 60.0  # a worker still alive this long after its run completed is stopped
CONFIRM_CANCEL_TRAILER = "Reconciler-Confirm: cancel"
MOVING = "moving to"  # detail of an attempt the placement policy stopped to move the run
MOVE_WAIT_SECONDS = 600.0  # after a move, the next launch waits this long for the old worker to save and go


# ---- inputs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunObservation:
    """What storage says about one run."""

    lease_epoch: int = 0
    durable_step: int = 0
    heartbeat_step: int | None = None
    heartbeat_epoch: int | None = None
    heartbeat_time: float | None = None
    heartbeat_stopping: str | None = None  # the SDK's last beat said why it stops: deadline, signal, request
    done: bool = False
    done_time: float | None = None  # the worker's clock when it wrote the completion record
    error: str | None = None  # storage could not be read
    # Since when (reconciler's clock) and over how many observations the heartbeat has not changed;
    # None when the loop has no such memory yet (just started): then nothing is judged stalled.
    heartbeat_unchanged_since: float | None = None
    heartbeat_unchanged_ticks: int = 0
    heartbeat_first_observation: bool = False  # this reconciler process has not watched the run before


@dataclass
class Observed:
    workers: dict[WorkerRef, WorkerState] = field(default_factory=dict)
    unreachable: dict[str, str] = field(default_factory=dict)  # provider -> why it could not be asked
    runs: dict[tuple[str, str], RunObservation] = field(default_factory=dict)  # (job, run_id)
    logs: dict[WorkerRef, str] = field(default_factory=dict)  # tails of exited workers
    capacity: dict[str, Capacity] = field(default_factory=dict)  # provider -> what its adapter reports
    allowances: dict[str, Allowance] = field(default_factory=dict)  # provider -> its quota or credits now
    bad_hosts: frozenset[tuple[str, str]] = frozenset()  # (provider, host): lost a worker of ours lately
    run_storage: dict[tuple[str, str], str] = field(default_factory=dict)  # (job, run_id) -> store it was read from
    # Providers no longer in desired/ that the status says ran workers: asked so those workers can
    # be stopped and billed, never launched on.
    retired: dict[str, Provider] = field(default_factory=dict)
    free_slots: dict[str, int] = field(default_factory=dict)  # provider -> workers it can take now, where it says


# ---- actions ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    job: str
    run_id: str
    provider: str
    reason: str
    avoid_hosts: tuple[str, ...] = ()  # machines of this provider that recently lost a worker of ours


@dataclass(frozen=True)
class Terminate:
    ref: WorkerRef
    reason: str
    # Where the run's folder is, for the stop request the executor writes there first (None: the
    # settings' storage). A locator, not part of what is stopped, so it takes no part in equality.
    store: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class MoveRunData:
    """Copy a run's folder to the store `storage:` now names (verified), before its next attempt."""

    job: str
    run_id: str
    source: str
    target: str


@dataclass(frozen=True)
class RequestStop:
    """Ask a live worker, through its run folder, to save and exit 75 at its next heartbeat, without
    asking the provider to stop it (the provider has announced it will: an interruption notice)."""

    ref: WorkerRef
    reason: str
    store: str | None = field(default=None, compare=False)


Action = Launch | Terminate | MoveRunData | RequestStop


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    statuses: dict[str, JobStatus] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # things worth logging that change nothing


# ---- results from the executor ------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchResult:
    action: Launch
    ref: WorkerRef | None = None
    error: str | None = None
    unavailable: bool = True  # error was the provider's (capacity, API), not the job's config
    job_config_error: bool = False  # the job cannot run as written: fail it at once


@dataclass(frozen=True)
class MoveResult:
    action: MoveRunData
    error: str | None = None


# ---- one job's tick -----------------------------------------------------------------------------


@dataclass
class JobTick:
    """The planner's working state for one job, handed from step to step."""

    job: Job
    st: JobStatus
    run: RunObservation
    workers: dict[WorkerRef, WorkerState]
    desired: DesiredState
    observed: Observed
    now: float
    out: Plan
    busy: dict[str, int]
    current: Attempt | None = None
    policy: PlacementPolicy = choose
    reliability: dict[str, Reliability] = field(default_factory=dict)

    def price(self, provider: str) -> float:
        prov = self.desired.providers.get(provider) or self.observed.retired.get(provider)
        return prov.spec.price_per_hour if prov else 0.0

    def live_refs(self, epoch: int | None = None) -> list[WorkerRef]:
        return [r for r, s in self.workers.items() if _live(s) and r.run_id == self.st.run_id
                and (epoch is None or r.epoch == epoch)]

    def stop(self, ref: WorkerRef, reason: str) -> None:
        if not any(isinstance(a, Terminate) and a.ref == ref for a in self.out.actions):
            self.out.actions.append(Terminate(ref, reason, self.observed.run_storage.get((ref.job, ref.run_id))))

    def close_current(self, outcome: Outcome, detail: str, exit_code: int | None = None,
                      ended: float | None = None) -> None:
        assert self.current is not None
        cur = self.current
        seen = next((s for r, s in self.workers.items()
                     if (r.provider, r.id, r.epoch) == (cur.provider, cur.worker, cur.epoch)), None)
        closed = close(cur, outcome, self.now, self.run, detail, exit_code, self.price(cur.provider), ended,
                       seen.cost_usd if seen else None)
        record_close(self.st, closed.model_copy(update={"host": seen.host}) if seen and seen.host else closed)
        self.current = None


Step = Callable[[JobTick], bool]  # True = the job's status is settled for this tick


def _live(state: WorkerState) -> bool:
    return state.phase in (WorkerPhase.PENDING, WorkerPhase.RUNNING)


# ---- the planner -------------------------------------------------------------------------------


def plan(desired: DesiredState, observed: Observed, recorded: dict[str, JobStatus], now: float,
         commit: str = "", confirm_cancel: bool = False, policy: PlacementPolicy = choose) -> Plan:
    """`confirm_cancel`: the commits being acted on carry the CONFIRM_CANCEL_TRAILER, so a change
    that cancels most jobs at once is meant (otherwise it is held, as Argo CD guards pruning).
    `policy` places runs that have a deadline (reconciler.deadline; benchmarks pass baselines)."""
    out = Plan()
    spot = {name: bool(getattr(p.spec.settings, "interruptible", False)) for name, p in desired.providers.items()}
    reliability = reliabilities(recorded.values(), spot, now)
    observed = replace(observed, allowances={**own_quotas(desired, recorded, observed, now), **observed.allowances},
                       bad_hosts=observed.bad_hosts | bad_hosts(recorded.values(), now))
    busy: dict[str, int] = {}
    by_job: dict[str, dict[WorkerRef, WorkerState]] = {}
    for ref, state in observed.workers.items():
        by_job.setdefault(ref.job, {})[ref] = state
        if _live(state):
            busy[ref.provider] = busy.get(ref.provider, 0) + 1
    held = _mass_cancel_hold(desired, recorded, confirm_cancel)
    if held:
        out.notes.append(held)
    for name in sorted(set(desired.jobs) | set(recorded)):
        job = desired.jobs.get(name)
        workers = by_job.get(name, {})
        if job is None:
            _plan_removed(out, recorded[name], workers, desired, observed, now, held)
        else:
            _plan_job(out, job, recorded.get(name), workers, desired, observed, now, commit, busy,
                      policy, reliability)
    return out


def bad_hosts(statuses: Iterable[JobStatus], now: float) -> frozenset[tuple[str, str]]:
    """Machines where an attempt of ours was interrupted in the last HOST_COOLDOWN_SECONDS (a Vast.ai
    host that lost its network, say): the next launches on that provider avoid them, whatever the job."""
    return frozenset(
        (a.provider, a.host) for st in statuses for a in st.attempts
        if a.host and a.outcome == Outcome.INTERRUPTION and a.ended is not None
        and now - a.ended < HOST_COOLDOWN_SECONDS)


def own_quotas(desired: DesiredState, recorded: dict[str, JobStatus], observed: Observed,
               now: float) -> dict[str, Allowance]:
    """A provider's `free_quota_hours` binds: what is left this week by our own ledger (worker hours
    in the status), for providers whose API reports no allowance of its own."""
    quota = {name: p for name, p in desired.providers.items()
             if p.spec.free_quota_hours is not None and name not in observed.allowances}
    if not quota:
        return {}
    lines = build_ledger(quota, recorded.values(), desired.jobs, {}, now)
    return {x.provider: Allowance("free hours", remaining=(quota[x.provider].spec.free_quota_hours or 0.0)
                                  - x.worker_hours, resets_at=x.period_start + WEEK) for x in lines}


def _plan_job(out: Plan, job: Job, rec: JobStatus | None, workers: dict[WorkerRef, WorkerState],
              desired: DesiredState, observed: Observed, now: float, commit: str, busy: dict[str, int],
              policy: PlacementPolicy, reliability: dict[str, Reliability]) -> None:
    st = identify(job, rec, desired, observed, now, commit)
    run = observed.runs.get((job.name, st.run_id), RunObservation())
    t = JobTick(job, st, run, workers, desired, observed, now, out, busy, st.current, policy, reliability)
    for step in STEPS:
        if step(t):
            break
    _trim(t.st)
    _keep_settled_forecast(t.st, rec)
    out.statuses[job.name] = t.st


def _keep_settled_forecast(st: JobStatus, rec: JobStatus | None) -> None:
    """The forecast's figures move every tick; they ride along with other changes of the status
    (progress in tenths, attempts, phase) and with a change of risk or placement, never commit alone."""
    if rec is None or rec.forecast is None or st.forecast is None:
        return
    if (st.forecast.risk, st.forecast.placement) != (rec.forecast.risk, rec.forecast.placement):
        return
    if st.model_copy(update={"forecast": rec.forecast}) == rec:
        st.forecast = rec.forecast


def identify(job: Job, rec: JobStatus | None, desired: DesiredState, observed: Observed, now: float,
             commit: str) -> JobStatus:
    """Step 1: which run this is. A changed command/code/env starts a new run (the old attempt is
    closed as replaced); a manifest restored after a delete revives its cancelled run."""
    run_id = job.run_id()
    target = job.spec.target_steps
    manifest = desired.job_files.get(job.name, "")
    if rec is None or rec.run_id != run_id:
        st = JobStatus(job=job.name, run_id=run_id, manifest=manifest, desired_commit=commit,
                       progress=Progress(target=target), message="new job")
        if rec is not None:
            st.message = f"run {run_id} replaces {rec.run_id}: the command, code or env changed"
            st.attempts = [a for a in rec.attempts if not a.open][-MAX_ATTEMPTS_KEPT:]
            if rec.current is not None:
                run_old = observed.runs.get((job.name, rec.run_id), RunObservation())
                st.attempts.append(close(rec.current, Outcome.CANCELLED, now, run_old, "replaced by a new run"))
        return st
    st = rec.model_copy(deep=True)
    st.manifest = manifest
    st.progress = Progress(step=st.progress.step, target=target)
    if st.phase == Phase.CANCELLED and st.current is None:
        st.phase = Phase.PENDING
        st.message = f"manifest restored: the run resumes from its durable progress (step {st.progress.step})"
    return st


def fence(t: JobTick) -> bool:
    """Step 2: workers that must not run: other runs of this job, and older epochs (zombies)."""
    for ref, state in t.workers.items():
        if not _live(state):
            continue
        if ref.run_id != t.st.run_id:
            t.stop(ref, f"run {ref.run_id} was replaced by {t.st.run_id}")
        elif ref.epoch < t.run.lease_epoch and (t.current is None or ref.epoch != t.current.epoch):
            t.stop(ref, f"stale worker of epoch {ref.epoch}; lease is at {t.run.lease_epoch}")
    return False


def read_storage(t: JobTick) -> bool:
    """Step 3: storage that cannot be read decides nothing about the run. A finished job keeps its
    own message (the reason it failed must survive a storage outage)."""
    t.st.storage = t.observed.run_storage.get((t.job.name, t.st.run_id), t.desired.settings.storage)
    if t.st.storage != t.desired.settings.storage and t.current is not None:
        t.out.notes.append(f"{t.job.name}: storage change to {t.desired.settings.storage} held while attempt "
                           f"{t.current.epoch} is live on {t.st.storage}")
    if t.run.error:
        if not t.st.phase.terminal:
            t.st.message = f"run data unreadable, waiting: {t.run.error}"
        return True
    target = t.job.spec.target_steps
    t.st.progress = Progress(step=_status_step(t.st.progress.step, t.run.durable_step, target), target=target)
    return False


def adopt(t: JobTick) -> bool:
    """Step 4: a worker that holds the lease but is not recorded (the daemon died after launching
    it) becomes the current attempt instead of being duplicated."""
    if t.current is not None or t.st.phase.terminal or t.run.lease_epoch <= 0:
        return False
    for ref in t.live_refs(t.run.lease_epoch):
        adopted = Attempt(epoch=ref.epoch, provider=ref.provider, worker=ref.id, started=t.now,
                          step_start=t.run.durable_step, detail="adopted after a reconciler restart")
        t.st.attempts.append(adopted)
        t.st.total_attempts += 1
        t.current = adopted
        break
    return False


def foresee(t: JobTick) -> bool:
    """Step 5: the first heartbeat of the live attempt is noted (the changeover a move costs), and
    the job's forecast is brought up to date from its measured progress."""
    cur = t.current
    if cur is not None and cur.first_beat is None and t.run.heartbeat_epoch == cur.epoch:
        # The worker's own time of that beat, kept between the launch and now (a skewed clock can
        # move it by no more than a tick): noticing it at the tick would add the tick to every changeover.
        beat = min(t.now, max(cur.started, t.run.heartbeat_time if t.run.heartbeat_time is not None else t.now))
        t.st.attempts[-1] = t.current = cur.model_copy(update={"first_beat": beat,
                                                                "first_beat_step": t.run.heartbeat_step})
    if not t.st.phase.terminal or t.current is not None:
        t.st.forecast = forecast(_outlook(t, set()), None)
    return False


def _outlook(t: JobTick, available: set[str], placement: Placement | None = None) -> Outlook:
    placement = placement or place(t.job, t.desired.providers, t.st, t.now, t.observed.capacity,
                                   t.observed.allowances)
    order = list(placement.order)
    if t.current is not None and t.current.provider in t.desired.providers and t.current.provider not in order:
        order.append(t.current.provider)
    done = max(t.run.durable_step, t.st.progress.step)
    cur = t.current
    beat = t.run.heartbeat_step if cur is not None and t.run.heartbeat_epoch == cur.epoch else None
    return outlook(t.job, t.st, done, order, t.desired.providers, t.reliability, available, t.now, beat,
                   t.observed.allowances)


def stop_on_policy(t: JobTick) -> bool:
    """Step 6: the live attempt is stopped (SIGTERM, so it saves) when the manifest suspends the
    job (free), or when its deadline has come or its budget is spent (Failed, with the reason)."""
    if t.current is None or t.run.done:
        return False
    spec = t.job.spec
    if spec.suspend:
        _stop_current(t, "suspended by the manifest")
        return False
    if spec.deadline is not None and t.now >= spec.deadline.timestamp():
        _stop_current(t, "policy: deadline reached")
        _fail(t.st, f"policy: deadline {spec.deadline.isoformat()} reached; the worker was asked to save and stop")
        return True
    price = t.price(t.current.provider)
    spent = t.st.cost_usd + max(0.0, t.now - t.current.started) / 3600.0 * price
    if spec.budget_usd is not None and price > 0 and spent >= spec.budget_usd:
        _stop_current(t, "policy: cost budget spent")
        _fail(t.st, f"policy: cost budget of ${spec.budget_usd:g} spent (${t.st.cost_usd:g})")
        return True
    return False


def _stop_current(t: JobTick, reason: str) -> None:
    assert t.current is not None
    for ref in t.live_refs(t.current.epoch):
        t.stop(ref, reason)
    t.close_current(Outcome.CANCELLED, reason)


def judge(t: JobTick) -> bool:
    """Step 7: how the current attempt is doing, from the provider's word and storage."""
    cur = t.current
    if cur is None:
        return False
    seen = next((r for r in t.workers if r.run_id == t.st.run_id and r.epoch == cur.epoch
                 and r.provider == cur.provider), None)
    if t.run.done:
        state = t.workers.get(seen) if seen is not None else None
        t.close_current(Outcome.SUCCEEDED, "completed", state.exit_code if state else None,
                        ended=t.run.done_time or (state.ended_at if state else None))
        return False
    if seen is None:
        _judge_unseen(t)
        return False
    if cur.unseen_since is not None:
        t.st.attempts[-1] = t.current = cur.model_copy(update={"unseen_since": None})
    return _judge_seen(t, seen, t.workers[seen])


def _judge_seen(t: JobTick, ref: WorkerRef, state: WorkerState) -> bool:
    assert t.current is not None
    verdict = classify(t.job, t.current, state, t.run)
    if verdict is None:
        _judge_live(t, ref, state)
        return False
    beat = t.run.heartbeat_time if t.run.heartbeat_epoch == t.current.epoch else None
    t.close_current(verdict.outcome, verdict.detail, state.exit_code, ended=end_time(
        t.current, t.now, state.ended_at, beat))
    if verdict.avoid_provider:
        t.st.provider_backoff[ref.provider] = t.now + STORAGE_UNREACHABLE_BACKOFF_SECONDS
    if verdict.outcome == Outcome.JOB_ERROR:
        tail = t.observed.logs.get(ref, "")
        t.st.log_tail = tail[-LOG_TAIL_CHARS:] if tail else None
    if verdict.fail_now:
        _fail(t.st, f"failed: {verdict.detail}")
        return True
    return False


def _judge_live(t: JobTick, ref: WorkerRef, state: WorkerState) -> None:
    assert t.current is not None
    stalled = _stalled(t.job, t.current, t.run, t.now, state)
    if stalled:
        t.stop(ref, "stalled: no heartbeat")
        t.close_current(Outcome.STALLED, stalled)
    elif state.phase == WorkerPhase.PENDING and t.now - t.current.started > PENDING_TIMEOUT_SECONDS:
        t.stop(ref, "never started")
        t.close_current(Outcome.INTERRUPTION, "the provider did not start the worker in time")
    else:
        t.st.phase = Phase.RUNNING if state.phase == WorkerPhase.RUNNING else Phase.LAUNCHING
        t.st.message = _running_message(t.current, t.run, state)
        if state.notice:
            reason = f"{ref.provider} will interrupt it: {state.notice}"
            t.out.actions.append(RequestStop(ref, reason, t.observed.run_storage.get((ref.job, ref.run_id))))
            t.st.message = f"{t.st.message}; asked the worker to save and leave ({reason})"


def _judge_unseen(t: JobTick) -> None:
    """Never lost on one failed observation: a sustained silence is required (longer when the
    provider could not even be asked)."""
    cur = t.current
    assert cur is not None
    unreachable = t.observed.unreachable.get(cur.provider)
    if unreachable is not None:
        t.st.message = f"cannot reach provider {cur.provider} ({unreachable}); keeping the worker"
    if cur.unseen_since is None:
        t.st.attempts[-1] = t.current = cur.model_copy(update={"unseen_since": t.now})
        return
    silent = t.now - cur.unseen_since
    if unreachable is not None and silent >= LOST_AFTER_SECONDS * 5:
        t.close_current(Outcome.INTERRUPTION, f"provider {cur.provider} unreachable since {int(silent)}s")
    elif unreachable is None and silent >= LOST_AFTER_SECONDS:
        t.close_current(Outcome.INTERRUPTION, "worker vanished from the provider")


def reconsider(t: JobTick) -> bool:
    """Step 8: a running attempt of a job with a deadline is checked against the placement policy:
    it stays, or the run moves (the worker is stopped so it saves; the next tick launches where the
    policy says)."""
    cur = t.current
    if cur is None or t.run.done or t.job.spec.deadline is None:
        return False
    if not any(s.phase == WorkerPhase.RUNNING for r, s in t.workers.items()
               if r.run_id == t.st.run_id and r.epoch == cur.epoch):
        return False
    look = _outlook(t, _available(t, _placement(t).order))
    choice = t.policy(look.situation)
    t.st.forecast = forecast(look, choice)
    if choice.provider is not None and choice.provider != cur.provider:
        why = choice.reason if choice.reason.startswith(MOVING) else f"{MOVING} {choice.provider}: {choice.reason}"
        _stop_current(t, why)
        t.st.phase = Phase.PENDING
        t.st.message = why
        return True
    t.st.message = f"{t.st.message}; {choice.reason}"
    return False


def finish(t: JobTick) -> bool:
    """Step 9: a completed run is Succeeded; a worker that wrote its completion but does not exit
    is stopped after a short grace, so it stops billing. A live attempt settles the tick."""
    if t.run.done:
        t.st.phase = Phase.SUCCEEDED
        target = t.job.spec.target_steps
        t.st.progress = Progress(step=max(t.run.durable_step, target or 0, t.st.progress.step), target=target)
        t.st.message = "run completed"
        t.st.forecast = None
        t.st.backoff_until = None
        t.st.provider_backoff = {}
        t.st.log_tail = None
        done_at = t.run.done_time if t.run.done_time is not None else t.now
        if t.now - done_at >= FINISHED_GRACE_SECONDS:
            for ref in t.live_refs():
                t.stop(ref, f"run completed {int(t.now - done_at)}s ago but the worker has not exited")
        return True
    return t.current is not None


def hold_finished(t: JobTick) -> bool:
    """Step 10: a Failed or Cancelled job launches nothing; a worker of it still running (its
    terminate failed, or it came back) is stopped on every tick until it is gone."""
    if t.st.phase not in (Phase.FAILED, Phase.CANCELLED):
        return False
    for ref, state in t.workers.items():
        if _live(state):
            t.stop(ref, f"job is {t.st.phase.value.lower()}")
    return True


def decide_launch(t: JobTick) -> bool:
    """Step 11: with no live attempt, whether (guards) and where (placement) to launch the next."""
    if t.job.spec.suspend:
        t.st.phase = Phase.SUSPENDED
        t.st.message = "suspended by the manifest (spec.suspend: true)"
        return True
    for guard in GUARDS:
        reason = guard(t)
        if reason:
            _fail(t.st, reason)
            return True
    if _backing_off(t):
        return True
    if t.st.storage != t.desired.settings.storage:
        # A changed `storage:` moves the run between attempts, never under a live worker.
        t.out.actions.append(MoveRunData(t.job.name, t.st.run_id, t.st.storage, t.desired.settings.storage))
        t.st.phase = Phase.PENDING
        t.st.message = f"moving the run's data from {t.st.storage} to {t.desired.settings.storage}"
        return True
    _place(t)
    return True


# ---- launch guards: each returns why the job must fail now, or "" ------------------------------


def _guard_config(t: JobTick) -> str:
    missing = [p for p in t.job.spec.placement.providers if p not in t.desired.providers]
    if missing and len(missing) == len(t.job.spec.placement.providers):
        return f"config error: no provider named {', '.join(missing)} is defined"
    return ""


def _guard_retries(t: JobTick) -> str:
    r = t.job.spec.retry
    if t.st.failures > r.max_retries:
        return (f"failed {t.st.failures} times, more than the retry budget of {r.max_retries}; "
                f"last: {_last_detail(t.st)}")
    return ""


def _guard_crash_loop(t: JobTick) -> str:
    limit = t.job.spec.retry.max_unproductive_attempts
    if t.st.unproductive >= limit:
        return (f"crash loop: {t.st.unproductive} attempts in a row ended without a new checkpoint "
                f"(limit retry.max_unproductive_attempts={limit}); last: {_last_detail(t.st)}")
    return ""


def _guard_budget(t: JobTick) -> str:
    budget = t.job.spec.budget_usd
    if budget is not None and t.st.cost_usd >= budget:
        return f"policy: cost budget of ${budget:g} spent (${t.st.cost_usd:g})"
    return ""


def _guard_deadline(t: JobTick) -> str:
    deadline = t.job.spec.deadline
    if deadline is not None and t.now >= deadline.timestamp():
        return f"policy: deadline {deadline.isoformat()} passed"
    return ""


GUARDS: tuple[Callable[[JobTick], str], ...] = (
    _guard_config, _guard_retries, _guard_crash_loop, _guard_budget, _guard_deadline)


def _last_detail(st: JobStatus) -> str:
    return st.attempts[-1].detail if st.attempts else ""


def _backing_off(t: JobTick) -> bool:
    """Charged failures back off exponentially, and so do free ends without progress from the
    second in a row (one early preemption relaunches at once; a loop of them slows down)."""
    st, last = t.st, (t.st.attempts[-1] if t.st.attempts else None)
    strikes = max(st.failures if last is not None and last.outcome is not None and last.outcome.charged else 0,
                  st.unproductive - 1)
    if last is not None and last.ended is not None and strikes > 0:
        if st.backoff_until is None or st.backoff_until < last.ended:
            st.backoff_until = last.ended + _backoff(t.job, strikes)
    if st.backoff_until is not None and t.now < st.backoff_until:
        st.phase = Phase.BACKOFF
        why = f"{st.failures} failure(s)" if st.failures else f"{st.unproductive} attempt(s) without progress"
        st.message = f"backing off after {why}: {_last_detail(st)}"
        return True
    st.backoff_until = None
    return False


def _placement(t: JobTick) -> Placement:
    t.st.provider_backoff = {p: until for p, until in t.st.provider_backoff.items() if until > t.now}
    return place(t.job, t.desired.providers, t.st, t.now, t.observed.capacity, t.observed.allowances)


def _available(t: JobTick, order: list[str]) -> set[str]:
    """Providers that could take a worker of this job now: reachable, not avoided, below their
    concurrency, and with a free slot where the provider reports its slots."""
    return {name for name in order
            if name not in t.observed.unreachable and name not in t.st.provider_backoff
            and t.busy.get(name, 0) < t.desired.providers[name].spec.concurrency
            and t.observed.free_slots.get(name, 1) > 0}


def _launch(t: JobTick, name: str) -> None:
    st = t.st
    prov = t.desired.providers[name]
    t.busy[name] = t.busy.get(name, 0) + 1
    _reserve_allowance(t, name, prov.spec.price_per_hour)
    reason = "first launch" if not st.attempts else f"relaunch after: {_last_detail(st)}"
    avoid = tuple(sorted(h for p, h in t.observed.bad_hosts | bad_hosts([st], t.now) if p == name))
    t.out.actions.append(Launch(t.job.name, st.run_id, name, reason, avoid))
    st.phase = Phase.LAUNCHING
    st.message = f"launching on {name}"


def _moving_worker_still_live(t: JobTick) -> bool:
    """After a move, the old worker saves and goes before the run starts elsewhere (a new epoch
    started earlier would fence its final checkpoint)."""
    last = t.st.attempts[-1] if t.st.attempts else None
    if last is None or not last.detail.startswith(MOVING) or last.ended is None:
        return False
    return t.now - last.ended < MOVE_WAIT_SECONDS and bool(t.live_refs(last.epoch))


def _place(t: JobTick) -> None:
    st = t.st
    placement = _placement(t)
    if _moving_worker_still_live(t):
        st.phase = Phase.PENDING
        st.message = f"{_last_detail(st)} (waiting for the worker to save and stop)"
        return
    if t.job.spec.deadline is not None or t.job.spec.budget_usd is not None:
        _place_by_policy(t, placement)
        return
    for name in placement.order:
        if name in _available(t, [name]):
            _launch(t, name)
            return
    _say_why_waiting(t, placement)


def _place_by_policy(t: JobTick, placement: Placement) -> None:
    """Jobs with a deadline or a budget: options whose projected cost breaks the budget are left
    out, and the placement policy picks among the rest."""
    look = _outlook(t, _available(t, placement.order), placement)
    broke = over_budget(look)
    if broke:
        placement = Placement([n for n in placement.order if n not in broke], {**placement.excluded, **broke})
        look = _outlook(t, _available(t, placement.order), placement)
    choice = t.policy(look.situation) if placement.order else None
    t.st.forecast = forecast(look, choice)
    if choice is not None and choice.provider is not None and choice.provider in _available(t, [choice.provider]):
        _launch(t, choice.provider)
        reason = choice.reason.removeprefix(f"on {choice.provider}: ")
        t.st.message = f"launching on {choice.provider}: {reason}"
    elif choice is not None and t.job.spec.deadline is not None:
        t.st.phase = Phase.PENDING
        t.st.message = choice.reason
    else:
        _say_why_waiting(t, placement)


def _say_why_waiting(t: JobTick, placement: Placement) -> None:
    st = t.st
    st.phase = Phase.PENDING
    avoided = [n for n in placement.order if n in st.provider_backoff and n not in t.observed.unreachable]
    if placement.order and len(avoided) == len(placement.order) and st.attempts:
        until = f"{(iso(max(st.provider_backoff[n] for n in avoided)) or '')[11:16]} UTC"
        st.message = f"waiting: {', '.join(avoided)} avoided until {until} after: {_last_detail(st)}"
    elif placement.order:
        st.message = f"waiting for capacity on {', '.join(placement.order)}"
    else:
        st.message = f"no allowed provider can take this job: {placement.why_nowhere() or 'none defined'}"


def _reserve_allowance(t: JobTick, provider: str, price: float) -> None:
    """A launch draws on the provider's allowance before its API says so: the next job placed in
    this tick sees what is left (a session's minimum of quota, or an hour of credits)."""
    a = t.observed.allowances.get(provider)
    if a is not None and (a.applies_to_cpu or t.job.spec.resources.gpus > 0):
        spend = price if a.unit == "credits" else a.minimum
        t.observed.allowances[provider] = replace(a, remaining=a.remaining - spend)


STEPS: tuple[Step, ...] = (fence, read_storage, adopt, foresee, stop_on_policy, judge, reconsider, finish,
                          hold_finished, decide_launch)


# ---- jobs whose manifest is gone --------------------------------------------------------------


def _mass_cancel_hold(desired: DesiredState, recorded: dict[str, JobStatus], confirmed: bool) -> str:
    """A commit that would cancel most of the active jobs at once (an emptied or moved desired/,
    a bad merge) is held until confirmed; returns the message, or "" when nothing is held."""
    active = [st for st in recorded.values() if not st.phase.terminal]
    doomed = [st for st in active if st.job not in desired.jobs and st.manifest not in desired.files_with_errors]
    if confirmed or len(doomed) < 2 or len(doomed) * 2 <= len(active):
        return ""
    return (f"holding: this commit would cancel {len(doomed)} of {len(active)} active jobs; if that is "
            f"meant, commit again with the trailer '{CONFIRM_CANCEL_TRAILER}' "
            f"(e.g. git commit --allow-empty -m 'cancel jobs' --trailer '{CONFIRM_CANCEL_TRAILER}')")


def _plan_removed(out: Plan, rec: JobStatus, workers: dict[WorkerRef, WorkerState], desired: DesiredState,
                  observed: Observed, now: float, held: str) -> None:
    """A job whose manifest is gone is cancelled: its workers are stopped (through the provider
    definition the status last knew, when that is gone too), and its attempt is billed until the
    worker is seen gone."""
    st = rec.model_copy(deep=True)
    out.statuses[st.job] = st
    if rec.manifest and rec.manifest in desired.files_with_errors:
        st.message = f"manifest {rec.manifest} has errors; holding the job as it is until they are fixed"
        return
    if held and not st.phase.terminal:
        st.message = held
        return
    live = [ref for ref, state in workers.items() if _live(state)]
    for ref in live:
        out.actions.append(Terminate(ref, "manifest deleted", observed.run_storage.get((ref.job, ref.run_id))))
    run = observed.runs.get((st.job, st.run_id), RunObservation())
    cur = st.current
    if cur is not None and any(r.epoch == cur.epoch and r.run_id == st.run_id for r in live):
        st.message = f"manifest deleted; stopping {cur.worker} on {cur.provider} (billed until it is gone)"
        return
    if cur is not None:
        prov = desired.providers.get(cur.provider) or observed.retired.get(cur.provider)
        price = prov.spec.price_per_hour if prov else 0.0
        gone = next((s.ended_at for r, s in workers.items() if r.epoch == cur.epoch and r.run_id == st.run_id), None)
        record_close(st, close(cur, Outcome.CANCELLED, now, run, "manifest deleted", None, price, gone))
    if not st.phase.terminal:
        st.phase = Phase.CANCELLED
        st.message = "manifest deleted; run cancelled (this file stays as history; restore it to resume)"
        st.backoff_until = None


# ---- small rules --------------------------------------------------------------------------------


def _backoff(job: Job, strikes: int) -> float:
    r = job.spec.retry
    return min(r.backoff_max_seconds, r.backoff_seconds * (2 ** max(0, strikes - 1)))


def _status_step(recorded: int, durable: int, target: int | None) -> int:
    """Durable progress as written to git: updated in tenths of the target so that a running
    job does not commit on every checkpoint; every other change carries the exact figure."""
    if durable <= recorded:
        return recorded
    if target:
        if durable >= target or (durable * 10) // target > (recorded * 10) // target:
            return durable
        return recorded
    return durable


def _stalled(job: Job, attempt: Attempt, run: RunObservation, now: float, state: WorkerState) -> str:
    """Stalled = the heartbeat has not changed for the stall timeout, timed by the reconciler's
    own clock from when it first saw that heartbeat, over several observations. Never by comparing
    the worker's clock with ours, and never on one observation: a clock jump, or a tick that comes
    late, must not make a healthy worker look stalled. A run that has never heartbeated (a plain
    script, not instrumented) is judged by its provider's state alone unless the job sets a timeout."""
    if state.phase != WorkerPhase.RUNNING or run.heartbeat_unchanged_since is None:
        return ""
    if run.heartbeat_epoch is None and job.spec.stall_timeout_seconds is None:
        return ""
    limit = job.spec.stall_timeout_seconds or DEFAULT_STALL_SECONDS
    age = now - max(run.heartbeat_unchanged_since, attempt.started)
    if age > limit and run.heartbeat_unchanged_ticks >= STALL_MIN_OBSERVATIONS:
        return f"stalled: no new heartbeat for {int(age)}s (limit {int(limit)}s) while the provider says running"
    if run.heartbeat_first_observation:
        # A reconciler that has never watched this run (just restarted, or `run --once` from
        # cron) has only the worker's own clock to go by: trust it with a wide margin.
        beat = run.heartbeat_time if run.heartbeat_epoch == attempt.epoch else None
        worker_age = now - (beat if beat is not None else attempt.started)
        if worker_age > STALE_BY_WORKER_CLOCK * limit:
            return (f"stalled: last heartbeat {int(worker_age)}s ago by the worker's clock "
                    f"(limit {int(limit)}s, x{STALE_BY_WORKER_CLOCK} without observations of our own)")
    return ""


def _running_message(attempt: Attempt, run: RunObservation, state: WorkerState) -> str:
    where = f"{attempt.provider}/{attempt.worker}"
    if state.phase == WorkerPhase.PENDING:
        return f"attempt {attempt.epoch} waiting to start on {where}"
    if run.heartbeat_epoch is None:
        return (f"attempt {attempt.epoch} running on {where} (not instrumented: no heartbeat, so it is "
                "judged by the provider's state alone)")
    return f"attempt {attempt.epoch} running on {where}"


def _fail(st: JobStatus, reason: str) -> None:
    st.phase = Phase.FAILED
    st.message = reason
    st.backoff_until = None


def _trim(st: JobStatus) -> None:
    if len(st.attempts) > MAX_ATTEMPTS_KEPT:
        st.attempts = st.attempts[-MAX_ATTEMPTS_KEPT:]


def apply_results(p: Plan, results: list[LaunchResult], now: float, durable: dict[tuple[str, str], int],
                  moves: list[MoveResult] | None = None) -> None:
    """Records launched attempts; backs off a provider that refused a launch; fails a job that
    cannot run as written; records where a moved run's data now is."""
    for moved in moves or []:
        st = p.statuses[moved.action.job]
        if moved.error:
            st.message = f"cannot move the run's data to {moved.action.target} ({moved.error}); trying again"
        else:
            st.storage = moved.action.target
            st.message = f"run data moved to {moved.action.target}; the next attempt resumes there"
    for res in results:
        st = p.statuses[res.action.job]
        if res.ref is not None:
            st.attempts.append(Attempt(epoch=res.ref.epoch, provider=res.ref.provider, worker=res.ref.id,
                                       started=now, step_start=durable.get((st.job, st.run_id), 0)))
            st.total_attempts += 1
            st.phase = Phase.LAUNCHING
            st.message = f"attempt {res.ref.epoch} launched on {res.ref.provider} ({res.action.reason})"
            _trim(st)
        elif res.job_config_error:
            _fail(st, f"config error: {res.error}")
        elif res.unavailable:
            st.provider_backoff[res.action.provider] = now + UNAVAILABLE_BACKOFF_SECONDS
            st.phase = Phase.PENDING
            st.message = f"provider {res.action.provider} refused the launch: {res.error}"
        else:
            st.phase = Phase.PENDING
            st.message = f"cannot launch: {res.error}"
