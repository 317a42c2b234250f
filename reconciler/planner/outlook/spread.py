"""A job's spread: what this repository measured, per provider, turned into the futures' lanes
(reconciler.planner.outlook.futures), and their P50 and P90. Pure: it reads the desired state,
the job statuses and the provider ledger as git records them.

Each input says where it comes from: measured (from this repository's attempts, or the provider's
own word on its quota), borrowed (from other providers, the job's rate elsewhere, or a prior), or
declared (a setting: a price, a session limit, a checkpoint interval, the step time a manifest
states; with that, a run not started yet has futures too). The futures follow the run
on the provider it is on, or the first its placement would pick, and on the cheapest reliable
provider allowed (the fallback) once a quota is spent or a deadline calls for it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from statistics import median

from desired.models import Job, Provider
from reconciler.planner.outlook.forecast import (
    PRIOR_CHANGEOVER_SECONDS,
    Track,
    attempt_rate,
    changeover,
    first_step,
    job_rate,
    job_tracks,
    lost_interval_steps,
    open_cost,
    provider_rate,
    said_interval_steps,
)
from reconciler.planner.outlook.futures import Evidence, Lane, Run, Spread, seed_of, spread
from reconciler.planner.outlook.placement import place
from reconciler.planner.outlook.reliability import prior_mtbf, watched_records
from status.models import Attempt, JobStatus, Outcome, ProviderLedger

MEASURED, BORROWED, DECLARED = "measured", "borrowed", "declared"
PRIOR_WAIT_SECONDS = 300.0  # after an interruption, until the next launch, while none is measured anywhere
FALLBACK_CHECKPOINT_SECONDS = 1800.0  # work between checkpoints when neither measured nor declared


@dataclass(frozen=True)
class Input:
    provider: str
    name: str  # mtbf, wait, changeover, rate, checkpoint, price, session, quota
    value: float | None
    unit: str
    source: str  # measured, borrowed or declared
    how: str  # from what, in words


@dataclass
class JobSpread:
    job: str
    spread: Spread | None = None
    provider: str = ""  # where the futures start
    fallback: str = ""  # where they go when the quota is spent or the deadline calls for it
    inputs: list[Input] = field(default_factory=list)
    note: str = ""  # why there is no spread

    @property
    def borrowed(self) -> list[Input]:
        return [i for i in self.inputs if i.source != MEASURED]


def job_spread(job: Job, st: JobStatus | None, providers: Mapping[str, Provider], statuses: Iterable[JobStatus],
               now: float, ledger: Mapping[str, ProviderLedger] | None = None, futures: int = 400) -> JobSpread:
    """The spread of the rest of `job`'s run as `st` records it (None: a run not started)."""
    out = JobSpread(job.name)
    target = job.spec.target_steps
    stated = job.spec.step_seconds
    if target is None:
        out.note = "no target_steps: the work left is unknown"
        return out
    if st is None and not stated:
        out.note = "no run recorded yet"
        return out
    st = st if st is not None else JobStatus(job=job.name, run_id=job.run_id())  # a run not started yet
    if job_rate(_tracks(st, now)) is None and not stated:
        out.note = "rate not measured yet: less than 15 min of attempt time with progress"
        return out
    order = place(job, dict(providers), now).order
    first = _first(st, order)
    if first is None:
        out.note = "no provider allowed for the job"
        return out
    statuses = list(statuses)
    lane = _lane(job, st, first, providers, statuses, now, ledger or {}, out.inputs)
    back = _fallback(first, order, providers)
    fb = _lane(job, st, back, providers, statuses, now, ledger or {}, out.inputs) if back else None
    out.provider, out.fallback = first, back or ""
    current = st.current
    live = current.first_beat if current is not None else None
    prices = {n: p.spec.price_per_hour for n, p in providers.items()}
    reached, unsaved = _position(st, lane, now, target)
    run = Run(remaining_steps=max(0, target - reached), spent_usd=st.cost_usd + open_cost(st, now, prices),
              deadline_in_seconds=job.spec.deadline.timestamp() - now if job.spec.deadline else None,
              budget_usd=job.spec.budget_usd,
              live_seconds=None if current is None or live is None or current.provider != first
              else max(0.0, now - live),
              waiting=current is None and bool(st.attempts) and st.attempts[-1].provider_ended,
              unsaved_steps=unsaved)
    out.spread = spread(run, lane, fb, seed=seed_of(st.run_id or job.run_id()), futures=futures)
    return out


