"""Chaos soak: many simulated jobs over mixed providers with preemptions, API faults, storage
faults, rejected pushes, zombies, clock jumps and reconciler crashes, all through the real tick.

Jobs are spread over independent worlds of `--per-world` jobs (each world is one repository,
one storage, one reconciler), run in parallel processes. Each world runs under faults for a
while, then is healed and must settle: every job Succeeded, or Failed for its own reason.

    python bench/soak.py --quick                 # under a minute
    python bench/soak.py                         # 1,000 jobs
    python bench/soak.py --trace trace.json      # spot preemptions replayed from a trace
    python bench/soak.py --stateful 200          # plus 200 Hypothesis fault sequences

Prints a table, then one line: jobs=N completed=N violations=N duplicate_completions=N
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from adapters.sim import JobModel, PreemptionTrace, ProviderModel  # noqa: E402
from reconciler.sim.driver import Faults, JobPlan, ProviderPlan, SimConfig, Simulation  # noqa: E402


def world_config(seed: int, jobs: int, trace: dict[str, Any] | None, quick: bool) -> SimConfig:
    rng = random.Random(seed)
    spot = ProviderModel("spot", launch_delay_seconds=60.0, price_per_hour=0.4,
                         mtbf_seconds=(1800.0 if quick else 3600.0),
                         notice_seconds=30.0 if rng.random() < 0.5 else 0.0, api_error_rate=0.05,
                         api_timeout_rate=0.02, lost_observation_rate=0.05, zombie_rate=0.1,
                         zombie_return_seconds=900.0)
    if trace is not None:
        spot.trace = PreemptionTrace.from_json(trace)
        spot.mtbf_seconds = None
    notebook = ProviderModel("notebook", launch_delay_seconds=120.0, session_limit_seconds=3600.0,
                             mtbf_seconds=6 * 3600.0, api_slow_seconds=2.0, api_error_rate=0.1)
    rental = ProviderModel("rental", launch_delay_seconds=180.0, price_per_hour=0.8, mtbf_seconds=12 * 3600.0,
                           api_error_rate=0.02, capacity=max(2, jobs // 3))
    providers = [ProviderPlan(spot, concurrency=max(2, jobs // 2)),
                 ProviderPlan(notebook, concurrency=max(1, jobs // 4)),
                 ProviderPlan(rental, concurrency=max(2, jobs // 3))]
    plans = []
    lo, hi = (1200, 2400) if quick else (1800, 5400)
    for i in range(jobs):
        r = rng.random()
        if r < 0.03:
            model = JobModel(always_fails=True)
            plans.append(JobPlan(f"job-{seed}-{i}", target_steps=600, model=model, max_retries=2))
            continue
        model = JobModel(step_seconds=1.0, checkpoint_cost_seconds=rng.choice([10.0, 30.0, 60.0]),
                         restart_cost_seconds=rng.choice([30.0, 60.0, 120.0]),
                         error_rate_per_hour=0.5 if r < 0.10 else 0.0)
        plans.append(JobPlan(f"job-{seed}-{i}", target_steps=rng.randint(lo, hi), checkpoint_every=300,
                             model=model, max_retries=3,
                             providers=rng.choice([[], [], ["spot", "rental"], ["notebook", "spot"]])))
    faults = Faults(crash_rate=0.05, tick_storage_error_rate=0.01, worker_storage_error_rate=0.02,
                    slow_write_seconds=0.2, push_reject_rate=0.1, pull_error_rate=0.05, clock_jump_rate=0.02,
                    clock_jump_seconds=60.0)
    return SimConfig(providers=providers, jobs=plans, seed=seed, tick_seconds=120.0, faults=faults)


def run_world(args: tuple[int, int, dict[str, Any] | None, bool]) -> dict[str, Any]:
    seed, jobs, trace, quick = args
    logging.getLogger("reconciler").setLevel(logging.CRITICAL)
    config = world_config(seed, jobs, trace, quick)
    sim = Simulation(config)
    t0 = time.perf_counter()
    chaos_steps = 30 if quick else 40
    sim.run(chaos_steps)
    sim.heal()
    settled = sim.run_to_completion(2000)
    sim.run(3)
    sim.checker.check_final()
    fig = sim.figures()
    fig["settled"] = settled
    fig["lost"] = [x[4] for x in sim.cloud.interruptions]
    fig["delays"] = [d / config.tick_seconds for d in sim.cloud.relaunch_delays]
    fig["violation_text"] = sim.checker.violations[:3]
    fig["seconds"] = time.perf_counter() - t0
    fig["failed_own"] = sum(1 for s in sim.statuses().values() if s.phase.value == "Failed")
    sim.close()
    return fig


def run_stateful(examples: int) -> str:
    from hypothesis import HealthCheck, settings
    from hypothesis.stateful import run_state_machine_as_test

    from reconciler.sim.stateful import ChaosMachine

    logging.getLogger("reconciler").setLevel(logging.CRITICAL)
    run_state_machine_as_test(ChaosMachine, settings=settings(
        max_examples=examples, stateful_step_count=25, deadline=None, database=None,
        suppress_health_check=list(HealthCheck)))
    return f"{examples} random fault sequences: no invariant broken"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a small soak, under a minute")
    ap.add_argument("--jobs", type=int, default=None, help="jobs in all (default 1000, quick 24)")
    ap.add_argument("--per-world", type=int, default=None, help="jobs per simulated world (default 20, quick 12)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--trace", help='spot preemption trace JSON: {"gap_seconds": S, "data": [n0, n1, ...]}')
    ap.add_argument("--processes", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--stateful", type=int, default=0, help="also run this many Hypothesis fault sequences")
    a = ap.parse_args()
    jobs = a.jobs or (24 if a.quick else 1000)
    per = a.per_world or (12 if a.quick else 20)
    trace = None
    if a.trace:
        with open(a.trace) as fh:
            trace = json.load(fh)
        PreemptionTrace.from_json(trace)  # validate before forking
    tasks = []
    left = jobs
    i = 0
    while left > 0:
        n = min(per, left)
        tasks.append((a.seed * 10_000 + i, n, trace, a.quick))
        left -= n
        i += 1
    t0 = time.perf_counter()
    results = []
    with ProcessPoolExecutor(max_workers=a.processes) as pool:
        for r in pool.map(run_world, tasks):
            results.append(r)
            print(f"# world {len(results)}/{len(tasks)}: {r['completed']}/{r['jobs']} completed, "
                  f"{r['violations']} violations, {r['seconds']:.0f} s", file=sys.stderr, flush=True)
    wall = time.perf_counter() - t0
    total = {k: sum(r[k] for r in results) for k in (
        "jobs", "completed", "failed_own", "violations", "duplicate_completions", "interruptions", "crashes",
        "tick_exceptions", "zombies", "rejected_pushes", "storage_errors", "steps")}
    lost = [x for r in results for x in r["lost"]]
    delays = [x for r in results for x in r["delays"]]
    unsettled = sum(1 for r in results if not r["settled"])
    rows = [
        ("worlds (jobs each)", f"{len(results)} ({per})"),
        ("jobs", total["jobs"]),
        ("completed (Succeeded)", total["completed"]),
        ("failed for their own reason", total["failed_own"]),
        ("worlds not settled after healing", unsettled),
        ("invariant violations", total["violations"]),
        ("duplicate completions", total["duplicate_completions"]),
        ("ticks run (all worlds)", total["steps"]),
        ("reconciler crashes injected", total["crashes"]),
        ("ticks that raised (not injected)", total["tick_exceptions"]),
        ("interruptions (preempted, session end, zombie)", total["interruptions"]),
        ("zombies", total["zombies"]),
        ("rejected pushes", total["rejected_pushes"]),
        ("storage errors injected", total["storage_errors"]),
        ("work lost per interruption, mean (steps = s)", f"{sum(lost) / len(lost):.0f}" if lost else "0"),
        ("work lost per interruption, worst (steps = s)", max(lost) if lost else 0),
        ("relaunch delay after a death, mean (ticks)", f"{sum(delays) / len(delays):.2f}" if delays else "-"),
        ("relaunch delay after a death, worst (ticks)", f"{max(delays):.2f}" if delays else "-"),
        ("wall time (s)", f"{wall:.0f}"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"| {'chaos soak' + (' (trace)' if trace else ''):<{width}} | value |")
    print(f"|{'-' * (width + 2)}|-------|")
    for name, value in rows:
        print(f"| {name:<{width}} | {value} |")
    for r in results:
        for v in r["violation_text"]:
            print("violation:", v)
    if a.stateful:
        print(run_stateful(a.stateful))
    print(f"jobs={total['jobs']} completed={total['completed']} violations={total['violations']} "
          f"duplicate_completions={total['duplicate_completions']}")


if __name__ == "__main__":
    main()
