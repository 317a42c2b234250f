"""The planner: every decision of the loop, as a pure function of what is wanted and what is seen.

`plan(desired, observed, recorded, now)` returns the actions to take and the status each job
would have if they succeed; `apply_results` folds in what the executor reports. Nothing here
does I/O or reads the clock, so every rule is tested with tables of inputs and expected actions.

Failure classes (DESIGN.md §5): interruptions and session ends are free; job errors and stalls
are charged to the retry budget, with exponential backoff; a worker is declared lost only after
it has been missing for `LOST_AFTER_SECONDS` across at least two observations.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from adapters.compute import WorkerPhase, WorkerRef, WorkerState
from desired.models import Job, Provider
from desired.parse import DesiredState
from status.models import LOG_TAIL_CHARS, MAX_ATTEMPTS_KEPT, Attempt, JobStatus, Outcome, Phase, Progress

LOST_AFTER_SECONDS = 60.0  # a worker missing from observations this long is lost
PENDING_TIMEOUT_SECONDS = 1800.0  # a launch the provider never starts is given up on
PROVIDER_COOLDOWN_SECONDS = 300.0  # a provider that just interrupted a run is tried last
UNAVAILABLE_BACKOFF_SECONDS = 120.0  # a provider that refused a launch is skipped this long
STALL_MIN_OBSERVATIONS = 3  # a stall needs this many observations of the same heartbeat
STALE_BY_WORKER_CLOCK = 3  # without observations of our own, a heartbeat this many timeouts old is a stall
EXIT_INTERRUPTED = 75  # worker checkpointed and left because it was told to (EX_TEMPFAIL)


# ---- inputs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunObservation:
    """What storage says about one run."""

    lease_epoch: int = 0
    durable_step: int = 0
    heartbeat_step: int | None = None
    heartbeat_epoch: int | None = None
    heartbeat_time: float | None = None
    done: bool = False
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


# ---- actions ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    job: str
    run_id: str
    provider: str
    reason: str


@dataclass(frozen=True)
class Terminate:
    ref: WorkerRef
    reason: str


Action = Launch | Terminate


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


# ---- helpers -----------------------------------------------------------------------------------


def _close(attempt: Attempt, outcome: Outcome, now: float, run: RunObservation, detail: str = "",
           exit_code: int | None = None, price_per_hour: float = 0.0) -> Attempt:
    heartbeat = run.heartbeat_step if run.heartbeat_epoch == attempt.epoch else None
    lost = 0
    if outcome in (Outcome.INTERRUPTION, Outcome.SESSION_END, Outcome.STALLED, Outcome.JOB_ERROR):
        if heartbeat is not None:
            lost = max(0, heartbeat - run.durable_step)
    hours = max(0.0, now - attempt.started) / 3600.0
    return attempt.model_copy(
        update={
            "ended": now,
            "outcome": outcome,
            "detail": detail or attempt.detail,
            "exit_code": exit_code,
            "step_end": run.durable_step,
            "steps_lost": lost,
            "cost_usd": round(hours * price_per_hour, 4),
            "unseen_since": None,
        }
    )


def _record_close(st: JobStatus, closed: Attempt) -> None:
    st.attempts[-1] = closed
    st.steps_lost += closed.steps_lost
    st.cost_usd = round(st.cost_usd + closed.cost_usd, 4)
    if closed.outcome is not None and closed.outcome.charged:
        st.failures += 1
    elif closed.outcome in (Outcome.INTERRUPTION, Outcome.SESSION_END):
        st.interruptions += 1


def _classify(state: WorkerState, run: RunObservation) -> tuple[Outcome | None, str]:
    """One table from the shared worker vocabulary to the failure classes of DESIGN.md §5."""
    if state.phase in (WorkerPhase.PENDING, WorkerPhase.RUNNING):
        return None, ""
    word = state.provider_state or state.phase.value
    if state.detail:
        word += f" ({state.detail})"
    if state.phase == WorkerPhase.PREEMPTED:
        return Outcome.INTERRUPTION, f"interrupted: {word}"
    if state.phase == WorkerPhase.LOST:
        return Outcome.INTERRUPTION, f"worker lost: {word}"
    if state.phase == WorkerPhase.SESSION_LIMIT:
        return Outcome.SESSION_END, f"session limit reached: {word}"
    # exited by itself
    if state.exit_code == 0 and run.done:
        return Outcome.SUCCEEDED, "completed"
    if state.exit_code == EXIT_INTERRUPTED:
        return Outcome.INTERRUPTION, "worker checkpointed and exited on a stop notice (exit 75)"
    if state.exit_code == 0:
        return Outcome.JOB_ERROR, "exited 0 without writing its completion record (done.json)"
    return Outcome.JOB_ERROR, f"exited with code {state.exit_code}"


def _backoff(job: Job, failures: int) -> float:
    r = job.spec.retry
    return min(r.backoff_max_seconds, r.backoff_seconds * (2 ** max(0, failures - 1)))


def _provider_order(job: Job, providers: dict[str, Provider], st: JobStatus, now: float) -> list[str]:
    """Placement: allowed providers, free first, then cheapest, preference order breaking ties;
    one that just interrupted this run is tried after the others."""
    allowed = job.spec.placement.providers or sorted(providers)
    cap = job.spec.placement.max_price_per_hour
    recent_bad = {
        a.provider
        for a in st.attempts
        if a.outcome in (Outcome.INTERRUPTION, Outcome.SESSION_END)
        and a.ended is not None
        and now - a.ended < PROVIDER_COOLDOWN_SECONDS
    }
    candidates = []
    for rank, name in enumerate(allowed):
        prov = providers.get(name)
        if prov is None:
            continue
        price = prov.spec.price_per_hour
        if cap is not None and price > cap:
            continue
        free = 0 if (prov.spec.free_quota_hours or price == 0) else 1
        candidates.append((name in recent_bad, free, price, rank, name))
    return [c[-1] for c in sorted(candidates)]


# ---- the planner -------------------------------------------------------------------------------


def plan(desired: DesiredState, observed: Observed, recorded: dict[str, JobStatus], now: float,
         commit: str = "") -> Plan:
    out = Plan()
    # Live workers per provider, to respect concurrency limits across jobs.
    busy: dict[str, int] = {}
    for ref, state in observed.workers.items():
        if state.phase in (WorkerPhase.PENDING, WorkerPhase.RUNNING):
            busy[ref.provider] = busy.get(ref.provider, 0) + 1
    by_job: dict[str, dict[WorkerRef, WorkerState]] = {}
    for ref, state in observed.workers.items():
        by_job.setdefault(ref.job, {})[ref] = state

    for name in sorted(set(desired.jobs) | set(recorded)):
        job = desired.jobs.get(name)
        rec = recorded.get(name)
        workers = by_job.get(name, {})
        if job is None:
            assert rec is not None
            _plan_removed(out, rec, workers, desired, observed, now)
        else:
            _plan_job(out, job, rec, workers, desired, observed, now, commit, busy)
    return out


def _live(state: WorkerState) -> bool:
    return state.phase in (WorkerPhase.PENDING, WorkerPhase.RUNNING)


def _plan_removed(out: Plan, rec: JobStatus, workers: dict[WorkerRef, WorkerState],
                  desired: DesiredState, observed: Observed, now: float) -> None:
    st = rec.model_copy(deep=True)
    if rec.manifest and rec.manifest in desired.files_with_errors:
        # The file is broken, not deleted: hold everything as it is until it is fixed.
        st.message = f"manifest {rec.manifest} has errors; holding the job as it is until they are fixed"
        out.statuses[st.job] = st
        return
    for ref, state in workers.items():
        if _live(state):
            out.actions.append(Terminate(ref, "manifest deleted"))
    if not st.phase.terminal:
        run = observed.runs.get((st.job, st.run_id), RunObservation())
        if st.current is not None:
            _record_close(st, _close(st.current, Outcome.CANCELLED, now, run, "manifest deleted"))
        st.phase = Phase.CANCELLED
        st.message = "manifest deleted; run cancelled (this file stays as history)"
        st.backoff_until = None
    out.statuses[st.job] = st


def _plan_job(out: Plan, job: Job, rec: JobStatus | None, workers: dict[WorkerRef, WorkerState],
              desired: DesiredState, observed: Observed, now: float, commit: str,
              busy: dict[str, int]) -> None:
    run_id = job.run_id()
    target = job.spec.target_steps
    manifest = desired.job_files.get(job.name, "")
    if rec is None or rec.run_id != run_id:
        st = JobStatus(job=job.name, run_id=run_id, manifest=manifest, desired_commit=commit,
                       progress=Progress(target=target))
        if rec is not None:
            st.message = f"run {run_id} replaces {rec.run_id}: the command, code or env changed"
            st.attempts = [a for a in rec.attempts if not a.open][-MAX_ATTEMPTS_KEPT:]
            old = rec.current
            if old is not None:
                run_old = observed.runs.get((job.name, rec.run_id), RunObservation())
                st.attempts.append(_close(old, Outcome.CANCELLED, now, run_old, "replaced by a new run"))
        else:
            st.message = "new job"
    else:
        st = rec.model_copy(deep=True)
        st.manifest = manifest
    st.progress = Progress(step=st.progress.step, target=target)
    run = observed.runs.get((job.name, run_id), RunObservation())

    # Workers that must not be running: other runs of this job, older epochs (zombies).
    current = st.current
    for ref, state in workers.items():
        if not _live(state):
            continue
        if ref.run_id != run_id:
            out.actions.append(Terminate(ref, f"run {ref.run_id} was replaced by {run_id}"))
        elif ref.epoch < run.lease_epoch and (current is None or ref.epoch != current.epoch):
            out.actions.append(Terminate(ref, f"stale worker of epoch {ref.epoch}; lease is at {run.lease_epoch}"))

    if run.error:
        # Storage cannot be read: decide nothing about this run that depends on it. A finished
        # job keeps its own message (the reason it failed must survive a storage outage).
        if not st.phase.terminal:
            st.message = f"run data unreadable, waiting: {run.error}"
        out.statuses[job.name] = st
        return

    st.progress = Progress(step=_status_step(st.progress.step, run.durable_step, target), target=target)

    # Adopt a worker that holds the lease but is not recorded (the daemon died after launching it).
    if current is None and not st.phase.terminal:
        for ref, state in workers.items():
            if ref.run_id == run_id and ref.epoch == run.lease_epoch and run.lease_epoch > 0 and _live(state):
                adopted = Attempt(epoch=ref.epoch, provider=ref.provider, worker=ref.id, started=now,
                                  step_start=run.durable_step, detail="adopted after a reconciler restart")
                st.attempts.append(adopted)
                st.total_attempts += 1
                current = adopted
                break

    # A suspended job's live attempt is stopped (the worker gets SIGTERM and saves); free.
    if current is not None and job.spec.suspend and not run.done:
        provider = desired.providers.get(current.provider)
        price = provider.spec.price_per_hour if provider else 0.0
        for ref, state in workers.items():
            if ref.run_id == run_id and ref.epoch == current.epoch and _live(state):
                out.actions.append(Terminate(ref, "suspended by the manifest"))
        _record_close(st, _close(current, Outcome.CANCELLED, now, run, "suspended by the manifest", None, price))
        current = None

    # Judge the current attempt.
    if current is not None:
        provider = desired.providers.get(current.provider)
        price = provider.spec.price_per_hour if provider else 0.0
        seen: WorkerRef | None = next((r for r in workers if r.run_id == run_id and r.epoch == current.epoch
                                       and r.provider == current.provider), None)
        if run.done:
            # The completion record is the proof; a worker still exiting is left to finish.
            code = workers[seen].exit_code if seen is not None else None
            _record_close(st, _close(current, Outcome.SUCCEEDED, now, run, "completed", code, price))
            current = None
        elif seen is not None:
            ref = seen
            state = workers[ref]
            if current.unseen_since is not None:
                st.attempts[-1] = current = current.model_copy(update={"unseen_since": None})
            outcome, detail = _classify(state, run)
            if outcome is None:
                stalled = _stalled(job, current, run, now, state)
                pending_too_long = (state.phase == WorkerPhase.PENDING
                                    and now - current.started > PENDING_TIMEOUT_SECONDS)
                budget = job.spec.budget_usd
                spent = st.cost_usd + max(0.0, now - current.started) / 3600.0 * price
                if stalled:
                    out.actions.append(Terminate(ref, "stalled: no heartbeat"))
                    _record_close(st, _close(current, Outcome.STALLED, now, run, stalled, None, price))
                    current = None
                elif budget is not None and price > 0 and spent >= budget:
                    # The budget binds the running attempt too, not only the next launch.
                    out.actions.append(Terminate(ref, "policy: cost budget spent"))
                    _record_close(st, _close(current, Outcome.CANCELLED, now, run, "cost budget spent", None, price))
                    _fail(st, f"policy: cost budget of ${budget:g} spent (${st.cost_usd:g})")
                    out.statuses[job.name] = st
                    return
                elif pending_too_long:
                    out.actions.append(Terminate(ref, "never started"))
                    _record_close(st, _close(current, Outcome.INTERRUPTION, now, run,
                                             "the provider did not start the worker in time", None, price))
                    current = None
                else:
                    st.phase = Phase.RUNNING if state.phase == WorkerPhase.RUNNING else Phase.LAUNCHING
                    st.message = _running_message(current, run, state)
            else:
                closed = _close(current, outcome, now, run, detail, state.exit_code, price)
                _record_close(st, closed)
                current = None
                if outcome == Outcome.JOB_ERROR:
                    tail = observed.logs.get(ref, "")
                    st.log_tail = tail[-LOG_TAIL_CHARS:] if tail else None
                if outcome == Outcome.SUCCEEDED:
                    st.log_tail = None
        elif current.provider in observed.unreachable:
            st.message = f"cannot reach provider {current.provider} ({observed.unreachable[current.provider]}); " \
                         "keeping the worker"
            if current.unseen_since is None:
                st.attempts[-1] = current = current.model_copy(update={"unseen_since": now})
            elif now - current.unseen_since >= LOST_AFTER_SECONDS * 5:
                _record_close(st, _close(current, Outcome.INTERRUPTION, now, run,
                                         f"provider {current.provider} unreachable since "
                                         f"{int(now - current.unseen_since)}s", None, price))
                current = None
        else:
            # The provider answered and did not list the worker.
            if current.unseen_since is None:
                st.attempts[-1] = current = current.model_copy(update={"unseen_since": now})
            elif now - current.unseen_since >= LOST_AFTER_SECONDS:
                _record_close(st, _close(current, Outcome.INTERRUPTION, now, run,
                                         "worker vanished from the provider", None, price))
                current = None

    if run.done:
        st.phase = Phase.SUCCEEDED
        st.progress = Progress(step=max(run.durable_step, target or 0, st.progress.step), target=target)
        st.message = "run completed"
        st.backoff_until = None
        st.provider_backoff = {}
        _trim(st)
        out.statuses[job.name] = st
        return
    if current is not None:
        _trim(st)
        out.statuses[job.name] = st
        return

    # No live attempt: decide whether and where to launch the next one.
    if st.phase == Phase.FAILED or st.phase == Phase.CANCELLED:
        # A worker of a finished job still running (its terminate failed, or it came back) is
        # stopped on every tick until it is gone: it would only spend money.
        for ref, state in workers.items():
            if _live(state) and not any(a.ref == ref for a in out.actions if isinstance(a, Terminate)):
                out.actions.append(Terminate(ref, f"job is {st.phase.value.lower()}"))
        out.statuses[job.name] = st
        return
    if job.spec.suspend:
        st.phase = Phase.SUSPENDED
        st.message = "suspended by the manifest (spec.suspend: true)"
        out.statuses[job.name] = st
        return
    missing = [p for p in job.spec.placement.providers if p not in desired.providers]
    if missing and len(missing) == len(job.spec.placement.providers):
        _fail(st, f"config error: no provider named {', '.join(missing)} is defined")
        out.statuses[job.name] = st
        return
    if st.failures > job.spec.retry.max_retries:
        last = st.attempts[-1].detail if st.attempts else ""
        _fail(st, f"failed {st.failures} times, more than the retry budget of "
                  f"{job.spec.retry.max_retries}; last: {last}")
        out.statuses[job.name] = st
        return
    if job.spec.budget_usd is not None and st.cost_usd >= job.spec.budget_usd:
        _fail(st, f"policy: cost budget of ${job.spec.budget_usd:g} spent (${st.cost_usd:g})")
        out.statuses[job.name] = st
        return
    if job.spec.deadline is not None and now >= job.spec.deadline.timestamp():
        _fail(st, f"policy: deadline {job.spec.deadline.isoformat()} passed")
        out.statuses[job.name] = st
        return
    last_attempt = st.attempts[-1] if st.attempts else None
    if last_attempt is not None and last_attempt.outcome is not None and last_attempt.outcome.charged \
            and last_attempt.ended is not None:
        if st.backoff_until is None or st.backoff_until < last_attempt.ended:
            st.backoff_until = last_attempt.ended + _backoff(job, st.failures)
    if st.backoff_until is not None and now < st.backoff_until:
        st.phase = Phase.BACKOFF
        st.message = f"backing off after {st.failures} failure(s): {last_attempt.detail if last_attempt else ''}"
        _trim(st)
        out.statuses[job.name] = st
        return
    st.backoff_until = None
    st.provider_backoff = {p: t for p, t in st.provider_backoff.items() if t > now}
    for name in _provider_order(job, desired.providers, st, now):
        prov = desired.providers[name]
        if name in observed.unreachable or name in st.provider_backoff:
            continue
        if busy.get(name, 0) >= prov.spec.concurrency:
            continue
        busy[name] = busy.get(name, 0) + 1
        reason = "first launch" if not st.attempts else f"relaunch after: {st.attempts[-1].detail}"
        out.actions.append(Launch(job.name, run_id, name, reason))
        st.phase = Phase.LAUNCHING
        st.message = f"launching on {name}"
        _trim(st)
        out.statuses[job.name] = st
        return
    st.phase = Phase.PENDING
    waiting = _provider_order(job, desired.providers, st, now)
    st.message = f"waiting for capacity on {', '.join(waiting) or 'no allowed provider'}"
    _trim(st)
    out.statuses[job.name] = st


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
    late, must not make a healthy worker look stalled."""
    if state.phase != WorkerPhase.RUNNING or run.heartbeat_unchanged_since is None:
        return ""
    limit = job.spec.stall_timeout_seconds or 300.0
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
    return f"attempt {attempt.epoch} running on {where}"