def _first(st: JobStatus, order: list[str]) -> str | None:
    """The live attempt's provider, else where the status says the run should go, else the first
    allowed (a provider no longer declared or allowed is left)."""
    if st.current is not None and st.current.provider in order:
        return st.current.provider
    placed = st.forecast.placement if st.forecast is not None else ""
    return placed if placed in order else (order[0] if order else None)


def _fallback(first: str, order: list[str], providers: Mapping[str, Provider]) -> str | None:
    """The cheapest allowed provider nobody takes machines away from, and with no quota to spend."""
    def reliable(name: str) -> bool:
        spec = providers[name].spec
        return not getattr(spec.settings, "interruptible", False) and spec.free_quota_hours is None

    if reliable(first):
        return None
    options = [n for n in order if n != first and reliable(n)]
    return min(options, key=lambda n: providers[n].spec.price_per_hour) if options else None


def _lane(job: Job, st: JobStatus, name: str, providers: Mapping[str, Provider], statuses: list[JobStatus],
          now: float, ledger: Mapping[str, ProviderLedger], said: list[Input]) -> Lane:
    """One provider as measured, each figure said in `said` with where it comes from."""
    prov = providers[name]
    settings = prov.spec.settings
    session = getattr(settings, "session_hours", None)
    session_s = session * 3600.0 - getattr(settings, "save_margin_seconds", 0.0) if session else None
    rate, rate_src, rate_how = _rate(st, name, now, stated=job.spec.step_seconds)
    fails, fail_src, fail_how = _interruptions(statuses, name, now, bool(getattr(settings, "interruptible", False)),
                                               sessions=session_s is not None)
    wait, wait_src, wait_how = _wait(statuses, name, now)
    change, change_src, change_how = _changeover(statuses, name, st, rate)
    ckpt, ckpt_src, ckpt_how = _checkpoint(job, st, rate)
    save, save_src, save_how = _save(st)
    if save > 0:
        rate = _rate(st, name, now, saves=(ckpt, save), stated=job.spec.step_seconds)[0]
    quota, refill_in, refill, quota_src, quota_how = _quota(job, prov, ledger.get(name), now)
    price = prov.spec.price_per_hour
    said += [
        Input(name, "rate", rate * 3600.0, "steps/h", rate_src, rate_how),
        Input(name, "mtbf", fails.mean_seconds, "s", fail_src, fail_how),
        Input(name, "wait", wait.mean_seconds, "s", wait_src, wait_how),
        Input(name, "changeover", change, "s", change_src, change_how),
        Input(name, "checkpoint", ckpt, "steps", ckpt_src, ckpt_how),
        Input(name, "save", save, "s", save_src, save_how),
        Input(name, "price", price, "$/h", DECLARED, "price_per_hour of the provider"),
    ]
    if session_s is not None:
        said.append(Input(name, "session", session_s, "s", DECLARED, "session_hours, less the save margin"))
    if quota_src:
        said.append(Input(name, "quota", None if quota is None else quota / 3600.0, "h", quota_src, quota_how))
    return Lane(name, price, rate, fails, wait, change, ckpt, session_s, quota, refill_in, refill,
                save_seconds=save)


