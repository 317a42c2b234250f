"""What the forecast's spread costs `plan`: CPU seconds of reconciler.planner.outlook.spread.job_spread
for every job of a pull request, as `plan --base` calls it (each job reads every job's status).

Each job ran on one spot provider whose availability follows one of bench/forecast.py's synthetic
traces (seeds 1, 2, ...); its status holds the attempts of the trace's past 48 h, as at a
forecast's cutoff. CPU time (the box is shared), the least of --rounds rounds.

    python bench/spread_cost.py                 # 50 jobs, 400 futures each, 5 rounds
    python bench/spread_cost.py --jobs 3 --rounds 1 --futures 50   # the test's

Last line: spread_cpu_seconds=X jobs=N attempts=M futures=F
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import forecast  # noqa: E402 - bench/forecast.py: its traces, histories, job and provider

from reconciler.planner.outlook.spread import job_spread  # noqa: E402
from status.models import JobStatus, Phase, Progress  # noqa: E402

CUTOFF = 200_000.0  # s into each trace: past its first 48 h


def statuses(jobs: int) -> list[JobStatus]:
    out = []
    for i in range(jobs):
        trace = forecast.Trace.load(f"{forecast.SYNTHETIC}{i + 1}")
        attempts, step, _ = forecast.history(trace, CUTOFF)
        attempts = [a.model_copy(update={"worker": f"j{i}-{a.worker}"}) for a in attempts]
        out.append(JobStatus(job=f"j{i}", phase=Phase.RUNNING, run_id=f"r{i}", attempts=attempts,
                             progress=Progress(step=step, target=step + 8 * 3600, seen_at=CUTOFF)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--futures", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    sts = statuses(a.jobs)
    jobs = [forecast.job(st.job, st.progress.target or 0) for st in sts]
    providers = {"spot": forecast.provider()}
    best = float("inf")
    for _ in range(a.rounds):
        t = time.process_time()
        spreads = [job_spread(job, st, providers, sts, CUTOFF, futures=a.futures) for job, st in zip(jobs, sts,
                                                                                                     strict=True)]
        best = min(best, time.process_time() - t)
    missing = [sp.job for sp in spreads if sp.spread is None]
    if missing:
        raise SystemExit(f"no spread for {', '.join(missing)}")
    print(f"spread_cpu_seconds={best:.3f} jobs={a.jobs} attempts={sum(len(st.attempts) for st in sts)} "
          f"futures={a.futures}")


if __name__ == "__main__":
    main()
