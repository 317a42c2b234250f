"""Is the forecast's spread honest? P50 and P90 of the time to finish, checked against outcomes the
forecast did not see.

A job does W hours of work (1 step a second, a checkpoint every 600 steps) on a spot provider
($1/h; a move or relaunch costs a 180 s changeover, billed). At a cutoff the forecast is made the
way `plan` makes it: a status holds the attempts the job had until then (from the trace's past:
one attempt per available period, the work since the last checkpoint lost at each end, the wait
until the next one recorded), and reconciler.planner.outlook.spread.job_spread turns it into 400
futures. The outcome is the same job's rest replayed on what the trace did after the cutoff.

- traces: the public skypilot-org/spot-traces, read from a clone (--trace-dir, or $SPOT_TRACES; the
  repository states no license, so its files are not copied here). Tuned on
  availability/1-node/aws-10-26-2022 and preemption/1-node/aws-04-22-2023; checked on
  availability/1-node/aws-02-15-2023, kept aside. A trace is replayed in a loop past its end.
  Without a clone, synthetic traces (exponential available and unavailable periods, means 3 h and
  2 h, one a seed: seeds 1-12 to tune, 101-112 kept aside) stand in, so that the bench and its
  test run anywhere.
- simulator, known rates: the real loop (Reconciler.tick, reconciler/sim) in simulated time, one
  spot provider ($1/h, 120 s launch delay, 60 s restore) whose machines are preempted at a known
  rate (exponential, MTBF 2 h, 6 h and 24 h), one job of 8 h of work (a checkpoint every 600 steps,
  10 s each), ticks of 300 s. After 3-5 h (drawn per seed) the forecast is made from the status the loop recorded in
  git, as `plan` makes it; the same simulation then runs on to the job's completion: the outcome
  (time from the cutoff to the completion, and what the provider billed for the whole run). One
  outcome a seed, --seeds seeds a rate.

Coverage: the share of outcomes at or under each quantile (goal: about 0.5 and 0.9, P90 within
0.85-0.97), of the time to finish and of the cost. The line before the last is over the simulator
set (the status as recorded); the last line is over the outcomes kept aside (the checked traces):

    git clone https://github.com/skypilot-org/spot-traces ~/spot-traces
    python bench/forecast.py --quick --trace-dir ~/spot-traces   # W = 8 h, 10 cutoffs a trace, 10 seeds, under a minute
    python bench/forecast.py --trace-dir ~/spot-traces           # W = 8 h and 24 h, 20 cutoffs a trace, 40 seeds
    python bench/forecast.py --quick --only-check --traces 1 --seeds 1   # the smallest case (the test's)
    python bench/forecast.py --quick --by-state   # each trace set also split: a machine running, or waiting

    ... a markdown table ...
    simulator: coverage_p50=… coverage_p90=…
    coverage_p50=… coverage_p90=…
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import yaml  # noqa: E402

from desired.models import Job, Provider  # noqa: E402
from reconciler.planner.outlook.forecast import open_cost  # noqa: E402
from reconciler.planner.outlook.spread import job_spread  # noqa: E402
from status.models import Attempt, JobStatus, Outcome, Phase, Progress  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TRACES_ENV = "SPOT_TRACES"  # a clone of github.com/skypilot-org/spot-traces (--trace-dir sets it)
SYNTHETIC = "synthetic:"
SYNTHETIC_TUNE = tuple(f"{SYNTHETIC}{seed}" for seed in range(1, 13))
SYNTHETIC_CHECK = tuple(f"{SYNTHETIC}{seed}" for seed in range(101, 113))
TUNE = ("availability/1-node/aws-10-26-2022/us-west-2a_v100_1.json",
        "availability/1-node/aws-10-26-2022/us-west-2b_v100_1.json",
        "availability/1-node/aws-10-26-2022/us-west-2a_k80_1.json",
        "availability/1-node/aws-10-26-2022/us-west-2b_k80_8.json",
        "preemption/1-node/aws-04-22-2023/us-west-2b_v100_1.json",
        "preemption/1-node/aws-04-22-2023/us-east-1f_v100_1.json")
CHECK = ("availability/1-node/aws-02-15-2023/us-east-1f_v100_1.json",
         "availability/1-node/aws-02-15-2023/us-east-2a_v100_1.json",
         "availability/1-node/aws-02-15-2023/us-west-2b_v100_1.json")
CHANGEOVER = 180.0  # s, launch and restore, billed
CKPT = 600  # steps (= seconds of work) between checkpoints
PRICE = 1.0  # $/h
HISTORY = 48 * 3600.0  # the trace's past a status holds at the cutoff
H = 3600.0


def provider() -> Provider:
    spec = {"price_per_hour": PRICE, "settings": {"type": "sim", "interruptible": True}}
    return Provider.model_validate({"apiVersion": "reconciler.dev/v1", "kind": "Provider",
                                    "metadata": {"name": "spot"}, "spec": spec})


def job(name: str, target: int) -> Job:
    return Job.model_validate(yaml.safe_load(yaml.safe_dump({
        "apiVersion": "reconciler.dev/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"command": ["python", "train.py"], "target_steps": target, "checkpoint_every": CKPT,
                 "placement": {"providers": ["spot"]}}})))


# ---- real traces ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trace:
    name: str
    gap: float
    up: tuple[bool, ...]  # one worker can run through each gap

    @classmethod
    def load(cls, rel: str) -> Trace:
        """A file of the spot-traces clone SPOT_TRACES names, or `synthetic:<seed>`."""
        if rel.startswith(SYNTHETIC):
            return cls.synthetic(rel, int(rel.removeprefix(SYNTHETIC)))
        with open(os.path.join(os.environ[TRACES_ENV], rel)) as fh:
            obj = json.load(fh)
        gap = float(obj.get("metadata", obj).get("gap_seconds"))
        return cls(rel, gap, tuple(int(x) >= 1 for x in obj["data"]))

    @classmethod
    def synthetic(cls, rel: str, seed: int, gap: float = 300.0, days: float = 30.0) -> Trace:
        """Available and unavailable periods in turn, exponential durations (means 3 h and 2 h)."""
        rng = random.Random(seed)
        up, n = rng.random() < 0.6, int(days * 24 * H / gap)
        data: list[bool] = []
        while len(data) < n:
            data += [up] * max(1, round(rng.expovariate(1.0 / ((3 if up else 2) * H)) / gap))
            up = not up
        return cls(rel, gap, tuple(data[:n]))

    @property
    def seconds(self) -> float:
        return self.gap * len(self.up)

    def periods(self, start: float, end: float) -> list[tuple[float, float]]:
        """Available periods overlapping [start, end), clipped to it; the trace loops past its end."""
        out: list[tuple[float, float]] = []
        k = int(math.floor(start / self.gap))
        while k * self.gap < end:
            if self.up[k % len(self.up)]:
                s, e = max(start, k * self.gap), min(end, (k + 1) * self.gap)
                if out and out[-1][1] == s:
                    out[-1] = (out[-1][0], e)
                else:
                    out.append((s, e))
            k += 1
        return out


def history(trace: Trace, t0: float) -> tuple[list[Attempt], int, int]:
    """The attempts a status would hold at `t0` for a job that ran on the trace before it (one per
    available period; the last is open when the trace is available at `t0`), its durable step,
    and the step the live attempt has reached (its heartbeat's; the durable step without one)."""
    attempts, step, reached = [], 0, 0
    periods = trace.periods(max(0.0, t0 - HISTORY), t0)
    for i, (s, e) in enumerate(periods):
        worked = max(0.0, e - s - CHANGEOVER)
        durable = int(worked // CKPT) * CKPT
        live = e == t0 and trace.up[int(t0 // trace.gap) % len(trace.up)]
        beat = s + CHANGEOVER if e - s > CHANGEOVER else None
        attempts.append(Attempt(
            epoch=i + 1, provider="spot", worker=f"w{i + 1}", started=s, first_beat=beat,
            first_beat_step=step if beat is not None else None, step_start=step,
            ended=None if live else e, outcome=None if live else Outcome.INTERRUPTION,
            step_end=None if live else step + durable, steps_lost=0 if live else int(worked - durable)))
        reached = step + int(worked) if live else step + durable
        step += durable
    return attempts, step, reached


def replay(trace: Trace, t0: float, work: float, live_since: float | None, unsaved: float = 0.0) -> tuple[float, float]:
    """Seconds from `t0` until `work` seconds of work past the durable step are done on what the
    trace did after `t0`, and what they cost; `live_since`: the live attempt's first heartbeat (no
    changeover to pay), `unsaved`: the work it has done since its last checkpoint."""
    left, cost, horizon = work, 0.0, t0
    while True:
        start = horizon
        horizon += 20 * work
        for s, e in trace.periods(start, horizon):
            live = live_since is not None and s == t0
            begin = max(s, live_since) if live and live_since is not None else s + CHANGEOVER
            billed_from = t0 if live else s
            ahead = unsaved if live else 0.0  # work done before `begin` that the attempt has not saved
            if begin >= e:
                cost += (e - billed_from) / H * PRICE
                continue
            if e - begin >= left - ahead:
                cost += (begin + left - ahead - billed_from) / H * PRICE
                return begin + left - ahead - t0, cost
            left -= (e - begin + ahead) // CKPT * CKPT
            cost += (e - billed_from) / H * PRICE


def trace_case(args: tuple[str, float, float, int]) -> dict[str, Any]:
    """One cutoff of one trace: the forecast from its past (the status as a tick at the cutoff
    writes it: the durable step, and the live worker's heartbeat step seen with it), the outcome
    from its future."""
    rel, t0, hours, futures = args
    trace = Trace.load(rel)
    attempts, step, reached = history(trace, t0)
    live = attempts[-1] if attempts and attempts[-1].open else None
    target = step + int(hours * H)
    the_job = job("train", target)
    st = JobStatus(job="train", phase=Phase.RUNNING, run_id=f"{rel}@{t0:.0f}", attempts=attempts,
                   progress=Progress(step=step, target=target, seen_at=t0,
                                     heartbeat_step=reached if live is not None else None))
    sp = job_spread(the_job, st, {"spot": provider()}, [st], t0, futures=futures)
    seconds, cost = replay(trace, t0, hours * H, live.first_beat if live is not None else None, reached - step)
    # The forecast's cost is the whole run's, spent included (the live attempt's time before the
    # cutoff): so is the outcome's.
    return {**_row(rel, hours, sp, seconds, open_cost(st, t0, {"spot": PRICE}) + cost),
            "state": "running" if live is not None else "waiting"}


def _row(where: str, hours: float, sp: Any, seconds: float, cost: float) -> dict[str, Any]:
    s = sp.spread
    if s is None:
        return {"where": where, "hours": hours, "skipped": sp.note}
    return {"where": where, "hours": hours, "p50": s.seconds[0], "p90": s.seconds[1], "c50": s.cost_usd[0],
            "c90": s.cost_usd[1], "outcome": seconds, "cost": cost}


def trace_tasks(files: Sequence[str], hours: Sequence[float], cutoffs: int, futures: int) -> list[tuple]:
    """`cutoffs` cutoffs per trace, evenly spread after the first HISTORY."""
    tasks = []
    for rel in files:
        span = Trace.load(rel).seconds - HISTORY
        for i in range(cutoffs):
            t0 = HISTORY + span * (i + 0.5) / cutoffs
            tasks += [(rel, math.floor(t0), h, futures) for h in hours]
    return tasks


# ---- the simulator under known rates --------------------------------------------------------------


SIM_MTBF_HOURS = (2.0, 6.0, 24.0)  # the spot provider's true mean time between preemptions
SIM_HOURS = 8.0  # W: the job's work
SIM_CUTOFF_HOURS = 4.0  # of simulated time: the forecast is made here, from the status recorded so far
SIM_CUTOFF_JITTER_HOURS = 1.0  # ... give or take up to this much, drawn per seed
SIM_TICK = 300.0  # s between ticks
SIM_LAUNCH = 120.0  # s, the provider's launch delay (and 60 s of restore: the changeover)
SIM_CASES = "simulator, known rates"


def sim_case(args: tuple[float, int, int]) -> dict[str, Any]:
    """One seed of one known rate: the real loop (Reconciler.tick) in simulated time until the
    cutoff, the forecast from the status it recorded in git (job_spread, called as `plan` calls it),
    then the same simulation on to the end: the time the worker wrote its completion, and what the
    provider billed for the whole run."""
    from adapters.sim import JobModel, ProviderModel
    from desired.parse import parse_desired
    from reconciler.sim.driver import JobPlan, ProviderPlan, SimConfig, Simulation

    mtbf_h, seed, futures = args
    logging.getLogger("reconciler").setLevel(logging.CRITICAL)
    spot = ProviderModel("spot", launch_delay_seconds=SIM_LAUNCH, price_per_hour=PRICE, mtbf_seconds=mtbf_h * H)
    model = JobModel(step_seconds=1.0, checkpoint_cost_seconds=10.0, restart_cost_seconds=60.0,
                     checkpoint_interval_seconds=float(CKPT))
    plan = JobPlan("train", target_steps=int(SIM_HOURS * H), providers=["spot"], model=model, max_retries=10**6,
                   checkpoint_every=CKPT)
    sim = Simulation(SimConfig(providers=[ProviderPlan(spot, concurrency=1, interruptible=True)], jobs=[plan],
                               seed=seed, tick_seconds=SIM_TICK, check=False))
    try:
        sim.run(sim_cutoff_ticks(seed))
        now = sim.clock.t
        desired = parse_desired(sim.repo.read_files(sim.repo.head(), "desired"))
        job_, st = desired.jobs["train"], sim.statuses()["train"]
        sp = job_spread(job_, st, desired.providers, [st], now, futures=futures)
        sim.run_to_completion(int(50 * SIM_HOURS * H / SIM_TICK))
        done = [c[3] for c in sim.cloud.completions if c[0] == "train"]
        seconds, cost = (min(done) - now if done else math.inf), sim.cloud.spent_usd("spot")
        row = _row(f"MTBF {mtbf_h:g} h, seed {seed}", SIM_HOURS, sp, seconds, cost)
        row["mtbf"] = mtbf_h
        return row
    finally:
        sim.close()


def sim_cutoff_ticks(seed: int) -> int:
    """The ticks before the forecast: SIM_CUTOFF_HOURS, moved by up to an hour either way (drawn
    from the seed) so that the cases do not all stand at the same point of a checkpoint interval."""
    hours = SIM_CUTOFF_HOURS + random.Random(seed).uniform(-SIM_CUTOFF_JITTER_HOURS, SIM_CUTOFF_JITTER_HOURS)
    return round(hours * H / SIM_TICK)


def sim_tasks(seeds: int, futures: int) -> list[tuple[float, int, int]]:
    return [(m, seed, futures) for m in SIM_MTBF_HOURS for seed in range(1, seeds + 1)]


# ---- the report ---------------------------------------------------------------------------------


def coverage(rows: list[dict[str, Any]]) -> tuple[float, float, float, float]:
    """Shares of outcomes at or under P50 and P90, of the time and of the cost (within a microsecond
    and a nano-dollar: an uninterrupted finish forecast to the second differs by float rounding)."""
    ok = [r for r in rows if "p50" in r]
    if not ok:
        return (math.nan,) * 4
    n = len(ok)
    return (sum(r["outcome"] <= r["p50"] + 1e-6 for r in ok) / n, sum(r["outcome"] <= r["p90"] + 1e-6 for r in ok) / n,
            sum(r["cost"] <= r["c50"] + 1e-9 for r in ok) / n, sum(r["cost"] <= r["c90"] + 1e-9 for r in ok) / n)


def under(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """Shares of outcomes strictly under the time's P50 and P90. An uninterrupted finish is the same
    time in the futures and the outcome: where many are, a right forecast has strictly-under at or
    below the quantile's level and at-or-under at or above it."""
    ok = [r for r in rows if "p50" in r]
    if not ok:
        return math.nan, math.nan
    return (sum(r["outcome"] < r["p50"] - 1e-6 for r in ok) / len(ok),
            sum(r["outcome"] < r["p90"] - 1e-6 for r in ok) / len(ok))


def table(groups: dict[str, list[dict[str, Any]]], by_state: bool = False) -> list[str]:
    """One line per set and W (and per known rate); `by_state` adds, for the traces' cases, one line
    each for the cutoffs with a machine running and those waiting for spot."""
    lines = ["| set | W (h) | cases | time <= P50 | time <= P90 | cost <= P50 | cost <= P90 | time < P50 "
             "| time < P90 |",
             "|---|---|---|---|---|---|---|---|---|"]

    def line(label: str, hours: float, part: list[dict[str, Any]]) -> str:
        cells = (*coverage(part), *under(part))
        return f"| {label} | {hours:g} | {len(part)} | " + " | ".join(f"{x:.2f}" for x in cells) + " |"

    for name, rows in groups.items():
        keys = sorted({(r["hours"], r.get("mtbf")) for r in rows}, key=lambda k: (k[0], k[1] or 0.0))
        for hours, mtbf in keys:
            part = [r for r in rows if r["hours"] == hours and r.get("mtbf") == mtbf]
            lines.append(line(name if mtbf is None else f"{name}: MTBF {mtbf:g} h", hours, part))
            for state in ("running", "waiting") if by_state and mtbf is None else ():
                lines.append(line(f"{name}: {state}", hours, [r for r in part if r.get("state") == state]))
        if any("mtbf" in r for r in rows):
            lines.append(line(f"{name}: all", rows[0]["hours"], rows))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="W = 8 h, 10 cutoffs a trace")
    ap.add_argument("--only-check", action="store_true", help="skip the tuning traces")
    ap.add_argument("--traces", type=int, help="use the first N traces of each set")
    ap.add_argument("--futures", type=int, default=400)
    ap.add_argument("--seeds", type=int, help="simulator: seeds per known rate (default 10 with --quick, else 40)")
    ap.add_argument("--trace-dir", default=os.environ.get(TRACES_ENV),
                    help="a clone of github.com/skypilot-org/spot-traces (default: $SPOT_TRACES); without "
                         "one, synthetic traces (seeded) stand in for both sets")
    ap.add_argument("--by-state", action="store_true",
                    help="also split each trace set by the cutoff's state: a machine running, or waiting for spot")
    a = ap.parse_args()
    logging.getLogger("reconciler").setLevel(logging.CRITICAL)
    hours, cutoffs = ((8.0,), 10) if a.quick else ((8.0, 24.0), 20)
    if a.trace_dir:
        os.environ[TRACES_ENV] = a.trace_dir  # read by the pool's processes
        tune = ("tune (aws-10-26-2022, preemption aws-04-22-2023)", TUNE)
        check = ("check (aws-02-15-2023, kept aside)", CHECK)
    else:
        tune = ("tune (synthetic, seeds 1-12)", SYNTHETIC_TUNE)
        check = ("check (synthetic, seeds 101-112, kept aside)", SYNTHETIC_CHECK)
    sets = {check[0]: check[1][:a.traces] if a.traces else check[1]}
    if not a.only_check:
        sets = {tune[0]: tune[1][:a.traces] if a.traces else tune[1], **sets}
    seeds = a.seeds if a.seeds is not None else (10 if a.quick else 40)
    t0 = time.perf_counter()
    groups: dict[str, list[dict[str, Any]]] = {}
    with ProcessPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        for name, files in sets.items():
            groups[name] = list(pool.map(trace_case, trace_tasks(files, hours, cutoffs, a.futures), chunksize=8))
        groups[SIM_CASES] = list(pool.map(sim_case, sim_tasks(seeds, a.futures)))
    print("\n".join(table(groups, a.by_state)))
    print(f"({time.perf_counter() - t0:.1f} s; {a.futures} futures a case; traces: a job of W hours on one spot "
          f"provider, forecast from the trace's past {HISTORY / H:.0f} h, outcome from its future; simulator: "
          f"{seeds} seeds a rate, forecast after {SIM_CUTOFF_HOURS:g} ± {SIM_CUTOFF_JITTER_HOURS:g} h of the real "
          f"loop, outcome from the same simulation's rest)")
    s50, s90, _, _ = coverage(groups[SIM_CASES])
    print(f"simulator: coverage_p50={s50:.2f} coverage_p90={s90:.2f}")
    p50, p90, _, _ = coverage(groups[next(k for k in groups if k.startswith("check"))])
    print(f"coverage_p50={p50:.2f} coverage_p90={p90:.2f}")


if __name__ == "__main__":
    main()
