"""Provider health: the trouble each provider gave us lately, shared by every job. Pure.

Two kinds of trouble count, both read from durable facts in every job's status (so the verdict
survives a restart and one job's trouble protects the others):
- a refusal: a launch the provider refused (`JobStatus.refusals`: no capacity, an API down, a
  working directory that cannot be made). While it cools down the provider is skipped.
- a lost worker: an attempt the provider ended (an interruption: preempted, vanished, host lost;
  or the end of its session). While it cools down the provider is tried after every provider
  that is not cooling down.

Each trouble is a strike. The cool-down after a trouble is its kind's base (REFUSAL_COOLDOWN_SECONDS,
LOSS_COOLDOWN_SECONDS) doubled for every strike before it still counted, up to COOLDOWN_MAX_SECONDS;
every FORGIVE_SECONDS without trouble after a cool-down ends forgives one strike, so a provider
that stops failing is soon trusted at the base again. How reliable a provider is over the long run (its MTBF) is
reconciler.planner.outlook.forecast's business, not this module's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from status.models import JobStatus, Phase, iso

REFUSAL_COOLDOWN_SECONDS = 120.0  # a provider that refused a launch is skipped this long (first strike)
LOSS_COOLDOWN_SECONDS = 300.0  # a provider that lost a worker is tried last this long (first strike)
COOLDOWN_MAX_SECONDS = 3600.0  # however often the trouble repeats, a cool-down lasts at most this
FORGIVE_SECONDS = 1800.0  # each this long without trouble forgives one strike
RATE_WINDOW_SECONDS = 3600.0  # the "recent" in recent refusals and losses
REFUSED, LOST = "refused", "lost"


@dataclass(frozen=True)
class Trouble:
    provider: str
    at: float
    kind: str  # REFUSED or LOST
    detail: str
    job: str = ""


@dataclass(frozen=True)
class ProviderHealth:
    """One provider's record: the cool-down in force, if any, and why."""

    provider: str
    strikes: int = 0  # troubles that still count, after forgiveness
    refused_until: float | None = None  # skipped until then
    lost_until: float | None = None  # tried after the providers that are not cooling down until then
    reason: str = ""  # the latest trouble, e.g. "refused: no capacity"
    refusals: int = 0  # in the last RATE_WINDOW_SECONDS
    losses: int = 0  # in the last RATE_WINDOW_SECONDS

    def until(self, now: float) -> float | None:
        """When the cool-down in force ends, or None."""
        ends = [u for u in (self.refused_until, self.lost_until) if u is not None and u > now]
        return max(ends) if ends else None

    def skipped(self, now: float) -> bool:
        return self.refused_until is not None and now < self.refused_until

    def state(self, now: float) -> str:
        """"cooling down" (skipped), "tried last" (lost workers lately) or "healthy"."""
        if self.skipped(now):
            return "cooling down"
        return "tried last" if self.until(now) is not None else "healthy"

    def describe(self, now: float, rate: bool = False) -> str:
        """One line, e.g. "broken is cooling down until 18:39 UTC (refused: Not a directory)"; with
        `rate` (for `plan`), how often it gave trouble in the last hour too. A job's message goes
        without: it would change, and be committed, as troubles leave the hour."""
        until = self.until(now)
        if until is None:
            return f"{self.provider} is healthy"
        if self.skipped(now):
            assert self.refused_until is not None
            line = f"{self.provider} is cooling down until {clock(self.refused_until)} ({self.reason})"
        else:
            line = f"{self.provider} is tried last until {clock(until)} ({self.reason})"
        return line + (self._rate() if rate else "")

    def _rate(self) -> str:
        parts = [f"{n} {what}{'' if n == 1 else 's'}" for n, what in ((self.refusals, "refusal"),
                                                                        (self.losses, "lost worker")) if n]
        return f"; {' and '.join(parts)} in the last hour" if parts else ""


def clock(ts: float) -> str:
    """HH:MM UTC: a cool-down ends within COOLDOWN_MAX_SECONDS, so the time of day names it."""
    return f"{(iso(ts) or '')[11:16]} UTC"


