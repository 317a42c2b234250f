"""The planner: every decision of the loop, as a pure function of what is wanted and what is seen.

`plan(desired, observed, recorded, now)` returns the actions to take and the status each job
would have if they succeed; `apply_results` folds in what the executor reports. Nothing here
does I/O or reads the clock, so every rule is tested with tables of inputs and expected actions.

Each job goes through the same named steps in a fixed order (as Flux's reconcilers run their
guards): identify the run -> fence workers that must not run -> read storage -> adopt an
unrecorded worker -> foresee (the forecast) -> stop on policy (suspend, deadline, budget) ->
judge the live attempt -> note a lost worker against its provider's health (reconciler.planner.health,
computed once per plan from every job's status and shared by all) -> carry out a drill
(reconciler.planner.drill) -> wait while run storage has a fault -> reconsider where it runs ->
finish -> hold a finished job -> decide the next launch (guards, then the jobs it runs `after`).
A step either passes the job on or settles its status for this tick. How attempts end is judged
in `reconciler.planner.judge`; foresee, reconsider and the launch live in
`reconciler.planner.launching`; the planner's inputs, actions and per-job state in
`reconciler.planner.tick`.
"""

from __future__ import annotations

from dataclasses import replace

from adapters.compute import Allowance, WorkerPhase, WorkerRef, WorkerState
from desired.models import Job
from desired.parse import DesiredState
from reconciler.planner.dependencies import HELD
from reconciler.planner.drill import drill
from reconciler.planner.health import LOSS_COOLDOWN_SECONDS, REFUSAL_COOLDOWN_SECONDS, health_of, troubles
from reconciler.planner.judge import EXIT_INTERRUPTED, classify, close, end_time, record_close
from reconciler.planner.launching import (
    HOST_COOLDOWN_SECONDS,
    MOVE_WAIT_SECONDS,
    MOVING,
    bad_hosts,
    decide_launch,
    foresee,
    reconsider,
)
from reconciler.planner.ledger import WEEK, build_ledger
from reconciler.planner.outlook.deadline import PlacementPolicy, choose
from reconciler.planner.outlook.forecast import Reliability, open_cost, provider_reliabilities
from reconciler.planner.sweeps import live_members, settle_live, sweep_changes
from reconciler.planner.tick import (
    Action,
    ArmDrill,
    JobTick,
    Launch,
    LaunchResult,
    MoveResult,
    MoveRunData,
    Observed,
    Plan,
    RequestStop,
    RunObservation,
    Step,
    Terminate,
    fail,
    live,
    stop_current,
)
from status.models import (
    LOG_TAIL_CHARS,
    MAX_ATTEMPTS_KEPT,
    MAX_REFUSALS_KEPT,
    OUTPUTS_LISTED,
    Attempt,
    HandedInput,
    JobStatus,
    Outcome,
    Output,
    Phase,
    Progress,
    Refusal,
)

# Re-exported: the planner's vocabulary is imported from here by the loop, the executor and tests.
__all__ = [
    "EXIT_INTERRUPTED", "HOST_COOLDOWN_SECONDS", "LOSS_COOLDOWN_SECONDS", "MOVE_WAIT_SECONDS", "MOVING",
    "REFUSAL_COOLDOWN_SECONDS",
    "Action", "ArmDrill", "Launch", "LaunchResult", "MoveResult", "MoveRunData", "Observed", "Plan", "RequestStop",
    "RunObservation", "Terminate", "apply_results", "plan",
]

LOST_AFTER_SECONDS = 60.0  # a worker missing from observations this long is lost
PENDING_TIMEOUT_SECONDS = 1800.0  # a launch the provider never starts is given up on
STORAGE_UNREACHABLE_BACKOFF_SECONDS = 3600.0  # a provider whose worker could not reach run storage
STALL_MIN_OBSERVATIONS = 3  # a stall needs this many observations of the same heartbeat
STALE_BY_WORKER_CLOCK = 3  # without observations of our own, a heartbeat this many timeouts old is a stall
DEFAULT_STALL_SECONDS = 300.0  # stall timeout of an instrumented worker when the job sets none
FINISHED_GRACE_SECONDS = 60.0  # a worker still alive this long after its run completed is stopped
# A running worker that has not heartbeated this long is called not instrumented (the SDK's first
# beat comes after imports and the restore, which can take a while on a cold machine).
FIRST_HEARTBEAT_GRACE_SECONDS = 120.0
CONFIRM_CANCEL_TRAILER = "Reconciler-Confirm: cancel"


