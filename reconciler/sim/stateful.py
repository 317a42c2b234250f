"""Random fault sequences for the simulation, as a Hypothesis rule-based state machine.

Why Hypothesis: it picks which faults to combine and in what order, and shrinks a failure to
the shortest sequence that still breaks an invariant. The CI test runs a few examples
(tests/sim/test_stateful.py); `bench/soak.py --stateful N` runs many with the same machine.

Every rule either moves time (one or more real ticks, maybe killed part way) or switches a
fault on or off; the invariant checker runs after every tick, and the teardown heals the world
and requires every job to end for a reason of its own.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from adapters.compute import WorkerPhase
from adapters.sim import JobModel, ProviderModel
from reconciler.sim.driver import Faults, JobPlan, ProviderPlan, SimConfig, Simulation

PROVIDERS = ("spot", "free", "cheap")
JOBS = ("job-a", "job-b", "job-c")
RATES = st.sampled_from([0.0, 0.0, 0.2, 0.5, 0.9])


def chaos_config(seed: int) -> SimConfig:
    providers = [
        ProviderPlan(ProviderModel("spot", launch_delay_seconds=30.0, price_per_hour=0.2, mtbf_seconds=900.0,
                                   notice_seconds=30.0), concurrency=3),
        ProviderPlan(ProviderModel("free", launch_delay_seconds=60.0, session_limit_seconds=1200.0), concurrency=1),
        ProviderPlan(ProviderModel("cheap", launch_delay_seconds=90.0, price_per_hour=0.05), concurrency=2),
    ]
    model = JobModel(step_seconds=1.0, checkpoint_cost_seconds=10.0, restart_cost_seconds=20.0)
    flaky = JobModel(step_seconds=1.0, checkpoint_cost_seconds=10.0, restart_cost_seconds=20.0,
                     error_rate_per_hour=2.0)
    jobs = [
        JobPlan("job-a", target_steps=600, checkpoint_every=120, model=model, max_retries=1),
        JobPlan("job-b", target_steps=900, checkpoint_every=120, model=flaky, max_retries=2,
                providers=["spot", "cheap"]),
        JobPlan("job-c", target_steps=600, checkpoint_every=200, model=model, max_retries=0, budget_usd=0.5),
    ]
    return SimConfig(providers=providers, jobs=jobs, seed=seed, faults=Faults())


class ChaosMachine(RuleBasedStateMachine):
    settle_steps = 600

    def __init__(self) -> None:
        super().__init__()
        self.sim: Simulation | None = None

    @property
    def s(self) -> Simulation:
        assert self.sim is not None
        return self.sim

    @initialize(seed=st.integers(0, 2**16))
    def start(self, seed: int) -> None:
        self.sim = Simulation(chaos_config(seed))

    # ---- time ---------------------------------------------------------------------------------
    @rule(n=st.integers(1, 4))
    def ticks(self, n: int) -> None:
        for _ in range(n):
            self.s.step()

    @rule(k=st.integers(1, 120))
    def crash_during_next_tick(self, k: int) -> None:
        self.s.step(crash_at=k)

    @rule(seconds=st.floats(-120.0, 120.0))
    def clock_jump(self, seconds: float) -> None:
        self.s.step(jump=seconds)

    # ---- the providers --------------------------------------------------------------------------
    @rule(i=st.integers(0, 50), zombie=st.booleans())
    def preempt_a_worker(self, i: int, zombie: bool) -> None:
        live = sorted(self.s.cloud.live.values(), key=lambda w: w.ref.id)
        if live:
            w = live[i % len(live)]
            saved = w.provider.zombie_rate
            w.provider.zombie_rate = 1.0 if zombie else 0.0
            w.kill("preempted", WorkerPhase.PREEMPTED, "PREEMPTED")
            w.provider.zombie_rate = saved

    @rule(p=st.sampled_from(PROVIDERS), down=st.booleans())
    def provider_outage(self, p: str, down: bool) -> None:
        self.s.cloud.providers[p].down = down

    @rule(p=st.sampled_from(PROVIDERS), rate=RATES)
    def api_errors(self, p: str, rate: float) -> None:
        self.s.cloud.providers[p].api_error_rate = rate

    @rule(p=st.sampled_from(PROVIDERS), rate=RATES)
    def api_timeouts(self, p: str, rate: float) -> None:
        self.s.cloud.providers[p].api_timeout_rate = rate

    @rule(p=st.sampled_from(PROVIDERS), seconds=st.sampled_from([0.0, 2.0, 20.0]))
    def slow_api(self, p: str, seconds: float) -> None:
        self.s.cloud.providers[p].api_slow_seconds = seconds

    @rule(p=st.sampled_from(PROVIDERS), rate=RATES)
    def lost_observations(self, p: str, rate: float) -> None:
        self.s.cloud.providers[p].lost_observation_rate = rate

    @rule(p=st.sampled_from(PROVIDERS), rate=RATES)
    def zombies(self, p: str, rate: float) -> None:
        self.s.cloud.providers[p].zombie_rate = rate

    # ---- storage and git ---------------------------------------------------------------------------
    @rule(tick=st.sampled_from([0.0, 0.02, 0.2]), worker=st.sampled_from([0.0, 0.05, 0.3]),
          slow=st.sampled_from([0.0, 1.0]))
    def storage_faults(self, tick: float, worker: float, slow: float) -> None:
        sf = self.s.store.faults
        sf.tick_error_rate, sf.worker_error_rate, sf.slow_write_seconds = tick, worker, slow

    @rule(push=RATES, pull=RATES)
    def git_faults(self, push: float, pull: float) -> None:
        self.s.repo.faults.push_reject_rate = push
        self.s.repo.faults.pull_error_rate = pull

    # ---- what a person does ---------------------------------------------------------------------------
    @rule(job=st.sampled_from(JOBS))
    def delete_job(self, job: str) -> None:
        if job not in self.s.deleted_jobs:
            self.s.delete_job(job)

    @rule(job=st.sampled_from(JOBS[:2]), providers=st.sampled_from([["spot"], ["cheap", "spot"], []]))
    def move_job(self, job: str, providers: list[str]) -> None:
        """A placement change applies to the current run (no new run, no lost progress)."""
        if job in self.s.deleted_jobs:
            return
        plan = next(j for j in self.s.config.jobs if j.name == job)
        plan.providers = list(providers)
        self.s.edit_job(plan)

    # ---- checks ---------------------------------------------------------------------------------------
    @invariant()
    def invariants_hold(self) -> None:
        if self.sim is not None:
            assert self.sim.checker.violations == [], self.sim.checker.violations[:5]

    def teardown(self) -> None:
        sim = self.sim
        if sim is None:
            return
        try:
            sim.heal()
            settled = sim.run_to_completion(self.settle_steps)
            sim.run(3)
            sim.checker.check_final()
            detail: Any = {n: (s.phase.value, s.message) for n, s in sim.statuses().items()}
            assert settled, f"not settled after healing: {detail}"
            assert sim.checker.violations == [], sim.checker.violations[:5]
        finally:
            sim.close()
