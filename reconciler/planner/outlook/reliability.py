"""A provider's mean time between interruptions, learned from every job's attempts on it. Pure.

What counts: machine time (each attempt from its launch to its end, or now) as exposure, and each
end the provider made as an interruption (`Attempt.provider_ended`: preempted, host lost, vanished
from its listing, stopped on its notice, the session's limit), whether or not the worker saved
first; not an interruption the provider never confirmed, nor one a run-store fault caused.
Both are read from the attempts kept in the job statuses, so the estimate survives a restart of
the daemon, and both are weighed by their age with a half-life (HALF_LIFE_SECONDS): a provider
that changes is followed within a few interruptions, and after a quiet spell the estimate drifts
back to its prior (at once where machines keep running there without interruption, within days
where none runs).

The estimate is `checkpoint_policy.estimate_mtbf`: a Gamma posterior whose prior (PRIOR_SPOT for
interruptible machines, PRIOR_RELIABLE for others) weighs one pseudo-interruption at most, so that
five interruptions a few seconds apart read as a few seconds. Weighed as the prior's own length of
exposure (30 days), it had outweighed twelve interruptions in ten minutes.

The deadline lookahead prices hours of a run ahead with `expected_mean`, the same record's
posterior mean with the prior weighed as half an event whatever the record: one interruption 30
minutes into a 6 h prior reads 0.9 h with the cap (right for a checkpoint interval, where reading
too long loses work) and 2.3 h without it, and the lookahead, reading the first as spot's steady
rate, gave spot up for hours after one early interruption (docs/guides/deadlines-budgets.md).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from reconciler.checkpoint_policy import estimate_mtbf
from reconciler.planner.outlook.lookahead import SHORT_ROOM_SECONDS
from status.models import Attempt, JobStatus
from status.room import RoomEvidence

HALF_LIFE_SECONDS = 6 * 3600.0  # an interruption (or an hour of machine time) this old counts half
PRIOR_SPOT_MTBF_SECONDS = 6 * 3600.0
PRIOR_RELIABLE_MTBF_SECONDS = 30 * 24 * 3600.0  # machines nobody takes away still die, rarely
PRIOR_ROOM_WAIT_SECONDS = 3600.0  # how long a provider stays without room, until the daemon has seen it
EXPECTED_PRIOR_EVENTS = 0.5  # what the prior weighs in `expected_mean`: half an event (Jeffreys' prior for a rate)
SHORT_WITHIN_SECONDS = 2 * SHORT_ROOM_SECONDS  # a room period that ends this soon counts as short (RoomWatch)
PRIOR_PERIODS = 10.0  # the short share's prior weighs this many room periods
# The share of short room periods a provider is taken to have until its own are seen: borrowed from the
# public AWS spot traces, where it reads 0.26 to 0.45 per zone (0.45 and 0.26 on the two tuning traces;
# docs/guides/deadlines-budgets.md). The periods the daemon then sees pull it toward their own share.
PRIOR_SHORT_SHARE = 0.35
MAX_SHORT_SHARE = 0.9
SHAPE_HALF_LIFE_SECONDS = 7 * 24 * 3600.0  # a room period this old counts half toward the short share
UNWATCHED_GRACE_SECONDS = 24 * 3600.0  # a wait without a machine there ages the record nothing up to this
RESUME_GAP_SECONDS = 900.0  # a daemon back within this long goes on with the state it last saw (RoomWatch.recalled)


@dataclass(frozen=True)
class Record:
    """One provider's evidence, every item weighed by its age."""

    exposure_seconds: float = 0.0  # machine time
    interruptions: float = 0.0  # ends the provider made

    def __add__(self, other: Record) -> Record:
        return Record(self.exposure_seconds + other.exposure_seconds, self.interruptions + other.interruptions)

    def __sub__(self, other: Record) -> Record:
        return Record(max(0.0, self.exposure_seconds - other.exposure_seconds),
                      max(0.0, self.interruptions - other.interruptions))


def prior_mtbf(interruptible: bool) -> float:
    return PRIOR_SPOT_MTBF_SECONDS if interruptible else PRIOR_RELIABLE_MTBF_SECONDS