# ---- the planner -------------------------------------------------------------------------------


def plan(desired: DesiredState, observed: Observed, recorded: dict[str, JobStatus], now: float,
         commit: str = "", confirm_cancel: bool = False, policy: PlacementPolicy = choose) -> Plan:
    """`confirm_cancel`: the commits being acted on carry the CONFIRM_CANCEL_TRAILER, so a change
    that cancels most jobs at once is meant (otherwise it is held, as Argo CD guards pruning).
    `policy` places runs that have a deadline (reconciler.planner.outlook.deadline; benchmarks pass baselines)."""
    out = Plan()
    reliability = {name: replace(rel, room_wait_seconds=observed.room_waits.get(name, rel.room_wait_seconds),
                                 room_shape=observed.room_shapes.get(name, rel.room_shape))
                   for name, rel in provider_reliabilities(desired.providers, recorded.values(), now).items()}
    observed = replace(observed, allowances={**own_quotas(desired, recorded, observed, now), **observed.allowances},
                       bad_hosts=observed.bad_hosts | bad_hosts(recorded.values(), now))
    out.troubles = set(troubles(recorded.values()))
    out.health = health_of(out.troubles, now, desired.providers)  # once, shared by every job
    busy: dict[str, int] = {}
    by_job: dict[str, dict[WorkerRef, WorkerState]] = {}
    for ref, state in observed.workers.items():
        by_job.setdefault(ref.job, {})[ref] = state
        if live(state):
            busy[ref.provider] = busy.get(ref.provider, 0) + 1
    held = _mass_cancel_hold(desired, recorded, confirm_cancel)
    if held:
        out.notes.append(held)
    out.sweep_live = live_members(desired, recorded, observed.workers)
    for name in sorted(set(desired.jobs) | set(recorded)):
        job = desired.jobs.get(name)
        workers = by_job.get(name, {})
        if job is None:
            _plan_removed(out, recorded[name], workers, desired, observed, now, held)
        else:
            _plan_job(out, job, recorded, workers, desired, observed, now, commit, busy, policy, reliability)
        settle_live(out.sweep_live, out.statuses[name], workers)
    out.sweeps = sweep_changes(desired, recorded, out.statuses)
    return out


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


def _plan_job(out: Plan, job: Job, recorded: dict[str, JobStatus], workers: dict[WorkerRef, WorkerState],
              desired: DesiredState, observed: Observed, now: float, commit: str, busy: dict[str, int],
              policy: PlacementPolicy, reliability: dict[str, Reliability]) -> None:
    rec = recorded.get(job.name)
    st = identify(job, rec, desired, observed, now, commit)
    st.held = None  # the loop adds a hold of the signature check; a cancel hold is _plan_removed's
    run = observed.runs.get((job.name, st.run_id), RunObservation())
    t = JobTick(job, st, run, workers, desired, observed, now, out, busy, st.current, policy, reliability, rec,
                recorded)
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
    sweep = desired.sweep_of.get(job.name)
    if rec is None or rec.run_id != run_id:
        st = JobStatus(job=job.name, run_id=run_id, manifest=manifest, sweep=sweep, desired_commit=commit,
                       progress=Progress(target=target), message="new job",
                       first_launched=rec.first_launched if rec is not None else None)
        if rec is not None:
            st.message = f"run {run_id} replaces {rec.run_id}: the command, code or env changed"
            st.attempts = [a for a in rec.attempts if not a.open][-MAX_ATTEMPTS_KEPT:]
            if rec.current is not None:
                run_old = observed.runs.get((job.name, rec.run_id), RunObservation())
                st.attempts.append(close(rec.current, Outcome.CANCELLED, now, run_old, "replaced by a new run"))
        return st
    st = rec.model_copy(deep=True)
    st.manifest, st.sweep = manifest, sweep
    st.progress = st.progress.model_copy(update={"target": target})
    if st.phase == Phase.CANCELLED and st.current is None:
        st.phase = Phase.PENDING
        st.message = f"manifest restored: the run resumes from its durable progress (step {st.progress.step})"
    return st


