"""`deadline_policy: lookahead` (reconciler.planner.outlook.deadline with Situation.lookahead, over
reconciler.planner.outlook.lookahead), and how long spot stays without room as the daemon learns it
(reconciler.planner.outlook.reliability.RoomWatch). Situations worked out by hand, then the daemon's
own loop in simulated time."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np

from desired.parse import parse_settings
from reconciler.checkpoint_policy import estimate_mtbf
from reconciler.planner.outlook.deadline import Option, Situation, choose
from reconciler.planner.outlook.lookahead import Model, _most_done, _solve
from reconciler.planner.outlook.reliability import (
    PRIOR_ROOM_WAIT_SECONDS,
    PRIOR_SHORT_SHARE,
    RoomShape,
    RoomWatch,
    expected_mean,
    weight,
)

HOUR = 3600.0


def situation(left_h: float, work_h: float, current: str | None = None, spot_there: bool = True,
              unsaved: float = 0.0) -> Situation:
    """A job of `work_h` hours of steps left (one step a second) and `left_h` hours to its deadline,
    a 300 s tick, spot ($1/h, a 6 h MTBF, room back within an hour) and on-demand ($3/h)."""
    spot = Option("spot", 1.0, True, False, spot_there, 1.0, True, 6 * HOUR, 180.0, room_wait_seconds=HOUR)
    ondemand = Option("ondemand", 3.0, False, False, True, 1.0, True, 30 * 24 * HOUR, 180.0)
    return Situation(job="train", now=0.0, deadline=left_h * HOUR, budget_left=None, done_steps=0,
                     target_steps=int(work_h * HOUR), window_start=0.0, current=current,
                     options=(spot, ondemand), checkpoint_seconds=600.0, unsaved_seconds=unsaved,
                     tick_seconds=300.0, lookahead=True)


def test_with_slack_it_takes_spot_and_waits_for_it_when_it_is_gone() -> None:
    on = choose(situation(6, 2))
    assert on.provider == "spot" and "expected cost to finish: on spot $" in on.reason
    gone = choose(situation(6, 2, spot_there=False))
    assert gone.provider is None and gone.headline == "waiting for cheaper capacity" and not gone.leave


def test_with_the_deadline_near_it_runs_on_demand() -> None:
    choice = choose(situation(2 + 10 / 60, 2, spot_there=False))
    assert choice.provider == "ondemand"


def test_a_live_spot_attempt_stays_and_one_on_demand_leaves_when_spot_has_room_and_time_allows() -> None:
    assert choose(situation(6, 2, current="spot", unsaved=250.0)).provider == "spot"
    moving = choose(situation(6, 2, current="ondemand"))
    assert moving.provider == "spot" and moving.headline == "moving to spot"
    # With half an hour of slack and spot gone, on-demand keeps the run (a wait in vain would make it late).
    assert choose(situation(2.5, 2, current="ondemand", spot_there=False)).provider == "ondemand"


def test_a_run_takes_spot_only_where_the_worst_interruption_there_would_leave_it_above_the_net() -> None:
    """The lookahead prices an interruption's average loss (half a checkpoint interval). With 25
    minutes of slack on on-demand it would move to spot: the move costs a tick and a changeover each
    way (11 minutes), and an interruption just before a save 15 more (600 s of work, a 300 s tick),
    which leaves less than the net's 6 minutes. With 35 minutes it moves."""
    assert choose(situation(2 + 25 / 60, 2, current="ondemand")).provider == "ondemand"
    assert choose(situation(2 + 35 / 60, 2, current="ondemand")).provider == "spot"
    # From nowhere the way in is the launch's changeover: 22 minutes of slack (the way to on-demand
    # counted) are too few, 27 enough.
    assert choose(situation(2 + 25 / 60, 2)).provider == "ondemand"
    assert choose(situation(2 + 30 / 60, 2)).provider == "spot"


def test_one_early_interruption_does_not_read_as_spots_steady_rate_to_the_lookahead() -> None:
    """An interruption 30 minutes into spot's 6 h prior: the MTBF the status shows (capped: 0.9 h)
    would keep a run on on-demand for the rest of its 4 h of work; the lookahead plans with the
    posterior mean (2.3 h) and leaves on-demand to wait for spot, with 2 h of slack."""
    capped, expected = estimate_mtbf(1800.0, 1, 6 * HOUR), expected_mean(1800.0, 1, 6 * HOUR)
    assert round(capped / HOUR, 2) == 0.92 and round(expected / HOUR, 2) == 2.33
    s = situation(6, 4, current="ondemand", spot_there=False)
    spot, ondemand = s.options
    told = replace(s, options=(replace(spot, mtbf_seconds=capped, mtbf_expected_seconds=expected), ondemand))
    assert choose(told).leave and choose(told).headline == "leaving ondemand to wait for cheaper capacity"
    assert choose(replace(told, options=(replace(spot, mtbf_seconds=capped), ondemand))).provider == "ondemand"


