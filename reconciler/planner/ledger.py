"""The provider ledger: each provider's quota or credits as its API reports them, beside this
repository's own use of it in the current period, counted from the attempts in the job statuses.

Why both: the provider's word decides what may start (placement reads the allowance); our own
count is the audit trail in git, and still says what we spent when the provider's API is down.
The period is the provider's refill week when it reports a refill time, else the ISO week (UTC).
Pure: statuses and observations in, ledger lines out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from adapters.compute import Allowance
from desired.models import Job, Provider
from status.models import Attempt, JobStatus, ProviderLedger

WEEK = 7 * 86400.0


def period_start(now: float, allowance: Allowance | None) -> float:
    """Start of the current accounting period: a week before the provider's next refill, else
    Monday 00:00 UTC of this week."""
    if allowance is not None and allowance.resets_at is not None and allowance.resets_at > now:
        return allowance.resets_at - WEEK
    day = datetime.fromtimestamp(now, UTC)
    midnight = day.replace(hour=0, minute=0, second=0, microsecond=0)
    return midnight.timestamp() - day.weekday() * 86400.0


def _hours_within(attempt: Attempt, since: float, now: float) -> float:
    end = attempt.ended if attempt.ended is not None else now
    return max(0.0, end - max(attempt.started, since)) / 3600.0


def _share_of_cost(attempt: Attempt, since: float, now: float, price: float) -> float:
    """What the attempt cost within the period: its recorded cost prorated, or the price while open."""
    if attempt.ended is None:
        return _hours_within(attempt, since, now) * price
    whole = max(1e-9, attempt.ended - attempt.started) / 3600.0
    return attempt.cost_usd * min(1.0, _hours_within(attempt, since, now) / whole)


def build_ledger(providers: dict[str, Provider], statuses: Iterable[JobStatus], jobs: dict[str, Job],
                 allowances: dict[str, Allowance], now: float,
                 answers: Mapping[str, str] | None = None) -> list[ProviderLedger]:
    """`answers`: how a slow or unresponsive provider answered this tick (reconciler.daemon.asking)."""
    lines = {}
    for name, prov in providers.items():
        a = allowances.get(name)
        lines[name] = ProviderLedger(
            provider=name, type=prov.spec.type, period_start=period_start(now, a),
            unit=a.unit if a else None, remaining=a.remaining if a else None, total=a.total if a else None,
            used=a.used if a else None, resets_at=a.resets_at if a else None, answers=(answers or {}).get(name))
    for st in statuses:
        gpus = jobs[st.job].spec.resources.gpus if st.job in jobs else 0
        for attempt in st.attempts:
            line = lines.get(attempt.provider)
            if line is None:
                continue
            hours = _hours_within(attempt, line.period_start, now)
            line.worker_hours += hours
            line.gpu_hours += hours * gpus
            line.cost_usd += _share_of_cost(attempt, line.period_start, now,
                                            providers[attempt.provider].spec.price_per_hour)
            line.running += attempt.ended is None
    return list(lines.values())
