"""reconciler.planner.outlook.deadline.choose on situations worked out by hand (no planner)."""

from __future__ import annotations

from reconciler.planner.outlook.deadline import Option, Situation, choose

HOUR = 3600.0


def options(spot_available: bool) -> tuple[Option, ...]:
    spot = Option("spot", 1.0, True, False, spot_available, 1.0, True, 6 * HOUR, 180.0)
    ondemand = Option("ondemand", 3.0, False, False, True, 1.0, True, 30 * 24 * HOUR, 180.0)
    return spot, ondemand


def situation(now_h: float, done_h: float, current: str | None = None) -> Situation:
    """A job of 10 h of work, 20 h to its deadline from its first launch (slack ratio 1)."""
    return Situation(job="train", now=now_h * HOUR, deadline=20 * HOUR, budget_left=None,
                     done_steps=int(done_h * HOUR), target_steps=int(10 * HOUR), window_start=0.0,
                     current=current, options=options(spot_available=False))


def test_behind_uniform_progress_but_with_slack_above_what_is_kept_it_waits_for_spot() -> None:
    # At 8 h with 2 h done, Uniform Progress's line says 4 h: behind, on-demand. The slack is
    # 12 - 8 = 4 h, above the 0.4 x 8 h = 3.2 h kept for the rest: wait.
    choice = choose(situation(8, 2))
    assert choice.provider is None and choice.headline == "waiting for cheaper capacity"


def test_with_slack_below_what_is_kept_it_runs_on_demand() -> None:
    choice = choose(situation(9, 2))  # 3 h of slack, 3.2 h kept
    assert choice.provider == "ondemand"


def test_on_demand_well_above_what_is_kept_stops_to_wait_and_not_before_the_first_hour() -> None:
    leave = choose(situation(4, 3, current="ondemand"))  # 9 h of slack, 2.8 h kept
    assert leave.provider is None and leave.leave
    early = choose(situation(0.5, 0.4, current="ondemand"))  # far ahead, but its rate is minutes old
    assert early.provider == "ondemand" and not early.leave