def test_rules_stay_the_default_and_the_lookahead_leaves_a_run_saving_its_last_steps_alone() -> None:
    rules = choose(replace(situation(6, 2), lookahead=False))
    assert "expected cost to finish" not in rules.reason
    done = replace(situation(1, 2, current="spot"), done_steps=int(2 * HOUR))
    assert choose(done).provider == "spot"


def test_the_setting_reads_rules_or_lookahead_and_nothing_else() -> None:
    assert parse_settings("deadline_policy: lookahead\n")[0].deadline_policy == "lookahead"
    assert parse_settings("")[0].deadline_policy == "rules"
    settings, errors = parse_settings("deadline_policy: fastest\n")
    assert settings.deadline_policy == "rules"
    assert [(e.field, e.message) for e in errors] == [("deadline_policy", "Input should be 'rules' or 'lookahead'")]


def test_room_watch_learns_how_long_room_stays_away() -> None:
    watch = RoomWatch()
    assert watch.mean_wait("spot") == PRIOR_ROOM_WAIT_SECONDS  # nothing seen: the prior
    t = 0.0
    for _ in range(4):  # four spells of 2 h without room, each followed by room
        watch.see("spot", t, room=False)
        watch.see("spot", t + 2 * HOUR, room=True)
        t += 3 * HOUR
    # Four returns over 8 h without room, weighed by age, the 1 h prior weighing half a wait.
    assert 1.5 * HOUR < watch.mean_wait("spot") < 2.2 * HOUR
    # Time with room counts for nothing; a spell still under way counts as waiting.
    watch.see("spot", t, room=False)
    watch.see("spot", t + 5 * HOUR, room=False)
    assert watch.mean_wait("spot") > 2.2 * HOUR
    assert watch.waits() == {"spot": watch.mean_wait("spot")}


def test_a_move_onto_room_just_back_waits_where_room_that_comes_back_often_goes_again() -> None:
    """Seen in bench/deadline.py (us-west-2a, 2022, 1.5 W): spot came back after three hours, the
    run left on-demand for it with under an hour of slack, and it was gone a tick later. On the AWS
    traces a quarter to a half of the room periods are short; the lookahead weighs that by how long
    room has been back."""
    def choice(shape: RoomShape) -> str | None:
        s = situation(5 + 40 / 60, 5, current="ondemand")  # 40 minutes of slack, on on-demand
        return choose(replace(s, options=(replace(s.options[0], room_shape=shape), s.options[1]))).provider

    assert choice(RoomShape(short_share=0.3, age_seconds=0.0)) == "ondemand"  # just back: it stays
    assert choice(RoomShape(short_share=0.3, age_seconds=1800.0)) == "spot"  # back for half an hour: it moves
    assert choice(RoomShape(short_share=0.0, age_seconds=0.0)) == "spot"  # memoryless room: it moves at once


def test_room_watch_learns_how_often_room_goes_again_soon_after_it_came_back() -> None:
    def watched(pattern: list[int]) -> RoomWatch:
        """Spot's room at each 300 s tick, the pattern over and over for a week."""
        watch, t = RoomWatch(), 0.0
        while t < 7 * 24 * HOUR:
            for room in pattern:
                watch.see("spot", t, bool(room))
                t += 300.0
        return watch

    # Every other room period lasts one tick, the rest 4 h: far more short ones than 2 h memoryless periods.
    flaky = watched([1] + [0] * 12 + [1] * 48 + [0] * 12)
    assert 0.35 < flaky.short_share("spot") < 0.6
    # Periods of 3 h every time: no more short ones than memoryless periods would have (none).
    steady = watched([1] * 36 + [0] * 12)
    assert steady.short_share("spot") == 0.0
    # Nothing seen: the share borrowed from the public AWS traces; a few periods seen move it their way.
    assert RoomWatch().short_share("spot") == PRIOR_SHORT_SHARE
    few = RoomWatch()
    for i, room in enumerate(([0] * 12 + [1] * 36) * 3):  # three 3-hour periods, two of them seen whole
        few.see("spot", i * 300.0, bool(room))
    assert 0.0 < few.short_share("spot") < PRIOR_SHORT_SHARE
    # How long room has been back: from the look that first saw it; unknown if it was there at the first look.
    watch = RoomWatch()
    watch.see("spot", 0.0, room=True)
    watch.see("spot", 600.0, room=True)
    assert watch.shapes()["spot"].age_seconds is None
    watch.see("spot", 900.0, room=False)
    watch.see("spot", 1200.0, room=True)
    watch.see("spot", 1800.0, room=True)
    assert watch.shapes()["spot"] == RoomShape(short_share=PRIOR_SHORT_SHARE, age_seconds=600.0)
    assert watch.periods.get("spot") is None  # the first period began before the first look: not counted
    watch.see("spot", 1000.0, room=False)  # the clock went back: room gone since 1000 s, no period counted
    watch.see("spot", 2400.0, room=True)
    assert watch.periods.get("spot") is None and watch.shapes()["spot"].age_seconds == 0.0