def fence(t: JobTick) -> bool:
    """Step 2: workers that must not run: other runs of this job, and older epochs (zombies)."""
    for ref, state in t.workers.items():
        if not live(state):
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
    fault = t.observed.store_fault
    t.st.storage_fault = fault.describe() if fault is not None and not t.st.phase.terminal else None
    if t.st.storage != t.desired.settings.storage and t.current is not None:
        t.out.notes.append(f"{t.job.name}: storage change to {t.desired.settings.storage} held while attempt "
                           f"{t.current.epoch} is live on {t.st.storage}")
    if t.run.error:
        if not t.st.phase.terminal:
            fault = t.observed.store_fault
            t.st.message = (f"waiting: {fault.describe()}; nothing is charged or launched until it is back"
                            if fault else f"run data unreadable, waiting: {t.run.error}")
        return True
    target = t.job.spec.target_steps
    step = _status_step(t.st.progress.step, t.run.durable_step, target)
    was = t.st.progress
    live = t.current is not None and t.run.heartbeat_epoch == t.current.epoch and t.run.heartbeat_step is not None
    save, every = was.save_seconds, was.save_every_seconds
    if live:
        # The worker's word goes with a new step, so that git changes no more often than before;
        # each figure's first word at once, as the deadline policy weighs it from the run's first
        # save (a worker whose saves a step count pins never says how often: that alone changes nothing).
        new = step != was.step
        save = _whole(t.run.heartbeat_save_seconds, save) if new or save is None else save
        every = _whole(t.run.heartbeat_save_every_seconds, every) if new or every is None else every
    if step == was.step:
        seen_at, beat = was.seen_at, was.heartbeat_step
    else:  # the live worker's step goes with it
        seen_at, beat = t.now, max(step, t.run.heartbeat_step or 0) if live else None
    t.st.progress = Progress(step=step, target=target, seen_at=seen_at, heartbeat_step=beat, save_seconds=save,
                             save_every_seconds=every)
    return False


def _whole(said: float | None, before: float | None) -> float | None:
    """What the worker said, in whole seconds; else what the status had."""
    return float(round(said)) if said is not None else before


def adopt(t: JobTick) -> bool:
    """Step 4: a worker that holds the lease but is not recorded (the daemon died after launching
    it) becomes the current attempt instead of being duplicated."""
    if t.current is not None or t.st.phase.terminal or t.run.lease_epoch <= 0:
        return False
    for ref in t.live_refs(t.run.lease_epoch):
        adopted = Attempt(run_id=t.st.run_id, epoch=ref.epoch, provider=ref.provider, worker=ref.id, started=t.now,
                          step_start=t.run.durable_step, detail="adopted after a reconciler restart")
        t.st.attempts.append(adopted)
        t.st.total_attempts += 1
        t.current = adopted
        break
    return False


def stop_on_policy(t: JobTick) -> bool:
    """Step 6: the live attempt is stopped (SIGTERM, so it saves) when the manifest suspends the
    job (free), or when its deadline has come or its budget is spent (Failed, with the reason)."""
    if t.current is None or t.run.done:
        return False
    spec = t.job.spec
    if spec.suspend:
        stop_current(t, "suspended by the manifest")
        return False
    if spec.deadline is not None and t.now >= spec.deadline.timestamp():
        stop_current(t, "policy: deadline reached")
        fail(t.st, f"policy: deadline {spec.deadline.isoformat()} reached; the worker was asked to save and stop")
        return True
    price = t.price(t.current.provider)
    spent = t.st.cost_usd + open_cost(t.st, t.now, {t.current.provider: price})
    if spec.budget_usd is not None and price > 0 and spent >= spec.budget_usd:
        stop_current(t, "policy: cost budget spent")
        fail(t.st, f"policy: cost budget of ${spec.budget_usd:g} spent (${t.st.cost_usd:g})")
        return True
    return False


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
        # It ended at its last step, not at its last checkpoint (the completion saves none).
        last = t.st.attempts[-1]
        final = t.run.done_step if t.run.done_step is not None else t.job.spec.target_steps
        if final is not None and final > (last.step_end or 0):
            t.st.attempts[-1] = last.model_copy(update={"step_end": final})
        return False
    if seen is None:
        _judge_unseen(t)
        return False
    if cur.unseen_since is not None:
        t.st.attempts[-1] = t.current = cur.model_copy(update={"unseen_since": None})
    return _judge_seen(t, seen, t.workers[seen])


