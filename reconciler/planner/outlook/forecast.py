"""Forecast: how fast a run progresses on each provider, and what finishing it will take. Pure.

A job's rate on a provider is the steps its attempts there gained per second from the first
heartbeat the reconciler saw (the step it reported, at the worker's time of it kept between the
launch and that tick: pairing it with the tick's time inflated rates by up to a fifth) to their
end (or now), over the attempts its status keeps: closed attempts count their
durable steps (work lost at an interruption is lost), the live one what its heartbeat reports
(durable progress lags by up to a checkpoint interval, which made early estimates read half the
true speed). Checkpoints sit inside the rate; the changeover (launch to the first step of work:
the first heartbeat seen, back-dated by the steps it reports) is measured apart and added once
per move, and again per interruption expected, so ETAs include both. A provider's rate is pulled
towards the job's rate everywhere while its own record is short, and a provider the job has not
run on yet borrows that rate and says so. Until the run has progress over MIN_MEASURED_SECONDS in
all, nothing is guessed.

A provider's reliability is measured across every job's attempts on it: its mean time between
interruptions (reconciler.planner.outlook.reliability: learned, recent evidence weighing most, leaning on a prior
for its kind while the record is short), and the changeover (launch to the first step), as long as
the median seen on the other providers (PRIOR_CHANGEOVER until one is seen) while it has none.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from math import floor, log10
from statistics import median

from desired.models import Provider
from reconciler.planner.outlook.reliability import (
    PRIOR_ROOM_WAIT_SECONDS,
    PRIOR_SPOT_MTBF_SECONDS,
    RoomShape,
    mtbf,
    prior_mtbf,
    records,
)
from status.models import Attempt, JobStatus, Outcome

MIN_MEASURED_SECONDS = 900.0  # less attempt time than this, all providers together, measures nothing yet
PRIOR_WEIGHT_SECONDS = 3600.0  # a provider's own record outweighs the job's overall rate after this long
PRIOR_CHANGEOVER_SECONDS = 600.0  # launch + restore, until one is seen


@dataclass(frozen=True)
class Track:
    """One job's record on one provider (or, summed, everywhere)."""

    seconds: float = 0.0  # attempt time, first heartbeat to end (or now)
    steps: int = 0  # steps gained

    @property
    def rate(self) -> float | None:
        """Steps per second; None until enough is measured."""
        if self.seconds < MIN_MEASURED_SECONDS or self.steps <= 0:
            return None
        return self.steps / self.seconds

    def __add__(self, other: Track) -> Track:
        return Track(self.seconds + other.seconds, self.steps + other.steps)


def provider_rate(track: Track | None, job_rate: float | None) -> float | None:
    """A provider's rate for the job, pulled towards the job's rate everywhere while its own record
    is short (as if it had run PRIOR_WEIGHT_SECONDS at that rate): a quarter of an hour of
    heartbeats, seen at tick granularity, read anywhere from 0.7 to 1.1 of the true speed."""
    if job_rate is None:
        return None
    if track is None:
        return job_rate
    return (track.steps + job_rate * PRIOR_WEIGHT_SECONDS) / (track.seconds + PRIOR_WEIGHT_SECONDS)


@dataclass(frozen=True)
class Reliability:
    """One provider's record across all jobs."""

    mtbf_seconds: float  # mean machine time between interruptions or session ends (learned)
    changeover_seconds: float  # launch to the first step of work: paid again on every move
    measured: bool  # False: the priors alone
    interruptions: float = 0.0  # the provider's ends, weighed by their age (reconciler.planner.outlook.reliability)
    exposure_seconds: float = 0.0  # machine time, weighed by its age
    prior_seconds: float = PRIOR_SPOT_MTBF_SECONDS  # the MTBF it starts from, for its kind
    interruptible: bool = False  # its kind: machines that can be taken away (spot)
    room_wait_seconds: float = PRIOR_ROOM_WAIT_SECONDS  # mean time without room once it has none (RoomWatch)
    room_shape: RoomShape = RoomShape()  # how its room periods spread, and how long it has had room (RoomWatch)


def first_step(a: Attempt) -> int:
    """The step an attempt's work is counted from: its first heartbeat's, never below the
    checkpoint it started from (a worker's first beat may come before its restore, at step 0: read
    as progress, it made a spot attempt interrupted within a tick look thousands of steps fast)."""
    return a.step_start if a.first_beat_step is None else max(a.step_start, a.first_beat_step)


def _gained(attempt: Attempt, durable_step: int) -> int:
    end = attempt.step_end if attempt.step_end is not None else durable_step
    return max(0, end - first_step(attempt))


