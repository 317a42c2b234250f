"""bench/deadline.py's core: the offline optimum on traces whose answer can be worked out by hand,
and one tiny simulated case per policy."""

from __future__ import annotations

import math
import os
import sys

import pytest

if os.environ.get("CI") != "true":  # in CI numpy (the torch extra) must be there: a missing one fails
    pytest.importorskip("numpy")  # the optimum's dynamic programming

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import deadline as bench  # noqa: E402

from adapters.sim import PreemptionTrace  # noqa: E402
from reconciler.planner.outlook import lookahead as la  # noqa: E402
from reconciler.planner.outlook.deadline import Option, Situation  # noqa: E402

HOUR = 3600.0
MIN = 60.0  # the optimum's step: costs below count steps of a minute


def minutes(cost_per_hour: float, n: int) -> float:
    return cost_per_hour * n / 60.0


def test_spot_always_there_costs_the_work_and_one_changeover_at_the_spot_price() -> None:
    pools = [bench.Pool(1.0, [True] * 200), bench.Pool(3.0, [True] * 200)]
    cost = bench.optimum_cost(pools, deadline=2 * HOUR, work=HOUR, changeover=3 * MIN)
    assert cost == pytest.approx(minutes(1.0, 60 + 3))


def test_spot_never_there_costs_on_demand() -> None:
    pools = [bench.Pool(1.0, [False] * 200), bench.Pool(3.0, [True] * 200)]
    cost = bench.optimum_cost(pools, deadline=2 * HOUR, work=HOUR, changeover=3 * MIN)
    assert cost == pytest.approx(minutes(3.0, 60 + 3))


def test_the_optimum_waits_for_spot_when_the_deadline_allows_and_mixes_when_it_does_not() -> None:
    late_spot = [i >= 60 for i in range(200)]  # spot from the 60th minute on
    pools = [bench.Pool(1.0, late_spot), bench.Pool(3.0, [True] * 200)]
    assert bench.optimum_cost(pools, deadline=3 * HOUR, work=HOUR, changeover=3 * MIN) == pytest.approx(
        minutes(1.0, 63))
    # By 90 minutes: spot gives at most 27 minutes of work (60..90, after its changeover), so
    # on-demand must do the other 33, with its own changeover.
    assert bench.optimum_cost(pools, deadline=1.5 * HOUR, work=HOUR, changeover=3 * MIN) == pytest.approx(
        minutes(3.0, 33 + 3) + minutes(1.0, 27 + 3))


def test_a_free_quota_is_spent_first_changeover_included() -> None:
    pools = [bench.Pool(1.0, [False] * 200), bench.Pool(3.0, [True] * 200), bench.Pool(0.0, [True] * 200, 30 * MIN)]
    cost = bench.optimum_cost(pools, deadline=2 * HOUR, work=HOUR, changeover=3 * MIN)
    assert cost == pytest.approx(minutes(3.0, 33 + 3))  # free: 3 changeover + 27 work


def test_no_schedule_finishes_in_time() -> None:
    pools = [bench.Pool(1.0, [True] * 200), bench.Pool(3.0, [True] * 200)]
    assert math.isinf(bench.optimum_cost(pools, deadline=HOUR, work=HOUR, changeover=3 * MIN))


def test_a_trace_is_read_as_minutes_of_availability() -> None:
    trace = PreemptionTrace(300.0, (1, 0, 2))
    assert bench.availability(trace, 16) == [True] * 5 + [False] * 5 + [True] * 5 + [True]
    synthetic = bench.synthetic_trace(3, 10 * HOUR)
    assert len(synthetic.data) == 120 and set(synthetic.data) <= {0, 1}
    assert synthetic == bench.synthetic_trace(3, 10 * HOUR)


def test_every_policy_runs_through_the_real_tick_and_the_baselines_meet_a_loose_deadline() -> None:
    # Spot for the first 40 minutes, then gone for an hour, then back: one preemption at least.
    trace = PreemptionTrace(300.0, (1,) * 8 + (0,) * 12 + (1,) * 40)
    case = bench.Case(hours=1.0, ratio=3.0, trace=trace, seed=1)
    results = {name: bench.simulate((name, case)) for name in bench.REPORTED}
    for name, r in results.items():
        assert r["violations"] == 0 and r["tick_exceptions"] == 0 and r["settled"], (name, r)
        assert r["cost"] >= 0
    for name in ("greedy", "uniform-progress", "on-demand", "lookahead", "ours-lookahead"):
        assert results[name]["met"], (name, results[name]["message"])
    # The simulation bills what the optimum's model counts: on-demand alone costs one changeover
    # and the work, checkpoints included, at the on-demand price.
    work = bench.Known().work_seconds(case.target_steps)
    assert results["on-demand"]["cost"] == pytest.approx((work + bench.CHANGEOVER) / HOUR * bench.ON_DEMAND_PRICE,
                                                         rel=0.01)
    assert results["greedy"]["cost"] < results["on-demand"]["cost"]
    best = bench.optimum(case)
    assert best["met"] and best["cost"] <= min(r["cost"] for r in results.values() if r["met"]) + 1e-9