def _judge_seen(t: JobTick, ref: WorkerRef, state: WorkerState) -> bool:
    assert t.current is not None
    verdict = classify(t.job, t.current, state, t.run, t.st.attempts[-2] if len(t.st.attempts) > 1 else None,
                       t.observed.store_fault)
    if verdict is None:
        _judge_live(t, ref, state)
        return False
    beat = t.run.heartbeat_time if t.run.heartbeat_epoch == t.current.epoch else None
    if t.current.stop_reason:  # stopped by us (its manifest was deleted, then restored): never the worker's end
        t.close_current(Outcome.CANCELLED, t.current.stop_reason, state.exit_code,
                        ended=end_time(t.current, t.now, state.ended_at, beat))
        return False
    t.close_current(verdict.outcome, verdict.detail, state.exit_code, ended=end_time(
        t.current, t.now, state.ended_at, beat), unconfirmed=verdict.unconfirmed)
    if verdict.avoid_provider:
        t.st.provider_backoff[ref.provider] = t.now + STORAGE_UNREACHABLE_BACKOFF_SECONDS
    if verdict.outcome == Outcome.JOB_ERROR:
        tail = t.observed.logs.get(ref, "")
        t.st.log_tail = tail[-LOG_TAIL_CHARS:] if tail else None
    if verdict.fail_now:
        fail(t.st, f"failed: {verdict.detail}")
        return True
    return False


def _judge_live(t: JobTick, ref: WorkerRef, state: WorkerState) -> None:
    assert t.current is not None
    # A heartbeat cannot move while the store refuses writes: no stall is judged during a fault.
    stalled = "" if t.observed.store_fault else _stalled(t.job, t.current, t.run, t.now, state)
    if stalled:
        t.stop(ref, "stalled: no heartbeat")
        t.close_current(Outcome.STALLED, stalled)
    elif state.phase == WorkerPhase.PENDING and t.now - t.current.started > PENDING_TIMEOUT_SECONDS:
        t.stop(ref, "never started")
        t.close_current(Outcome.INTERRUPTION, "the provider did not start the worker in time")
    else:
        t.st.phase = Phase.RUNNING if state.phase == WorkerPhase.RUNNING else Phase.LAUNCHING
        if state.phase == WorkerPhase.RUNNING and t.current.running_since is None:
            t.st.attempts[-1] = t.current = t.current.model_copy(update={"running_since": t.now})
        t.st.message = _running_message(t.current, t.run, state, t.now)
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


def note_trouble(t: JobTick) -> bool:
    """Step 7b: a worker the judge just found lost counts against its provider's health at once,
    for this job's next launch and every job planned after it in this tick."""
    new = set(troubles([t.st])) - t.out.troubles
    if new:
        t.out.troubles |= new
        t.out.health = health_of(t.out.troubles, t.now, t.desired.providers)
    return False


def wait_for_store(t: JobTick) -> bool:
    """Step 8a: while run storage has a fault, a job that has not completed launches, moves and
    relaunches nothing (each would need the store); a live worker keeps running (the SDK retries
    its saves), and the status says what is wrong with the store."""
    fault = t.observed.store_fault
    if fault is None or t.run.done or t.st.phase.terminal or (t.current is None and t.job.spec.suspend):
        return False
    if t.current is not None:
        t.st.message = f"{t.st.message}; {fault.describe()}: its saves wait, nothing is charged"
    else:
        t.st.phase = Phase.PENDING
        t.st.message = f"waiting: {fault.describe()}; nothing is charged or launched until it is back"
    return True


def finish(t: JobTick) -> bool:
    """Step 9: a completed run is Succeeded; a worker that wrote its completion but does not exit
    is stopped after a short grace, so it stops billing. A live attempt settles the tick."""
    if t.run.done:
        t.st.phase = Phase.SUCCEEDED
        target = t.job.spec.target_steps
        t.st.progress = Progress(step=max(t.run.durable_step, t.run.done_step or 0, target or 0, t.st.progress.step),
                                 target=target)
        t.st.message = "run completed"
        listed = t.run.outputs
        t.st.outputs = [Output(path=path, size=size) for path, size in listed[:OUTPUTS_LISTED]] or None
        t.st.outputs_more = len(listed) - OUTPUTS_LISTED if len(listed) > OUTPUTS_LISTED else None
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
        if live(state):
            t.stop(ref, f"job is {t.st.phase.value.lower()}")
    return True


