"""The futures of a run (reconciler.planner.outlook.futures) and the inputs they are fed from a
status (reconciler.planner.outlook.spread)."""

from __future__ import annotations

import pytest
import yaml

from desired.models import Job, Provider
from reconciler.planner.outlook.futures import Evidence, Lane, Run, seed_of, spread
from reconciler.planner.outlook.spread import BORROWED, DECLARED, MEASURED, job_spread
from status.models import Attempt, JobStatus, Outcome, Phase, Progress

H = 3600.0
NEVER = Evidence(0.0, 0.0, 30 * 24 * H * 1e6)  # a provider that (practically) never interrupts
NO_WAIT = Evidence(0.0, 0.0, 1e-3)


def spot(events: float = 10.0, mtbf: float = 3 * H, wait: float = 2 * H, **kw: object) -> Lane:
    return Lane("spot", 1.0, 1.0, Evidence(events, events * mtbf, 6 * H), Evidence(events, events * wait, 600.0),
                180.0, 600.0, **kw)  # type: ignore[arg-type]


def ondemand() -> Lane:
    return Lane("ondemand", 3.0, 1.0, NEVER, NO_WAIT, 180.0, 600.0)


def test_the_same_seed_gives_the_same_figures_and_another_seed_others() -> None:
    run = Run(int(8 * H), deadline_in_seconds=12 * H)
    assert spread(run, spot(), seed=seed_of("r1")) == spread(run, spot(), seed=seed_of("r1"))
    assert spread(run, spot(), seed=seed_of("r1")) != spread(run, spot(), seed=seed_of("r2"))


def test_a_provider_that_never_interrupts_finishes_after_one_changeover_at_its_price() -> None:
    s = spread(Run(int(8 * H), spent_usd=2.0), ondemand(), seed=1)
    assert s.seconds == (8 * H + 180.0, 8 * H + 180.0)
    assert s.cost_usd[0] == s.cost_usd[1] == 2.0 + (8 * H + 180.0) / H * 3.0


def test_a_live_attempt_pays_no_changeover() -> None:
    assert spread(Run(int(H), live_seconds=600.0), ondemand(), seed=1).seconds == (H, H)


def test_p90_is_at_least_p50_and_interruptions_make_the_run_longer() -> None:
    s = spread(Run(int(8 * H)), spot(), seed=3)
    assert 8 * H < s.seconds[0] <= s.seconds[1]
    assert s.cost_usd[0] <= s.cost_usd[1]


def test_the_spread_narrows_as_the_failure_rate_rests_on_more_interruptions() -> None:
    run = Run(int(8 * H))
    few = spread(run, spot(events=2.0), seed=5, futures=2000)
    many = spread(run, spot(events=200.0), seed=5, futures=2000)
    assert few.seconds[1] - few.seconds[0] > many.seconds[1] - many.seconds[0]


def test_interruptions_lose_the_work_since_the_last_checkpoint() -> None:
    often = Lane("spot", 1.0, 1.0, Evidence(50, 50 * H, 6 * H), NO_WAIT, 0.0, 60.0)
    rarely = Lane("spot", 1.0, 1.0, Evidence(50, 50 * H, 6 * H), NO_WAIT, 0.0, 3000.0)
    run = Run(int(8 * H))
    assert spread(run, rarely, seed=2).seconds[0] > spread(run, often, seed=2).seconds[0] + 0.1 * H


def test_a_spent_quota_moves_the_run_to_the_fallback_and_its_price() -> None:
    free = Lane("kaggle", 0.0, 1.0, NEVER, NO_WAIT, 0.0, 600.0, quota_seconds=2 * H)
    s = spread(Run(int(4 * H)), free, ondemand(), seed=1)
    expected = 2 * 3.0 + 180.0 / H * 3.0  # the two hours the quota did not carry, and the changeover
    assert s.cost_usd[0] == s.cost_usd[1] == pytest.approx(expected)