def _rate(st: JobStatus, name: str, now: float, saves: tuple[float, float] | None = None,
          stated: float | None = None) -> tuple[float, str, str]:
    """Steps per second of work there: the status's rate counts durable steps only, and the futures
    take the work an interruption loses off themselves, so the lost steps are counted back in.
    `saves`: (steps between checkpoints, seconds a save takes), where known: the rate then spreads
    the saves' cost evenly (_whole_saves). Until the run's rate is measured, the manifest's
    `stated` step_seconds."""
    tracks = _tracks(st, now)
    for a in st.attempts:
        if a.steps_lost > 0 and a.provider in tracks:
            tracks[a.provider] = tracks[a.provider] + Track(0.0, a.steps_lost)
    if saves is not None:
        for provider, seconds in _whole_saves(st, *saves).items():
            if provider in tracks:
                tracks[provider] = tracks[provider] + Track(seconds, 0)
    overall = job_rate(tracks)
    if overall is None:
        assert stated is not None
        return 1.0 / stated, DECLARED, "step_seconds of the job (this run's rate is not measured yet)"
    own = tracks.get(name)
    rate = provider_rate(own, overall) or overall
    if own is not None and own.rate is not None:
        return rate, MEASURED, f"this run's attempts there ({own.seconds / 3600.0:.1f} h)"
    return rate, BORROWED, "this run's rate on the providers it ran on"


def _whole_saves(st: JobStatus, ckpt: float, save: float) -> dict[str, float]:
    """Seconds to add to each provider's attempt time so that it holds the saves' cost pro rata
    (one save per `ckpt` steps) rather than the whole saves its attempts made: a window that ends
    just before a checkpoint holds one save fewer than its share, and read the rate high (a live
    attempt 270 steps past a checkpoint: 4.5 s short, 0.03 % over 4 h)."""
    out: dict[str, float] = {}
    ckpt = max(1.0, ckpt)
    for a in st.attempts:
        b0 = first_step(a)
        b1 = max(st.progress.step, _live_beat(st) or 0) if a.open else (a.step_end or b0) + a.steps_lost
        if a.first_beat is None or b1 <= b0:
            continue
        held = math.floor((b1 - a.step_start) / ckpt) - math.floor((b0 - a.step_start) / ckpt)
        out[a.provider] = out.get(a.provider, 0.0) + ((b1 - b0) / ckpt - held) * save
    return out


def _interruptions(statuses: list[JobStatus], name: str, now: float, spot: bool,
                   sessions: bool) -> tuple[Evidence, str, str]:
    """Machine time and interruptions there, across every job, weighed by age as the MTBF is
    (reconciler.planner.outlook.reliability), the age counted in time watched
    (`watched_records`); session ends are left out where the session limit is modelled apart.
    The prior is what the weighing left of the older record (the kind's prior while there is
    none): a provider steady for days is not pulled towards the kind's 6 h."""
    exposure = events = whole = ends = 0.0
    attempts = list(_attempts(statuses, name))
    for a, rec in zip(attempts, watched_records(attempts, now), strict=True):
        counted = not (sessions and a.outcome == Outcome.SESSION_END)
        exposure += rec.exposure_seconds
        events += rec.interruptions if counted else 0.0
        whole += max(0.0, min(now, a.ended if a.ended is not None else now) - a.started)
        ends += 1.0 if counted and rec.interruptions > 0 else 0.0  # the provider ended it
    older = Evidence(max(0.0, ends - events), max(0.0, whole - exposure), prior_mtbf(spot)).mean_seconds
    evidence = Evidence(events, exposure, older)
    kind = "interruptible" if spot else "reliable"
    if exposure <= 0:
        return evidence, BORROWED, f"the prior for {kind} machines"
    return (evidence, MEASURED,
            f"{events:.1f} interruptions over {exposure / 3600.0:.1f} h of machine time (weighed by its age)")


def _attempts(statuses: Iterable[JobStatus], name: str | None = None) -> Iterable[Attempt]:
    return (a for st in statuses for a in st.attempts if name is None or a.provider == name)