STEPS: tuple[Step, ...] = (fence, read_storage, adopt, foresee, stop_on_policy, judge, note_trouble, drill,
                          wait_for_store, reconsider, finish, hold_finished, decide_launch)


# ---- jobs whose manifest is gone --------------------------------------------------------------


def cancelled_by(desired: DesiredState, recorded: dict[str, JobStatus]) -> list[JobStatus]:
    """The active jobs this desired state would cancel: their manifest is gone (a manifest that
    merely stopped parsing holds its job instead). Members that an edit of their sweep's matrix
    removed are not counted: the sweep is still there, so the change is as deliberate as a new
    command (a deleted or renamed sweep counts each of its members)."""
    return [st for st in recorded.values() if not st.phase.terminal and st.job not in desired.jobs
            and st.manifest not in desired.files_with_errors and not _left_matrix(st, desired)]


def _left_matrix(st: JobStatus, desired: DesiredState) -> bool:
    """A member of a sweep that is still defined, whose values its matrix no longer makes."""
    return bool(st.sweep) and st.sweep in desired.sweeps


def confirms_cancel(message: str) -> bool:
    """The commit message carries CONFIRM_CANCEL_TRAILER as a git trailer: a line of its own in the
    last paragraph, after the subject. Quoting it in a sentence (as the reconciler's own status
    commits do when they say what is held) confirms nothing."""
    paragraphs = [p for p in message.strip().split("\n\n") if p.strip()]
    if len(paragraphs) < 2:
        return False
    key, _, value = CONFIRM_CANCEL_TRAILER.partition(":")
    for line in paragraphs[-1].splitlines():
        k, sep, v = line.partition(":")
        if sep and k.strip().lower() == key.lower() and v.strip().lower() == value.strip().lower():
            return True
    return False


def _mass_cancel_hold(desired: DesiredState, recorded: dict[str, JobStatus], confirmed: bool) -> str:
    """A commit that would cancel most of the active jobs at once (an emptied or moved desired/,
    a bad merge) is held until confirmed; returns the message, or "" when nothing is held. Nothing
    of it is kept in memory: every tick (and every restarted daemon) finds the same hold from git."""
    active = [st for st in recorded.values() if not st.phase.terminal]
    doomed = cancelled_by(desired, recorded)
    if confirmed or len(doomed) < 2 or len(doomed) * 2 <= len(active):
        return ""
    names = ", ".join(sorted(st.job for st in doomed))
    return (f"holding: this change would cancel {len(doomed)} of {len(active)} active jobs ({names}); nothing "
            f"is stopped until a commit carries the trailer '{CONFIRM_CANCEL_TRAILER}' "
            f"(git commit --allow-empty -m 'cancel jobs' --trailer '{CONFIRM_CANCEL_TRAILER}'), "
            "or the manifests are restored")