def test_without_a_fallback_a_spent_quota_waits_for_its_refill() -> None:
    free = Lane("kaggle", 0.0, 1.0, NEVER, NO_WAIT, 0.0, 600.0, quota_seconds=2 * H, refill_in_seconds=10 * H,
                refill_seconds=30 * H)
    assert spread(Run(int(4 * H)), free, seed=1).seconds == (12 * H, 12 * H)
    gone = Lane("kaggle", 0.0, 1.0, NEVER, NO_WAIT, 0.0, 600.0, quota_seconds=2 * H)
    s = spread(Run(int(4 * H), deadline_in_seconds=100 * H), gone, seed=1)
    assert s.unfinished == s.futures and s.seconds == (float("inf"),) * 2 and s.p_deadline == 0.0


def test_a_session_limit_costs_a_changeover_and_no_work() -> None:
    kaggle = Lane("kaggle", 0.0, 1.0, NEVER, NO_WAIT, 100.0, 1e9, session_seconds=3 * H)
    assert spread(Run(int(5 * H)), kaggle, seed=1).seconds == (5 * H + 2 * 100.0,) * 2


def test_the_chances_of_deadline_and_budget_are_the_shares_of_futures_that_meet_them() -> None:
    s = spread(Run(int(8 * H), deadline_in_seconds=8 * H, budget_usd=100.0), ondemand(), seed=1)
    assert s.p_deadline == 0.0 and s.p_budget == 1.0
    s = spread(Run(int(8 * H), deadline_in_seconds=9 * H, budget_usd=24.0), ondemand(), seed=1)
    assert s.p_deadline == 1.0 and s.p_budget == 0.0


def test_a_deadline_sends_an_interrupted_run_to_the_fallback_rather_than_wait() -> None:
    run = Run(int(8 * H), deadline_in_seconds=10 * H)
    alone = spread(run, spot(), seed=4)
    helped = spread(run, spot(), ondemand(), seed=4)
    assert helped.p_deadline is not None and alone.p_deadline is not None
    assert helped.p_deadline > alone.p_deadline and helped.p_deadline >= 0.95


# ---- the inputs, from a status -------------------------------------------------------------------


def _provider(name: str, **spec: object) -> Provider:
    return Provider.model_validate({"apiVersion": "reconciler.dev/v1", "kind": "Provider",
                                    "metadata": {"name": name}, "spec": spec})


def _job(**spec: object) -> Job:
    return Job.model_validate(yaml.safe_load(yaml.safe_dump({
        "apiVersion": "reconciler.dev/v1", "kind": "Job", "metadata": {"name": "train"},
        "spec": {"command": ["python", "t.py"], "target_steps": 100000, **spec}})))


def test_inputs_say_measured_where_this_repository_measured_them_and_borrowed_elsewhere() -> None:
    now = 1_800_000_000.0
    providers = {"spot": _provider("spot", price_per_hour=1.0, settings={"type": "sim", "interruptible": True}),
                 "od": _provider("od", price_per_hour=3.0, settings={"type": "sim"})}
    job = _job(placement={"providers": ["spot", "od"]}, deadline="2027-01-15T08:00:00Z")
    attempts = [Attempt(epoch=1, provider="spot", worker="w1", started=now - 5 * H, ended=now - 3 * H,
                        first_beat=now - 5 * H + 120, first_beat_step=0, step_start=0, step_end=20000,
                        outcome=Outcome.INTERRUPTION, steps_lost=300),
                Attempt(epoch=2, provider="spot", worker="w2", started=now - 2.5 * H, first_beat=now - 2.5 * H + 200,
                        first_beat_step=20000)]
    st = JobStatus(job="train", phase=Phase.RUNNING, run_id=job.run_id(), progress=Progress(step=40000, target=100000),
                   attempts=attempts)
    out = job_spread(job, st, providers, [st], now)
    assert out.spread is not None and out.provider == "spot" and out.fallback == "od"
    source = {(i.provider, i.name): i.source for i in out.inputs}
    assert source["spot", "rate"] == source["spot", "mtbf"] == source["spot", "wait"] == MEASURED
    assert source["spot", "changeover"] == source["spot", "checkpoint"] == MEASURED
    assert source["od", "rate"] == source["od", "mtbf"] == source["od", "changeover"] == BORROWED
    assert source["spot", "price"] == DECLARED
    assert out.spread.seconds[0] <= out.spread.seconds[1] and out.spread.p_deadline is not None
    assert job_spread(job, st, providers, [st], now) == out  # seeded by the run id


