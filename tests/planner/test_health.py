"""Provider health (reconciler.planner.health): refusals and lost workers, shared by every job, with
cool-downs that grow while the trouble repeats and decay when it stops."""

from __future__ import annotations

from reconciler.planner.health import (
    COOLDOWN_MAX_SECONDS,
    FORGIVE_SECONDS,
    LOSS_COOLDOWN_SECONDS,
    REFUSAL_COOLDOWN_SECONDS,
    clock,
    plan_lines,
    provider_health,
)
from reconciler.planner.plan import Launch, LaunchResult, Observed, Plan, apply_results, plan
from status.models import Attempt, JobStatus, Outcome, Phase, Refusal
from tests.planner.test_plan import NOW, PROVIDERS, desired, job_yaml

BROKEN_AND_GOOD = PROVIDERS.replace("name: free", "name: broken").replace("name: paid", "name: good")
NOT_A_DIRECTORY = "local provider 'broken': cannot create /srv/w/workers: [Errno 20] Not a directory: '/srv/w'"


def launches(p: Plan) -> list[tuple[str, str]]:
    return [(a.job, a.provider) for a in p.actions if isinstance(a, Launch)]


def refused_status(job: str, *times: float, provider: str = "broken", error: str = NOT_A_DIRECTORY) -> JobStatus:
    return JobStatus(job=job, phase=Phase.PENDING,
                     refusals=[Refusal(provider=provider, refused=t, error=error) for t in times])


def lost(job: str, provider: str, *ended: float) -> JobStatus:
    st = JobStatus(job=job, phase=Phase.PENDING, total_attempts=len(ended))
    st.attempts = [Attempt(epoch=i + 1, provider=provider, worker=f"w{i}", started=t - 600, ended=t,
                           outcome=Outcome.INTERRUPTION, detail="worker vanished from the provider")
                   for i, t in enumerate(ended)]
    return st


def test_a_refusal_cools_the_provider_down_for_a_job_committed_later() -> None:
    first = desired(job_yaml("a"), providers=BROKEN_AND_GOOD)
    p = plan(first, Observed(), {}, NOW)
    assert launches(p) == [("a", "broken")]
    apply_results(p, [LaunchResult(p.actions[0], error=NOT_A_DIRECTORY)], NOW, {})  # type: ignore[arg-type]
    both = desired(job_yaml("a"), job_yaml("b"), providers=BROKEN_AND_GOOD)
    later = plan(both, Observed(), dict(p.statuses), NOW + 27)
    assert sorted(launches(later)) == [("a", "good"), ("b", "good")]  # b never tries broken
    assert later.health["broken"].skipped(NOW + 27)


def test_a_waiting_job_says_which_provider_cools_down_until_when_and_why() -> None:
    d = desired(job_yaml("b", extra="  placement: {providers: [broken]}"), providers=BROKEN_AND_GOOD)
    p = plan(d, Observed(), {"a": refused_status("a", NOW - 10)}, NOW)
    assert not p.actions
    until = clock(NOW - 10 + REFUSAL_COOLDOWN_SECONDS)
    assert p.statuses["b"].phase == Phase.PENDING
    assert p.statuses["b"].message == f"waiting: broken is cooling down until {until} (refused: {NOT_A_DIRECTORY})"


def test_a_provider_that_lost_two_workers_is_tried_after_one_that_lost_one() -> None:
    d = desired(job_yaml("c"), providers=BROKEN_AND_GOOD)
    recorded = {"x": lost("x", "broken", NOW - 30), "y": lost("y", "broken", NOW - 5),
                "c": lost("c", "good", NOW - 1)}
    recorded["c"].run_id = d.jobs["c"].run_id()
    p = plan(d, Observed(), recorded, NOW)
    assert launches(p) == [("c", "good")]  # broken is cheaper, but its cool-down doubled and ends later
    assert p.health["broken"].lost_until == NOW - 5 + 2 * LOSS_COOLDOWN_SECONDS
    assert p.health["good"].lost_until == NOW - 1 + LOSS_COOLDOWN_SECONDS


def test_a_worker_lost_this_tick_counts_for_jobs_planned_after_it() -> None:
    """The judge closes a vanished worker in this tick: the next job placed sees its provider cooling."""
    d = desired(job_yaml("a"), job_yaml("b"), providers=BROKEN_AND_GOOD)
    a = JobStatus(job="a", run_id=d.jobs["a"].run_id(), phase=Phase.RUNNING, total_attempts=1,
                  attempts=[Attempt(epoch=1, provider="broken", worker="w", started=NOW - 600,
                                    unseen_since=NOW - 120)])
    p = plan(d, Observed(), {"a": a}, NOW)
    assert p.statuses["a"].attempts[0].outcome == Outcome.INTERRUPTION
    assert sorted(launches(p)) == [("a", "good"), ("b", "good")]


def test_cool_downs_double_while_refusals_repeat_up_to_the_cap() -> None:
    times, t = [], NOW
    for _ in range(8):
        times.append(t)
        h = provider_health([refused_status("a", *times)], t)["broken"]
        t = h.refused_until or t  # the next try comes as soon as the cool-down ends
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert gaps[:5] == [REFUSAL_COOLDOWN_SECONDS * 2 ** i for i in range(5)]
    assert max(gaps) == COOLDOWN_MAX_SECONDS


def test_strikes_decay_when_the_trouble_stops() -> None:
    st = refused_status("a", NOW, NOW + 200, NOW + 600)
    assert provider_health([st], NOW + 600)["broken"].strikes == 3
    quiet = NOW + 600 + 4 * REFUSAL_COOLDOWN_SECONDS + 2 * FORGIVE_SECONDS  # two quiet spells after the cool-down
    h = provider_health([st], quiet)["broken"]
    assert h.strikes == 1 and h.state(quiet) == "healthy"
    again = refused_status("a", NOW, NOW + 200, NOW + 600, quiet)
    assert provider_health([again], quiet)["broken"].refused_until == quiet + 2 * REFUSAL_COOLDOWN_SECONDS


def test_refusals_of_one_tick_are_one_strike_and_health_reads_every_job() -> None:
    h = provider_health([refused_status("a", NOW), refused_status("b", NOW)], NOW, ["good"])
    assert h["broken"].strikes == 1 and h["broken"].refusals == 2
    assert h["broken"].refused_until == NOW + REFUSAL_COOLDOWN_SECONDS
    assert h["good"].state(NOW) == "healthy" and h["good"].describe(NOW) == "good is healthy"


def test_plan_lines_name_the_waiting_jobs_and_each_provider_cooling_down_with_its_rate() -> None:
    statuses = [refused_status("a", NOW - 100, NOW - 10), lost("x", "good", NOW - 50)]
    health = provider_health(statuses, NOW, ["broken", "good", "idle"])
    lines = plan_lines(statuses, health, NOW, acting=False)
    assert lines == [
        "no actions now: 2 jobs are waiting (why, below)",
        f"provider broken is cooling down until {clock(NOW - 10 + 2 * REFUSAL_COOLDOWN_SECONDS)} "
        f"(refused: {NOT_A_DIRECTORY}); 2 refusals in the last hour",
        f"provider good is tried last until {clock(NOW - 50 + LOSS_COOLDOWN_SECONDS)} "
        "(lost a worker: worker vanished from the provider); 1 lost worker in the last hour"]
    settled = [JobStatus(job="done", phase=Phase.SUCCEEDED)]
    assert plan_lines(settled, provider_health(settled, NOW, ["idle"]), NOW, acting=False) == [
        "no actions: the world matches the desired state"]