def _gaps(statuses: Iterable[JobStatus], name: str | None) -> list[float]:
    """Seconds from each end the provider made to the next attempt of the same job."""
    return [max(0.0, b.started - a.ended) for st in statuses
            for a, b in zip(st.attempts, st.attempts[1:], strict=False)
            if a.ended is not None and a.provider_ended and (name is None or a.provider == name)]


def _under_way(statuses: Iterable[JobStatus], name: str, now: float) -> float:
    """Seconds the waits still under way there have lasted (a run whose last attempt the provider
    ended, none launched since): time without a relaunch, censored like a live attempt's."""
    return sum(max(0.0, now - st.attempts[-1].ended) for st in statuses
               if st.current is None and st.attempts and not st.phase.terminal and st.attempts[-1].provider_ended
               and st.attempts[-1].provider == name and st.attempts[-1].ended is not None)


def _wait(statuses: list[JobStatus], name: str, now: float) -> tuple[Evidence, str, str]:
    """The waits seen there, and those under way (a long wait is the likelier to be under way:
    leaving it out read waits short)."""
    own, open_ = _gaps(statuses, name), _under_way(statuses, name, now)
    if own or open_ > 0:
        return (Evidence(len(own), sum(own) + open_, PRIOR_WAIT_SECONDS), MEASURED,
                f"{len(own)} relaunches after an end there" + (", and the wait under way" if open_ > 0 else ""))
    everywhere = _gaps(statuses, None)
    if everywhere:
        mean = sum(everywhere) / len(everywhere)
        return Evidence(1.0, max(1.0, mean), max(1.0, mean)), BORROWED, f"{len(everywhere)} relaunches elsewhere"
    return Evidence(0.0, 0.0, PRIOR_WAIT_SECONDS), BORROWED, "a prior of one tick-sized wait (none measured)"


def _changeover(statuses: list[JobStatus], name: str, st: JobStatus, rate: float) -> tuple[float, str, str]:
    """Launch to the first step of work (forecast.changeover), each attempt's first heartbeat
    back-dated at its own speed, or this job's rate where it has none."""
    def changes(only: str | None) -> list[float]:
        return [x for job in statuses for a in job.attempts if only is None or a.provider == only
                if (x := changeover(a, attempt_rate(a) or (rate if job.job == st.job else None))) is not None]

    own = changes(name)
    if own:
        return median(own), MEASURED, f"median launch to first step over {len(own)} attempts"
    other = changes(None)
    if other:
        return median(other), BORROWED, "median launch to first step on the other providers"
    return PRIOR_CHANGEOVER_SECONDS, BORROWED, "the prior (none measured)"


def _checkpoint(job: Job, st: JobStatus, rate: float) -> tuple[float, str, str]:
    """Steps between durable checkpoints: the manifest's checkpoint_every where it pins the
    interval, else the worker's word on its interval, else twice the mean work an interruption lost
    (lost work is spread evenly over the interval), else a prior."""
    if job.spec.checkpoint_every:
        return float(job.spec.checkpoint_every), DECLARED, "checkpoint_every"
    if (said := said_interval_steps(st, rate)) is not None:
        return said, MEASURED, "the worker's word: from one save's start to the next"
    if measured := lost_interval_steps(st):
        return measured[0], MEASURED, f"twice the mean work lost over {measured[1]} interruptions"
    return rate * FALLBACK_CHECKPOINT_SECONDS, BORROWED, "a prior of one checkpoint per 30 min of work"


def _save(st: JobStatus) -> tuple[float, str, str]:
    """What the run's final save costs: the worker's word on its last save (copy, upload, commit).
    Without it none is counted, as before the workers said it."""
    if st.progress.save_seconds is not None:
        return st.progress.save_seconds, MEASURED, "the worker's last save, until durable"
    return 0.0, BORROWED, "none counted (the worker has not said what a save costs)"