def test_no_futures_without_a_measured_rate_or_a_target() -> None:
    providers = {"od": _provider("od", price_per_hour=3.0, settings={"type": "sim"})}
    st = JobStatus(job="train", phase=Phase.PENDING, run_id="r")
    assert job_spread(_job(), st, providers, [st], 0.0).note.startswith("rate not measured yet")
    job = _job()
    untargeted = job.model_copy(update={"spec": job.spec.model_copy(update={"target_steps": None})})
    assert job_spread(untargeted, st, providers, [st], 0.0).note.startswith("no target_steps")


def test_the_live_rate_is_measured_up_to_when_the_statuss_step_was_seen_not_up_to_now() -> None:
    """Git keeps a running job's step in tenths of the target: the step 10,000 seen 5,000 s into the
    attempt is 2 steps/s, however long ago that was."""
    now = 1_800_000_000.0
    providers = {"od": _provider("od", price_per_hour=3.0, settings={"type": "sim"})}
    job = _job(placement={"providers": ["od"]})
    live = Attempt(epoch=1, provider="od", worker="w1", started=now - 9000, first_beat=now - 9000, first_beat_step=0,
                   step_start=0)

    def rate(seen_at: float | None) -> float:
        st = JobStatus(job="train", phase=Phase.RUNNING, run_id=job.run_id(), attempts=[live],
                       progress=Progress(step=10000, target=100000, seen_at=seen_at))
        return next(i.value for i in job_spread(job, st, providers, [st], now).inputs if i.name == "rate")

    assert rate(now - 4000) == pytest.approx(2 * 3600)  # steps/h
    assert rate(None) == pytest.approx(10000 / 9000 * 3600)  # a status from before: up to now, as it was


def test_the_futures_start_from_the_live_workers_heartbeat_step_and_its_rate_since() -> None:
    """The durable step in git lags the worker: the rest is counted from the heartbeat step seen
    with it, moved on at the measured rate, and an interruption loses what was not saved yet."""
    now = 1_800_000_000.0
    providers = {"od": _provider("od", price_per_hour=3.0, settings={"type": "sim"})}
    job = _job(placement={"providers": ["od"]}, checkpoint_every=600)
    live = Attempt(epoch=1, provider="od", worker="w1", started=now - 11000, first_beat=now - 11000,
                   first_beat_step=0, step_start=0)

    def p50(beat: int | None) -> float:
        st = JobStatus(job="train", phase=Phase.RUNNING, run_id=job.run_id(), attempts=[live],
                       progress=Progress(step=10000, target=100000, seen_at=now - 1000, heartbeat_step=beat))
        sp = job_spread(job, st, providers, [st], now).spread
        assert sp is not None
        return sp.seconds[0]

    # 1 step/s up to seen_at, then 1,000 s more: 10,000 steps ahead of the durable step's 10,000 at now
    assert p50(None) == pytest.approx(90_000 - 1000, abs=200)  # the live attempt's rate from its first beat
    assert p50(8000) == pytest.approx(90_000 - 1000, abs=200)  # a beat behind the durable step counts as it
    # a beat ahead: 12,000 steps in 10,000 s, and 1,200 more since
    assert p50(12000) == pytest.approx((100_000 - 13_200) / 1.2, abs=200)


def test_an_interruption_loses_the_live_attempts_unsaved_steps_too() -> None:
    """50 steps left, a 1-in-2 chance of an interruption before they are done: one that comes first
    costs the 900 unsaved steps too (950 to redo, beyond what this lane ever does uninterrupted)."""
    lane = Lane("spot", 1.0, 1.0, Evidence(1e4, 72e4, 72.0), Evidence(1e4, 1e4, 1.0), 0.0, 1000.0)
    saved = spread(Run(50, live_seconds=0.0, unsaved_steps=0.0), lane, seed=1).seconds
    unsaved = spread(Run(50, live_seconds=0.0, unsaved_steps=900.0), lane, seed=1).seconds
    assert saved[0] <= 50 < saved[1] < 1000
    assert unsaved[1] > 10 * saved[1]


