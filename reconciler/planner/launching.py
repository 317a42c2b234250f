"""Launching: where and when a job's next attempt goes, and whether a live one should move.
Pure. The planner's last steps (reconciler.planner.plan runs them in order): `foresee` brings the job's
forecast up to date, `reconsider` asks the placement policy whether a running attempt of a job
with a deadline should stay or move, and `decide_launch` runs the launch guards, the dependencies
(`after`: reconciler.planner.dependencies), the back-off and then placement. Where a run should go,
and why, is one question to time and money (reconciler.planner.outlook.where): plain cheapest-first
for most jobs, the placement policy for jobs with a deadline or a budget.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from adapters.artifacts import Input
from adapters.compute import WorkerPhase
from desired.models import Job
from reconciler.planner.dependencies import dependencies, inputs, waiting
from reconciler.planner.health import clock
from reconciler.planner.judge import (
    JOB_DEADLINE_STOP,
    MAX_STOP_MARGIN_SECONDS,
    RAPID_END_LIMIT,
    RAPID_END_SECONDS,
    grace,
)
from reconciler.planner.outlook.deadline import Choice, Situation
from reconciler.planner.outlook.where import Answer, Question, where_to_run
from reconciler.planner.tick import JobTick, Launch, MoveRunData, fail, last_detail, stop_current
from status.models import JobStatus, Outcome, Phase

HOST_COOLDOWN_SECONDS = 6 * 3600.0  # a machine that lost a worker of ours is avoided this long
MOVING = "moving to"  # detail of an attempt the placement policy stopped to move the run
LEAVING = "leaving"  # detail of an attempt the placement policy stopped to wait for cheaper capacity
INFEASIBLE_NOTE = "the deadline cannot be met (the forecast's decision says why, and at which rate)"
MOVE_WAIT_SECONDS = 600.0  # after a move, the next launch waits this long for the old worker to save and go


def bad_hosts(statuses: Iterable[JobStatus], now: float) -> frozenset[tuple[str, str]]:
    """Machines where an attempt of ours was interrupted in the last HOST_COOLDOWN_SECONDS (a Vast.ai
    host that lost its network, say): the next launches on that provider avoid them, whatever the job."""
    return frozenset(
        (a.provider, a.host) for st in statuses for a in st.attempts
        if a.host and a.outcome == Outcome.INTERRUPTION and a.provider_ended and a.ended is not None
        and now - a.ended < HOST_COOLDOWN_SECONDS)


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
        t.st.forecast = _ask(t, None).forecast
    return False


def _ask(t: JobTick, policy: Callable[[Situation], Choice] | None, launch: bool = True) -> Answer:
    """Where this job should run now, and why (without a policy: only its forecast)."""
    cur = t.current
    beat = t.run.heartbeat_step if cur is not None and t.run.heartbeat_epoch == cur.epoch else None
    available = frozenset(n for n in t.desired.providers if not _unavailable(t, n)) if policy else frozenset()
    return where_to_run(Question(
        job=t.job, status=t.st, providers=t.desired.providers, now=t.now,
        done_step=max(t.run.durable_step, t.st.progress.step), live_step=beat,
        current=cur.provider if cur is not None else None, recorded=t.recorded, capacity=t.observed.capacity,
        allowances=t.observed.allowances, health=t.health, reliability=t.reliability, available=available,
        policy=policy, launch=launch, tick_seconds=t.desired.settings.tick_seconds,
        lookahead=t.desired.settings.deadline_policy == "lookahead"))


def reconsider(t: JobTick) -> bool:
    """Step 8: a running attempt of a job with a deadline is checked against the placement policy:
    it stays, or the run moves (the worker is stopped so it saves; the next tick launches where the
    policy says), or, where the policy says to leave, the worker is stopped and the run waits."""
    cur = t.current
    if cur is None or t.run.done or t.job.spec.deadline is None:
        return False
    if not any(s.phase == WorkerPhase.RUNNING for r, s in t.workers.items()
               if r.run_id == t.st.run_id and r.epoch == cur.epoch):
        return False
    _forget_past_backoff(t)
    answer = _ask(t, t.policy, launch=False)
    choice = answer.choice
    assert choice is not None  # a running attempt of a job with a deadline is always judged
    t.st.forecast = answer.forecast
    if choice.provider is None and choice.leave:
        why = choice.reason if choice.reason.startswith(LEAVING) else f"{LEAVING} {cur.provider}: {choice.reason}"
        stop_current(t, why)
        t.st.phase = Phase.PENDING
        t.st.message = why
        return True
    if choice.provider is not None and choice.provider != cur.provider:
        why = choice.reason if choice.reason.startswith(MOVING) else f"{MOVING} {choice.provider}: {choice.reason}"
        stop_current(t, why)
        t.st.phase = Phase.PENDING
        t.st.message = why
        return True
    # The reasoning, with its figures, is the forecast's `decision`; the message only says when the
    # deadline cannot be met (its figures would change it, and commit it, every tick).
    if answer.infeasible:
        t.st.message = f"{t.st.message}; {INFEASIBLE_NOTE}"
    return False


def decide_launch(t: JobTick) -> bool:
    """Step 11: with no live attempt, whether (guards, dependencies, back-off, the sweep's max_parallel)
    and where (placement) to launch the next."""
    if t.job.spec.suspend:
        t.st.phase = Phase.SUSPENDED
        t.st.message = "suspended by the manifest (spec.suspend: true)"
        return True
    for guard in GUARDS:
        reason = guard(t)
        if reason:
            fail(t.st, reason)
            return True
    if _pending(t, _awaiting_dependencies(t)) or _pending(t, _too_late(t)):
        return True
    if _backing_off(t):
        return True
    if t.st.storage != t.desired.settings.storage:
        # A changed `storage:` moves the run between attempts, never under a live worker.
        t.out.actions.append(MoveRunData(t.job.name, t.st.run_id, t.st.storage, t.desired.settings.storage))
        t.st.phase = Phase.PENDING
        t.st.message = f"moving the run's data from {t.st.storage} to {t.desired.settings.storage}"
        return True
    if _pending(t, _sweep_full(t)):
        return True
    _place(t)
    return True


def _pending(t: JobTick, why: str) -> bool:
    """The job waits (Pending) for `why`; False when there is no reason to."""
    if why:
        t.st.phase = Phase.PENDING
        t.st.message = why
    return bool(why)


def _sweep_full(t: JobTick) -> str:
    """Why a member of a sweep waits for its sweep's `max_parallel` ("" when it need not): the
    members holding a live attempt are counted on the plan, this tick's launches included."""
    sweep = t.desired.sweeps.get(t.st.sweep or "")
    if sweep is None or sweep.max_parallel is None:
        return ""
    live = t.out.sweep_live.get(sweep.name, set()) - {t.job.name}
    if len(live) < sweep.max_parallel:
        return ""
    members = f"{len(live)} member{'' if len(live) == 1 else 's'}"
    return (f"waiting: sweep {sweep.name} has {members} live, its max_parallel of {sweep.max_parallel}; "
            "this one starts when one of them ends")


def _guard_config(t: JobTick) -> str:
    missing = [p for p in t.job.spec.placement.providers if p not in t.desired.providers]
    if missing and len(missing) == len(t.job.spec.placement.providers):
        return f"config error: no provider named {', '.join(missing)} is defined"
    return ""


def _guard_retries(t: JobTick) -> str:
    r = t.job.spec.retry
    if t.st.failures > r.max_retries:
        return (f"failed {t.st.failures} times, more than the retry budget of {r.max_retries}; "
                f"last: {last_detail(t.st)}")
    return ""


def _guard_crash_loop(t: JobTick) -> str:
    limit = t.job.spec.retry.max_unproductive_attempts
    if t.st.unproductive >= limit:
        return (f"crash loop: {t.st.unproductive} attempts in a row ended without a new checkpoint "
                f"(limit retry.max_unproductive_attempts={limit}); last: {last_detail(t.st)}")
    return ""


def _guard_rapid_ends(t: JobTick) -> str:
    n = _rapid_ends(t.st)
    if n >= RAPID_END_LIMIT:
        return (f"rapid-end loop: {n} attempts in a row ended within {RAPID_END_SECONDS:g} s of starting "
                f"(limit {RAPID_END_LIMIT}, whatever their progress); last: {last_detail(t.st)}")
    return ""


def _rapid_ends(st: JobStatus) -> int:
    """Attempts in a row, newest first, that ended within RAPID_END_SECONDS of their start (the
    first heartbeat, else the launch) without the provider's word. Ends the provider confirmed, and
    ours (cancelled, superseded), neither count nor break the row, as in the crash-loop guard."""
    n = 0
    for a in reversed(st.attempts):
        if a.outcome is None or a.ended is None or a.outcome in (Outcome.CANCELLED, Outcome.SUPERSEDED):
            continue
        if a.outcome in (Outcome.INTERRUPTION, Outcome.SESSION_END) and not a.unconfirmed:
            continue
        start = a.first_beat if a.first_beat is not None else a.started
        if a.outcome == Outcome.SUCCEEDED or a.ended - start >= RAPID_END_SECONDS:
            break
        n += 1
    return n


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
    _guard_config, _guard_retries, _guard_crash_loop, _guard_rapid_ends, _guard_budget, _guard_deadline)


