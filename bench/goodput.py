"""Goodput against the limit: the useful fraction of paid compute that the whole system achieves
(real tick, simulated spot provider with exponential preemptions, workers choosing their
checkpoint interval with the worker SDK's own policy, reconciler.checkpoint_policy.IntervalPolicy,
from the MTBF the planner measured and passed at launch as RECONCILER_MTBF_SECONDS) against
the Young/Daly optimum for the same C, R and failure rate, and against a naive fixed 30-minute
interval run through the same simulation.

Useful fraction = compute the jobs needed / machine time the provider billed (launch delay,
restore, checkpoints and recomputed work included). R is the whole restart overhead: the
provider's launch delay plus the worker's restore. Time between a death and the next launch is
not billed and is reported separately (it depends on the tick interval, not on the policy).

Second table: sessions with a known end (12 h notebook limits, RECONCILER_DEADLINE): work lost
at the limit, with and without the deadline.

    python bench/goodput.py --quick
    python bench/goodput.py --trace trace.json     # also replay a preemption trace

Prints the tables, then one line: goodput_vs_optimum=X (the worst of the three MTBFs).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from adapters.sim import JobModel, PreemptionTrace, ProviderModel  # noqa: E402
from reconciler.checkpoint_policy import (  # noqa: E402
    daly_interval,
    expected_efficiency,
    optimal_interval,
)
from reconciler.sim.driver import JobPlan, ProviderPlan, SimConfig, Simulation  # noqa: E402

C = 60.0  # checkpoint cost, s
RESTORE = 60.0  # worker restore, s
LAUNCH = 60.0  # provider launch delay, s
R = LAUNCH + RESTORE


def simulate(args: tuple[str, float | None, str, int, float, dict[str, Any] | None]) -> dict[str, Any]:
    """One world: `jobs` jobs of `hours` compute each on one spot provider."""
    label, mtbf, policy, jobs, hours, trace = args
    logging.getLogger("reconciler").setLevel(logging.CRITICAL)
    spot = ProviderModel("spot", launch_delay_seconds=LAUNCH, price_per_hour=1.0, mtbf_seconds=mtbf)
    if trace is not None:
        spot.trace = PreemptionTrace.from_json(trace)
    model = JobModel(step_seconds=1.0, checkpoint_cost_seconds=C, restart_cost_seconds=RESTORE)
    target = int(hours * 3600)
    plans = [JobPlan(f"g-{i}", target_steps=target, model=model, max_retries=0) for i in range(jobs)]
    # Billed time does not depend on the tick interval (a machine is billed from launch to death),
    # so the tick is a twelfth of the MTBF to keep the run short; only the wall-clock column moves.
    tick = max(300.0, (mtbf or 3600.0) / 12.0)
    # interruptible: the planner's prior for this provider is one interruption per 6 h until measured.
    config = SimConfig(providers=[ProviderPlan(spot, concurrency=jobs, interruptible=True)], jobs=plans,
                       seed=int(mtbf or 1) % 10_000, tick_seconds=tick, policy=policy)
    sim = Simulation(config)
    t0 = time.perf_counter()
    settled = sim.run_to_completion(int(hours * 3600 / tick * 20) + 200)
    sim.checker.check_final()
    billed = sum(w.ledger.billed_seconds for w in sim.cloud.workers.values())
    useful = sum(p.target_steps * p.model.step_seconds for p in plans
                 if sim.statuses().get(p.name) and sim.statuses()[p.name].phase.value == "Succeeded")
    intervals = [w.interval for w in sim.cloud.workers.values()]
    failures = sum(1 for w in sim.cloud.workers.values() if w.ledger.end_reason == "preempted")
    wall = max(1.0, sim.phys - sim.cloud.t0)
    out = {
        "label": label, "mtbf": mtbf, "policy": policy, "settled": settled, "useful": useful, "billed": billed,
        "fraction": useful / billed if billed else 0.0, "failures": failures,
        "interval": sum(intervals) / len(intervals) if intervals else 0.0,
        "wall_fraction": useful / (wall * jobs), "violations": len(sim.checker.violations),
        "seconds": time.perf_counter() - t0,
    }
    sim.close()
    return out


def sessions(args: tuple[bool, float, int]) -> dict[str, Any]:
    """A 12 h notebook limit; the worker is told RECONCILER_DEADLINE or not."""
    told, hours, jobs = args
    logging.getLogger("reconciler").setLevel(logging.CRITICAL)
    nb = ProviderModel("notebook", launch_delay_seconds=LAUNCH, session_limit_seconds=12 * 3600.0, tell_deadline=told)
    model = JobModel(step_seconds=1.0, checkpoint_cost_seconds=C, restart_cost_seconds=RESTORE,
                     checkpoint_interval_seconds=1800.0)
    plans = [JobPlan(f"s-{i}", target_steps=int(hours * 3600), model=model, max_retries=0) for i in range(jobs)]
    config = SimConfig(providers=[ProviderPlan(nb, concurrency=jobs)], jobs=plans, seed=7, tick_seconds=1800.0)
    sim = Simulation(config)
    sim.run_to_completion(int(hours * 3600 / 1800 * 3) + 200)
    ends = [w for w in sim.cloud.workers.values() if w.ledger.end_reason in ("session-limit", "interrupted")]
    lost = sum(w.ledger.lost_steps or 0 for w in ends)
    computed = sum(w.ledger.steps_computed for w in ends)
    unused = sum(max(0.0, w.session_end_at - (w.ledger.ended or w.session_end_at)) for w in ends)
    session_time = sum(w.ledger.running_seconds for w in ends)
    out = {"told": told, "sessions": len(ends), "lost_fraction": lost / computed if computed else 0.0,
           "unused_fraction": unused / (session_time + unused) if session_time else 0.0,
           "violations": len(sim.checker.violations),
           "lost_mean": lost / len(ends) if ends else 0.0}
    sim.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer failures per point, under a minute")
    ap.add_argument("--trace", help='preemption trace JSON: {"gap_seconds": S, "data": [n0, n1, ...]}')
    ap.add_argument("--processes", type=int, default=min(2, os.cpu_count() or 1))
    a = ap.parse_args()
    trace = None
    if a.trace:
        with open(a.trace) as fh:
            trace = json.load(fh)
        PreemptionTrace.from_json(trace)
    mtbfs = [("30 min", 1800.0), ("3 h", 3 * 3600.0), ("12 h", 12 * 3600.0)]
    # Enough compute per point for many failures: failures ~ jobs * hours / mtbf.
    failures_wanted = 30 if a.quick else 150
    jobs = 4 if a.quick else 8
    tasks = []
    for label, m in mtbfs:
        hours = max(2.0, failures_wanted * m / 3600.0 / jobs)
        for policy in ("young-daly", "fixed-30m"):
            tasks.append((label, m, policy, jobs, hours, None))
    if trace is not None:
        tasks.append(("trace", None, "young-daly", jobs, 24.0 if a.quick else 96.0, trace))
        tasks.append(("trace", None, "fixed-30m", jobs, 24.0 if a.quick else 96.0, trace))
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=a.processes) as pool:
        results = list(pool.map(simulate, tasks))
        sess = list(pool.map(sessions, [(True, 36.0 if a.quick else 72.0, 2), (False, 36.0 if a.quick else 72.0, 2)]))
    by = {(r["label"], r["policy"]): r for r in results}
    print(f"C = {C:.0f} s checkpoint, R = {R:.0f} s restart (launch {LAUNCH:.0f} s + restore {RESTORE:.0f} s); "
          "useful fraction = needed compute / billed machine time")
    print()
    print("| MTBF | preemptions | interval used (s) | Daly interval (s) | optimum | ours | ours / optimum "
          "| fixed 30 min | fixed / optimum | ours, wall clock (tick = MTBF/12) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    worst = 1.0
    for label, m in mtbfs:
        ours, naive = by[(label, "young-daly")], by[(label, "fixed-30m")]
        opt = expected_efficiency(optimal_interval(C, R, m), C, R, m)
        ratio = ours["fraction"] / opt
        worst = min(worst, ratio)
        print(f"| {label} | {ours['failures']} | {ours['interval']:.0f} | {daly_interval(C, m):.0f} | {opt:.3f} "
              f"| {ours['fraction']:.3f} | {ratio:.3f} | {naive['fraction']:.3f} | {naive['fraction'] / opt:.3f} "
              f"| {ours['wall_fraction']:.3f} |")
    if trace is not None:
        ours, naive = by[("trace", "young-daly")], by[("trace", "fixed-30m")]
        print(f"| trace | {ours['failures']} | {ours['interval']:.0f} | - | - | {ours['fraction']:.3f} | - "
              f"| {naive['fraction']:.3f} | - | {ours['wall_fraction']:.3f} |")
    print()
    print("| 12 h session limit | sessions ended | work lost at the limit | session time left unused |")
    print("|---|---|---|---|")
    for s in sess:
        name = "RECONCILER_DEADLINE told" if s["told"] else "deadline not told"
        print(f"| {name} | {s['sessions']} | {100 * s['lost_fraction']:.2f}% | {100 * s['unused_fraction']:.2f}% |")
    ours_bad = sum(r["violations"] for r in results if r["policy"] == "young-daly")
    fixed_bad = sum(r["violations"] for r in results if r["policy"] == "fixed-30m")
    sess_bad = sum(s["violations"] for s in sess)
    unsettled = sum(1 for r in results if not r["settled"])
    print()
    print(f"invariant violations: {ours_bad} with ours, {fixed_bad} with fixed 30 min, {sess_bad} in sessions; "
          f"runs not settled: {unsettled}; wall time {time.perf_counter() - t0:.0f} s")
    print(f"goodput_vs_optimum={worst:.3f}")


if __name__ == "__main__":
    main()