def test_the_changeover_runs_to_the_first_step_not_to_the_tick_that_saw_the_first_heartbeat() -> None:
    """The first heartbeat was seen 300 s after the launch, when the worker had done 120 steps at
    1 step/s: it began work 180 s after the launch."""
    now = 1_800_000_000.0
    providers = {"od": _provider("od", price_per_hour=3.0, settings={"type": "sim"})}
    job = _job(placement={"providers": ["od"]})
    t0 = now - 7200
    closed = Attempt(epoch=1, provider="od", worker="w1", started=t0, first_beat=t0 + 300, first_beat_step=120,
                     step_start=0, ended=t0 + 3300, outcome=Outcome.INTERRUPTION, step_end=3000, steps_lost=120)
    st = JobStatus(job="train", phase=Phase.PENDING, run_id=job.run_id(), attempts=[closed],
                   progress=Progress(step=3000, target=100000))
    inputs = {i.name: i for i in job_spread(job, st, providers, [st], now).inputs}
    assert inputs["changeover"].value == pytest.approx(180.0)
    assert inputs["changeover"].source == MEASURED


def test_a_pinned_checkpoint_interval_outweighs_the_work_interruptions_were_seen_to_lose() -> None:
    """Lost work is known only up to the last heartbeat seen, so it undercounts the interval."""
    now = 1_800_000_000.0
    providers = {"spot": _provider("spot", price_per_hour=1.0, settings={"type": "sim", "interruptible": True})}
    closed = Attempt(epoch=1, provider="spot", worker="w1", started=now - 3 * H, first_beat=now - 3 * H + 120,
                     first_beat_step=0, step_start=0, ended=now - H, outcome=Outcome.INTERRUPTION, step_end=7200,
                     steps_lost=30)

    def checkpoint(**spec: object) -> tuple[float | None, str]:
        job = _job(placement={"providers": ["spot"]}, **spec)
        st = JobStatus(job="train", phase=Phase.PENDING, run_id=job.run_id(), attempts=[closed],
                       progress=Progress(step=7200, target=100000))
        got = next(i for i in job_spread(job, st, providers, [st], now).inputs if i.name == "checkpoint")
        return got.value, got.source

    assert checkpoint(checkpoint_every=600) == (600.0, DECLARED)
    assert checkpoint() == (60.0, MEASURED)


def test_an_interruption_can_come_during_the_changeover() -> None:
    """A 600 s changeover on machines that last 600 s on average: two launches in three are lost
    before the 60 s of work are done, most of them in the changeover."""
    lane = Lane("spot", 1.0, 1.0, Evidence(1e4, 6e6, 600.0), Evidence(1e4, 1e4, 1.0), 600.0, 600.0)
    s = spread(Run(60), lane, seed=3)
    assert s.seconds[0] > 800  # not the single launch (660 s) that 9 tries in 10 would be if it could not
    assert s.cost_usd[0] == pytest.approx(s.seconds[0] / 3600.0, rel=0.05)  # interrupted changeovers are billed


def test_the_prior_weighs_half_an_interruption() -> None:
    """Hours without an interruption move the MTBF away from the prior as a Gamma prior of shape
    1/2 with the prior's mean lets them: 4 h seen, a 6 h prior, 14 h (it read 10 h with one)."""
    assert Evidence(0.0, 4 * H, 6 * H).mean_seconds == pytest.approx(14 * H)
    assert Evidence(0.0, 0.0, 6 * H).mean_seconds == pytest.approx(6 * H)  # nothing seen: the prior
    # two interruptions in 4 h: 2 h, pulled towards 6 h by half a 2-hour gap at the prior's rate
    assert Evidence(2.0, 4 * H, 6 * H).mean_seconds == pytest.approx(5 * H / (2 + 1 / 6))