def test_a_spot_traces_file_is_read_with_its_gap_under_metadata(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "zone.json"
    path.write_text('{"metadata": {"gap_seconds": 195}, "data": [0, 1, 2]}')
    assert bench.load_trace(str(path)) == PreemptionTrace(195.0, (0, 1, 2))


def test_the_breakdown_says_where_the_money_went_trace_by_trace() -> None:
    trace = PreemptionTrace(300.0, (1,) * 60)  # spot all along: one attempt, no loss
    case = bench.Case(hours=0.5, ratio=3.0, trace=trace, seed=1)
    greedy = bench.simulate(("greedy", case))
    assert greedy["od_h"] == 0 and greedy["attempts"] == 1 and greedy["preempted"] == 0 and greedy["lost_h"] == 0
    assert greedy["cost"] == pytest.approx(greedy["spot_h"] * bench.SPOT_PRICE)
    lines = bench.breakdown_lines([greedy, bench.optimum(case)], [3.0])
    assert lines[2].startswith("| 3 W | 1 | greedy |") and lines[3].startswith("| 3 W | 1 | optimum |")


def _situation(now: float, done: int, current: str | None, spot_there: bool) -> Situation:
    """One job of 1 h of steps due 3 h after the benchmark's start, on the benchmark's two pools."""
    options = tuple(Option(name, price, name == "spot", False, there, 1.0, True, 3 * HOUR, bench.CHANGEOVER)
                    for name, price, there in (("spot", 1.0, spot_there), ("ondemand", 3.0, True)))
    return Situation(job="job", now=bench.START + now, deadline=bench.START + 3 * HOUR, budget_left=None,
                     done_steps=done, target_steps=3600, window_start=bench.START + now, current=current,
                     options=options)


def test_uniform_progress_draws_its_line_from_the_submission_and_stops_on_demand_once_ahead() -> None:
    """As the paper's simulator (skypilot-org/can-be-late, sky_spot/strategies) writes it: ep(t)
    starts when the job is submitted, not at its first launch, and a run ahead of the line with no
    spot is idle, its on-demand machine stopped."""
    up = bench.UniformProgress(bench.Known())
    # Nothing launched yet, 30 min in, spot gone: behind the line from the start, so on-demand
    # (the line from the first launch would read 0 expected and wait).
    behind = up(_situation(30 * MIN, 0, None, spot_there=False))
    assert behind.provider == "ondemand"
    # On on-demand and ahead of ep(t + 2d), spot still gone: stop it and wait.
    ahead = up(_situation(HOUR, 2400, "ondemand", spot_there=False))
    assert ahead.provider is None and ahead.leave
    # On on-demand but behind ep(t + 2d): stay (the hysteresis).
    assert up(_situation(HOUR, 1200, "ondemand", spot_there=True)).provider == "ondemand"


def test_a_traces_mean_periods_are_its_runs_of_availability() -> None:
    trace = PreemptionTrace(300.0, (1, 1, 0, 1, 1, 1, 1, 0, 0, 0))
    assert bench.periods(trace) == (3 * 300.0, 2 * 300.0)  # available 2 then 4 ticks; gone 1 then 3
    assert bench.periods(PreemptionTrace(60.0, (1, 1))) == (120.0, 60.0)  # never gone: one tick stands in


def test_with_watched_days_the_daemon_has_watched_spot_before_a_replayed_traces_start() -> None:
    trace = PreemptionTrace(600.0, tuple([1, 0] * 504 + [1] * 1008))  # 1 h flicker for a week, then steady
    week = bench.history(trace, 7 * 24 * HOUR)
    assert week.data == trace.data[-1008:]  # the week before the start: the trace wraps around
    assert len(bench.history(bench.rotated(trace, 3), 7 * 24 * HOUR).data) == 1008
    sim = bench.Simulation(bench.SimConfig(providers=bench.providers(bench.Case(1.0, 2.0, trace)), jobs=[],
                                           tick_seconds=bench.TICK))
    try:
        bench.watched(sim, PreemptionTrace(600.0, tuple([1, 1, 0] * 336)))  # room 20 min in every 30
        watch = sim.reconciler.room
        assert watch.last["spot"][0] < bench.START  # all of it before the first tick
        assert 200 < watch.periods["spot"] < 336  # 336 periods of 20 minutes, the oldest weighing half
        assert watch.short_share("spot") > 0.5  # all of them short
    finally:
        sim.close()


def test_the_lookahead_takes_spot_that_lasts_and_on_demand_when_the_deadline_is_near() -> None:
    model = la.Model(step_seconds=300.0, spot_price=1.0, fallback_price=3.0, changeover_spot=180.0,
                     changeover_fallback=180.0, up_seconds=6 * HOUR, down_seconds=HOUR, unsaved_seconds=300.0)
    loose, _ = la.choose(model, 6 * HOUR, 2 * HOUR, 2 * HOUR, la.NOWHERE, room=True)
    assert loose == la.RUN_SPOT
    waits, costs = la.choose(model, 6 * HOUR, 2 * HOUR, 2 * HOUR, la.NOWHERE, room=False)
    assert waits == la.WAIT and costs[la.WAIT] < costs[la.RUN_FALLBACK]  # 4 h of slack: spot will come back
    tight, _ = la.choose(model, 2 * HOUR + 10 * MIN, 2 * HOUR, 2 * HOUR, la.NOWHERE, room=False)
    assert tight == la.RUN_FALLBACK
    # On spot, a stop loses the work since the checkpoint: with spot there, it stays.
    stays, _ = la.choose(model, 6 * HOUR, 2 * HOUR - 250.0, 2 * HOUR, la.SPOT, room=True)
    assert stays == la.RUN_SPOT


def test_the_lookahead_does_not_launch_on_spot_when_the_safety_net_would_take_it_off_again() -> None:
    """The full bench's eleventh synthetic trace at 1.1 W: with 9 minutes of slack the lookahead
    took spot (rule 2's net is two changeovers, 6 minutes), a tick later 4 were left, the net moved
    the run to on-demand, and it finished 30 s late. The lookahead now plans with the net."""
    hours = 24.0
    trace = bench.synthetic_trace(11, max(bench.DEADLINES) * hours * 3600.0 + 40 * bench.TICK)
    result = bench.simulate(("ours-lookahead", bench.Case(hours, 1.1, trace, False, 11)))
    assert result["met"] and result["violations"] == 0
