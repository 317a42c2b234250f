"""Which notification events a tick brought about, decided from the statuses before and after it
(reconciler.daemon.notices, pure): tables of statuses in, events out."""

from __future__ import annotations

import re
from pathlib import Path

from desired.models import Notifications, NotifyTarget
from desired.parse import parse_settings
from reconciler.daemon.notices import events, messages
from status.models import Attempt, Drill, DrillPhase, Forecast, JobStatus, Outcome, Phase, Progress

RULES = Notifications(targets=[NotifyTarget(url_env="HOOK")])


def status(phase: Phase = Phase.RUNNING, *, cost: float = 0.0, risk: str = "", outcomes: tuple[str, ...] = (),
           message: str = "") -> JobStatus:
    attempts = [Attempt(epoch=i + 1, provider="spot", worker=f"w{i}", started=float(i), ended=float(i) + 0.5,
                        outcome=Outcome(o)) for i, o in enumerate(outcomes)]
    return JobStatus(job="train", phase=phase, run_id="r1", message=message, cost_usd=cost,
                     progress=Progress(step=60, target=60), total_attempts=len(attempts), attempts=attempts,
                     forecast=Forecast(risk=risk) if risk else None)


def kinds(old: JobStatus | None, new: JobStatus, budget: float | None = None,
          rules: Notifications = RULES) -> list[str]:
    return [e.kind for e in events({"train": old} if old else {}, {"train": new}, {"train": budget}, rules)]


def test_a_job_that_becomes_succeeded_or_failed_is_one_event() -> None:
    assert kinds(status(), status(Phase.SUCCEEDED)) == ["succeeded"]
    assert kinds(status(), status(Phase.FAILED, message="retry budget spent")) == ["failed"]
    found = events({}, {"train": status(Phase.FAILED, message="retry budget spent")}, {}, RULES)
    assert "retry budget spent" in found[0].text and found[0].title == "reconciler: train failed"


def test_a_status_that_stays_terminal_brings_no_event_again() -> None:
    """A restarted daemon reads the committed status as `before`: the same transition is not found twice."""
    assert kinds(status(Phase.SUCCEEDED), status(Phase.SUCCEEDED)) == []
    assert kinds(status(Phase.FAILED), status(Phase.FAILED)) == []
    assert kinds(status(), status()) == []


def test_deadline_at_risk_fires_when_the_forecast_turns_at_risk_not_while_it_stays() -> None:
    assert kinds(status(risk="on track"), status(risk="at risk")) == ["deadline-at-risk"]
    assert kinds(status(risk="on track"), status(risk="infeasible")) == ["deadline-at-risk"]
    assert kinds(status(risk="at risk"), status(risk="infeasible")) == []
    assert kinds(status(risk="at risk"), status(risk="at risk")) == []
    assert kinds(status(risk="at risk"), status(risk="on track")) == []


def test_budget_nearly_spent_fires_once_when_spending_crosses_the_configured_share() -> None:
    assert kinds(status(cost=7.0), status(cost=8.0), budget=10.0) == ["budget-nearly-spent"]
    assert kinds(status(cost=8.0), status(cost=9.0), budget=10.0) == []  # already past it
    assert kinds(status(cost=5.0), status(cost=7.9), budget=10.0) == []
    assert kinds(status(cost=5.0), status(cost=9.0), budget=None) == []  # no budget, no event
    half = Notifications(targets=RULES.targets, budget_fraction=0.5)
    assert kinds(status(cost=4.0), status(cost=5.0), budget=10.0, rules=half) == ["budget-nearly-spent"]


def test_repeated_preemptions_fire_at_the_configured_streak_and_again_only_after_it_breaks() -> None:
    two = ("interruption", "interruption")
    three = ("job-error", *two, "interruption")
    assert kinds(status(outcomes=two), status(outcomes=(*two, "interruption"))) == ["repeated-preemptions"]
    assert kinds(status(outcomes=(*two, "interruption")), status(outcomes=(*two, "interruption", "interruption"))) == []
    assert kinds(status(outcomes=two), status(outcomes=(*two, "job-error"))) == []
    assert kinds(status(outcomes=("job-error", *two)), status(outcomes=three)) == ["repeated-preemptions"]
    five = Notifications(targets=RULES.targets, preemptions=5)
    assert kinds(status(outcomes=two), status(outcomes=(*two, "interruption")), rules=five) == []
    text = events({}, {"train": status(outcomes=three)}, {}, RULES)[0].text
    assert "3 times in a row" in text and "spot" in text


def test_an_interruption_the_provider_did_not_confirm_is_no_preemption() -> None:
    before = status(outcomes=("interruption", "interruption"))
    after = status(outcomes=("interruption", "interruption", "interruption"))
    after.attempts[-1].unconfirmed = True  # killed by a signal on a machine that is still there
    assert kinds(before, after) == []


def test_each_target_gets_the_events_and_jobs_it_asked_for() -> None:
    rules = Notifications(targets=[NotifyTarget(url_env="ALL"),
                                   NotifyTarget(url_env="FAILURES", events=["failed"]),
                                   NotifyTarget(url_env="OTHER_JOB", jobs=["other"])])
    found = events({}, {"train": status(Phase.FAILED)}, {}, rules)
    assert [m.url_env for m in messages(found, rules)] == ["ALL", "FAILURES"]
    found = events({}, {"train": status(Phase.SUCCEEDED)}, {}, rules)
    assert [m.url_env for m in messages(found, rules)] == ["ALL"]