def _plan_removed(out: Plan, rec: JobStatus, workers: dict[WorkerRef, WorkerState], desired: DesiredState,
                  observed: Observed, now: float, held: str) -> None:
    """A job whose manifest is gone is cancelled: its workers are stopped (through the provider
    definition the status last knew, when that is gone too), and its attempt is billed until the
    worker is seen gone."""
    st = rec.model_copy(update={"held": None}, deep=True)
    out.statuses[st.job] = st
    if rec.manifest and rec.manifest in desired.files_with_errors:
        st.message = f"manifest {rec.manifest} has errors; holding the job as it is until they are fixed"
        return
    why, since, back = (("manifest deleted", "its manifest has been deleted", "restore it")
                        if not _left_matrix(st, desired) else
                        (f"no longer in the matrix of sweep {st.sweep}", f"it left sweep {st.sweep}'s matrix",
                         "put its values back in the matrix"))
    if held and not st.phase.terminal:
        st.message = f"{why}; the cancel is held until a commit confirms it or the manifest is restored"
        st.held = held
        return
    alive = [ref for ref, state in workers.items() if live(state)]
    for ref in alive:
        out.actions.append(Terminate(ref, why, observed.run_storage.get((ref.job, ref.run_id))))
    run = observed.runs.get((st.job, st.run_id), RunObservation())
    cur = st.current
    if cur is not None and any(r.epoch == cur.epoch and r.run_id == st.run_id for r in alive):
        st.attempts[-1] = cur.model_copy(update={"stop_reason": why})
        st.message = f"{why}; stopping {cur.worker} on {cur.provider} (billed until it is gone)"
        return
    if cur is not None:
        prov = desired.providers.get(cur.provider) or observed.retired.get(cur.provider)
        price = prov.spec.price_per_hour if prov else 0.0
        gone = next((s for r, s in workers.items() if r.epoch == cur.epoch and r.run_id == st.run_id), None)
        # A run that completed first (while the cancel was held, or just before it) succeeded.
        outcome, detail = (Outcome.SUCCEEDED, "completed") if run.done else (Outcome.CANCELLED, why)
        record_close(st, close(cur, outcome, now, run, detail, gone.exit_code if gone else None,
                               price, gone.ended_at if gone else None))
    if not st.phase.terminal:
        st.backoff_until = None
        if run.done:
            st.phase, st.message = Phase.SUCCEEDED, f"run completed; {since} since"
            st.progress = Progress(step=max(st.progress.step, run.durable_step, run.done_step or 0),
                                   target=st.progress.target)
        else:
            st.phase = Phase.CANCELLED
            st.message = f"{why}; run cancelled (this file stays as history; {back} to resume)"


# ---- small rules --------------------------------------------------------------------------------


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


def _running_message(attempt: Attempt, run: RunObservation, state: WorkerState, now: float) -> str:
    """The live attempt in a few words. "Not instrumented" only once the worker has run past the
    grace without a single heartbeat of the run: said earlier, it is a false alarm on every SDK job."""
    where = f"{attempt.provider}/{attempt.worker}"
    if state.phase == WorkerPhase.PENDING:
        return f"attempt {attempt.epoch} waiting to start on {where}"
    since = attempt.running_since if attempt.running_since is not None else attempt.started
    if run.heartbeat_epoch is None and now - since >= FIRST_HEARTBEAT_GRACE_SECONDS:
        return (f"attempt {attempt.epoch} running on {where} (not instrumented: no heartbeat, so it is "
                "judged by the provider's state alone)")
    return f"attempt {attempt.epoch} running on {where}"


def _trim(st: JobStatus) -> None:
    if len(st.attempts) > MAX_ATTEMPTS_KEPT:
        st.attempts = st.attempts[-MAX_ATTEMPTS_KEPT:]


def apply_results(p: Plan, results: list[LaunchResult], now: float, durable: dict[tuple[str, str], int],
                  moves: list[MoveResult] | None = None) -> None:
    """Records launched attempts; records a provider's refusal (its health); fails a job that
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
            st.attempts.append(Attempt(run_id=st.run_id, epoch=res.ref.epoch, provider=res.ref.provider,
                                       worker=res.ref.id, started=now,
                                       step_start=durable.get((st.job, st.run_id), 0)))
            st.total_attempts += 1
            if st.first_launched is None:
                st.first_launched = min((a.started for a in st.attempts), default=now)
            if res.action.inputs and st.inputs is None:
                st.inputs = [HandedInput(dir=i.dir, job=i.job, run_id=i.run_id, storage=i.storage)
                             for i in res.action.inputs]
            st.phase = Phase.LAUNCHING
            st.message = f"attempt {res.ref.epoch} launched on {res.ref.provider} ({res.action.reason})"
            _trim(st)
        elif res.job_config_error:
            fail(st, f"config error: {res.error}")
        elif res.held:
            st.phase = Phase.PENDING
            st.message = f"{HELD} {res.error}"
        elif res.unavailable:
            # A durable fact, read by every job's planner: the provider cools down for all of them.
            st.refusals = [*st.refusals, Refusal(provider=res.action.provider, refused=now,
                                                 error=res.error or "")][-MAX_REFUSALS_KEPT:]
            st.phase = Phase.PENDING
            st.message = f"provider {res.action.provider} refused the launch: {res.error}"
        else:
            st.phase = Phase.PENDING
            st.message = f"cannot launch: {res.error}"