def _awaiting_dependencies(t: JobTick) -> str:
    """Why the run may not start yet, or "": a job with `after` starts only once every job it names
    has succeeded, by the statuses the tick read (one that succeeds during this tick lets it start
    at the next). A run that has started is relaunched without waiting for anything."""
    if not t.job.spec.after or t.st.total_attempts:
        return ""
    return waiting(dependencies(t.job, t.desired.jobs, t.recorded_jobs, t.desired.sweeps))


def _too_late(t: JobTick) -> str:
    """Why no attempt is launched before the job's deadline, or "": one that cannot save new work
    before it would do nothing but cost a start-up (the deadline itself then ends the job). The
    worker already said so when it stopped for that deadline; else the job's measured start-up and
    restore (launch to first heartbeat, its latest attempt) plus the SDK's stop margin must fit. A
    deadline moved later since that stop is a new one: it is measured afresh."""
    deadline = t.job.spec.deadline
    if deadline is None:
        return ""
    when, margin = deadline.isoformat(), grace(t.job)
    last = t.st.attempts[-1] if t.st.attempts else None
    if last is not None and last.outcome == Outcome.CANCELLED and JOB_DEADLINE_STOP in last.detail \
            and last.ended is not None and deadline.timestamp() - last.ended <= max(MAX_STOP_MARGIN_SECONDS, margin):
        return (f"not relaunching: the last attempt stopped for the job's deadline ({when}), too close for "
                "another to save new work; the deadline will end the job")
    left = deadline.timestamp() - t.now
    changeover = next((a.first_beat - a.started for a in reversed(t.st.attempts) if a.first_beat is not None), None)
    if left < (changeover or 0.0) + margin:
        took = ("start-up and restore not measured yet" if changeover is None else
                f"{changeover:.0f} s of start-up and restore, as its latest measured attempt took")
        return (f"not launching: {left:.0f} s to the deadline ({when}), less than an attempt needs to save new "
                f"work ({took}, and the {margin:g} s before the deadline at which the worker stops to "
                "checkpoint); the deadline will end the job")
    return ""


