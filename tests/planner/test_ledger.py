"""The provider ledger in the status: each provider's own word on quota or credits, beside this
repository's use of it in the current period (the provider's refill week, else the ISO week)."""

from __future__ import annotations

import calendar

import pytest
import yaml

from adapters.compute import Allowance
from reconciler.planner.ledger import build_ledger, period_start
from status.models import Attempt, JobStatus, render_index, render_ledger
from tests.planner.test_plan import PROVIDERS, desired, job_yaml

WED_NOON = float(calendar.timegm((2026, 12, 2, 12, 0, 0)))  # a Wednesday
MONDAY = float(calendar.timegm((2026, 11, 30, 0, 0, 0)))


def test_the_period_is_the_providers_refill_week_else_the_iso_week() -> None:
    assert period_start(WED_NOON, None) == MONDAY
    refill = WED_NOON + 3600
    assert period_start(WED_NOON, Allowance("gpu-hours", 1.0, resets_at=refill)) == refill - 7 * 86400


def test_our_use_this_period_is_counted_from_the_attempts_and_the_providers_word_kept_beside_it() -> None:
    d = desired(job_yaml(extra="  resources: {gpus: 2}"), job_yaml("cpu"))
    st = JobStatus(job="train", attempts=[
        Attempt(epoch=1, provider="free", worker="w1", started=MONDAY - 3600, ended=MONDAY + 3600, cost_usd=0.0),
        Attempt(epoch=2, provider="paid", worker="w2", started=WED_NOON - 7200, ended=WED_NOON - 3600, cost_usd=0.4),
        Attempt(epoch=3, provider="paid", worker="w3", started=WED_NOON - 1800),
    ])
    cpu = JobStatus(job="cpu", attempts=[Attempt(epoch=1, provider="free", worker="c", started=WED_NOON - 3600,
                                                 ended=WED_NOON)])
    quota = Allowance("gpu-hours", remaining=12.5, total=30, used=17.5, resets_at=None, applies_to_cpu=False)
    lines = {x.provider: x for x in build_ledger(d.providers, [st, cpu], d.jobs, {"free": quota}, WED_NOON)}
    free, paid = lines["free"], lines["paid"]
    assert free.worker_hours == pytest.approx(2.0)  # 1 h of train after Monday 00:00 + 1 h of cpu
    assert free.gpu_hours == pytest.approx(2.0)  # train's hour, 2 GPUs
    assert (free.unit, free.remaining, free.total) == ("gpu-hours", 12.5, 30)
    assert paid.worker_hours == pytest.approx(1.5) and paid.running == 1
    assert paid.cost_usd == pytest.approx(0.4 + 0.5 * 0.5)  # billed attempt + the open one at the price
    text = render_ledger(list(lines.values()))
    rows = {r["provider"]: r for r in yaml.safe_load(text)["providers"]}
    assert rows["free"]["remaining"] == 12.5 and rows["free"]["period_start"] == "2026-11-30T00:00:00Z"
    index = render_index([st, cpu], [], list(lines.values()))
    assert "## Providers" in index and "| free | 12.5 gpu-hours |" in index


def test_ledger_is_empty_of_allowance_for_providers_that_report_none() -> None:
    d = desired(job_yaml(), providers=PROVIDERS)
    lines = build_ledger(d.providers, [], d.jobs, {}, WED_NOON)
    assert all(x.unit is None and x.remaining is None and x.worker_hours == 0 for x in lines)
