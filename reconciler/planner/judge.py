"""How an attempt ended and whose fault it was: one table from what the provider and storage say
to the failure classes of DESIGN.md §5, and how a closed attempt is written into the status.

Pure (no I/O, no clock). A free interruption needs evidence: the provider's own word
(preempted, host lost, session end) or durable progress gained by the attempt. A signal the job
raises on itself (SEGV, ABRT, ...) or an OOM kill is the job's error; a kill from outside that
gained nothing is counted too, because nothing shows it was not the job's own doing.

An interruption the provider does not confirm (a signal after a new checkpoint, an exit 75 with
no notice behind it) is free once but backs off like an error, and the next one in a row is
charged: an out-of-memory kill on a machine that reports none looks exactly like it, and must
not relaunch the job every few seconds for ever.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from adapters.compute import WorkerPhase, WorkerState
from adapters.hosted import SECRET_NOT_ATTACHED, STORAGE_UNREACHABLE
from adapters.stores.faults import StoreFault
from desired.models import ExitCodeRule, Job
from status.models import FREE_BY_RULE_DETAIL, STORAGE_FAULT_DETAIL, Attempt, JobStatus, Outcome

if TYPE_CHECKING:
    from reconciler.planner.run_observation import RunObservation

EXIT_INTERRUPTED = 75  # worker checkpointed and left because it was told to (EX_TEMPFAIL)
RAPID_END_SECONDS = 60.0
"""An attempt that ends within this many seconds of its start (its first heartbeat, or its launch
when it never sent one) is a rapid end, whatever progress it made: a relaunch storm is made of them."""
RAPID_END_LIMIT = 5
"""This many rapid ends in a row, of ends not confirmed by the provider, hold the job (Failed,
naming the loop): on a hosted provider each of them paid a start-up and its minimum bill."""
# The worker SDK (reconciler.worker.run, which the planner does not import: torch) stops this long
# before RECONCILER_DEADLINE at the least: RECONCILER_GRACE, default 30 s; and at the most twice
# its last save, capped at MAX_DEADLINE_MARGIN there (mirrored here), when that is longer.
DEFAULT_GRACE_SECONDS = 30.0
MAX_STOP_MARGIN_SECONDS = 1800.0
JOB_DEADLINE_STOP = "checkpointed and stopped before the job's deadline"  # in the detail of such an end
CRASH_SIGNALS = frozenset({"SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL", "SIGSYS", "SIGTRAP"})


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    detail: str
    fail_now: bool = False  # the job's own exit-code rule says: no retry
    unconfirmed: bool = False  # an interruption, or so it seemed, that the provider never confirmed
    avoid_provider: bool = False  # the worker could not reach run storage, or lacks a secret, at this provider


def exit_rule(job: Job, code: int | None) -> ExitCodeRule | None:
    if code is None:
        return None
    return next((r for r in job.spec.retry.exit_codes if code in r.codes), None)


def classify(job: Job, attempt: Attempt, state: WorkerState, run: RunObservation,
             previous: Attempt | None = None, store_fault: StoreFault | None = None) -> Verdict | None:
    """None while the worker is pending or running; otherwise how its attempt ended. `previous`,
    the attempt before this one, decides whether an unconfirmed interruption is a repeat.
    `store_fault`: run storage is faulty now (the tick's probe), so an end that is not a success is
    the store's."""
    if state.phase in (WorkerPhase.PENDING, WorkerPhase.RUNNING):
        return None
    word = state.provider_state or state.phase.value
    if state.detail:  # "killed by SIGKILL, not by the reconciler" already says "killed by SIGKILL"
        word = state.detail if state.detail.startswith(word) else f"{word} ({state.detail})"
    if state.phase == WorkerPhase.PREEMPTED:
        return Verdict(Outcome.INTERRUPTION, f"interrupted: {word}")
    if state.phase == WorkerPhase.LOST:
        return Verdict(Outcome.INTERRUPTION, f"worker lost: {word}")
    if state.phase == WorkerPhase.SESSION_LIMIT:
        return Verdict(Outcome.SESSION_END, f"session limit reached: {word}")
    if state.exit_code == 0 and run.done:
        return Verdict(Outcome.SUCCEEDED, "completed")
    if store_fault is not None:
        # A worker that could not save while the store itself was full, read-only, ... is not at
        # fault: a storage-fault interruption, free; nothing is relaunched until the store is back.
        return Verdict(Outcome.INTERRUPTION, f"{STORAGE_FAULT_DETAIL} ended ({word}, exit code {state.exit_code}) "
                       f"while {store_fault.describe()}; not charged")
    if state.exit_code == STORAGE_UNREACHABLE and "cannot reach run storage" in state.detail:
        # Charged once, and that provider is avoided for a while: relaunching there would only
        # repeat it (missing storage secrets, a firewall), and the job must not loop on it.
        return Verdict(Outcome.JOB_ERROR, f"the worker cannot reach run storage from {attempt.provider}: "
                       f"{state.detail}", avoid_provider=True)
    if state.exit_code == SECRET_NOT_ATTACHED and "is not attached" in state.detail:
        # Only a person can attach it (Kaggle: in the editor, to the job's kernel, which the detail
        # names): charged once, and the provider avoided for a while, so the job does not loop.
        return Verdict(Outcome.JOB_ERROR, f"a secret is missing on {attempt.provider}: {state.detail}",
                       avoid_provider=True)
    verdict = _rule_verdict(job, state)
    if verdict is not None:
        return verdict
    verdict = _evidence_verdict(job, attempt, state, run, word)
    if verdict.unconfirmed and verdict.outcome == Outcome.INTERRUPTION and previous is not None \
            and previous.unconfirmed:
        return Verdict(Outcome.JOB_ERROR, f"{verdict.detail}; the second interruption in a row that the "
                       "provider did not confirm, so it counts as a failure", unconfirmed=True)
    return verdict


def _rule_verdict(job: Job, state: WorkerState) -> Verdict | None:
    rule = exit_rule(job, state.exit_code)
    if rule is None:
        return None
    what = f"exited with code {state.exit_code}"
    if rule.action == "fail":
        return Verdict(Outcome.JOB_ERROR, f"{what}, which the job's exit_codes rule says is final", fail_now=True)
    if rule.action == "ignore":
        return Verdict(Outcome.INTERRUPTION, f"{what} {FREE_BY_RULE_DETAIL}")
    return Verdict(Outcome.JOB_ERROR, f"{what} (counted by the job's exit_codes rule)")


def _evidence_verdict(job: Job, attempt: Attempt, state: WorkerState, run: RunObservation,
                      word: str) -> Verdict:
    gained = run.durable_step > attempt.step_start
    if state.oom:
        return Verdict(Outcome.JOB_ERROR, f"killed for running out of memory: {word}")
    if state.signal in CRASH_SIGNALS:
        return Verdict(Outcome.JOB_ERROR, f"crashed with {state.signal}: {word}")
    if state.signal:
        if gained:
            return Verdict(Outcome.INTERRUPTION, f"interrupted: {word}, after a new checkpoint, without the "
                           "provider's word", unconfirmed=True)
        return Verdict(Outcome.JOB_ERROR, f"{word} before any new checkpoint; without the provider's word that "
                                          "it was preempted, this counts as a failure")
    if _stopped_by_sdk(attempt, state, run):
        # The SDK wrote its last beat after the final checkpoint and then exited 75, but torchrun
        # reports any rank's failing exit as 1: the beat is the evidence of a clean stop.
        why = f"the launcher exited with code {state.exit_code}"
        if run.heartbeat_stopping == "deadline":
            return _deadline_stop(job, run, "every rank", f"; {why}")
        return Verdict(Outcome.INTERRUPTION, f"every rank checkpointed and stopped ({run.heartbeat_stopping}); "
                       f"{why}", unconfirmed=run.heartbeat_stopping != "request")
    if state.exit_code == EXIT_INTERRUPTED and run.heartbeat_epoch == attempt.epoch \
            and run.heartbeat_stopping == "deadline":
        return _deadline_stop(job, run, "worker", " (exit 75)")
    if state.exit_code == EXIT_INTERRUPTED and run.heartbeat_epoch == attempt.epoch \
            and run.heartbeat_stopping == "request":
        return Verdict(Outcome.INTERRUPTION, "worker checkpointed and exited on the provider's stop notice (exit 75)")
    if state.exit_code == EXIT_INTERRUPTED:
        return Verdict(Outcome.INTERRUPTION, "worker checkpointed and stopped (exit 75) with no stop notice from "
                       "the provider", unconfirmed=True)
    if state.exit_code == 0:
        return Verdict(Outcome.JOB_ERROR, "exited 0 without writing its completion record (done.json)")
    return Verdict(Outcome.JOB_ERROR, f"exited with code {state.exit_code}")


def _deadline_stop(job: Job, run: RunObservation, who: str, how: str) -> Verdict:
    """The SDK saw RECONCILER_DEADLINE (the earlier of the job's deadline and the provider's session
    end) and saved in time. Near the job's deadline it is the job's own policy ending the run: ours,
    free, and no reason to relaunch (reconciler.planner.launching does not). Else it is the session's end,
    even when the provider's warning never came or came later (Slurm checks its warnings every 30 s)."""
    deadline = job.spec.deadline
    stopped = run.heartbeat_time
    if deadline is not None and stopped is not None \
            and deadline.timestamp() - stopped <= max(MAX_STOP_MARGIN_SECONDS, grace(job)):
        return Verdict(Outcome.CANCELLED, f"{who} {JOB_DEADLINE_STOP}{how}")
    return Verdict(Outcome.SESSION_END, f"{who} checkpointed and stopped before its session's end{how}")


def grace(job: Job) -> float:
    """The least stop margin the job's workers use: RECONCILER_GRACE from its env, else the SDK's default."""
    try:
        return float(job.spec.env.get("RECONCILER_GRACE", DEFAULT_GRACE_SECONDS))
    except ValueError:
        return DEFAULT_GRACE_SECONDS


def _stopped_by_sdk(attempt: Attempt, state: WorkerState, run: RunObservation) -> bool:
    """Exited non-zero right after this attempt's SDK wrote its stopping beat, which it writes only
    once the final checkpoint is committed: a launcher's code for its ranks' exit 75 (torchrun
    reports any failed rank as 1; srun the highest of its tasks' codes, 137 for one it ended)."""
    return state.exit_code not in (None, 0, EXIT_INTERRUPTED) and run.heartbeat_epoch == attempt.epoch \
        and run.heartbeat_stopping is not None


def end_time(attempt: Attempt, now: float, *candidates: float | None) -> float:
    """When the attempt really ended: the first known of `candidates` (the provider's end time,
    the completion record, the last heartbeat), kept between its start and now; else now."""
    for t in candidates:
        if t is not None:
            return min(now, max(attempt.started, t))
    return now


def steps_lost(attempt: Attempt, run: RunObservation) -> int:
    """The steps the next attempt will compute again: the highest step this attempt finished (its
    heartbeat, or the worker's per-step mark when that is further) minus the durable step, the
    one the next attempt restores from. The heartbeat alone (every 10 s) misses the steps after it.
    """
    if run.heartbeat_epoch != attempt.epoch:
        return 0
    reached = max(run.heartbeat_step or 0, run.reached_step or 0)
    return max(0, reached - run.durable_step)


def close(attempt: Attempt, outcome: Outcome, now: float, run: RunObservation, detail: str = "",
          exit_code: int | None = None, price_per_hour: float = 0.0, ended: float | None = None,
          billed: float | None = None) -> Attempt:
    """The attempt, ended at `ended` (default now) and billed up to then: the provider's own bill
    when it reports one (`billed`), else the provider's price over the attempt's time."""
    end = now if ended is None else end_time(attempt, now, ended)
    lost = 0
    if outcome in (Outcome.INTERRUPTION, Outcome.SESSION_END, Outcome.STALLED, Outcome.JOB_ERROR):
        lost = steps_lost(attempt, run)
    hours = max(0.0, end - attempt.started) / 3600.0
    return attempt.model_copy(update={
        "ended": end,
        "outcome": outcome,
        "detail": detail or attempt.detail,
        "exit_code": exit_code,
        "step_end": run.durable_step,
        "steps_lost": lost,
        "cost_usd": round(billed if billed is not None else hours * price_per_hour, 4),
        "unseen_since": None,
    })


PROVIDER_ENDED = frozenset({WorkerPhase.PREEMPTED, WorkerPhase.LOST, WorkerPhase.SESSION_LIMIT})


def record_close(st: JobStatus, closed: Attempt, provider_ended: bool = False) -> None:
    """Folds a closed attempt into the job's counters: charges, free interruptions, and the run
    of attempts in a row that gained no durable step (the crash-loop guard).

    An attempt the provider itself ended (its word: preempted, host lost, session over) says
    nothing about the job, so without progress it leaves that run as it was, as SkyPilot's
    managed jobs recover preemptions without limit: a spot market that preempts faster than the
    job checkpoints is the `repeated-preemptions` notice's business, and the budget's and the
    deadline's, not a "crash loop" that fails a job which would finish elsewhere."""
    st.attempts[-1] = closed
    st.steps_lost += closed.steps_lost
    st.cost_usd = round(st.cost_usd + closed.cost_usd, 4)
    if closed.outcome is not None and closed.outcome.charged:
        st.failures += 1
    elif closed.outcome in (Outcome.INTERRUPTION, Outcome.SESSION_END):
        st.interruptions += 1
    if closed.outcome in (Outcome.CANCELLED, Outcome.SUPERSEDED):
        return  # we ended it: says nothing about the job
    if closed.outcome == Outcome.SUCCEEDED or (closed.step_end or 0) > closed.step_start:
        st.unproductive = 0
    elif provider_ended and not (closed.outcome is not None and closed.outcome.charged):
        return
    else:
        st.unproductive += 1
