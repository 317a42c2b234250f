"""Placement: which allowed providers may take a run's next attempt, best first, and why the
others may not. Pure.

Order: free first, then cheapest, the job's preference order breaking ties; a provider that just
interrupted this run goes last. A provider is left out when its price is above the job's cap or
what it offers (its declared `spec.resources`, else what its adapter reports) cannot meet the
job's `resources`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from desired.models import Capacity, Job, Provider
from status.models import JobStatus, Outcome

PROVIDER_COOLDOWN_SECONDS = 300.0  # a provider that just interrupted a run is tried last


@dataclass
class Placement:
    order: list[str] = field(default_factory=list)  # where the next attempt may go, best first
    excluded: dict[str, str] = field(default_factory=dict)  # provider -> why not

    def why_nowhere(self) -> str:
        return "; ".join(f"{name}: {why}" for name, why in sorted(self.excluded.items()))


def capacity_of(provider: Provider, reported: Capacity | None) -> Capacity | None:
    return provider.spec.resources or reported


def place(job: Job, providers: dict[str, Provider], st: JobStatus, now: float,
          reported: dict[str, Capacity] | None = None) -> Placement:
    reported = reported or {}
    allowed = job.spec.placement.providers or sorted(providers)
    cap = job.spec.placement.max_price_per_hour
    recent_bad = {
        a.provider for a in st.attempts
        if a.outcome in (Outcome.INTERRUPTION, Outcome.SESSION_END)
        and a.ended is not None and now - a.ended < PROVIDER_COOLDOWN_SECONDS
    }
    out = Placement()
    candidates = []
    for rank, name in enumerate(allowed):
        prov = providers.get(name)
        if prov is None:
            out.excluded[name] = "no such provider"
            continue
        price = prov.spec.price_per_hour
        if cap is not None and price > cap:
            out.excluded[name] = f"price ${price:g}/h is above the job's cap of ${cap:g}/h"
            continue
        offered = capacity_of(prov, reported.get(name))
        short = offered.shortfall(job.spec.resources) if offered is not None else None
        if short:
            out.excluded[name] = short
            continue
        free = 0 if (prov.spec.free_quota_hours or price == 0) else 1
        candidates.append((name in recent_bad, free, price, rank, name))
    out.order = [c[-1] for c in sorted(candidates)]
    return out