def troubles(statuses: Iterable[JobStatus]) -> list[Trouble]:
    """Every refusal and lost worker the statuses record, oldest first."""
    found: set[Trouble] = set()
    for st in statuses:
        for r in st.refusals:
            found.add(Trouble(r.provider, r.refused, REFUSED, r.error, st.job))
        for a in st.attempts:
            if a.provider_ended and a.ended is not None:
                found.add(Trouble(a.provider, a.ended, LOST, a.detail, st.job))
    return sorted(found, key=_order)


def _order(t: Trouble) -> tuple[float, str, str, str, str]:
    return (t.at, t.provider, t.kind, t.job, t.detail)


def provider_health(statuses: Iterable[JobStatus], now: float,
                    providers: Iterable[str] = ()) -> dict[str, ProviderHealth]:
    """Each provider's health at `now`: those named in `providers` (healthy when they gave no
    trouble) and every provider the statuses record trouble for."""
    return health_of(troubles(statuses), now, providers)


def health_of(found: Iterable[Trouble], now: float, providers: Iterable[str] = ()) -> dict[str, ProviderHealth]:
    """provider_health from troubles already gathered (the planner adds a tick's own as it goes)."""
    by_provider: dict[str, list[Trouble]] = {name: [] for name in providers}
    for t in sorted(found, key=_order):
        if t.at <= now:
            by_provider.setdefault(t.provider, []).append(t)
    return {name: _health(name, found, now) for name, found in sorted(by_provider.items())}


def _health(name: str, found: list[Trouble], now: float) -> ProviderHealth:
    strikes, last, calm = 0, None, 0.0  # calm: when the latest cool-down ends (quiet counts from there)
    until: dict[str, float | None] = {REFUSED: None, LOST: None}
    for t in found:
        if t.at != last:  # troubles seen in the same tick (two jobs refused at once) are one strike
            strikes = _forgiven(strikes, calm, t.at) + 1
        last = t.at
        base = REFUSAL_COOLDOWN_SECONDS if t.kind == REFUSED else LOSS_COOLDOWN_SECONDS
        ends = t.at + min(COOLDOWN_MAX_SECONDS, base * 2 ** (strikes - 1))
        until[t.kind] = max(ends, until[t.kind] or ends)
        calm = max(calm, ends)
    if last is None:
        return ProviderHealth(name)
    latest = found[-1]
    recent = [t for t in found if now - t.at < RATE_WINDOW_SECONDS]
    return ProviderHealth(
        name, strikes=_forgiven(strikes, calm, now), refused_until=until[REFUSED], lost_until=until[LOST],
        reason=f"{'refused' if latest.kind == REFUSED else 'lost a worker'}: {latest.detail}",
        refusals=sum(t.kind == REFUSED for t in recent), losses=sum(t.kind == LOST for t in recent))


def _forgiven(strikes: int, calm: float, at: float) -> int:
    """Strikes left at `at`: one forgiven per FORGIVE_SECONDS of quiet after the cool-down ended."""
    return max(0, strikes - int(max(0.0, at - calm) // FORGIVE_SECONDS)) if strikes else 0



def plan_lines(statuses: Iterable[JobStatus], health: dict[str, ProviderHealth], now: float,
               acting: bool, held: bool = False) -> list[str]:
    """What `plan` says above its jobs: when it would act on nothing, whether that is because all is
    as desired, because a change is held, or because jobs wait (each job's line says why); then every
    provider cooling down."""
    waiting = sum(st.phase in (Phase.PENDING, Phase.BACKOFF) for st in statuses)
    lines = []
    if not acting and held:
        lines.append("no actions: a change is held (the warning above says what releases it)")
    elif not acting and not waiting:
        lines.append("no actions: the world matches the desired state")
    elif not acting:
        lines.append(f"no actions now: {waiting} job{' is' if waiting == 1 else 's are'} waiting (why, below)")
    lines += [f"provider {h.describe(now, rate=True)}" for h in health.values() if h.until(now) is not None]
    return lines