def _quota(job: Job, prov: Provider, line: ProviderLedger | None,
           now: float) -> tuple[float | None, float | None, float | None, str, str]:
    """Attempt seconds left, when it refills (from now) and with how much; source and words."""
    price = prov.spec.price_per_hour
    weekly = prov.spec.free_quota_hours
    if line is not None and line.remaining is not None and (line.unit == "credits" or job.spec.resources.gpus):
        per_hour = price if line.unit == "credits" else 1.0
        if per_hour <= 0:
            return None, None, None, "", ""
        total = line.total if line.total is not None else (weekly if line.unit != "credits" else None)
        refill = None if total is None or line.resets_at is None else total / per_hour * 3600.0
        return (max(0.0, line.remaining) / per_hour * 3600.0,
                None if line.resets_at is None else max(0.0, line.resets_at - now), refill,
                MEASURED, f"the provider's word at the last tick ({line.unit})")
    if weekly is not None and job.spec.resources.gpus:
        return weekly * 3600.0, 7 * 24 * 3600.0, weekly * 3600.0, BORROWED, \
            "free_quota_hours, taken as all left (no ledger)"
    return None, None, None, "", ""


def _recorded_at(st: JobStatus) -> float | None:
    """When the status's step was seen: it is written in tenths of the target, so the live attempt
    is measured up to then, not up to now (which would count the time since as time without
    progress); one that has recorded no step of its own yet counts no time."""
    return st.progress.seen_at if st.current is not None else None


def _live_beat(st: JobStatus) -> int | None:
    """The live worker's heartbeat step at `seen_at`, where it was seen during the live attempt."""
    cur, p = st.current, st.progress
    if cur is None or p.heartbeat_step is None or p.seen_at is None or p.seen_at < cur.started:
        return None
    return max(p.step, p.heartbeat_step)


def _tracks(st: JobStatus, now: float) -> dict[str, Track]:
    return job_tracks(st, st.progress.step, now, live_step=_live_beat(st), reached_at=_recorded_at(st))


def _position(st: JobStatus, lane: Lane, now: float, target: int) -> tuple[int, float]:
    """Where the run is now, and the steps of it not yet saved: the live worker's heartbeat step
    at `seen_at` (else its first heartbeat's) and its rate since (the durable step lags it by up
    to a checkpoint interval), else the durable step. Its checkpoints count from its start."""
    cur, beat = st.current, _live_beat(st)
    if cur is None:
        return st.progress.step, 0.0
    if beat is not None and st.progress.seen_at is not None:
        base, at = beat, st.progress.seen_at
    elif cur.first_beat is not None:
        base, at = first_step(cur), cur.first_beat
    else:
        return st.progress.step, 0.0
    ckpt = max(1.0, lane.checkpoint_steps)
    gained = _steps_in(float(max(0, base - cur.step_start) % ckpt), max(0.0, now - at), lane)
    reached = max(st.progress.step, min(target, base + int(gained)))
    return reached, float(max(0, reached - cur.step_start) % ckpt)


def _steps_in(unsaved: float, seconds: float, lane: Lane) -> float:
    """Steps a worker `unsaved` steps past its last checkpoint does in `seconds`: at the rate, or,
    where its save cost is known, working between whole saves (the rate spreads their cost)."""
    ckpt, save = max(1.0, lane.checkpoint_steps), max(0.0, min(lane.save_seconds, lane.checkpoint_steps / lane.rate))
    if save <= 0:
        return lane.rate * seconds
    step = 1.0 / lane.rate - save / ckpt  # a step's work, its share of the saves taken off
    first = (ckpt - unsaved) * step  # to the next checkpoint
    if seconds <= first:
        return seconds / step
    cycles, rest = divmod(max(0.0, seconds - first - save), ckpt * step + save)
    return ckpt - unsaved + cycles * ckpt + min(rest / step, ckpt)