def _backing_off(t: JobTick) -> bool:
    """Charged failures back off exponentially, and so do free ends without progress from the
    second in a row (the provider's own word neither adds to that row nor clears it, so it
    relaunches at once unless such a row came before it), and interruptions the provider did not
    confirm from the first (a strike per one in a row)."""
    st, last = t.st, (t.st.attempts[-1] if t.st.attempts else None)
    strikes = max(st.failures if last is not None and last.outcome is not None and last.outcome.charged else 0,
                  st.unproductive - 1, _unconfirmed_in_a_row(st))
    if last is not None and last.ended is not None and strikes > 0:
        if st.backoff_until is None or st.backoff_until < last.ended:
            st.backoff_until = last.ended + _backoff(t.job, strikes)
    if st.backoff_until is not None and t.now < st.backoff_until:
        st.phase = Phase.BACKOFF
        why = f"{st.failures} failure(s)" if st.failures else f"{st.unproductive} attempt(s) without progress"
        if last is not None and last.unconfirmed and not (last.outcome is not None and last.outcome.charged):
            why = "an interruption the provider did not confirm"
        st.message = f"backing off after {why}: {last_detail(st)}"
        return True
    st.backoff_until = None
    return False


def _unconfirmed_in_a_row(st: JobStatus) -> int:
    n = 0
    for a in reversed(st.attempts):
        if not a.unconfirmed:
            break
        n += 1
    return n


def _forget_past_backoff(t: JobTick) -> None:
    t.st.provider_backoff = {p: until for p, until in t.st.provider_backoff.items() if until > t.now}


def _unavailable(t: JobTick, name: str) -> str:
    """Why `name` cannot take a worker of this job now ("" when it can): unreachable, cooling down
    after a refusal (any job's: reconciler.planner.health), avoided by this job, or full."""
    health = t.health.get(name)
    if name in t.observed.unreachable:
        return f"{name} cannot be reached ({t.observed.unreachable[name]})"
    if health is not None and health.skipped(t.now):
        return health.describe(t.now)
    if name in t.st.provider_backoff:
        return f"{name} is avoided by this job until {clock(t.st.provider_backoff[name])}"
    limit = t.desired.providers[name].spec.concurrency
    if t.busy.get(name, 0) >= limit:
        return f"{name} already runs {limit} worker{'' if limit == 1 else 's'}, its concurrency limit"
    if t.observed.free_slots.get(name, 1) <= 0:
        return f"{name} has no free slot"
    return ""


