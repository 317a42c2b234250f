"""reconciler.planner.outlook.deadline.choose on situations worked out by hand (no planner)."""

from __future__ import annotations

from dataclasses import replace

from reconciler.planner.outlook.deadline import Option, Situation, choose, stay_gain

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


def test_a_move_off_on_demand_counts_the_tick_it_takes_and_the_work_the_stop_may_lose() -> None:
    """Seen in bench/deadline.py (us-west-2b, 2023, 1.5 W, under the rules): on on-demand, the run
    moved to spot on 11 minutes of slack once it had left (two changeovers taken off), which
    covered the expected 3 minutes of losses there. But the move also took a tick, and the stop
    lost the work since the last checkpoint: the run went back to on-demand a tick later, and
    finished late. Now 11 minutes of slack so counted keeps it on on-demand; 27 do not."""
    spot, ondemand = options(spot_available=True)

    def where(slack_minutes: float) -> str | None:
        left = HOUR + slack_minutes * 60 + 180  # an hour of work on on-demand, its way back in included
        s = Situation(job="train", now=0.0, deadline=left, budget_left=None, done_steps=int(9 * HOUR),
                      target_steps=int(10 * HOUR), window_start=-10 * HOUR, current="ondemand",
                      options=(replace(spot, mtbf_seconds=30 * 24 * HOUR), ondemand), checkpoint_seconds=600.0,
                      unsaved_seconds=300.0, tick_seconds=300.0)
        return choose(s).provider

    assert where(11 + 6) == "ondemand"  # 11 minutes once it has left, as the bench's run had
    assert where(27 + 6) == "spot"


def test_a_wait_is_judged_on_the_slack_a_tick_later() -> None:
    """Seen in bench/deadline.py (us-west-2a, 2022, 2 W, under the rules): spot was taken away as
    the run made its last save, so all that was left was a launch to record its completion. It
    waited for spot with 7 minutes of slack, above the net of two changeovers (6 minutes); a tick
    later 2 minutes were left, too few to launch anywhere, and the deadline passed."""
    spot, ondemand = options(spot_available=False)
    s = Situation(job="train", now=0.0, deadline=600.0, budget_left=None, done_steps=int(10 * HOUR),
                  target_steps=int(10 * HOUR), window_start=-20 * HOUR, current=None, options=(spot, ondemand),
                  checkpoint_seconds=600.0, tick_seconds=300.0)
    assert choose(s).provider == "ondemand"
    assert choose(replace(s, deadline=600.0 + 300.0)).provider is None  # a tick more: it can wait


def spot_lasting(mtbf_h: float, checkpoint_h: float | None, seen: float = 20.0) -> Situation:
    """On demand at 4 h with 3 h done (9 h of slack, well ahead), spot available, lasting `mtbf_h`
    on average over `seen` interruptions, the job checkpointing every `checkpoint_h` hours of work."""
    spot = Option("spot", 1.0, True, False, True, 1.0, True, mtbf_h * HOUR, 180.0, mtbf_shape=seen)
    ondemand = Option("ondemand", 3.0, False, False, True, 1.0, True, 30 * 24 * HOUR, 180.0)
    return Situation(job="train", now=4 * HOUR, deadline=20 * HOUR, budget_left=None, done_steps=int(3 * HOUR),
                     target_steps=int(10 * HOUR), window_start=0.0, current="ondemand", options=(spot, ondemand),
                     checkpoint_seconds=None if checkpoint_h is None else checkpoint_h * HOUR)


def test_a_move_to_spot_that_would_lose_its_work_before_the_next_checkpoint_is_not_made() -> None:
    # Spot has lasted 1 h on average over 20 interruptions and the job saves every 2 h: most stays
    # end before a checkpoint, so the work there is lost and the trip costs two changeovers. It
    # stays on on-demand, and does not stop there to wait for such spot either.
    far_apart = choose(spot_lasting(1, 2))
    assert far_apart.provider == "ondemand" and not far_apart.leave
    spot, ondemand = spot_lasting(1, 2).options
    gone = replace(spot_lasting(1, 2), options=(replace(spot, available=False), ondemand))
    assert not choose(gone).leave
    assert choose(replace(gone, checkpoint_seconds=HOUR / 6)).leave  # with checkpoints every 10 min it waits


def test_the_same_spot_with_frequent_checkpoints_is_worth_the_move() -> None:
    assert choose(spot_lasting(1, 1 / 6)).provider == "spot"  # every 10 min: most of an hour's work is kept
    assert choose(spot_lasting(6, 2)).provider == "spot"  # spot outlasts the checkpoint interval


def test_one_early_interruption_does_not_rule_spot_out() -> None:
    # Preempted once after 10 minutes, spot's MTBF reads 10 minutes, but on one interruption: it
    # may well last hours next time, and a move is still expected to pay. Twenty such say it will not.
    assert choose(spot_lasting(1 / 6, None, seen=1.0)).provider == "spot"
    assert choose(spot_lasting(1 / 6, None, seen=20.0)).provider == "ondemand"


def test_a_stay_gain_counts_the_work_lost_and_both_ends_of_the_trip() -> None:
    short = spot_lasting(10 / 60, None)  # spot lasting 10 minutes: the changeovers eat what it saves
    spot, ondemand = short.options
    assert stay_gain(short, spot, ondemand) < 0
    long = spot_lasting(6, 1 / 6)
    assert stay_gain(long, *long.options) > stay_gain(spot_lasting(6, 2), *long.options) > 0


def test_a_run_ahead_on_demand_stops_to_wait_only_just_after_a_checkpoint() -> None:
    # Well ahead, nothing cheap can start: it stops on-demand to wait, but a stop may lose the
    # work since the last checkpoint, so it waits for a tick where little of it is at risk.
    ahead = replace(situation(4, 3, current="ondemand"), checkpoint_seconds=600.0)
    assert choose(replace(ahead, unsaved_seconds=100.0)).leave
    late = choose(replace(ahead, unsaved_seconds=500.0))
    assert late.provider == "ondemand" and not late.leave


def test_an_infeasible_verdict_names_the_rate_it_rests_on() -> None:
    # 10 h of work, 2 h left: infeasible. The rates are borrowed on every provider (none has a record
    # of its own): measured across providers, or stated in the manifest, as the situation says.
    borrowed = tuple(replace(o, rate_measured=False) for o in options(spot_available=True))
    late = replace(situation(18, 0), options=borrowed)
    assert "at the measured rate" in choose(late).reason
    stated = choose(replace(late, rate_stated=True))
    assert stated.risk == "infeasible" and "at the manifest's step_seconds" in stated.reason