def test_room_watch_forgets_with_the_mtbf_half_life() -> None:
    watch = RoomWatch()
    watch.see("spot", 0.0, room=False)
    watch.see("spot", HOUR, room=True)
    fresh = watch.exposure["spot"]
    watch.see("spot", 7 * HOUR, room=True)
    assert watch.exposure["spot"] == fresh * weight(6 * HOUR)  # half after 6 h


def test_the_daemon_learns_spots_wait_for_room_from_its_free_slots() -> None:
    """The simulated spot pool has no room for the first hour: the daemon's watch sees it tick by tick."""
    from adapters.sim import PreemptionTrace, ProviderModel
    from reconciler.sim.driver import START, JobPlan, ProviderPlan, SimConfig, Simulation

    trace = PreemptionTrace(300.0, (0,) * 12 + (1,) * 60)
    spot = ProviderModel("spot", launch_delay_seconds=60.0, price_per_hour=1.0, trace=trace)
    config = SimConfig(providers=[ProviderPlan(spot, concurrency=1, interruptible=True)],
                       jobs=[JobPlan("job", target_steps=100_000)], tick_seconds=300.0)
    sim = Simulation(config)
    try:
        for _ in range(16):
            sim.step()
        watch = sim.reconciler.room
        assert watch.returns["spot"] > 0.9  # room came back once
        assert 0.75 * HOUR < watch.exposure["spot"] < HOUR  # up to an hour without room, weighed by age
        age = watch.shapes()["spot"].age_seconds  # room back since the first tick at or after the hour
        assert age is not None and watch.last["spot"][0] - age == START + HOUR
    finally:
        sim.close()


def test_a_first_heartbeat_before_the_restore_is_not_read_as_progress() -> None:
    """Seen in bench/deadline.py (us-east-1c, 1.5 W, ours-lookahead): a spot attempt from a checkpoint
    at step 6000, interrupted within a tick, whose only heartbeat said step 0. Counted from 0, its
    6000 steps in a second made the job's measured rate jump and its slack read hours too long."""
    from reconciler.planner.outlook.forecast import attempt_rate, job_tracks
    from status.models import Attempt, JobStatus, Outcome

    steady = Attempt(epoch=1, provider="spot", worker="w1", started=0.0, ended=6000.0 + 100.0,
                     outcome=Outcome.INTERRUPTION, step_start=0, step_end=6000, first_beat=100.0, first_beat_step=0)
    early = Attempt(epoch=2, provider="spot", worker="w2", started=6200.0, ended=6360.0, outcome=Outcome.INTERRUPTION,
                    step_start=6000, step_end=6000, first_beat=6360.0, first_beat_step=0)
    st = JobStatus(job="train", run_id="r1", attempts=[steady, early])
    track = job_tracks(st, 6000, 6400.0)["spot"]
    assert track.steps == 6000 and track.rate is not None and track.rate < 1.01  # one step a second, not 2
    assert attempt_rate(early) is None


def test_the_lookahead_table_skips_only_work_levels_the_run_cannot_reach() -> None:
    """_solve leaves out the work levels below where the run is that no step reaches: what it
    returns is the full table's, to the bit, at every level the caller reads."""
    rng = random.Random(7)
    for _ in range(40):
        m = Model(step_seconds=rng.choice([30.0, 300.0, 450.0]), spot_price=rng.uniform(0.2, 2.0),
                  fallback_price=rng.uniform(2.0, 4.0), changeover_spot=rng.uniform(30.0, 400.0),
                  changeover_fallback=rng.uniform(30.0, 400.0), up_seconds=rng.uniform(600.0, 30_000.0),
                  down_seconds=rng.uniform(60.0, 20_000.0), unsaved_seconds=rng.uniform(0.0, 900.0),
                  fallback_speed=rng.choice([1.0, 0.5, 1.7]), reserve_seconds=rng.uniform(0.0, 900.0),
                  short_share=rng.choice([0.0, 0.4]), short_seconds=rng.uniform(100.0, 900.0))
        units, steps = rng.randint(2, 400), rng.randint(1, 120)
        least, beyond = rng.randint(0, units), rng.uniform(0.0, m.step_seconds)
        whole = _solve(m, steps, units, beyond, least=0)
        part = _solve(m, steps, units, beyond, least=least)
        lowest = max(0, least - _most_done(m))
        assert np.array_equal(whole[..., lowest:], part[..., lowest:])
