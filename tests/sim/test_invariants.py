"""The completion guarantee under one fault at a time: the real tick, simulated providers,
storage and git, and the invariant checker after every step (reconciler/sim/invariants.py)."""

from __future__ import annotations

from collections.abc import Callable

from adapters.sim import JobModel, ProviderModel
from reconciler.sim import Faults, JobPlan, ProviderPlan, SimConfig, Simulation
from status.models import Phase
from tests.sim.conftest import small_config

Make = Callable[[SimConfig], Simulation]


def finish(sim: Simulation, steps: int = 400) -> None:
    sim.heal()
    assert sim.run_to_completion(steps), {n: (s.phase.value, s.message) for n, s in sim.statuses().items()}
    sim.run(3)
    sim.checker.check_final()
    assert sim.checker.violations == []


def phases(sim: Simulation) -> dict[str, Phase]:
    return {n: s.phase for n, s in sim.statuses().items()}


def test_every_job_finishes_through_preemptions_without_being_charged(make_sim: Make) -> None:
    spot = ProviderModel("spot", launch_delay_seconds=30.0, mtbf_seconds=600.0)
    sim = make_sim(small_config(jobs=3, providers=[ProviderPlan(spot)], max_retries=0))
    finish(sim, 600)
    assert set(phases(sim).values()) == {Phase.SUCCEEDED}
    assert len(sim.cloud.interruptions) >= 3
    assert all(s.failures == 0 for s in sim.statuses().values())


def test_a_crash_at_any_call_of_the_launching_tick_is_survived(make_sim: Make) -> None:
    probe = make_sim(small_config(jobs=1, target=300))
    probe.step()
    points = probe.tick_calls
    assert points > 5
    for k in range(1, points + 1):
        sim = make_sim(small_config(jobs=1, seed=k, target=300))
        sim.step(crash_at=k)
        assert sim.crashes == 1
        finish(sim, 100)
        assert phases(sim) == {"job-0": Phase.SUCCEEDED}
        assert len({w.ref.epoch for w in sim.cloud.workers.values()}) == len(sim.cloud.workers)


def test_a_crash_at_any_call_of_a_relaunching_tick_is_survived(make_sim: Make) -> None:
    def world(seed: int) -> Simulation:
        sim = make_sim(small_config(jobs=1, seed=seed, target=900))
        sim.run(12)
        (w,) = sim.cloud.live.values()
        w.kill("preempted", w.state.phase.PREEMPTED, "PREEMPTED")
        return sim

    probe = world(0)
    probe.step()
    for k in range(1, probe.tick_calls + 1):
        sim = world(k)
        sim.step(crash_at=k)
        finish(sim, 100)
        st = sim.statuses()["job-0"]
        assert st.phase == Phase.SUCCEEDED and st.failures == 0


def test_zombies_that_come_back_are_fenced_and_never_roll_progress_back(make_sim: Make) -> None:
    spot = ProviderModel("spot", launch_delay_seconds=30.0, mtbf_seconds=400.0, zombie_rate=1.0,
                         zombie_return_seconds=200.0)
    sim = make_sim(small_config(jobs=2, target=1200, providers=[ProviderPlan(spot)]))
    finish(sim, 800)
    zombies = [w for w in sim.cloud.workers.values() if w.zombie]
    assert len(zombies) >= 2
    ended = {w.ledger.end_reason for w in zombies if not w.alive}
    assert ended & {"fenced", "terminated"}, ended


def test_a_launch_that_timed_out_but_happened_is_adopted_not_doubled(make_sim: Make) -> None:
    spot = ProviderModel("spot", launch_delay_seconds=30.0, api_timeout_rate=0.5)
    sim = make_sim(small_config(jobs=3, providers=[ProviderPlan(spot)], max_retries=0))
    sim.run(60)
    finish(sim)
    assert set(phases(sim).values()) == {Phase.SUCCEEDED}


def test_lost_observations_and_api_errors_never_charge_the_retry_budget(make_sim: Make) -> None:
    spot = ProviderModel("spot", launch_delay_seconds=30.0, lost_observation_rate=0.4, api_error_rate=0.3,
                         api_slow_seconds=3.0)
    sim = make_sim(small_config(jobs=3, providers=[ProviderPlan(spot)], max_retries=0))
    sim.run(80)
    finish(sim)
    assert set(phases(sim).values()) == {Phase.SUCCEEDED}
    assert all(s.failures == 0 for s in sim.statuses().values())


def test_a_provider_outage_moves_runs_to_the_next_provider(make_sim: Make) -> None:
    down = ProviderModel("cheap", launch_delay_seconds=30.0, down=True)
    up = ProviderModel("backup", launch_delay_seconds=30.0, price_per_hour=0.1)
    sim = make_sim(small_config(jobs=2, providers=[ProviderPlan(down), ProviderPlan(up)]))
    sim.run(60)
    assert {w.provider.name for w in sim.cloud.workers.values()} == {"backup"}
    finish(sim)
    assert set(phases(sim).values()) == {Phase.SUCCEEDED}


def test_storage_errors_and_slow_writes_delay_but_never_corrupt(make_sim: Make) -> None:
    faults = Faults(tick_storage_error_rate=0.05, worker_storage_error_rate=0.1, slow_write_seconds=0.5)
    spot = ProviderModel("spot", launch_delay_seconds=30.0, mtbf_seconds=900.0)
    sim = make_sim(small_config(jobs=3, providers=[ProviderPlan(spot)], faults=faults, max_retries=0))
    sim.run(80)
    assert sim.store.faults.errors > 0
    finish(sim, 600)
    assert set(phases(sim).values()) == {Phase.SUCCEEDED}


