"""Scale: time per tick and memory against the number of jobs (10, 100, 1,000, 10,000), with
simulated providers, in-memory storage and git, so the figure is the loop's own cost.

Each size runs in its own process (for a clean peak RSS): one launching tick (every status is
new), then steady ticks with every job running. Reported as ratios against the 10-job run of
the same invocation, plus where the steady tick spends its time (cProfile of one tick at the
largest size up to 1,000).

    python bench/scale.py --quick          # 10, 100, 300
    python bench/scale.py                  # 10, 100, 1,000, 10,000 (10,000 takes several minutes)

Prints the table, then one line: tick_seconds_per_1000_jobs=X growth_exponent=Y
"""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import math
import os
import pstats
import resource
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def measure(n: int, steady: int, profile: bool) -> dict[str, Any]:
    from adapters.sim import JobModel, ProviderModel
    from reconciler.sim.driver import JobPlan, ProviderPlan, SimConfig, Simulation

    logging.getLogger("reconciler").setLevel(logging.CRITICAL)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    model = JobModel(step_seconds=1.0, checkpoint_cost_seconds=10.0, restart_cost_seconds=10.0,
                     checkpoint_interval_seconds=600.0)
    providers = [ProviderPlan(ProviderModel("spot", launch_delay_seconds=0.0, price_per_hour=0.1), concurrency=n),
                 ProviderPlan(ProviderModel("free", launch_delay_seconds=0.0), concurrency=n)]
    jobs = [JobPlan(f"job-{i:05d}", target_steps=10**7, model=model, checkpoint_every=600) for i in range(n)]
    # The invariant checker is on up to 1,000 jobs; above, it would cost more than the tick.
    sim = Simulation(SimConfig(providers=providers, jobs=jobs, tick_seconds=60.0, check=n <= 1000))
    # CPU time of Reconciler.tick() alone (the box is shared: wall time would measure the
    # neighbours); the simulated world's own work between ticks is not counted.
    sim.step()
    launch = sim.last_tick_cpu
    sim.step()  # the attempts become Running
    sim.step()  # and the loop has seen their heartbeats once: from here on nothing changes
    times = []
    walls = []
    for _ in range(steady):
        w = time.perf_counter()
        sim.step()
        times.append(sim.last_tick_cpu)
        walls.append(time.perf_counter() - w)
    out: dict[str, Any] = {
        "n": n, "launch": launch, "tick": sum(times) / len(times), "wall": sum(walls) / len(walls),
        "running": len(sim.cloud.live),
        "violations": len(sim.checker.violations),
        "rss_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_rss) / 1024.0,
    }
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        sim.reconciler.tick()
        prof.disable()
        stats = pstats.Stats(prof)
        total = max(1e-9, sum(v[3] for k, v in stats.stats.items() if k[2] == "tick"))  # type: ignore[attr-defined]
        share = {}
        for label, (file_part, func) in {
            "parse status YAML": ("status/models.py", "parse_status"),
            "render status YAML": ("status/models.py", "render_status"),
            "parse manifests": ("desired/parse.py", "parse_desired"),
            "read run folders": ("reconciler/daemon/loop.py", "read_run"),
            "plan (mostly deep copies of every status)": ("reconciler/planner/plan.py", "plan"),
            "compare and commit statuses": ("reconciler/daemon/loop.py", "_commit"),
            "observe providers": ("adapters/sim.py", "observe"),
        }.items():
            share[label] = sum(v[3] for k, v in stats.stats.items()  # type: ignore[attr-defined]
                               if k[0].endswith(file_part) and k[2] == func) / total
        out["profile"] = share
    sim.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10, 100 and 300 jobs")
    ap.add_argument("--sizes", help="comma-separated job counts (overrides --quick)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--steady", type=int, default=2)
    ap.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        print(json.dumps(measure(a.child, a.steady, a.profile)))
        return
    sizes = [int(x) for x in a.sizes.split(",")] if a.sizes else ([10, 100, 300] if a.quick else
                                                                  [10, 100, 1000, 10000])
    rows = []
    profiled = max(n for n in sizes if n <= 1000) if min(sizes) <= 1000 else sizes[0]
    for n in sizes:
        steady = 3 if n <= 1000 else 2
        cmd = [sys.executable, __file__, "--child", str(n), "--steady", str(steady)]
        if n == profiled:
            cmd.append("--profile")
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"# {n} jobs: launching tick {r['launch']:.2f} s, steady tick {r['tick']:.3f} s CPU",
              file=sys.stderr, flush=True)
    base = rows[0]
    print("| jobs | launching tick, CPU s | steady tick, CPU s | per job, ms | tick ratio vs first | jobs ratio "
          "| steady step, wall s | peak RSS growth, MiB | violations |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']:,} | {r['launch']:.2f} | {r['tick']:.3f} | {1000 * r['tick'] / r['n']:.1f} "
              f"| {r['tick'] / base['tick']:.1f}x | {r['n'] // base['n']}x | {r['wall']:.2f} | {r['rss_mb']:.0f} "
              f"| {r['violations']} |")
    last = rows[-1]
    prof = next((r for r in rows if "profile" in r), None)
    if prof is not None:
        print()
        print(f"Where a steady tick of {prof['n']:,} jobs spends its time (cProfile, share of the tick):")
        print()
        print("| part | share |")
        print("|---|---|")
        for label, share in prof["profile"].items():
            print(f"| {label} | {100 * share:.0f}% |")
    # growth exponent: slope of log(tick) against log(jobs) over the two largest sizes
    if len(rows) >= 2:
        a1, a2 = rows[-2], rows[-1]
        k = math.log(a2["tick"] / a1["tick"]) / math.log(a2["n"] / a1["n"])
    else:
        k = float("nan")
    per1000 = next((r["tick"] for r in rows if r["n"] == 1000), last["tick"] * 1000 / last["n"])
    print()
    print(f"tick_seconds_per_1000_jobs={per1000:.2f} growth_exponent={k:.2f}")


if __name__ == "__main__":
    main()