def mtbf(record: Record, interruptible: bool) -> float:
    """The provider's MTBF now: what RECONCILER_MTBF_SECONDS tells its next worker."""
    return estimate_mtbf(record.exposure_seconds, record.interruptions, prior_mtbf(interruptible))


def expected_mean(exposure_seconds: float, events: float, prior_seconds: float) -> float:
    """Mean seconds between events at the posterior mean rate: a Gamma prior of EXPECTED_PRIOR_EVENTS events
    with the prior's mean, never capped (see the module's docstring for why the lookahead uses it)."""
    return (exposure_seconds + EXPECTED_PRIOR_EVENTS * prior_seconds) / (events + EXPECTED_PRIOR_EVENTS)


def weight(age: float, half_life: float = HALF_LIFE_SECONDS) -> float:
    """What one item of evidence `age` seconds old counts for (1 when new)."""
    return 0.5 ** (max(0.0, age) / half_life)


def attempt_record(a: Attempt, now: float) -> Record:
    """One attempt's machine time (each second weighed by its age: the integral of `weight`
    from its start to its end) and, if the provider ended it, one interruption at its end."""
    end = min(now, a.ended if a.ended is not None else now)
    start = min(a.started, end)
    exposure = HALF_LIFE_SECONDS / math.log(2.0) * (weight(now - end) - weight(now - start))
    return Record(exposure, weight(now - end) if a.provider_ended else 0.0)


