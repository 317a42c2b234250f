"""A job's outlook: the planner's view of its time and money, built from the status and what the
tick observed. Pure. It turns measurements (reconciler.planner.outlook.forecast) into the `Situation` a placement
policy decides on (reconciler.planner.outlook.deadline), and the policy's choice into the `Forecast` the status
shows: ETA, spent and projected cost, slack, risk and the one-line reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from adapters.compute import Allowance
from desired.models import Job, Provider
from reconciler.planner.outlook.deadline import Choice, Option, Situation, fallback_of
from reconciler.planner.outlook.forecast import (
    Reliability,
    Track,
    job_rate,
    job_tracks,
    lost_interval_steps,
    open_cost,
    provider_rate,
    round_sig,
    round_time,
    said_interval_steps,
)
from reconciler.planner.outlook.reliability import expected_mean
from status.models import Forecast, JobStatus, Outcome, ProviderForecast


@dataclass(frozen=True)
class Outlook:
    situation: Situation
    spent: float  # dollars, the live attempt included
    note: str  # what could not be measured


def is_free(provider: Provider, prepaid: bool = False) -> bool:
    """Capacity that costs no new money: a price of 0, a free quota (Kaggle's weekly hours), or
    credits the provider holds (Lightning's), which are spent first while the slack allows."""
    return provider.spec.price_per_hour == 0 or provider.spec.free_quota_hours is not None or prepaid


def hours_left(provider: Provider, allowance: Allowance | None, gpus: int) -> float | None:
    """Attempt hours the provider's own allowance can still carry for this job, or None (no limit)."""
    if allowance is None or (not allowance.applies_to_cpu and gpus == 0):
        return None
    if allowance.unit == "credits":
        price = provider.spec.price_per_hour
        return max(0.0, allowance.remaining - allowance.minimum) / price if price > 0 else None
    return max(0.0, allowance.remaining)


def build_options(order: list[str], providers: dict[str, Provider], tracks: dict[str, Track],
                  reliability: dict[str, Reliability], available: set[str],
                  allowances: dict[str, Allowance] | None = None, gpus: int = 0,
                  step_seconds: float | None = None) -> tuple[Option, ...]:
    """Options in placement order; a provider the job has not run on borrows the job's rate, and
    until that is measured every provider borrows the manifest's `step_seconds` estimate."""
    overall = job_rate(tracks)
    if overall is None and step_seconds:
        overall = 1.0 / step_seconds
    allowances = allowances or {}
    out = []
    for name in order:
        prov = providers[name]
        rel = reliability.get(name) or Reliability(float("inf"), 0.0, False)
        own = tracks.get(name)
        out.append(Option(
            provider=name, price=prov.spec.price_per_hour,
            interruptible=bool(getattr(prov.spec.settings, "interruptible", False)),
            free=is_free(prov, getattr(allowances.get(name), "unit", "") == "credits"),
            available=name in available, rate=provider_rate(own, overall),
            rate_measured=own is not None and own.rate is not None,
            mtbf_seconds=rel.mtbf_seconds, changeover_seconds=rel.changeover_seconds,
            hours_left=hours_left(prov, allowances.get(name), gpus), mtbf_shape=_mtbf_shape(rel),
            room_wait_seconds=rel.room_wait_seconds, room_shape=rel.room_shape,
            mtbf_expected_seconds=expected_mean(rel.exposure_seconds, rel.interruptions, rel.prior_seconds)
            if rel.interruptible else None))
    return tuple(out)


def _mtbf_shape(rel: Reliability) -> float:
    """How many interruptions the MTBF rests on: the shape of estimate_mtbf's Gamma posterior (the
    weighed interruptions and at most one pseudo-interruption of the prior)."""
    if rel.interruptions <= 0 or rel.prior_seconds <= 0:
        return 1.0
    return rel.interruptions + min(rel.prior_seconds, rel.exposure_seconds / rel.interruptions) / rel.prior_seconds


def outlook(job: Job, st: JobStatus, durable_step: int, order: list[str], providers: dict[str, Provider],
            reliability: dict[str, Reliability], available: set[str], now: float,
            live_step: int | None = None, allowances: dict[str, Allowance] | None = None,
            tick_seconds: float = 30.0, lookahead: bool = False) -> Outlook:
    tracks = job_tracks(st, durable_step, now, live_step)
    options = build_options(order, providers, tracks, reliability, available, allowances, job.spec.resources.gpus,
                            job.spec.step_seconds)
    spent = st.cost_usd + open_cost(st, now, {n: p.spec.price_per_hour for n, p in providers.items()})
    budget = job.spec.budget_usd
    cur = st.current
    first = st.first_launched if st.first_launched is not None else \
        min((a.started for a in st.attempts), default=now)
    situation = Situation(
        job=job.name, now=now, deadline=job.spec.deadline.timestamp() if job.spec.deadline else None,
        budget_left=None if budget is None else budget - spent, done_steps=durable_step,
        target_steps=job.spec.target_steps, window_start=first, current=cur.provider if cur else None,
        options=options, lost_work_seconds=_worst_loss(st, job_rate(tracks), job.spec.checkpoint_every),
        checkpoint_seconds=_checkpoint_seconds(st, job_rate(tracks), job.spec.checkpoint_every),
        unsaved_seconds=_unsaved_seconds(durable_step, live_step if cur is not None else None, job_rate(tracks)),
        rate_stated=job_rate(tracks) is None and bool(job.spec.step_seconds), tick_seconds=tick_seconds,
        lookahead=lookahead)
    note = ""
    if job.spec.target_steps is None:
        note = "no target_steps: the work left is unknown, so there is no ETA"
    elif job_rate(tracks) is None and job.spec.step_seconds:
        note = (f"rate not measured yet (less than 15 min of attempt time with progress): the manifest's "
                f"estimate of {job.spec.step_seconds:g} s a step stands in")
    elif job_rate(tracks) is None:
        note = "rate not measured yet: less than 15 min of attempt time with progress"
    return Outlook(situation, spent, note)


def _worst_loss(st: JobStatus, rate: float | None, checkpoint_every: int | None) -> float | None:
    """Seconds the worst interruption of this run cost: the work since its last checkpoint (the
    most seen, or the job's checkpoint interval when that is longer) plus the time until the next
    attempt started (noticing the loss takes up to a tick)."""
    if not rate:
        return None
    lost = [a.steps_lost for a in st.attempts if a.outcome == Outcome.INTERRUPTION and a.steps_lost]
    work = max([*lost, checkpoint_every or 0]) / rate
    gaps = [b.started - a.ended for a, b in zip(st.attempts, st.attempts[1:], strict=False)
            if a.ended is not None and a.outcome == Outcome.INTERRUPTION]
    return work + max(gaps, default=0.0) if work or gaps else None


def _checkpoint_seconds(st: JobStatus, rate: float | None, checkpoint_every: int | None) -> float | None:
    """Attempt seconds between checkpoints: the job's checkpoint_every at its rate, else the
    worker's own word (from one save's start to the next), else twice the mean work an interruption lost
    (lost work is spread evenly over the interval), else None (unknown). The forecast's futures
    read it the same way."""
    if not rate:
        return None
    if checkpoint_every:
        return checkpoint_every / rate
    if (said := said_interval_steps(st, rate)) is not None:
        return said / rate
    measured = lost_interval_steps(st)
    return measured[0] / rate if measured else None


def _unsaved_seconds(durable_step: int, live_step: int | None, rate: float | None) -> float:
    """The live attempt's work since its last checkpoint: its heartbeat's step beyond the durable one."""
    if live_step is None or not rate:
        return 0.0
    return max(0, live_step - durable_step) / rate


def over_budget(o: Outlook) -> dict[str, str]:
    """Options whose projected cost to finish breaks the budget: provider -> why."""
    s = o.situation
    rest = s.remaining_steps
    if s.budget_left is None or rest is None:
        return {}
    out = {}
    for opt in s.options:
        hours = opt.hours_for(rest, opt.provider != s.current)
        if hours is not None and opt.price > 0 and hours * opt.price > s.budget_left:
            left = max(0.0, s.budget_left)
            cost = hours * opt.price
            out[opt.provider] = f"finishing there costs ${cost:.2f} more and ${left:.2f} of the budget is left"
    return out


def forecast(o: Outlook, choice: Choice | None) -> Forecast:
    """What the status shows. Figures are rounded (two significant digits, ETA to the half hour)
    so that a tick whose estimate barely moved does not commit."""
    s = o.situation
    rest = s.remaining_steps
    where = (choice.provider if choice and choice.provider else None) or s.current
    per: dict[str, ProviderForecast] = {}
    for opt in s.options:
        hours = opt.hours_for(rest, opt.provider != s.current) if rest is not None else None
        if hours is not None:
            per[opt.provider] = ProviderForecast(hours=round_sig(hours), cost_usd=round_sig(hours * opt.price),
                                                 measured=opt.rate_measured)
    at = per.get(where) if where else None
    if at is None and per:
        at = min(per.values(), key=lambda p: p.hours)
    there = next((x for x in s.options if x.provider == where), None)
    if at is not None and there is not None and rest is not None:
        at = _within_allowance(s, there, rest, at)
    return Forecast(
        rate_steps_per_hour=round_sig(there.rate * 3600) if there is not None and there.rate else None,
        eta=round_time(s.now + at.hours * 3600) if at is not None else None,
        spent_usd=round_sig(o.spent),
        projected_cost_usd=round_sig(o.spent + at.cost_usd) if at is not None else None,
        slack_hours=round_sig(choice.slack_hours) if choice and choice.slack_hours is not None else None,
        risk=choice.risk if choice else "",
        decision=choice.reason if choice and s.deadline is not None else "",
        placement=(choice.provider or "") if choice else "",
        note=o.note, providers=per)


def _within_allowance(s: Situation, there: Option, rest: int, whole: ProviderForecast) -> ProviderForecast:
    """Finishing where the run is going, as far as that provider's quota or credits carry it, and
    the rest on the fallback (an ETA that assumed 60 h on a 30 h quota was a day early)."""
    fb = fallback_of(s)
    if there.hours_left is None or there.rate is None or whole.hours <= there.hours_left or fb is None \
            or fb is there:
        return whole
    done_there = int(there.hours_left * 3600 * there.rate)
    after = fb.hours_for(max(0, rest - done_there)) or 0.0
    return ProviderForecast(hours=there.hours_left + after, cost_usd=there.hours_left * there.price + after * fb.price,
                            measured=whole.measured)
