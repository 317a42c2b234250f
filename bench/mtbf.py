"""The failure rate, learned: how much of the billed machine time is useful when workers checkpoint
at the SDK's interval for the MTBF the planner learns and hands them (RECONCILER_MTBF_SECONDS,
reconciler.planner.outlook.reliability), against the same SDK policy told the provider's true MTBF (Daly's
interval with the true rate), on one interruptible provider that fails every minute, then every
hour.

Both arms run the real `Reconciler.tick()` in simulated time (reconciler/sim) with the same seed,
so they see the same launches and the same preemptions (common random numbers): only the interval
the workers choose differs. C = 5 s per checkpoint, R = 15 s (10 s launch + 5 s restore); the
provider's prior is 6 h (interruptible), so the first workers of the minute phase are told 6 h,
and those of the hour phase start from what the minute phase taught.

Useful fraction = durable progress the workers gained (steps checkpointed beyond what they
restored) / machine time billed (launch to death), both counted within the phase (a worker alive
at the switch counts in each phase for its time there); "after the 10th" counts only the workers
launched after the phase's tenth interruption. The goal: the
learned rate reaches 0.95 of the true rate's useful fraction within ten interruptions.

    python bench/mtbf.py --quick       # 4 jobs: 30 min failing every minute, then 8 h every hour
    python bench/mtbf.py               # 4 jobs: 1 h, then 30 h (about 2 minutes on 2 cores)

Prints the tables, then one line: learned_vs_true_after_10=X (the worse phase) and the figures
each phase measured.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from adapters.sim import JobModel, ProviderModel, SimWorker  # noqa: E402
from reconciler.checkpoint_policy import daly_interval, expected_efficiency  # noqa: E402
from reconciler.sim.driver import JobPlan, ProviderPlan, SimConfig, Simulation  # noqa: E402

C = 5.0  # checkpoint cost, s
RESTORE = 5.0
LAUNCH = 10.0
R = LAUNCH + RESTORE
GOAL = 0.95
AFTER = 10  # interruptions into a phase after which the goal applies


@dataclass(frozen=True)
class Phase:
    label: str
    mtbf: float  # the provider's true mean time between preemptions of one worker
    seconds: float  # how long the phase lasts
    tick: float  # the reconciler's tick during the phase (no effect on billed time)


def gained(w: SimWorker) -> float:
    """Steps the worker has made durable beyond what it restored (computed minus lost, or, while it
    lives, minus what it would lose now)."""
    lost = w.ledger.lost_steps if w.ledger.lost_steps is not None else max(0, int(w.step) - w.durable)
    return max(0.0, w.ledger.steps_computed - lost)


def world(args: tuple[str, int, int, tuple[Phase, ...]]) -> dict[str, Any]:
    """One arm: `jobs` endless jobs on the provider through every phase; per phase, the workers'
    useful and billed seconds within it, and the MTBF each worker was told."""
    policy, jobs, seed, phases = args
    logging.getLogger("reconciler").setLevel(logging.CRITICAL)
    spot = ProviderModel("spot", launch_delay_seconds=LAUNCH, price_per_hour=1.0, mtbf_seconds=phases[0].mtbf)
    model = JobModel(step_seconds=1.0, checkpoint_cost_seconds=C, restart_cost_seconds=RESTORE)
    plans = [JobPlan(f"m-{i}", target_steps=10**9, model=model, max_retries=0) for i in range(jobs)]
    config = SimConfig(providers=[ProviderPlan(spot, concurrency=jobs, interruptible=True)], jobs=plans,
                       seed=seed, tick_seconds=phases[0].tick, policy=policy)
    sim = Simulation(config)
    t0 = time.perf_counter()
    bounds, marks = [], [_mark(sim)]
    for ph in phases:
        begin = sim.phys
        spot.mtbf_seconds = ph.mtbf
        for w in sim.cloud.live.values():  # exponential: the rest of a life is drawn afresh
            if math.isfinite(w.preempt_at):
                w.preempt_at = sim.phys + sim.cloud.rng.expovariate(1.0 / ph.mtbf)
        sim.config.tick_seconds = ph.tick
        sim.run(math.ceil(ph.seconds / ph.tick))
        sim.cloud.advance(sim.phys)
        bounds.append((begin, sim.phys))
        marks.append(_mark(sim))  # a worker that lives on into the next phase counts there from now
    out = {"policy": policy, "phases": [], "violations": len(sim.checker.violations),
           "seconds": time.perf_counter() - t0}
    for k, ((begin, end), ph) in enumerate(zip(bounds, phases, strict=True)):
        hits = sorted(t for *_, t, _lost, _s in sim.cloud.interruptions if begin <= t < end)
        tenth = hits[AFTER - 1] if len(hits) >= AFTER else end
        workers = sorted((w for w in sim.cloud.workers.values() if begin <= w.launched < end), key=lambda w: w.launched)
        told = [(w.launched, float(w.spec.env.get("RECONCILER_MTBF_SECONDS", "nan")), w.interval) for w in workers]
        within = {wid: _minus(v, marks[k].get(wid, (0.0, 0.0))) for wid, v in marks[k + 1].items()}
        late = {wid for wid, w in sim.cloud.workers.items() if tenth <= w.launched < end}
        out["phases"].append({
            "label": ph.label, "interruptions": len(hits),
            "fraction": _fraction(within.values()),
            "fraction_after": _fraction(v for wid, v in within.items() if wid in late),
            "told_after": {k: _told_after(told, hits, k) for k in (1, 5, AFTER)},
            "interval_after": _interval_after(told, tenth),
        })
    sim.close()
    return out


def _mark(sim: Simulation) -> dict[str, tuple[float, float]]:
    """Every worker's billed and useful seconds so far."""
    return {wid: (w.ledger.billed_seconds, gained(w) * w.model.step_seconds) for wid, w in sim.cloud.workers.items()}