def test_the_older_record_is_the_prior_of_the_recent_one() -> None:
    """Ten interruptions an hour apart a day ago, then two quiet hours: the futures' MTBF leans on
    that day's hour, not on the 6 h prior for interruptible machines."""
    now = 1_800_000_000.0
    providers = {"spot": _provider("spot", price_per_hour=1.0, settings={"type": "sim", "interruptible": True})}
    job = _job(placement={"providers": ["spot"]})
    old = [Attempt(epoch=k + 1, provider="spot", worker=f"w{k}", started=now - 34 * H + k * H, first_beat=None,
                   step_start=0, ended=now - 33 * H + k * H, outcome=Outcome.INTERRUPTION, step_end=0)
           for k in range(10)]
    live = Attempt(epoch=11, provider="spot", worker="w11", started=now - 2 * H, first_beat=now - 2 * H,
                   first_beat_step=0, step_start=0)
    st = JobStatus(job="train", phase=Phase.RUNNING, run_id=job.run_id(), attempts=[*old, live],
                   progress=Progress(step=7200, target=100000, seen_at=now, heartbeat_step=7200))
    mtbf = next(i.value for i in job_spread(job, st, providers, [st], now).inputs if i.name == "mtbf")
    assert mtbf is not None and mtbf < 4 * H  # the 6 h prior would read 6.3 h


def test_the_futures_mtbf_ages_its_record_only_while_a_machine_runs_there() -> None:
    """Three machines of 2 h, each interrupted, then a wait, then a live one for an hour: however
    long the last wait, the interruptions are as old as the machine time since them, and the
    futures' MTBF is the same. Aged by the calendar, it read 2.8 h after a wait of 9 h and 2.4 h
    after one of 30 minutes."""
    now = 1_800_000_000.0
    providers = {"spot": _provider("spot", price_per_hour=1.0, settings={"type": "sim", "interruptible": True})}
    job = _job(placement={"providers": ["spot"]})

    def mtbf(wait: float) -> float:
        live_from = now - H
        start = live_from - wait - 6 * H
        old = [Attempt(epoch=k + 1, provider="spot", worker=f"w{k}", started=start + 2 * k * H, first_beat=None,
                       step_start=0, ended=start + 2 * (k + 1) * H, outcome=Outcome.INTERRUPTION, step_end=0)
               for k in range(3)]
        live = Attempt(epoch=4, provider="spot", worker="w4", started=live_from, first_beat=live_from,
                       first_beat_step=0, step_start=0)
        st = JobStatus(job="train", phase=Phase.RUNNING, run_id=job.run_id(), attempts=[*old, live],
                       progress=Progress(step=3600, target=100000, seen_at=now, heartbeat_step=3600))
        value = next(i.value for i in job_spread(job, st, providers, [st], now).inputs if i.name == "mtbf")
        assert value is not None
        return value

    assert mtbf(9 * H) == pytest.approx(mtbf(0.5 * H))
    assert 2 * H < mtbf(9 * H) < 3 * H  # 3 interruptions in 7 h of machine time, the prior's half one besides


def test_the_run_ends_once_its_final_save_is_durable() -> None:
    """With a 10 s save said, an uninterrupted rest finishes about one save later: the rate spreads
    the saves' cost over the steps (600 steps in 610 s), the worker pays a last one at the end."""
    rate = 600.0 / 610.0
    bare = Lane("od", 1.0, rate, NEVER, NO_WAIT, 180.0, 600.0)
    saved = Lane("od", 1.0, rate, NEVER, NO_WAIT, 180.0, 600.0, save_seconds=10.0)
    run = Run(6000, live_seconds=60.0)
    assert spread(run, bare, seed=1).seconds[0] == pytest.approx(6100.0)
    assert spread(run, saved, seed=1).seconds[0] == pytest.approx(6110.0)  # 10 intervals of 610 s, and the final save


def test_the_save_of_the_interval_under_way_is_paid_whole() -> None:
    """530 steps past the last checkpoint, 70 to the next: that save costs all its 10 s, not the
    70/600 of it the rate would charge."""
    rate = 600.0 / 610.0
    lane = Lane("od", 1.0, rate, NEVER, NO_WAIT, 180.0, 600.0, save_seconds=10.0)
    run = Run(70 + 1200, live_seconds=60.0, unsaved_steps=530.0)
    assert spread(run, lane, seed=1).seconds[0] == pytest.approx(1270.0 + 3 * 10.0 + 10.0)