def _fail(st: JobStatus, reason: str) -> None:
    st.phase = Phase.FAILED
    st.message = reason
    st.backoff_until = None
    _trim(st)


def _trim(st: JobStatus) -> None:
    if len(st.attempts) > MAX_ATTEMPTS_KEPT:
        st.attempts = st.attempts[-MAX_ATTEMPTS_KEPT:]


def apply_results(p: Plan, results: list[LaunchResult], now: float, durable: dict[tuple[str, str], int]) -> None:
    """Records launched attempts, and backs off a provider that refused a launch."""
    for res in results:
        st = p.statuses[res.action.job]
        if res.ref is not None:
            st.attempts.append(Attempt(epoch=res.ref.epoch, provider=res.ref.provider, worker=res.ref.id,
                                       started=now, step_start=durable.get((st.job, st.run_id), 0)))
            st.total_attempts += 1
            st.phase = Phase.LAUNCHING
            st.message = f"attempt {res.ref.epoch} launched on {res.ref.provider} ({res.action.reason})"
            _trim(st)
        elif res.unavailable:
            st.provider_backoff[res.action.provider] = now + UNAVAILABLE_BACKOFF_SECONDS
            st.phase = Phase.PENDING
            st.message = f"provider {res.action.provider} refused the launch: {res.error}"
        else:
            st.phase = Phase.PENDING
            st.message = f"cannot launch: {res.error}"
