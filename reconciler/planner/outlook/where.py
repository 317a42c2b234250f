"""The one question the planner asks of time and money: where should this job run now, and why.

Placement (which providers may take it, best first, and why the others may not), the outlook
(measured rates, failure rates, prices, allowances), the budget (a launch leaves out the options
whose finish would break it) and the job's placement policy (deadline.py) answer it together, and
the answer carries the forecast the status shows and the failure rate the new worker is told. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from adapters.compute import Allowance
from desired.models import Capacity, Job, Provider
from reconciler.planner.health import ProviderHealth
from reconciler.planner.outlook.deadline import RISK_INFEASIBLE, Choice, Situation
from reconciler.planner.outlook.forecast import Reliability
from reconciler.planner.outlook.placement import Placement, place
from reconciler.planner.outlook.reliability import Record, change, mtbf
from reconciler.planner.outlook.view import Outlook, forecast, outlook, over_budget
from status.models import Forecast, JobStatus


@dataclass(frozen=True)
class Question:
    """One job at one tick, as time and money see it."""

    job: Job
    status: JobStatus
    providers: Mapping[str, Provider]
    now: float
    done_step: int  # the run's durable progress
    live_step: int | None = None  # the live attempt's last heartbeat step
    current: str | None = None  # the provider of the live attempt
    recorded: JobStatus | None = None  # the status as the tick read it (reliability counted it)
    capacity: Mapping[str, Capacity] = field(default_factory=dict)
    allowances: Mapping[str, Allowance] = field(default_factory=dict)
    health: Mapping[str, ProviderHealth] = field(default_factory=dict)
    reliability: Mapping[str, Reliability] = field(default_factory=dict)
    available: frozenset[str] = frozenset()  # providers that could take a worker of this job now
    policy: Callable[[Situation], Choice] | None = None  # None: only the forecast is wanted
    launch: bool = True  # where the next attempt goes; False: whether a running attempt should move
    tick_seconds: float = 30.0  # the daemon's pace (the placement policy is asked once a tick)
    lookahead: bool = False  # reconciler.yaml's `deadline_policy: lookahead`


@dataclass(frozen=True)
class Answer:
    provider: str | None  # where the run should be now (None: nowhere now, or not asked)
    placement: Placement  # the candidates, best first, and why the others are out
    forecast: Forecast | None = None  # what the status shows (None for a job without deadline or budget)
    choice: Choice | None = None  # the placement policy's own words, for a job with a deadline or budget
    mtbf_seconds: float | None = None  # RECONCILER_MTBF_SECONDS for a worker started on `provider`

    @property
    def infeasible(self) -> bool:
        return self.choice is not None and self.choice.risk == RISK_INFEASIBLE


def where_to_run(q: Question) -> Answer:
    """Without a policy, the forecast alone. A job with neither deadline nor budget goes to the best
    available candidate. Otherwise the policy chooses: for a launch among the options the budget
    can pay to finish on, for a running attempt among all (moving away is the policy's call)."""
    placement = place(q.job, dict(q.providers), q.now, dict(q.capacity), dict(q.allowances), dict(q.health))
    if q.policy is None:
        return Answer(None, placement, forecast(_outlook(q, placement), None))
    if q.job.spec.deadline is None and q.job.spec.budget_usd is None:
        best = next((name for name in placement.order if name in q.available), None)
        return _with_mtbf(q, Answer(best, placement))
    look = _outlook(q, placement)
    broke = over_budget(look) if q.launch else {}
    if broke:
        placement = Placement([n for n in placement.order if n not in broke], {**placement.excluded, **broke})
        look = _outlook(q, placement)
    choice = q.policy(look.situation) if placement.order or not q.launch else None
    return _with_mtbf(q, Answer(choice.provider if choice else None, placement, forecast(look, choice), choice))


def _outlook(q: Question, placement: Placement) -> Outlook:
    order = list(placement.order)
    if q.current is not None and q.current in q.providers and q.current not in order:
        order.append(q.current)
    available = set(q.available) & set(placement.order)  # the live attempt's provider counts only as a candidate
    return outlook(q.job, q.status, q.done_step, order, dict(q.providers), dict(q.reliability),
                   available, q.now, q.live_step, dict(q.allowances), q.tick_seconds, q.lookahead)


def _with_mtbf(q: Question, answer: Answer) -> Answer:
    """The provider's mean time between interruptions as reliability.py learns it from every job's
    attempts there, this job's as they stand now (an interruption closed in this tick counts for the
    relaunch it causes), in whole seconds."""
    rel = q.reliability.get(answer.provider) if answer.provider else None
    if rel is None or answer.provider is None:
        return answer
    seen = Record(rel.exposure_seconds, rel.interruptions) + change(q.recorded, q.status, answer.provider, q.now)
    m = mtbf(seen, rel.interruptible)
    if not (math.isfinite(m) and m > 0):
        return answer
    return Answer(answer.provider, answer.placement, answer.forecast, answer.choice, float(round(m)))
