"""Forecast: how fast a run progresses on each provider, and what finishing it will take. Pure.

A job's rate on a provider is the steps its attempts there gained per second from the first
heartbeat the reconciler saw (the step it reported, at the worker's time of it kept between the
launch and that tick: pairing it with the tick's time inflated rates by up to a fifth) to their
end (or now), over the attempts its status keeps: closed attempts count their
durable steps (work lost at an interruption is lost), the live one what its heartbeat reports
(durable progress lags by up to a checkpoint interval, which made early estimates read half the
true speed). Checkpoints sit inside the rate; the changeover (launch to first heartbeat) is
measured apart and added once per move, and again per interruption expected, so ETAs include
both. A provider's rate is pulled towards the job's rate everywhere while its own record is short,
and a provider the job has not run on yet borrows that rate and says so. Until the run has
progress over MIN_MEASURED_SECONDS in all, nothing is guessed.

A provider's reliability is measured across every job's attempts on it: interruptions (and
session ends) per hour, and the changeover (launch to first heartbeat). A provider with little
record leans on a prior: interruptible (spot) machines one interruption per PRIOR_SPOT_MTBF, and a
changeover as long as the median seen on the other providers (PRIOR_CHANGEOVER until one is seen).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from math import floor, log10
from statistics import median

from reconciler.checkpoint_policy import estimate_mtbf
from status.models import Attempt, JobStatus, Outcome

MIN_MEASURED_SECONDS = 900.0  # less attempt time than this, all providers together, measures nothing yet
PRIOR_WEIGHT_SECONDS = 3600.0  # a provider's own record outweighs the job's overall rate after this long
PRIOR_CHANGEOVER_SECONDS = 600.0  # launch + restore, until one is seen
PRIOR_SPOT_MTBF_SECONDS = 6 * 3600.0
PRIOR_RELIABLE_MTBF_SECONDS = 30 * 24 * 3600.0  # machines nobody takes away still die, rarely


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

    mtbf_seconds: float  # mean attempt time between interruptions or session ends
    changeover_seconds: float  # launch to first heartbeat: paid again on every move
    measured: bool  # False: the priors alone


def _gained(attempt: Attempt, durable_step: int) -> int:
    end = attempt.step_end if attempt.step_end is not None else durable_step
    start = attempt.first_beat_step if attempt.first_beat_step is not None else attempt.step_start
    return max(0, end - start)


def job_tracks(st: JobStatus, durable_step: int, now: float, live_step: int | None = None) -> dict[str, Track]:
    """The job's record per provider, from the attempts in its status. `live_step`: what the live
    attempt's heartbeat says it reached (None: its durable progress)."""
    seconds: dict[str, float] = {}
    steps: dict[str, int] = {}
    for a in st.attempts:
        reached = max(durable_step, live_step or 0) if a.open else durable_step
        gained = _gained(a, reached)
        if a.outcome in (Outcome.CANCELLED, Outcome.SUPERSEDED) and gained == 0:
            continue  # stopped by us before it did anything: says nothing about speed
        end = a.ended if a.ended is not None else now
        begin = a.first_beat if a.first_beat is not None else a.started
        seconds[a.provider] = seconds.get(a.provider, 0.0) + max(0.0, end - min(begin, end))
        steps[a.provider] = steps.get(a.provider, 0) + gained
    return {p: Track(seconds[p], steps[p]) for p in seconds}


def reliabilities(statuses: Iterable[JobStatus], interruptible: dict[str, bool], now: float) -> dict[str, Reliability]:
    """Every provider in `interruptible` (name -> whether its machines can be taken away)."""
    exposure: dict[str, float] = {}
    ends: dict[str, int] = {}
    changeovers: dict[str, list[float]] = {}
    for st in statuses:
        for a in st.attempts:
            end = a.ended if a.ended is not None else now
            exposure[a.provider] = exposure.get(a.provider, 0.0) + max(0.0, end - a.started)
            if a.outcome in (Outcome.INTERRUPTION, Outcome.SESSION_END):
                ends[a.provider] = ends.get(a.provider, 0) + 1
            if a.first_beat is not None:
                changeovers.setdefault(a.provider, []).append(max(0.0, a.first_beat - a.started))
    everywhere = [x for seen in changeovers.values() for x in seen]
    borrowed = median(everywhere) if everywhere else PRIOR_CHANGEOVER_SECONDS
    out = {}
    for name, spot in interruptible.items():
        prior = PRIOR_SPOT_MTBF_SECONDS if spot else PRIOR_RELIABLE_MTBF_SECONDS
        seen = changeovers.get(name)
        out[name] = Reliability(
            mtbf_seconds=estimate_mtbf(exposure.get(name, 0.0), ends.get(name, 0), prior),
            changeover_seconds=median(seen) if seen else borrowed,
            measured=bool(seen) or name in exposure)
    return out


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
