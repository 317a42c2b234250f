"""Bugs the simulation found in the loop, each pinned by the scenario that exposed it."""

from __future__ import annotations

from collections.abc import Callable

from adapters.sim import JobModel, ProviderModel
from reconciler.sim import JobPlan, ProviderPlan, SimConfig, Simulation
from status.models import Phase


def test_a_failed_job_keeps_its_own_reason_through_a_storage_outage(make_sim: Callable[..., Simulation]) -> None:
    """Found by the chaos run: a storage read error overwrote the Failed job's reason with
    "run data unreadable", and nothing ever wrote the reason back, so the audit trail said the job
    failed because of storage."""
    config = SimConfig(providers=[ProviderPlan(ProviderModel("spot", launch_delay_seconds=0.0))],
                       jobs=[JobPlan("bad", target_steps=100, max_retries=0, model=JobModel(always_fails=True))])
    sim = make_sim(config)
    assert sim.run_to_completion(40)
    st = sim.statuses()["bad"]
    assert st.phase == Phase.FAILED and st.message.startswith("failed 1 times")
    sim.store.faults.tick_error_rate = 1.0
    sim.step()
    sim.heal()
    sim.run(3)
    st = sim.statuses()["bad"]
    assert st.phase == Phase.FAILED
    assert st.message.startswith("failed 1 times"), st.message
    sim.checker.check_final()
    assert sim.checker.violations == []


def test_a_running_attempt_is_stopped_when_the_cost_budget_is_spent(make_sim: Callable[..., Simulation]) -> None:
    """Found by the chaos run: the budget was checked only before a launch, so one attempt ran on
    past it (a $0.05 budget billed $1 for an hour-long job)."""
    provider = ProviderModel("paid", launch_delay_seconds=0.0, price_per_hour=1.0)
    config = SimConfig(providers=[ProviderPlan(provider)],
                       jobs=[JobPlan("costly", target_steps=3600, budget_usd=0.05, checkpoint_every=300)])
    sim = make_sim(config)
    assert sim.run_to_completion(200)
    st = sim.statuses()["costly"]
    assert st.phase == Phase.FAILED and st.message.startswith("policy: cost budget"), st.message
    billed = sum(w.ledger.billed_seconds for w in sim.cloud.workers.values()) / 3600.0
    assert billed <= 0.05 + 2 * 30 / 3600.0
    sim.checker.check_final()
    assert sim.checker.violations == []


def test_a_worker_left_running_by_a_failed_terminate_is_stopped_once_the_job_failed(
        make_sim: Callable[..., Simulation]) -> None:
    """Found by the chaos run: when the terminate for a budget stop failed (provider API error),
    the job was recorded Failed and its worker, still holding the lease, was never asked again: it
    ran on and billed past the budget until it finished by itself."""
    provider = ProviderModel("paid", launch_delay_seconds=0.0, price_per_hour=1.0,
                             fail_ops=frozenset({"terminate"}))
    config = SimConfig(providers=[ProviderPlan(provider)],
                       jobs=[JobPlan("costly", target_steps=3600, budget_usd=0.05, checkpoint_every=300)])
    sim = make_sim(config)
    sim.run(30, until=lambda s: "costly" in s.statuses() and s.statuses()["costly"].phase == Phase.FAILED)
    assert sim.statuses()["costly"].phase == Phase.FAILED
    assert sim.cloud.live, "the terminate was refused, so the worker is still running"
    provider.fail_ops = frozenset()
    sim.run(3)
    assert not sim.cloud.live
    billed = sum(w.ledger.billed_seconds for w in sim.cloud.workers.values()) / 3600.0
    assert billed <= 0.05 + 4 * 30 / 3600.0


def test_status_left_unpushed_by_a_rejected_push_reaches_the_remote_once_pushes_work(
        make_sim: Callable[..., Simulation]) -> None:
    """Found by the Hypothesis soak (1,000 sequences): the loop pushed only in a tick that made a
    new status commit, so when the last change of a job (its completion) met a rejected push,
    the remote kept the stale status for good: nothing changed any more, so nothing was pushed.
    A restarted reconciler must flush it too."""
    config = SimConfig(providers=[ProviderPlan(ProviderModel("spot", launch_delay_seconds=0.0))],
                       jobs=[JobPlan("short", target_steps=300, checkpoint_every=100)])
    for fresh in (False, True):
        sim = make_sim(config)
        sim.repo.faults.push_reject_rate = 1.0
        sim.run(30, until=lambda s: s.statuses().get("short") is not None
                and s.statuses()["short"].phase == Phase.SUCCEEDED)
        assert sim.repo.unpushed, "the completion is committed locally, its push was rejected"
        sim.repo.faults.push_reject_rate = 0.0
        sim.step(fresh=fresh)
        sim.step()
        assert not sim.repo.unpushed
        remote = sim.repo.read_file(sim.repo.remote_head, "status/short.yaml") or b""
        assert b"phase: Succeeded" in remote