def test_the_worker_s_save_time_reaches_the_futures_from_the_status() -> None:
    """1 step/s with its saves, 10,000 steps seen on a checkpoint (every 500): a 30 s save said
    leaves the rate and the position as they were, and adds the final save."""
    now = 1_800_000_000.0
    providers = {"od": _provider("od", price_per_hour=3.0, settings={"type": "sim"})}
    job = _job(placement={"providers": ["od"]}, checkpoint_every=500)
    live = Attempt(epoch=1, provider="od", worker="w1", started=now - 11000, first_beat=now - 11000,
                   first_beat_step=0, step_start=0)

    def out(save: float | None) -> tuple[float, str]:
        st = JobStatus(job="train", phase=Phase.RUNNING, run_id=job.run_id(), attempts=[live],
                       progress=Progress(step=9600, target=100000, seen_at=now - 1000, heartbeat_step=10000,
                                         save_seconds=save))
        sp = job_spread(job, st, providers, [st], now)
        assert sp.spread is not None
        return sp.spread.seconds[0], next(i.source for i in sp.inputs if i.name == "save")

    (bare, unsaid), (saved, said) = out(None), out(30.0)
    assert unsaid == BORROWED and said == MEASURED
    assert saved - bare == pytest.approx(30.0, abs=1.0)


def test_a_wait_under_way_counts_as_time_without_a_relaunch() -> None:
    """Two waits of 1 h seen, and one under way for 4 h: the mean wait is longer than 1 h (the long
    waits are the ones likeliest to be under way when the forecast is made)."""
    now = 1_800_000_000.0
    providers = {"spot": _provider("spot", price_per_hour=1.0, settings={"type": "sim", "interruptible": True})}
    job = _job(placement={"providers": ["spot"]}, checkpoint_every=600)
    ends = [(now - 12 * H, now - 10 * H), (now - 9 * H, now - 7 * H), (now - 6 * H, now - 4 * H)]
    attempts = [Attempt(epoch=i + 1, provider="spot", worker=f"w{i}", started=s, ended=e, first_beat=s + 100,
                        first_beat_step=i * 7200, step_start=i * 7200, step_end=(i + 1) * 7200,
                        outcome=Outcome.INTERRUPTION) for i, (s, e) in enumerate(ends)]
    st = JobStatus(job="train", phase=Phase.RUNNING, run_id=job.run_id(), attempts=attempts,
                   progress=Progress(step=21600, target=100000))
    wait = next(i for i in job_spread(job, st, providers, [st], now).inputs if i.name == "wait")
    assert wait.source == MEASURED and "under way" in wait.how
    assert wait.value == pytest.approx((2 * H + 4 * H + 150.0) / 2.5)


def test_with_the_save_cost_known_the_rate_holds_the_saves_pro_rata() -> None:
    """9,270 steps at 1 step/s with a 10 s save every 600: 15 whole saves, 9,420 s. Read as is,
    the rate misses the share of the save the 270 steps past the last checkpoint will pay (4.5 s);
    with the save's cost said it is 600 steps in 610 s, the rate the futures spread saves with."""
    now = 1_800_000_000.0
    providers = {"od": _provider("od", price_per_hour=3.0, settings={"type": "sim"})}
    job = _job(placement={"providers": ["od"]}, checkpoint_every=600)
    live = Attempt(epoch=1, provider="od", worker="w1", started=now - 9420 - 100, first_beat=now - 9420,
                   first_beat_step=0, step_start=0)

    def rate(save: float | None) -> float:
        st = JobStatus(job="train", phase=Phase.RUNNING, run_id=job.run_id(), attempts=[live],
                       progress=Progress(step=9000, target=100000, seen_at=now, heartbeat_step=9270,
                                         save_seconds=save))
        return next(i.value for i in job_spread(job, st, providers, [st], now).inputs if i.name == "rate")

    assert rate(None) == pytest.approx(9270 / 9420 * 3600)
    assert rate(10.0) == pytest.approx(600 / 610 * 3600)
