"""Time and money as planned resources (issue 11): the measured rate and ETA, deadlines that move
runs between free, spot and reliable capacity, infeasible deadlines said at once, and budgets that
bind. Tables of inputs through the real planner."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from adapters.compute import Allowance, WorkerPhase, WorkerRef, WorkerState
from desired.parse import DesiredState, parse_desired
from reconciler.checkpoint_policy import estimate_mtbf
from reconciler.planner.outlook.deadline import Choice, Situation, choose
from reconciler.planner.outlook.forecast import Reliability, job_rate, job_tracks
from reconciler.planner.outlook.reliability import RoomShape, expected_mean
from reconciler.planner.outlook.view import outlook
from reconciler.planner.plan import (
    Launch,
    LaunchResult,
    Observed,
    Plan,
    RunObservation,
    Terminate,
    apply_results,
    plan,
)
from status.models import MAX_ATTEMPTS_KEPT, Attempt, JobStatus, Outcome, Phase
from tests.planner.test_plan import NOW, desired

HOUR = 3600.0
TARGET = 36_000  # steps; at the measured 1 step/s, 10 h of work

PROVIDERS = """
apiVersion: reconciler.dev/v1
kind: Provider
metadata: {name: kaggle}
spec: {settings: {type: local}, concurrency: 1, free_quota_hours: 30}
---
apiVersion: reconciler.dev/v1
kind: Provider
metadata: {name: spot}
spec: {settings: {type: sim, interruptible: true}, concurrency: 1, price_per_hour: 0.3}
---
apiVersion: reconciler.dev/v1
kind: Provider
metadata: {name: ondemand}
spec: {settings: {type: local}, concurrency: 1, price_per_hour: 1.0}
"""


def job(deadline_in: float | None = None, budget: float | None = None,
        providers: str = "[kaggle, spot, ondemand]", step_seconds: float | None = None) -> str:
    lines = ["apiVersion: reconciler.dev/v1", "kind: Job", "metadata: {name: train}", "spec:",
             "  command: [python, train.py]", f"  target_steps: {TARGET}", f"  placement: {{providers: {providers}}}"]
    if deadline_in is not None:
        when = datetime.fromtimestamp(NOW + deadline_in, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        lines.append(f"  deadline: '{when}'")
    if budget is not None:
        lines.append(f"  budget_usd: {budget}")
    if step_seconds is not None:
        lines.append(f"  step_seconds: {step_seconds}")
    return "\n".join(lines) + "\n"


def history(d, *attempts: Attempt) -> JobStatus:  # type: ignore[no-untyped-def]
    st = JobStatus(job="train", run_id=d.jobs["train"].run_id(), phase=Phase.PENDING,
                   manifest="desired/job0.yaml", total_attempts=len(attempts))
    st.attempts = list(attempts)
    st.progress.step = max((a.step_end or 0) for a in attempts) if attempts else 0
    return st


def done_on(provider: str, hours: float, steps: int, ago: float = 0.0, start_step: int = 0) -> Attempt:
    """A closed attempt that gained `steps` in `hours`, ended `ago` seconds before NOW."""
    end = NOW - ago
    return Attempt(epoch=1, provider=provider, worker="w1", started=end - hours * HOUR, ended=end,
                   outcome=Outcome.INTERRUPTION, step_start=start_step, step_end=start_step + steps)


def live_on(d, st: JobStatus, provider: str, since: float, durable: int, epoch: int = 2,  # type: ignore[no-untyped-def]
            step_start: int = 0) -> tuple[JobStatus, Observed]:
    run_id = d.jobs["train"].run_id()
    st.attempts.append(Attempt(epoch=epoch, provider=provider, worker=f"w{epoch}", started=since,
                               step_start=step_start, first_beat=since + 120))
    st.phase = Phase.RUNNING
    ref = WorkerRef(provider, f"w{epoch}", "train", run_id, epoch)
    run = RunObservation(lease_epoch=epoch, durable_step=durable, heartbeat_epoch=epoch, heartbeat_step=durable)
    return st, Observed(workers={ref: WorkerState(WorkerPhase.RUNNING, provider_state="running")},
                        runs={("train", run_id): run})


def launched(p) -> list[str]:  # type: ignore[no-untyped-def]
    return [a.provider for a in p.actions if isinstance(a, Launch)]


def stopped(p) -> list[str]:  # type: ignore[no-untyped-def]
    return [a.ref.provider for a in p.actions if isinstance(a, Terminate)]


# ---- the measured rate and the ETA -----------------------------------------------------------


def test_until_a_rate_is_measured_the_forecast_says_so_instead_of_guessing() -> None:
    d = desired(job(deadline_in=48 * HOUR), providers=PROVIDERS)
    st = plan(d, Observed(), {}, NOW).statuses["train"]
    assert st.forecast is not None and st.forecast.eta is None
    assert "rate not measured yet" in st.forecast.note


def test_a_run_whose_rate_halves_moves_its_eta() -> None:
    d = desired(job(), providers=PROVIDERS)
    st, seen = live_on(d, history(d), "ondemand", since=NOW - HOUR, durable=3600, epoch=1)
    first = plan(d, seen, {"train": st}, NOW).statuses["train"].forecast
    assert first is not None and first.eta == pytest.approx(NOW + 9 * HOUR, abs=1800)
    # 3600 steps from the first heartbeat (2 min after launch) to now
    assert first.rate_steps_per_hour == pytest.approx(3600 * 3600 / 3480, rel=0.02)
    # The next hour gains half as much: the pooled rate falls to 0.75 step/s.
    st, seen = live_on(d, history(d), "ondemand", since=NOW - HOUR, durable=5400, epoch=1)
    later = plan(d, seen, {"train": st}, NOW + HOUR).statuses["train"].forecast
    assert later is not None and later.eta is not None and first.eta is not None
    assert later.eta > first.eta + 2 * HOUR
    assert later.rate_steps_per_hour == pytest.approx(5400 * 3600 / 7080, rel=0.02)


def test_a_forecast_whose_figures_moved_does_not_change_the_status_alone() -> None:
    """Figures move every tick; a status that changed only in them would commit every tick."""
    d = desired(job(deadline_in=15 * HOUR, providers="[spot, ondemand]"), providers=PROVIDERS)
    st, seen = live_on(d, history(d), "spot", since=NOW - HOUR, durable=3600, epoch=1)
    first = plan(d, seen, {"train": st}, NOW).statuses["train"]
    assert first.forecast is not None and first.forecast.decision.startswith("on spot: ")
    # half an hour later, at half the speed: the slack and ETA moved, the progress is in the same tenth
    _, seen = live_on(d, history(d), "spot", since=NOW - HOUR, durable=4500, epoch=1)
    later = plan(d, seen, {"train": first}, NOW + 1800).statuses["train"]
    fresh = plan(d, seen, {"train": first.model_copy(update={"forecast": None})}, NOW + 1800).statuses["train"]
    assert fresh.forecast is not None and fresh.forecast.decision != first.forecast.decision
    assert later == first


def test_the_status_says_when_its_step_was_seen_and_keeps_that_while_the_step_stays() -> None:
    d = desired(job(), providers=PROVIDERS)
    st, seen = live_on(d, history(d), "ondemand", since=NOW - HOUR, durable=3600, epoch=1)
    first = plan(d, seen, {"train": st}, NOW).statuses["train"]
    assert (first.progress.step, first.progress.seen_at) == (3600, NOW)
    _, seen = live_on(d, history(d), "ondemand", since=NOW - HOUR, durable=4500, epoch=1)
    later = plan(d, seen, {"train": first}, NOW + 1800).statuses["train"]
    assert later.progress == first.progress  # the same tenth of the target: the step and its time stay


def test_the_status_keeps_the_live_workers_heartbeat_step_with_the_time_its_step_was_seen() -> None:
    """The worker runs ahead of its last checkpoint: the forecast starts from where it is."""
    d = desired(job(), providers=PROVIDERS)
    st, seen = live_on(d, history(d), "ondemand", since=NOW - HOUR, durable=3600, epoch=1)
    key = next(iter(seen.runs))
    seen.runs[key] = dataclasses.replace(seen.runs[key], heartbeat_step=3900)
    first = plan(d, seen, {"train": st}, NOW).statuses["train"]
    assert (first.progress.step, first.progress.heartbeat_step, first.progress.seen_at) == (3600, 3900, NOW)
    seen.runs[key] = dataclasses.replace(seen.runs[key], heartbeat_step=4400)
    later = plan(d, seen, {"train": first}, NOW + 600).statuses["train"]
    assert later.progress == first.progress  # the step stayed in its tenth: nothing new to commit


def test_the_status_keeps_the_workers_save_time_with_its_step_and_across_a_worker_that_has_not_said_it() -> None:
    """What the worker says its last save took (for the forecast's final save) is kept in whole
    seconds with the step, and kept on while a new worker has not saved yet."""
    d = desired(job(), providers=PROVIDERS)
    st, seen = live_on(d, history(d), "ondemand", since=NOW - HOUR, durable=3600, epoch=1)
    key = next(iter(seen.runs))
    seen.runs[key] = dataclasses.replace(seen.runs[key], heartbeat_step=3900, heartbeat_save_seconds=12.4)
    first = plan(d, seen, {"train": st}, NOW).statuses["train"]
    assert first.progress.save_seconds == 12.0
    # A step count pins its saves, so it never says how often it saves: a new save time in the same
    # tenth waits for the next step, as before (its first word was written at once).
    seen.runs[key] = dataclasses.replace(seen.runs[key], heartbeat_step=4000, heartbeat_save_seconds=15.2)
    same = plan(d, seen, {"train": first}, NOW + 300).statuses["train"]
    assert same.progress == first.progress and same.progress.save_every_seconds is None
    seen.runs[key] = dataclasses.replace(seen.runs[key], durable_step=7200, heartbeat_step=7300,
                                         heartbeat_save_seconds=None)
    later = plan(d, seen, {"train": first}, NOW + 3600).statuses["train"]
    assert later.progress.step == 7200 and later.progress.save_seconds == 12.0


def test_the_workers_save_period_is_kept_at_once_and_is_what_the_deadline_policy_expects_to_lose() -> None:
    """A worker that says how often it saves (no step count pins it) is taken at its word from its
    first beat, not from the next tenth of progress: an interruption loses half that on average,
    where the work lost so far (one unlucky loss of a whole interval) would say twice as much."""
    d = desired(job(deadline_in=20 * HOUR, providers="[spot, ondemand]"), providers=PROVIDERS)
    st, seen = live_on(d, history(d, done_on("spot", 1, 3600, ago=600)), "ondemand", since=NOW - 540,
                       durable=3600, step_start=3600)
    st.attempts[0].steps_lost = 900  # the interruption lost 900 steps: "an interval of 1,800"
    key = next(iter(seen.runs))
    seen.runs[key] = dataclasses.replace(seen.runs[key], heartbeat_step=3700, heartbeat_save_every_seconds=930.4)
    first = plan(d, seen, {"train": st}, NOW).statuses["train"]
    assert first.progress.step == 3600 and first.progress.save_every_seconds == 930.0
    seen.runs[key] = dataclasses.replace(seen.runs[key], heartbeat_step=4000, heartbeat_save_every_seconds=700.0)
    later = plan(d, seen, {"train": first}, NOW + 300).statuses["train"]
    assert later.progress == first.progress  # a new word in the same tenth: nothing new to commit

    def between_saves(status: JobStatus, checkpoint_every: int | None = None) -> tuple[float | None, float]:
        """The outlook's seconds between checkpoints, and the run's rate (steps a second)."""
        j = d.jobs["train"]
        if checkpoint_every:
            j = j.model_copy(update={"spec": j.spec.model_copy(update={"checkpoint_every": checkpoint_every})})
        s = outlook(j, status, 3600, ["spot", "ondemand"], d.providers, {}, {"spot"}, NOW).situation
        return s.checkpoint_seconds, job_rate(job_tracks(status, 3600, NOW)) or 0.0

    assert between_saves(later)[0] == pytest.approx(930.0)  # the worker's word
    seconds, rate = between_saves(st)
    assert seconds == pytest.approx(2 * 900 / rate)  # without it: twice the mean lost, at the run's rate
    seconds, rate = between_saves(later, checkpoint_every=600)
    assert seconds == pytest.approx(600 / rate)  # a pinned interval wins


def test_the_lookahead_is_handed_spots_mtbf_as_the_posterior_mean_and_the_rules_the_capped_one() -> None:
    d = desired(job(deadline_in=20 * HOUR, providers="[spot, ondemand]"), providers=PROVIDERS)
    record = {"spot": Reliability(estimate_mtbf(1800.0, 1, 6 * HOUR), 180.0, True, interruptions=1.0,
                                  exposure_seconds=1800.0, prior_seconds=6 * HOUR, interruptible=True),
              "ondemand": Reliability(30 * 24 * HOUR, 180.0, False, prior_seconds=30 * 24 * HOUR)}
    spot, ondemand = outlook(d.jobs["train"], JobStatus(job="train"), 0, ["spot", "ondemand"], d.providers,
                             record, {"spot"}, NOW).situation.options
    assert spot.mtbf_seconds == pytest.approx(estimate_mtbf(1800.0, 1, 6 * HOUR))  # 0.9 h
    assert spot.mtbf_expected_seconds == pytest.approx(expected_mean(1800.0, 1, 6 * HOUR))  # 2.3 h
    assert ondemand.mtbf_expected_seconds is None  # the lookahead models spot only


def test_the_forecast_shows_spent_and_projected_cost() -> None:
    d = desired(job(), providers=PROVIDERS)
    st = history(d, done_on("ondemand", 2, 7200, ago=60))
    st.cost_usd = 2.0
    fc = plan(d, Observed(), {"train": st}, NOW).statuses["train"].forecast
    assert fc is not None and fc.spent_usd == pytest.approx(2.0)
    assert fc.providers["ondemand"].measured and not fc.providers["spot"].measured
    assert fc.providers["ondemand"].hours == pytest.approx(8.0, rel=0.05)


# ---- deadlines ----------------------------------------------------------------------------------


def test_free_quota_is_spent_before_paid_capacity_while_slack_allows() -> None:
    d = desired(job(deadline_in=48 * HOUR), providers=PROVIDERS)
    st = history(d, done_on("ondemand", 1, 3600, ago=60))
    p = plan(d, Observed(), {"train": st}, NOW)
    assert launched(p) == ["kaggle"]
    fc = p.statuses["train"].forecast
    assert fc is not None and fc.risk == "on track" and "slack covers" in fc.decision


def test_the_eta_counts_only_the_hours_a_quota_can_still_carry() -> None:
    d = desired(job(deadline_in=48 * HOUR), providers=PROVIDERS)
    st = history(d, done_on("ondemand", 1, 3600, ago=60))
    quota = Allowance("free hours", remaining=2.0)
    p = plan(d, Observed(allowances={"kaggle": quota}), {"train": st}, NOW)
    assert launched(p) == ["kaggle"]
    fc = p.statuses["train"].forecast
    assert fc is not None and fc.eta is not None and fc.projected_cost_usd is not None
    # 2 h on kaggle's quota, the other 7 h (and a changeover) on the on-demand fallback at $1/h
    assert fc.eta == pytest.approx(NOW + 9.2 * HOUR, abs=1800)
    assert fc.projected_cost_usd == pytest.approx(7.2, abs=0.2)


def test_without_slack_the_run_goes_to_reliable_capacity() -> None:
    d = desired(job(deadline_in=9.3 * HOUR), providers=PROVIDERS)
    st = history(d, done_on("ondemand", 1, 3600, ago=60))
    p = plan(d, Observed(), {"train": st}, NOW)
    assert launched(p) == ["ondemand"]
    assert p.statuses["train"].forecast.risk == "at risk"  # type: ignore[union-attr]


def test_a_run_on_spot_moves_to_reliable_capacity_when_slack_no_longer_covers_the_losses() -> None:
    # 8 h of work left, 8.05 h to the deadline: after the 2 min changeover to on-demand (seen on
    # spot, borrowed), 5 min of slack no longer cover two changeovers plus one more interruption
    d = desired(job(deadline_in=8.05 * HOUR), providers=PROVIDERS)
    st, seen = live_on(d, history(d, done_on("ondemand", 1, 3600, ago=HOUR)), "spot", since=NOW - HOUR,
                       durable=7200, step_start=3600)
    p = plan(d, seen, {"train": st}, NOW)
    assert stopped(p) == ["spot"] and not launched(p)
    st2 = p.statuses["train"]
    assert st2.phase == Phase.PENDING
    assert st2.message == "moving to ondemand: 5 min of slack no longer covers an interruption on spot"
    assert st2.attempts[-1].outcome == Outcome.CANCELLED


def test_with_slack_and_no_cheap_capacity_it_waits_instead_of_paying_for_reliable() -> None:
    d = desired(job(deadline_in=40 * HOUR, providers="[spot, ondemand]"), providers=PROVIDERS)
    st = history(d, done_on("spot", 4, 14_400, ago=60))
    p = plan(d, Observed(free_slots={"spot": 0}), {"train": st}, NOW)
    assert not launched(p)
    assert p.statuses["train"].phase == Phase.PENDING
    assert "waiting for cheaper capacity" in p.statuses["train"].message


def test_a_job_whose_only_provider_is_free_runs_there_instead_of_waiting() -> None:
    d = desired(job(deadline_in=100 * HOUR, providers="[kaggle]"), providers=PROVIDERS)
    st = history(d, done_on("kaggle", 1, 3600, ago=60))
    assert launched(plan(d, Observed(), {"train": st}, NOW)) == ["kaggle"]


def test_an_infeasible_deadline_is_reported_at_once_and_the_run_goes_on_as_fast_as_allowed() -> None:
    d = desired(job(deadline_in=2 * HOUR), providers=PROVIDERS)
    st, seen = live_on(d, history(d), "ondemand", since=NOW - HOUR, durable=3600, epoch=1)
    p = plan(d, seen, {"train": st}, NOW)
    st2 = p.statuses["train"]
    assert not stopped(p) and not launched(p)
    assert st2.phase == Phase.RUNNING and "the deadline cannot be met (the forecast's decision" in st2.message
    assert st2.forecast is not None and st2.forecast.risk == "infeasible"
    assert "infeasible: the rest needs at least 8.7 h" in st2.forecast.decision
    assert "at the measured rate" in st2.forecast.decision
    assert "2 h are left before the deadline" in st2.forecast.decision


def test_a_declared_step_time_says_a_deadline_is_infeasible_before_anything_has_run() -> None:
    d = desired(job(deadline_in=5 * HOUR, providers="[spot, ondemand]", step_seconds=1.0), providers=PROVIDERS)
    p = plan(d, Observed(), {}, NOW)
    st = p.statuses["train"]
    assert launched(p) == ["ondemand"], "it still runs, as early as it can on reliable capacity"
    assert st.forecast is not None and st.forecast.risk == "infeasible"
    assert "infeasible: the rest needs at least 10 h" in st.forecast.decision
    assert "at the manifest's step_seconds" in st.forecast.decision
    without = plan(desired(job(deadline_in=5 * HOUR, providers="[spot, ondemand]"), providers=PROVIDERS),
                   Observed(), {}, NOW).statuses["train"]
    assert without.forecast is None or without.forecast.risk != "infeasible", "unmeasured and undeclared: no verdict"


def test_a_declared_step_time_gives_an_eta_marked_as_not_measured_until_the_rate_is() -> None:
    d = desired(job(deadline_in=30 * HOUR, providers="[spot, ondemand]", step_seconds=2.0), providers=PROVIDERS)
    o = outlook(d.jobs["train"], JobStatus(job="train"), 0, ["spot", "ondemand"], d.providers, {}, {"spot"}, NOW)
    assert [(x.provider, x.rate, x.rate_measured) for x in o.situation.options] == [
        ("spot", 0.5, False), ("ondemand", 0.5, False)]
    assert "the manifest's estimate of 2 s a step stands in" in o.note
    st = history(d, done_on("spot", 1, 3600, ago=60))  # an hour at 1 step/s: the measured rate wins
    o = outlook(d.jobs["train"], st, 3600, ["spot", "ondemand"], d.providers, {}, {"spot"}, NOW)
    assert [(x.rate, x.rate_measured) for x in o.situation.options] == [(1.0, True), (1.0, False)]
    assert o.note == ""


def test_an_infeasible_budget_is_reported_before_anything_is_launched() -> None:
    d = desired(job(deadline_in=20 * HOUR, budget=1.0, providers="[spot, ondemand]"), providers=PROVIDERS)
    st = history(d, done_on("spot", 1, 3600, ago=60))
    p = plan(d, Observed(), {"train": st}, NOW)
    assert not launched(p) and p.statuses["train"].phase == Phase.PENDING
    assert "of the budget is left" in p.statuses["train"].message


# ---- budgets -----------------------------------------------------------------------------------


def test_a_budget_stops_a_launch_whose_projected_cost_breaks_it() -> None:
    d = desired(job(budget=2.0, providers="[spot, ondemand]"), providers=PROVIDERS)
    st = history(d, done_on("ondemand", 1, 3600, ago=60))
    st.cost_usd = 1.0
    p = plan(d, Observed(), {"train": st}, NOW)
    assert not launched(p)
    msg = p.statuses["train"].message
    # 9 h of work left at the measured 1 step/s, plus the changeover (10 min until one is measured)
    assert "spot: finishing there costs $2.75 more and $1.00 of the budget is left" in msg
    assert "ondemand: finishing there costs $9.17 more" in msg


def test_a_budget_that_allows_the_cheaper_provider_places_there() -> None:
    d = desired(job(budget=5.0, providers="[spot, ondemand]"), providers=PROVIDERS)
    st = history(d, done_on("ondemand", 1, 3600, ago=60))
    assert launched(plan(d, Observed(), {"train": st}, NOW)) == ["spot"]


def test_a_budget_stops_a_running_attempt_once_spent() -> None:
    d = desired(job(budget=1.5, providers="[ondemand]"), providers=PROVIDERS)
    st, seen = live_on(d, history(d), "ondemand", since=NOW - 2 * HOUR, durable=7200, epoch=1)
    p = plan(d, seen, {"train": st}, NOW)
    assert stopped(p) == ["ondemand"]
    assert p.statuses["train"].phase == Phase.FAILED and "cost budget of $1.5 spent" in p.statuses["train"].message


@pytest.mark.parametrize(("price", "quota", "words"), [
    (0.2, 30, "quota is the prepaid option ($0.20/h, from its credits or quota) that can start now"),
    (0.0, 30, "quota is the free option that can start now"),
    (0.0, None, "quota is the free option that can start now"),
    (0.2, None, "quota is the cheapest option ($0.20/h) that can start now"),
])
def test_words_about_the_chosen_options_money_are_exact(price: float, quota: int | None, words: str) -> None:
    """Free only at a price of 0: a $0.20/h offer paid from a quota is not "the free option"."""
    extra = f", free_quota_hours: {quota}" if quota is not None else ""
    providers = ("apiVersion: reconciler.dev/v1\nkind: Provider\nmetadata: {name: quota}\n"
                 f"spec: {{settings: {{type: local}}, concurrency: 1, price_per_hour: {price}{extra}}}\n")
    d = desired(job(budget=100.0, providers="[quota]"), providers=providers)
    message = plan(d, Observed(), {}, NOW).statuses["train"].message
    assert message == f"launching on quota: {words} (no deadline to plan for)"


@pytest.mark.parametrize(("deadline_in", "held"), [(100.0, True), (149.0, True), (300.0, False)])
def test_no_attempt_is_launched_that_cannot_save_before_the_deadline(deadline_in: float, held: bool) -> None:
    # The last attempt took 120 s from launch to its first heartbeat (start-up and restore), and
    # the worker stops 30 s before the deadline to checkpoint: under 150 s left, a launch buys nothing.
    d = desired(PROVIDERS + "---\n" + job(deadline_in=deadline_in))
    last = done_on("spot", 1.0, 3000, ago=600.0)
    last.first_beat = last.started + 120.0
    p = plan(d, Observed(), {"train": history(d, last)}, NOW)
    st = p.statuses["train"]
    if held:
        assert launched(p) == [] and st.phase == Phase.PENDING
        assert st.message.startswith(f"not launching: {deadline_in:.0f} s to the deadline"), st.message
        assert "120 s of start-up and restore, as its latest measured attempt took" in st.message
        assert st.message.endswith("the deadline will end the job")
    else:
        assert not st.message.startswith("not launching"), st.message


@pytest.mark.parametrize(("deadline_in", "held"), [(30.0, True), (2 * HOUR, False)])
def test_after_the_worker_stopped_for_the_deadline_only_a_moved_deadline_relaunches(deadline_in: float,
                                                                                    held: bool) -> None:
    d = desired(PROVIDERS + "---\n" + job(deadline_in=deadline_in))
    stop = Attempt(epoch=1, provider="spot", worker="w1", started=NOW - 600.0, ended=NOW - 10.0, exit_code=75,
                   outcome=Outcome.CANCELLED, step_start=0, step_end=500,
                   detail="worker checkpointed and stopped before the job's deadline (exit 75)")
    p = plan(d, Observed(), {"train": history(d, stop)}, NOW)
    st = p.statuses["train"]
    assert st.message.startswith("not relaunching: the last attempt stopped for the job's deadline") == held, \
        st.message
    if held:
        assert launched(p) == [] and st.phase == Phase.PENDING


def on_demand_for_four_hours(deadline_in: float):  # type: ignore[no-untyped-def]
    """The plan for a run that did 4 h of its 10 h in 4 h on on-demand (live for the last 2),
    with spot full, `deadline_in` seconds before its deadline."""
    d = desired(job(deadline_in=deadline_in, providers="[spot, ondemand]"), providers=PROVIDERS)
    st, seen = live_on(d, history(d, done_on("ondemand", 2, 7200, ago=2 * HOUR)), "ondemand", since=NOW - 2 * HOUR,
                       durable=14_400, step_start=7200)
    seen.free_slots["spot"] = 0
    return plan(d, seen, {"train": st}, NOW)


def test_a_run_on_reliable_capacity_well_ahead_of_its_pace_stops_to_wait_for_cheaper() -> None:
    # 4 h done in 4 h on on-demand, 6 h left and 36 h to the deadline, spot full: on-demand is
    # paying for slack the run does not need, so the worker is stopped (it saves) and the run waits.
    p = on_demand_for_four_hours(deadline_in=36 * HOUR)
    assert stopped(p) == ["ondemand"] and not launched(p)
    st2 = p.statuses["train"]
    assert st2.phase == Phase.PENDING and st2.message.startswith("leaving ondemand to wait for cheaper capacity")
    assert st2.attempts[-1].outcome == Outcome.CANCELLED


def test_a_run_on_reliable_capacity_behind_its_pace_stays_there() -> None:
    # The same run with 6.5 h to the deadline: its half hour of slack is what the rest needs.
    p = on_demand_for_four_hours(deadline_in=6.5 * HOUR)
    assert not stopped(p) and p.statuses["train"].phase == Phase.RUNNING


def test_the_pace_line_starts_at_the_first_launch_after_older_attempts_are_trimmed() -> None:
    # Twelve short spot attempts over 12 h; the status keeps the newest ten, and would otherwise
    # read the job as started 10 h ago: its Uniform Progress line, and the slack ratio the policy
    # keeps, would slide with every attempt.
    d = desired(job(deadline_in=36 * HOUR, providers="[spot, ondemand]"), providers=PROVIDERS)
    launch = Launch("train", d.jobs["train"].run_id(), "spot", "test")
    st = history(d)
    for i in range(12):
        p = Plan(statuses={"train": st})
        apply_results(p, [LaunchResult(launch, ref=WorkerRef("spot", f"w{i}", "train", st.run_id, i + 1))],
                      NOW - (12 - i) * HOUR, {})
        st.attempts[-1] = st.attempts[-1].model_copy(update={"ended": NOW - (11.5 - i) * HOUR,
                                                             "outcome": Outcome.INTERRUPTION})
    assert len(st.attempts) == MAX_ATTEMPTS_KEPT and st.attempts[0].started == NOW - 10 * HOUR
    assert st.first_launched == NOW - 12 * HOUR
    situation = outlook(d.jobs["train"], st, 0, ["spot", "ondemand"], d.providers, {}, set(), NOW).situation
    assert situation.window_start == NOW - 12 * HOUR


def on_demand_under_lookahead() -> tuple[DesiredState, JobStatus, Observed]:
    """`deadline_policy: lookahead` in reconciler.yaml; a run on on-demand for an hour, just past a
    checkpoint, after four hours on spot, twelve hours before its deadline."""
    files = {"desired/job0.yaml": job(deadline_in=12 * HOUR, providers="[spot, ondemand]"),
             "desired/providers.yaml": PROVIDERS}
    d = parse_desired(files, "deadline_policy: lookahead\ntick_seconds: 300\n")
    assert not d.errors, d.errors
    st, seen = live_on(d, history(d, done_on("spot", 4, 14_400, ago=2 * HOUR)), "ondemand", since=NOW - HOUR,
                       durable=18_000, step_start=14_400)
    return d, st, seen


@pytest.mark.parametrize(("room_wait", "leaves"), [(600.0, True), (1000 * HOUR, False)],
                         ids=["spot-back-soon", "spot-gone-for-good"])
def test_deadline_policy_lookahead_in_reconciler_yaml_weighs_the_daemons_room_waits(room_wait: float,
                                                                                   leaves: bool) -> None:
    """`deadline_policy: lookahead` reaches the placement policy through the planner, and so does the
    wait for room the daemon measured (Observed.room_waits). A run on on-demand, just past a
    checkpoint, with spot full: if spot has room again within minutes, stopping to wait for it is
    worth a changeover; if it never has, the run stays where it is."""
    d, st, seen = on_demand_under_lookahead()
    seen = dataclasses.replace(seen, free_slots={"spot": 0}, room_waits={"spot": room_wait})
    p = plan(d, seen, {"train": st}, NOW)
    decision = p.statuses["train"].forecast.decision  # type: ignore[union-attr]
    assert "expected cost to finish:" in decision, decision
    assert stopped(p) == (["ondemand"] if leaves else []), decision


def test_the_daemons_room_shape_reaches_the_deadline_policy_through_the_planner() -> None:
    """Observed.room_shapes (RoomWatch: the share of short room periods, how long room has been back)
    is on the Option of the provider it was seen on, for the lookahead to weigh; a provider the
    daemon has no shape for keeps memoryless room."""
    d, st, seen = on_demand_under_lookahead()
    shape = RoomShape(short_share=0.3, age_seconds=600.0)
    seen = dataclasses.replace(seen, free_slots={"spot": 1}, room_shapes={"spot": shape})
    asked: list[Situation] = []

    def spy(s: Situation) -> Choice:
        asked.append(s)
        return choose(s)

    plan(d, seen, {"train": st}, NOW, policy=spy)
    options = {o.provider: o for o in asked[-1].options}
    assert options["spot"].room_shape == shape
    assert options["ondemand"].room_shape == RoomShape()
