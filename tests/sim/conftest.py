"""Builders for small simulated worlds; each test gets its own isolated storage world."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest

from adapters.sim import JobModel, ProviderModel
from reconciler.sim import Faults, JobPlan, ProviderPlan, SimConfig, Simulation


def small_config(*, jobs: int = 2, seed: int = 0, target: int = 1200, providers: list[ProviderPlan] | None = None,
                 model: JobModel | None = None, faults: Faults | None = None, **job_kw: object) -> SimConfig:
    providers = providers or [ProviderPlan(ProviderModel("spot", launch_delay_seconds=30.0), concurrency=10)]
    model = model or JobModel(step_seconds=1.0, checkpoint_cost_seconds=10.0, restart_cost_seconds=20.0)
    plans = [JobPlan(f"job-{i}", target_steps=target, checkpoint_every=300, model=model, **job_kw)  # type: ignore[arg-type]
             for i in range(jobs)]
    return SimConfig(providers=providers, jobs=plans, seed=seed, faults=faults or Faults())


@pytest.fixture
def make_sim() -> Iterator[Callable[[SimConfig], Simulation]]:
    logging.getLogger("reconciler").setLevel(logging.CRITICAL)
    made: list[Simulation] = []

    def make(config: SimConfig) -> Simulation:
        sim = Simulation(config)
        made.append(sim)
        return sim

    yield make
    for sim in made:
        sim.close()