def _minus(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    return a[0] - b[0], a[1] - b[1]


def _fraction(billed_useful: Iterable[tuple[float, float]]) -> float:
    pairs = list(billed_useful)
    billed = sum(b for b, _ in pairs)
    return sum(u for _, u in pairs) / billed if billed else 0.0


def _told_after(told: list[tuple[float, float, float]], hits: list[float], k: int) -> float | None:
    """The MTBF told to the first worker launched after the phase's k-th interruption."""
    if len(hits) < k:
        return None
    return next((m for launched, m, _ in told if launched >= hits[k - 1]), None)


def _interval_after(told: list[tuple[float, float, float]], tenth: float) -> float | None:
    late = [interval for launched, _, interval in told if launched >= tenth]
    return sum(late) / len(late) if late else None


def _seconds(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:,.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter phases: under a minute")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--processes", type=int, default=min(2, os.cpu_count() or 1))
    a = ap.parse_args()
    jobs = 4
    phases = (Phase("every minute", 60.0, (0.5 if a.quick else 1.0) * 3600, 15.0),
              Phase("every hour", 3600.0, (8.0 if a.quick else 30.0) * 3600, 60.0))
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=a.processes) as pool:
        learned, true = pool.map(world, [(p, jobs, a.seed, phases) for p in ("young-daly", "true-rate")])
    print(f"C = {C:.0f} s checkpoint, R = {R:.0f} s restart (launch {LAUNCH:.0f} s + restore {RESTORE:.0f} s), "
          f"{jobs} jobs; useful fraction = durable progress gained / billed machine time")
    print()
    print("| provider fails | interruptions | told after 1st / 5th / 10th (s) | Daly interval, true rate (s) "
          "| interval used after 10th (s) | learned, all | true rate, all | learned, after 10th "
          "| true rate, after 10th | learned / true, after 10th | expected at the true rate |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ratios, figures = [], []
    for ph, mine, best in zip(phases, learned["phases"], true["phases"], strict=True):
        told = " / ".join(_seconds(mine["told_after"][k]) for k in (1, 5, AFTER))
        ratio = mine["fraction_after"] / best["fraction_after"] if best["fraction_after"] else 0.0
        ratios.append(ratio)
        tau = daly_interval(C, ph.mtbf)
        figures.append(f"{ph.label.replace(' ', '_')}={ratio:.3f}")
        print(f"| {ph.label} | {mine['interruptions']} | {told} | {tau:.0f} | {_seconds(mine['interval_after'])} "
              f"| {mine['fraction']:.3f} | {best['fraction']:.3f} | {mine['fraction_after']:.3f} "
              f"| {best['fraction_after']:.3f} | {ratio:.3f} | {expected_efficiency(tau, C, R, ph.mtbf):.3f} |")
    print()
    print(f"goal: learned / true rate >= {GOAL} after the {AFTER}th interruption of each phase; "
          f"invariant violations: {learned['violations']} learned, {true['violations']} true rate; "
          f"wall time {time.perf_counter() - t0:.0f} s")
    print(f"learned_vs_true_after_10={min(ratios):.3f} " + " ".join(figures))


if __name__ == "__main__":
    main()
