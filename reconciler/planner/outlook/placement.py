"""Placement: which allowed providers may take a run's next attempt, best first, and why the
others may not. Pure.

Order: free first, then cheapest, the job's preference order breaking ties; a provider cooling down
after trouble (reconciler.planner.health: a refusal or a lost worker of any job) goes after the others, the
one whose cool-down ends first first. A provider is left out when its price is above the job's cap, when
what it offers (its declared `spec.resources`, else what its adapter reports) cannot meet the
job's `resources`, or when its own allowance (Kaggle's weekly GPU hours, Lightning's credits, as
its API reports them) cannot carry one more worker: less than `minimum` would be left, or, for
credits, less than one hour at the provider's price above it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from adapters.compute import Allowance
from desired.models import Capacity, Job, Provider
from reconciler.planner.health import ProviderHealth
from status.models import iso


@dataclass
class Placement:
    order: list[str] = field(default_factory=list)  # where the next attempt may go, best first
    excluded: dict[str, str] = field(default_factory=dict)  # provider -> why not

    def why_nowhere(self) -> str:
        return "; ".join(f"{name}: {why}" for name, why in sorted(self.excluded.items()))


def capacity_of(provider: Provider, reported: Capacity | None) -> Capacity | None:
    return provider.spec.resources or reported


def allowance_shortfall(job: Job, provider: Provider, allowance: Allowance | None) -> str | None:
    """Why the provider's allowance cannot carry one more worker of this job, or None."""
    if allowance is None or (not allowance.applies_to_cpu and job.spec.resources.gpus == 0):
        return None
    refill = f", refills {iso(allowance.resets_at)}" if allowance.resets_at else ""
    if allowance.unit == "credits":
        needed = allowance.minimum + provider.spec.price_per_hour
        if allowance.remaining < needed:
            return (f"credits: ${allowance.remaining:.2f} left, one hour here needs ${needed:.2f} "
                    f"(${allowance.minimum:g} kept aside){refill}")
        return None
    if allowance.remaining < max(allowance.minimum, 1e-9):
        return (f"quota: {allowance.remaining:.1f} {allowance.unit} left, a session needs "
                f"{allowance.minimum:g}{refill}")
    return None


def place(job: Job, providers: dict[str, Provider], now: float, reported: dict[str, Capacity] | None = None,
          allowances: dict[str, Allowance] | None = None,
          health: dict[str, ProviderHealth] | None = None) -> Placement:
    reported, allowances, health = reported or {}, allowances or {}, health or {}
    allowed = job.spec.placement.providers or sorted(providers)
    cap = job.spec.placement.max_price_per_hour
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
        if not job.spec.placement.interruptible and getattr(prov.spec.settings, "interruptible", False):
            out.excluded[name] = "its machines can be taken away (interruptible) and the job forbids that"
            continue
        offered = capacity_of(prov, reported.get(name))
        short = offered.shortfall(job.spec.resources) if offered is not None else None
        short = short or allowance_shortfall(job, prov, allowances.get(name))
        if short:
            out.excluded[name] = short
            continue
        free = 0 if (prov.spec.free_quota_hours or price == 0) else 1
        cooling = health[name].until(now) if name in health else None
        candidates.append((cooling or 0.0, free, price, rank, name))
    out.order = [c[-1] for c in sorted(candidates)]
    return out