def test_notification_settings_name_a_variable_and_known_events_or_say_which_field_is_wrong() -> None:
    settings, errors = parse_settings(b"notifications:\n  budget_fraction: 0.9\n  targets:\n"
                                      b"    - url_env: SLACK_WEBHOOK_URL\n      events: [failed, succeeded]\n")
    assert not errors
    assert settings.notifications.targets[0].url_env == "SLACK_WEBHOOK_URL"
    assert settings.notifications.budget_fraction == 0.9 and settings.notifications.preemptions == 3
    _, errors = parse_settings(b"notifications:\n  targets:\n    - url_env: https://hooks.slack.com/x\n")
    assert errors and errors[0].field == "notifications.targets.0.url_env"
    assert "not a valid environment variable name" in errors[0].message
    _, errors = parse_settings(b"notifications:\n  targets:\n    - url_env: HOOK\n      events: [done]\n")
    assert errors and errors[0].field == "notifications.targets.0.events.0"
    _, errors = parse_settings(b"notifications:\n  budget_fraction: 1.5\n")
    assert errors and errors[0].field == "notifications.budget_fraction"


def test_the_docs_notification_settings_are_valid() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "operations" / "notifications.md").read_text()
    block = re.search(r"```\n# reconciler.yaml\n(notifications:.*?)```", text, re.S)
    assert block is not None
    settings, errors = parse_settings(block.group(1).encode())
    assert not errors
    assert [t.url_env for t in settings.notifications.targets] == ["SLACK_WEBHOOK_URL", "ONCALL_WEBHOOK_URL"]


def test_a_drills_verdict_is_one_event_a_success_when_it_passed_a_warning_when_not() -> None:
    armed = status()
    armed.drill = Drill(id="d1", epoch=1)
    exact = armed.model_copy(update={"drill": Drill(id="d1", phase=DrillPhase.DONE, verdict="exact",
                                                    detail="steps 21..25 reported the same metrics")})
    [event] = events({"train": armed}, {"train": exact}, {}, RULES)
    assert (event.kind, event.level) == ("drill", "success")
    assert event.text == "train: drill d1: exact: steps 21..25 reported the same metrics"
    assert kinds(exact, exact) == []  # said once
    diverged = armed.model_copy(update={"drill": Drill(id="d1", phase=DrillPhase.DONE, verdict="diverged",
                                                       detail="first difference at step 21")})
    assert [e.level for e in events({"train": armed}, {"train": diverged}, {}, RULES)] == ["warning"]


def member(name: str, sweep: str | None, phase: Phase = Phase.RUNNING) -> JobStatus:
    return status(phase).model_copy(update={"job": name, "sweep": sweep})


def test_members_of_one_sweep_that_end_alike_in_a_tick_are_one_event_naming_them() -> None:
    names = [f"lr-{i:02d}" for i in range(12)]
    before = {n: member(n, "lr") for n in names} | {"other": member("other", None), "b-0": member("b-0", "b")}
    after = {n: member(n, "lr", Phase.SUCCEEDED) for n in names} | {
        "other": member("other", None, Phase.SUCCEEDED), "b-0": member("b-0", "b", Phase.SUCCEEDED)}
    found = events(before, after, {}, RULES)
    assert [(e.kind, e.jobs or (e.job,)) for e in found] == [
        ("succeeded", ("b-0",)), ("succeeded", tuple(names)), ("succeeded", ("other",))]
    rolled = found[1]
    assert rolled.title == "reconciler: sweep lr: 12 members succeeded" and rolled.level == "success"
    assert rolled.text.startswith("lr-00 succeeded at step 60") and rolled.text.endswith("; and 2 more")
    assert "lr-09 succeeded" in rolled.text and "lr-10 succeeded" not in rolled.text
    one = Notifications(targets=[NotifyTarget(url_env="HOOK", jobs=["lr-11"])])
    [alone] = messages(found, one)  # a target for one member hears of that member alone
    assert (alone.title, alone.level) == ("reconciler: lr-11 succeeded", "success")
    assert alone.body.startswith("lr-11 succeeded at step 60") and "lr-00" not in alone.body
    some = Notifications(targets=[NotifyTarget(url_env="HOOK", jobs=["lr-03", "lr-11", "other"])])
    assert [(m.title, m.body.count("succeeded at step")) for m in messages(found, some)] == [
        ("reconciler: sweep lr: 2 members succeeded", 2), ("reconciler: other succeeded", 1)]
    assert "lr-00" not in messages(found, some)[0].body
    every = Notifications(targets=[NotifyTarget(url_env="HOOK")])
    assert [m.title for m in messages(found, every)][1] == rolled.title


def test_a_target_that_names_a_sweep_hears_of_its_members_rolled_up_or_alone() -> None:
    names = [f"lr-{i}" for i in range(3)]
    before = {n: member(n, "lr") for n in names} | {"other": member("other", None)}
    after = {n: member(n, "lr", Phase.SUCCEEDED) for n in names[:2]} | {
        "lr-2": member("lr-2", "lr", Phase.FAILED), "other": member("other", None, Phase.SUCCEEDED)}
    sweep = Notifications(targets=[NotifyTarget(url_env="HOOK", jobs=["lr"])])
    assert [m.title for m in messages(events(before, after, {}, RULES), sweep)] == [
        "reconciler: sweep lr: 2 members succeeded", "reconciler: lr-2 failed"]


def test_a_sweep_member_alone_in_its_kind_this_tick_is_its_own_event() -> None:
    before = {"lr-0": member("lr-0", "lr"), "lr-1": member("lr-1", "lr")}
    after = {"lr-0": member("lr-0", "lr", Phase.SUCCEEDED),
             "lr-1": member("lr-1", "lr", Phase.FAILED).model_copy(update={"message": "retry budget spent"})}
    found = events(before, after, {}, RULES)
    assert [e.title for e in found] == ["reconciler: lr-0 succeeded", "reconciler: lr-1 failed"]