def job_tracks(st: JobStatus, durable_step: int, now: float, live_step: int | None = None,
               reached_at: float | None = None) -> dict[str, Track]:
    """The job's record per provider, from the attempts in its status. `live_step`: what the live
    attempt's heartbeat says it reached (None: its durable progress); `reached_at`: when the live
    attempt reached `durable_step`, where that is known and earlier than now (a status's step)."""
    seconds: dict[str, float] = {}
    steps: dict[str, int] = {}
    for a in st.attempts:
        reached = max(durable_step, live_step or 0) if a.open else durable_step
        gained = _gained(a, reached)
        if a.outcome in (Outcome.CANCELLED, Outcome.SUPERSEDED) and gained == 0:
            continue  # stopped by us before it did anything: says nothing about speed
        end = a.ended if a.ended is not None else min(now, max(reached_at or now, a.started))
        begin = a.first_beat if a.first_beat is not None else a.started
        seconds[a.provider] = seconds.get(a.provider, 0.0) + max(0.0, end - min(begin, end))
        steps[a.provider] = steps.get(a.provider, 0) + gained
    return {p: Track(seconds[p], steps[p]) for p in seconds}


def attempt_rate(a: Attempt) -> float | None:
    """A closed attempt's own steps per second from its first heartbeat (the work it lost included)."""
    if a.ended is None or a.first_beat is None or a.step_end is None or a.ended - a.first_beat < 60.0:
        return None
    steps = a.step_end + a.steps_lost - first_step(a)
    return steps / (a.ended - a.first_beat) if steps > 0 else None


def changeover(a: Attempt, speed: float | None) -> float | None:
    """Launch to the first step of work: the first heartbeat the loop saw, back-dated by the steps
    it reports at `speed` (steps per second) where known (it is seen a tick after the worker
    began, which would count that tick in every changeover). None before a first heartbeat."""
    if a.first_beat is None:
        return None
    done = first_step(a) - a.step_start
    back = done / speed if done > 0 and speed else 0.0
    return max(0.0, a.first_beat - back - a.started)


def said_interval_steps(st: JobStatus, rate: float) -> float | None:
    """Steps between checkpoints as the worker says it saves (seconds from one save's start to the
    next, at the run's rate in steps per attempt second), or None where it has not said. Where
    interruptions only sample it: one loss tells anything from nothing to twice the interval."""
    every = st.progress.save_every_seconds
    return every * rate if every is not None and rate > 0 else None


def lost_interval_steps(st: JobStatus) -> tuple[float, int] | None:
    """Steps between checkpoints read from the work interruptions lost: twice the mean (lost work
    is spread evenly over the interval; a low bound, as only the steps up to the last heartbeat
    seen are known lost), and over how many interruptions; None before any lost work."""
    lost = [a.steps_lost for a in st.attempts if a.outcome == Outcome.INTERRUPTION and a.steps_lost > 0]
    return (2.0 * sum(lost) / len(lost), len(lost)) if lost else None


def reliabilities(statuses: Iterable[JobStatus], interruptible: dict[str, bool], now: float) -> dict[str, Reliability]:
    """Every provider in `interruptible` (name -> whether its machines can be taken away)."""
    statuses = list(statuses)
    seen = records(statuses, now)
    changeovers: dict[str, list[float]] = {}
    for st in statuses:
        for a in st.attempts:
            if (seconds := changeover(a, attempt_rate(a))) is not None:
                changeovers.setdefault(a.provider, []).append(seconds)
    everywhere = [x for c in changeovers.values() for x in c]
    borrowed = median(everywhere) if everywhere else PRIOR_CHANGEOVER_SECONDS
    out = {}
    for name, spot in interruptible.items():
        rec = seen.get(name)
        own = changeovers.get(name)
        out[name] = Reliability(
            mtbf_seconds=mtbf(rec, spot) if rec else prior_mtbf(spot),
            changeover_seconds=median(own) if own else borrowed,
            measured=rec is not None,
            interruptions=rec.interruptions if rec else 0.0,
            exposure_seconds=rec.exposure_seconds if rec else 0.0,
            prior_seconds=prior_mtbf(spot), interruptible=spot)
    return out


def provider_reliabilities(providers: dict[str, Provider], statuses: Iterable[JobStatus],
                           now: float) -> dict[str, Reliability]:
    """`reliabilities` of the declared providers, each with the prior of its kind (interruptible or not)."""
    kinds = {name: bool(getattr(p.spec.settings, "interruptible", False)) for name, p in providers.items()}
    return reliabilities(statuses, kinds, now)


def job_rate(tracks: dict[str, Track]) -> float | None:
    """The job's rate over all its attempts, wherever they ran."""
    return sum(tracks.values(), Track()).rate


def open_cost(st: JobStatus, now: float, price_of: dict[str, float]) -> float:
    """What the live attempt has cost so far, at its provider's price."""
    cur = st.current
    if cur is None:
        return 0.0
    return max(0.0, now - cur.started) / 3600.0 * price_of.get(cur.provider, 0.0)


def round_sig(x: float, digits: int = 2) -> float:
    """Figures written to the status are rounded, so a tick whose estimate barely moved commits nothing."""
    if x == 0:
        return 0.0
    return round(x, -int(floor(log10(abs(x)))) + digits - 1)


def round_time(t: float, grain: float = 1800.0) -> float:
    return round(t / grain) * grain