def watched_records(attempts: list[Attempt], now: float) -> list[Record]:
    """Each attempt's record as `attempt_record` weighs it, but aged by the time the provider was
    watched since (some machine of ours ran there), not by the calendar: a wait without a machine
    ages nothing, up to UNWATCHED_GRACE_SECONDS (beyond it the calendar counts again, so the record
    of a provider nobody has used for days drifts back to its prior). Weighed by the calendar,
    the interruption that ends a machine falls behind the wait that follows it, so while a machine
    runs, the last interruptions count less than the machine time since and the MTBF reads long,
    and right after one it reads short (on bench/forecast.py's synthetic traces the forecast's
    median came before the outcome at 63 to 68 % of the cutoffs with a machine running). The
    forecast's futures use it; placement keeps the calendar (docs/performance.md says why)."""
    spans = sorted((a.started, max(a.started, min(now, a.ended if a.ended is not None else now))) for a in attempts)
    merged: list[list[float]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    # Counted after each span's end: the span itself, and the wait that follows it beyond the grace.
    nexts = [start for start, _ in merged[1:]] + [now][:len(merged)]
    counted = [end - start + max(0.0, nxt - end - UNWATCHED_GRACE_SECONDS)
               for (start, end), nxt in zip(merged, nexts, strict=True)]
    after = list(itertools.accumulate(reversed(counted)))[::-1] + [0.0]
    ends = [end for _, end in merged]

    def watched_since(t: float) -> float:
        i = bisect.bisect_left(ends, t)  # the span t is in (t is an attempt's end)
        return after[i] - (max(merged[i][0], t) - merged[i][0]) if i < len(merged) else 0.0

    out = []
    for a in attempts:
        end = min(now, a.ended if a.ended is not None else now)
        start = min(a.started, end)
        age_end = watched_since(end)
        age_start = age_end + (end - start)  # a machine ran all along
        exposure = HALF_LIFE_SECONDS / math.log(2.0) * (weight(age_end) - weight(age_start))
        out.append(Record(exposure, weight(age_end) if a.provider_ended else 0.0))
    return out


def records(statuses: Iterable[JobStatus], now: float) -> dict[str, Record]:
    """Every provider's evidence across all jobs' attempts, at `now`."""
    out: dict[str, Record] = {}
    for st in statuses:
        for a in st.attempts:
            out[a.provider] = out.get(a.provider, Record()) + attempt_record(a, now)
    return out


def change(before: JobStatus | None, after: JobStatus, provider: str, now: float) -> Record:
    """What one job's status adds to `provider`'s record between the recorded version the
    planner's figures were read from (`before`) and the one it is writing (`after`): the
    interruption it has just closed, which the relaunch it causes must count."""
    mine = records([after], now).get(provider, Record())
    return mine - records([before], now).get(provider, Record()) if before is not None else mine


@dataclass(frozen=True)
class RoomShape:
    """What the lookahead knows of a provider's room periods beside their mean (lookahead.Model)."""

    short_share: float = PRIOR_SHORT_SHARE  # the share of room periods of the short kind
    age_seconds: float | None = None  # how long it has had room now; None: no room, or since before the first look


@dataclass
class RoomWatch:
    """How long each provider stays without room for a worker once it has none, and how its room
    periods are spread: the lookahead (reconciler.planner.outlook.lookahead) prices a wait for spot
    with the first, and a move onto room that has just come back with the second. The daemon shows
    it every tick whether the provider said it had a free slot (or runs a worker of ours).

    The wait: time seen without room is exposure and each return of room an event, both weighed by
    age as the MTBF's record is, and the mean wait is estimated as the lookahead's MTBF is
    (`expected_mean`).

    The spread: each room period seen from its start to its end counts, and so does whether it ended
    within SHORT_WITHIN_SECONDS. On the public AWS spot traces far more of them do than a memoryless
    period of the same mean would: 29 to 51 % of them, holding a small share of the time
    with room (docs/guides/deadlines-budgets.md). `short_share` is the share of short periods (of
    mean lookahead.SHORT_ROOM_SECONDS) that explains the excess, with PRIOR_PERIODS periods of the
    share PRIOR_SHORT_SHARE (borrowed from those traces) as the prior; periods are weighed by age with
    a half-life of a week (SHAPE_HALF_LIFE_SECONDS), as the shape of a market changes slower than its rate.

    Kept in git (status/room.yaml, `evidence` and `recalled`), so that a restarted daemon goes on
    from what it had seen. A provider that never says whether it has room keeps the priors."""

    exposure: dict[str, float] = field(default_factory=dict)  # seconds without room, age-weighted
    returns: dict[str, float] = field(default_factory=dict)  # times room came back, age-weighted
    # provider -> (when seen, had room); None: not known then (a recalled look after a gap)
    last: dict[str, tuple[float, bool | None]] = field(default_factory=dict)
    since: dict[str, float | None] = field(default_factory=dict)  # when the last state began (None: unseen)
    periods: dict[str, float] = field(default_factory=dict)  # room periods seen whole, age-weighted
    shorts: dict[str, float] = field(default_factory=dict)  # those of them that ended within SHORT_WITHIN_SECONDS
    room_seconds: dict[str, float] = field(default_factory=dict)  # their length, age-weighted
    period_seen: dict[str, float] = field(default_factory=dict)  # when the last of them ended

    def see(self, provider: str, now: float, room: bool) -> None:
        before = self.last.get(provider)
        self.last[provider] = (now, room)
        if before is None or before[1] is None:  # the first look, or the first after a gap nobody saw
            self.since[provider] = None
            if before is not None:
                self._fade(provider, now - before[0])
            return
        if now <= before[0]:  # the clock went back: the new state is dated now, nothing is counted
            if room != before[1]:
                self.since[provider] = now
            return
        self._fade(provider, now - before[0])
        if not before[1]:  # without room since the last look
            self.exposure[provider] += now - before[0]
            self.returns[provider] += 1.0 if room else 0.0
        if room != before[1]:
            start = self.since.get(provider)
            if before[1] and start is not None:  # a room period seen whole has ended
                self._period(provider, now, now - start)
            self.since[provider] = now

    def _fade(self, provider: str, seconds: float) -> None:
        fade = weight(seconds)
        self.exposure[provider] = self.exposure.get(provider, 0.0) * fade
        self.returns[provider] = self.returns.get(provider, 0.0) * fade

    def _period(self, provider: str, now: float, seconds: float) -> None:
        fade = weight(now - self.period_seen.get(provider, now), SHAPE_HALF_LIFE_SECONDS)
        self.period_seen[provider] = now
        self.periods[provider] = self.periods.get(provider, 0.0) * fade + 1.0
        self.shorts[provider] = self.shorts.get(provider, 0.0) * fade + (seconds <= SHORT_WITHIN_SECONDS)
        self.room_seconds[provider] = self.room_seconds.get(provider, 0.0) * fade + seconds

    def mean_wait(self, provider: str) -> float:
        """Seconds: the mean wait for room there, from the prior PRIOR_ROOM_WAIT_SECONDS."""
        return expected_mean(self.exposure.get(provider, 0.0), self.returns.get(provider, 0.0),
                             PRIOR_ROOM_WAIT_SECONDS)

    def short_share(self, provider: str) -> float:
        """The share of short room periods that explains how many ended within SHORT_WITHIN_SECONDS
        beyond what memoryless periods of the same mean would, with PRIOR_PERIODS periods of the prior
        share PRIOR_SHORT_SHARE among those seen: the prior alone until periods are seen."""
        n = self.periods.get(provider, 0.0)
        if n <= 0:
            return PRIOR_SHORT_SHARE
        memoryless = 1.0 - math.exp(-SHORT_WITHIN_SECONDS * n / self.room_seconds[provider])
        short_kind = 1.0 - math.exp(-SHORT_WITHIN_SECONDS / SHORT_ROOM_SECONDS)
        if short_kind <= memoryless:
            return 0.0
        prior_ended = memoryless + PRIOR_SHORT_SHARE * (short_kind - memoryless)  # the prior's periods ending short
        seen = (self.shorts[provider] + PRIOR_PERIODS * prior_ended) / (n + PRIOR_PERIODS)
        return min(MAX_SHORT_SHARE, max(0.0, (seen - memoryless) / (short_kind - memoryless)))

    def evidence(self) -> dict[str, RoomEvidence]:
        """Every provider's evidence as of its last look, for status/room.yaml."""
        out = {}
        for name, (when, room) in self.last.items():
            out[name] = RoomEvidence(
                seen_at=when, had_room=room, state_since=self.since.get(name),
                seconds_without_room=self.exposure.get(name, 0.0), room_returns=self.returns.get(name, 0.0),
                room_periods=self.periods.get(name, 0.0), short_room_periods=self.shorts.get(name, 0.0),
                room_period_seconds=self.room_seconds.get(name, 0.0), last_period_end=self.period_seen.get(name),
                short_within_seconds=SHORT_WITHIN_SECONDS,
                mean_wait_hours=self.mean_wait(name) / 3600.0, short_share=self.short_share(name))
        return out

    def latest(self) -> float | None:
        """When any provider was last looked at (None: never)."""
        return max((when for when, _ in self.last.values()), default=None)

    @classmethod
    def recalled(cls, saved: dict[str, RoomEvidence], now: float) -> RoomWatch:
        """A watch that goes on from saved evidence. The state at a provider's last look goes on only
        where that look is at most RESUME_GAP_SECONDS old; after a longer gap, whose room nobody saw,
        the next look fades the evidence over the gap and starts a new state."""
        watch = cls()
        for name, ev in saved.items():
            watch.exposure[name], watch.returns[name] = ev.seconds_without_room, ev.room_returns
            watch.periods[name], watch.shorts[name] = ev.room_periods, ev.short_room_periods
            watch.room_seconds[name] = ev.room_period_seconds
            if ev.last_period_end is not None:
                watch.period_seen[name] = ev.last_period_end
            if now - ev.seen_at <= RESUME_GAP_SECONDS:
                watch.last[name], watch.since[name] = (ev.seen_at, ev.had_room), ev.state_since
            else:
                watch.last[name], watch.since[name] = (ev.seen_at, None), None
        return watch

    def waits(self) -> dict[str, float]:
        return {name: self.mean_wait(name) for name in self.last}

    def shapes(self) -> dict[str, RoomShape]:
        """Each provider's RoomShape at its last look."""
        out = {}
        for name, (when, room) in self.last.items():
            start = self.since.get(name)
            out[name] = RoomShape(self.short_share(name), when - start if room and start is not None else None)
        return out