def _launch(t: JobTick, name: str, mtbf_seconds: float | None) -> None:
    st = t.st
    prov = t.desired.providers[name]
    t.busy[name] = t.busy.get(name, 0) + 1
    if st.sweep:
        t.out.sweep_live.setdefault(st.sweep, set()).add(t.job.name)
    _reserve_allowance(t, name, prov.spec.price_per_hour)
    reason = ("first launch" if not st.attempts  # attempts of a replaced run are kept, but not counted
              else "first launch of the new run" if not st.total_attempts else f"relaunch after: {last_detail(st)}")
    avoid = tuple(sorted(h for p, h in t.observed.bad_hosts | bad_hosts([st], t.now) if p == name))
    t.out.actions.append(Launch(t.job.name, st.run_id, name, reason, avoid, mtbf_seconds, _handed(t)))
    st.phase = Phase.LAUNCHING
    st.message = f"launching on {name}"


def _handed(t: JobTick) -> tuple[Input, ...]:
    """The dependencies' outputs a launch hands over: those the run's first attempt was handed, so
    that a relaunch after a dependency has started (or finished) a new run resumes on the same inputs;
    the newest succeeded runs for the run's first attempt (or one whose status predates `inputs`)."""
    if not t.job.spec.after:
        return ()
    if t.st.inputs is not None:
        return tuple(Input(i.dir, i.job, i.run_id, i.storage) for i in t.st.inputs)
    return inputs(t.job, t.recorded_jobs, t.desired.sweeps)


def _moving_worker_still_live(t: JobTick) -> bool:
    """After a move, the old worker saves and goes before the run starts elsewhere (a new epoch
    started earlier would fence its final checkpoint)."""
    last = t.st.attempts[-1] if t.st.attempts else None
    if last is None or not last.detail.startswith((MOVING, LEAVING)) or last.ended is None:
        return False
    return t.now - last.ended < MOVE_WAIT_SECONDS and bool(t.live_refs(last.epoch))


def _place(t: JobTick) -> None:
    st = t.st
    _forget_past_backoff(t)
    if _moving_worker_still_live(t):
        st.phase = Phase.PENDING
        st.message = f"{last_detail(st)} (waiting for the worker to save and stop)"
        return
    answer = _ask(t, t.policy)
    if t.job.spec.deadline is not None or t.job.spec.budget_usd is not None:
        _place_by_policy(t, answer)
    elif answer.provider is not None:
        _launch(t, answer.provider, answer.mtbf_seconds)
    else:
        _say_why_waiting(t, answer)


def _place_by_policy(t: JobTick, answer: Answer) -> None:
    """Jobs with a deadline or a budget: the placement policy picked among the options the budget
    can pay to finish on; the forecast says why."""
    choice = answer.choice
    t.st.forecast = answer.forecast
    if choice is not None and choice.provider is not None and not _unavailable(t, choice.provider):
        _launch(t, choice.provider, answer.mtbf_seconds)
        reason = choice.reason.removeprefix(f"on {choice.provider}: ")
        t.st.message = f"launching on {choice.provider}: {reason}"
    elif choice is not None and choice.provider is not None:
        t.st.phase = Phase.PENDING
        why = _unavailable(t, choice.provider) or "it cannot take it now"
        t.st.message = f"waiting for {choice.provider}, where the placement policy wants the run: {why}"
    elif choice is not None and t.job.spec.deadline is not None:
        t.st.phase = Phase.PENDING
        t.st.message = f"{choice.headline} (the forecast's decision says why)"
    else:
        _say_why_waiting(t, answer)


def _say_why_waiting(t: JobTick, answer: Answer) -> None:
    st, placement = t.st, answer.placement
    st.phase = Phase.PENDING
    avoided = [n for n in placement.order if n in st.provider_backoff and n not in t.observed.unreachable]
    if placement.order and len(avoided) == len(placement.order) and st.attempts:
        until = clock(max(st.provider_backoff[n] for n in avoided))
        st.message = f"waiting: {', '.join(avoided)} avoided until {until} after: {last_detail(st)}"
    elif placement.order:
        reasons = [_unavailable(t, n) for n in placement.order]
        st.message = f"waiting: {'; '.join(r for r in reasons if r) or 'no provider can take it now'}"
    else:
        st.message = f"no allowed provider can take this job: {placement.why_nowhere() or 'none defined'}"


def _reserve_allowance(t: JobTick, provider: str, price: float) -> None:
    """A launch draws on the provider's allowance before its API says so: the next job placed in
    this tick sees what is left (a session's minimum of quota, or an hour of credits)."""
    a = t.observed.allowances.get(provider)
    if a is not None and (a.applies_to_cpu or t.job.spec.resources.gpus > 0):
        spend = price if a.unit == "credits" else a.minimum
        t.observed.allowances[provider] = replace(a, remaining=a.remaining - spend)


def _backoff(job: Job, strikes: int) -> float:
    r = job.spec.retry
    return min(r.backoff_max_seconds, r.backoff_seconds * (2 ** max(0, strikes - 1)))