def test_rejected_pushes_keep_status_local_until_a_push_goes_through(make_sim: Make) -> None:
    sim = make_sim(small_config(jobs=2, faults=Faults(push_reject_rate=0.8, pull_error_rate=0.3)))
    sim.run(40)
    assert sim.repo.faults.rejected_pushes > 0
    finish(sim)
    remote = sim.repo.read_files(sim.repo.remote_head, "status")
    assert {"status/job-0.yaml", "status/job-1.yaml"} <= set(remote)


def test_reconciler_crashes_every_few_ticks_change_nothing(make_sim: Make) -> None:
    spot = ProviderModel("spot", launch_delay_seconds=30.0, mtbf_seconds=900.0)
    sim = make_sim(small_config(jobs=3, providers=[ProviderPlan(spot)], faults=Faults(crash_rate=0.5)))
    sim.run(100)
    assert sim.crashes > 20
    finish(sim, 600)
    assert set(phases(sim).values()) == {Phase.SUCCEEDED}


def test_a_job_that_always_fails_fails_for_its_own_reason_after_its_budget(make_sim: Make) -> None:
    config = SimConfig(providers=[ProviderPlan(ProviderModel("spot", launch_delay_seconds=0.0, mtbf_seconds=300.0))],
                       jobs=[JobPlan("bad", target_steps=100, max_retries=2, model=JobModel(always_fails=True))])
    sim = make_sim(config)
    finish(sim)
    st = sim.statuses()["bad"]
    assert st.phase == Phase.FAILED and st.failures == 3 and st.message.startswith("failed 3 times")
    assert "simulated job error" in (st.log_tail or "")


def test_hung_workers_are_stalled_charged_and_relaunched(make_sim: Make) -> None:
    model = JobModel(step_seconds=1.0, checkpoint_cost_seconds=10.0, restart_cost_seconds=20.0,
                     hang_rate_per_hour=12.0)
    sim = make_sim(small_config(jobs=2, target=900, model=model, max_retries=10, stall_timeout_seconds=120.0))
    finish(sim, 800)
    assert sum(s.failures for s in sim.statuses().values()) >= 1
    assert set(phases(sim).values()) == {Phase.SUCCEEDED}


def test_deleting_a_manifest_cancels_the_run_and_stops_its_worker(make_sim: Make) -> None:
    sim = make_sim(small_config(jobs=2, target=3600))
    sim.run(10)
    sim.delete_job("job-1")
    finish(sim)
    assert phases(sim) == {"job-0": Phase.SUCCEEDED, "job-1": Phase.CANCELLED}
    assert not [w for w in sim.cloud.live.values() if w.spec.job == "job-1"]


def test_a_session_limit_with_a_known_deadline_loses_almost_nothing(make_sim: Make) -> None:
    kaggle = ProviderModel("kaggle", launch_delay_seconds=60.0, session_limit_seconds=3 * 3600.0)
    model = JobModel(step_seconds=1.0, checkpoint_cost_seconds=60.0, restart_cost_seconds=60.0,
                     checkpoint_interval_seconds=1800.0)
    config = small_config(jobs=1, target=8 * 3600, providers=[ProviderPlan(kaggle)], model=model)
    config.tick_seconds = 300.0
    sim = make_sim(config)
    finish(sim, 300)
    ends = [w for w in sim.cloud.ended if w.ledger.end_reason in ("interrupted", "session-limit")]
    assert len(ends) >= 2
    assert all(w.ledger.lost_steps == 0 for w in ends)


def test_the_checker_catches_a_worker_that_ignores_the_lease(make_sim: Make) -> None:
    """The checker has teeth: a worker SDK without fencing, plus zombies, is caught."""
    spot = ProviderModel("spot", launch_delay_seconds=30.0, mtbf_seconds=400.0, zombie_rate=1.0,
                         zombie_return_seconds=120.0)
    model = JobModel(step_seconds=1.0, checkpoint_cost_seconds=10.0, restart_cost_seconds=20.0, fencing=False)
    sim = make_sim(small_config(jobs=2, target=1800, providers=[ProviderPlan(spot)], model=model))
    sim.run(150)
    assert any("may write" in v for v in sim.checker.violations)


def test_a_clock_jump_never_charges_a_healthy_job(make_sim: Make) -> None:
    sim = make_sim(small_config(jobs=1, target=3600, max_retries=0))
    sim.run(20)
    sim.step(jump=400.0)
    finish(sim)
    assert phases(sim) == {"job-0": Phase.SUCCEEDED}


def test_suspending_a_running_job_stops_its_worker(make_sim: Make) -> None:
    sim = make_sim(small_config(jobs=1, target=3600))
    sim.run(10)
    plan = sim.config.jobs[0]
    plan.suspend = True
    sim.edit_job(plan)
    sim.run(5)
    assert sim.statuses()["job-0"].phase == Phase.SUSPENDED
    assert not sim.cloud.live


def test_a_hung_worker_is_found_even_when_the_reconciler_restarts_every_tick(make_sim: Make) -> None:
    model = JobModel(step_seconds=1.0, checkpoint_cost_seconds=10.0, restart_cost_seconds=20.0,
                     hang_rate_per_hour=60.0)
    sim = make_sim(small_config(jobs=1, target=600, model=model, max_retries=0, stall_timeout_seconds=120.0))
    for _ in range(60):
        sim.step(fresh=True)
    st = sim.statuses()["job-0"]
    assert st.phase.terminal, (st.phase, st.message)
