"""The simulation's own parts: checkpoint policy, trace replay, in-memory git, simfs storage."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from adapters.gitrepo import GitError
from adapters.sim import PreemptionTrace, ProviderModel
from adapters.storage import CheckpointName, Fenced, RunFolder
from reconciler.checkpoint_policy import (
    checkpoint_interval,
    daly_interval,
    estimate_mtbf,
    expected_efficiency,
    optimal_interval,
    young_interval,
)
from reconciler.sim import ProviderPlan, Simulation
from reconciler.sim.repo import RepoFaults, SimRepo
from reconciler.sim.storage import InjectedStorageError, drop_world, world_store
from tests.sim.conftest import small_config


@pytest.mark.parametrize("mtbf", [1800.0, 3 * 3600.0, 12 * 3600.0, 7 * 86400.0])
@pytest.mark.parametrize("cost", [5.0, 60.0, 600.0])
def test_the_daly_interval_is_within_a_tenth_of_a_percent_of_the_exact_optimum(mtbf: float, cost: float) -> None:
    best = expected_efficiency(optimal_interval(cost, 120.0, mtbf), cost, 120.0, mtbf)
    assert expected_efficiency(daly_interval(cost, mtbf), cost, 120.0, mtbf) >= 0.999 * best
    assert young_interval(cost, mtbf) == pytest.approx((2 * cost * mtbf) ** 0.5)


def test_the_mtbf_estimate_starts_at_the_prior_and_follows_the_evidence() -> None:
    assert estimate_mtbf(0.0, 0, prior_mtbf=3600.0) == 3600.0
    assert estimate_mtbf(100 * 1800.0, 100, prior_mtbf=3600.0) == pytest.approx(1818, rel=0.01)


def test_the_interval_is_bounded_whatever_the_inputs() -> None:
    assert checkpoint_interval(0.0, 3600.0) == 60.0  # a free save: once a minute at most
    assert checkpoint_interval(0.0, 10.0) == 1.0  # unless failures come faster: a tenth of the MTBF
    assert checkpoint_interval(0.0, 0.5) == 1.0  # never below a second
    assert checkpoint_interval(60.0, None) == pytest.approx(daly_interval(60.0, 6 * 3600.0))
    assert checkpoint_interval(600.0, 10**9) == 6 * 3600.0


def test_a_trace_is_replayed_in_a_loop_and_rejects_nonsense(tmp_path: object) -> None:
    trace = PreemptionTrace.from_json({"gap_seconds": 60, "data": [3, 1, 2]})
    assert [trace.live_at(t) for t in (0, 59, 60, 130, 180)] == [3, 3, 1, 2, 3]
    with pytest.raises(ValueError):
        PreemptionTrace.from_json({"gap_seconds": 0, "data": [1]})
    with pytest.raises(ValueError):
        PreemptionTrace.from_json(json.loads('{"gap_seconds": 5, "data": []}'))


def test_a_trace_drop_preempts_the_excess_and_the_loop_finishes_the_jobs(
        make_sim: Callable[..., Simulation]) -> None:
    spot = ProviderModel("spot", launch_delay_seconds=0.0,
                         trace=PreemptionTrace.from_json({"gap_seconds": 150, "data": [3, 3, 1, 0, 2, 3]}))
    sim = make_sim(small_config(jobs=3, target=900, providers=[ProviderPlan(spot)], max_retries=0))
    sim.heal()
    assert sim.run_to_completion(400)
    assert len(sim.cloud.interruptions) >= 2
    sim.checker.check_final()
    assert sim.checker.violations == []


def test_a_free_quota_ends_the_session_that_spends_it(make_sim: Callable[..., Simulation]) -> None:
    """A notebook whose quota runs out mid-session stops there, told in advance like a session
    limit (it was only checked at launch: a 12 h session started with 1 h left ran 12 h)."""
    notebook = ProviderModel("notebook", launch_delay_seconds=60.0, quota_seconds=3600.0,
                             session_limit_seconds=12 * 3600.0)
    sim = make_sim(small_config(jobs=1, target=4 * 3600, providers=[ProviderPlan(notebook, concurrency=1)]))
    sim.config.tick_seconds = 300.0
    sim.run(30)  # 2.5 h: the quota allows one
    workers = list(sim.cloud.workers.values())
    assert workers[0].ledger.end_reason == "interrupted"  # it saved and left before the quota ran out
    assert sum(w.ledger.billed_seconds for w in workers) <= 3600.0 + 1.0
    assert all(not w.alive for w in workers)
    assert sim.cloud.allowance("notebook").remaining <= 0.001  # type: ignore[union-attr]
    assert sim.checker.violations == []


def test_prepaid_credits_end_the_worker_that_spends_them(make_sim: Callable[..., Simulation]) -> None:
    """Credits that run out take the machine away unannounced, as Lightning's do; then launches
    there are refused, and the allowance the adapter reports reads empty."""
    credits = ProviderModel("credits", launch_delay_seconds=60.0, price_per_hour=2.0, credits_usd=3.0)
    sim = make_sim(small_config(jobs=1, target=4 * 3600, providers=[ProviderPlan(credits, concurrency=1)]))
    sim.config.tick_seconds = 300.0
    sim.run(36)  # 3 h: $3 buy 1.5 h (the planner starts nothing that credits cannot carry an hour)
    workers = list(sim.cloud.workers.values())
    assert workers[0].ledger.end_reason == "preempted"
    assert sim.cloud.spent_usd("credits") <= 3.0 + 1e-6
    assert all(not w.alive for w in workers)
    allowance = sim.cloud.allowance("credits")
    assert allowance is not None and allowance.unit == "credits" and allowance.remaining <= 1e-6
    assert sim.checker.violations == []


def test_the_memory_repo_rebases_local_status_on_a_person_s_push() -> None:
    repo = SimRepo({"desired/a.yaml": b"a"}, RepoFaults(push_reject_rate=1.0))
    repo.commit_status({"status/a.yaml": "x"}, "status")
    with pytest.raises(GitError):
        repo.push()
    repo.user_commit({"desired/b.yaml": b"b"}, "add b")
    repo.pull()
    head = repo.head()
    assert repo.read_file(head, "status/a.yaml") == b"x"
    assert repo.read_file(head, "desired/b.yaml") == b"b"
    assert repo.last_change(head, ["desired", "reconciler.yaml"]) == repo.remote_head
    repo.faults.push_reject_rate = 0.0
    repo.push()
    assert repo.remote_head == head and not repo.unpushed
    assert repo.commit_status({"status/a.yaml": "x"}, "same") is None
    with pytest.raises(GitError):
        repo.commit_status({"desired/a.yaml": "evil"}, "no")


def test_simfs_lists_by_index_fails_on_purpose_and_keeps_worlds_apart() -> None:
    folder = RunFolder("simfs://runs/job/r-1", {"world": "parts-a"})
    other = RunFolder("simfs://runs/job/r-1", {"world": "parts-b"})
    try:
        assert folder.bump_lease() == 1
        assert other.lease_epoch() == 0
        ckpt = CheckpointName(10, 1)
        folder.store.write_payload(f"checkpoints/{ckpt.dirname}/state", memoryview(b"abc"))
        folder.commit_checkpoint(1, ckpt, {"files": {"state": {"size": 3, "sha256": "0"}}})
        assert folder.durable_step() == 10
        assert folder.bump_lease() == 2
        with pytest.raises(Fenced):
            folder.write_progress(1, {"epoch": 1, "step": 11})
        world_store("parts-a").faults.worker_error_rate = 1.0
        with pytest.raises(Exception) as info:
            folder.lease_epoch()
        assert isinstance(info.value.__cause__, InjectedStorageError)
    finally:
        drop_world("parts-a")
        drop_world("parts-b")
