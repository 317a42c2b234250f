"""Meeting a deadline cheaply: the project's deadline-aware placement (reconciler.planner.outlook.deadline.choose)
against published baselines and the offline optimum, on the same spot-availability traces.

One job of W hours of compute must finish by D = 1.1, 1.5 and 2 x W after the start. Providers:
a spot pool (interruptible, $1/h) whose availability follows a trace, an on-demand pool (always
there, $3/h), and with --free a free provider (price 0, a quota of a quarter of W, 12 h
sessions). Every move pays a changeover: the provider's launch delay (120 s) and the worker's
restore (60 s), both billed. The worker checkpoints every 600 s of compute at a cost of 30 s, so
an interruption loses the work since its last checkpoint.

Each run is the real `Reconciler.tick()` in simulated time (reconciler/sim), one tick every
300 s, the invariant checker on; only the placement policy changes (`SimConfig.placement_policy`):

- ours: the product's policy, reconciler.planner.outlook.deadline.choose, as configured by default
  (`deadline_policy: rules`);
- ours-lookahead: the same with `deadline_policy: lookahead` (its expected-cost lookahead for spot,
  reconciler.planner.outlook.lookahead, from what the run has measured);
- greedy: spot (or free) whenever there is some; on-demand only once the time left is down to the
  work left plus a changeover, and then to the end;
- uniform-progress: the Uniform Progress policy of Wu et al., "Can't Be Late" (NSDI'24), written
  here from the paper's rules as its simulator writes them (see `UniformProgress`);
- on-demand: on-demand only;
- lookahead (with --lookahead): not a published baseline and not the product's policy; the
  expected-cost lookahead of reconciler.planner.outlook.lookahead, told each trace's mean available
  and unavailable periods (see `Lookahead`);
- optimum: not simulated but computed: the cheapest schedule that knows the whole trace and
  finishes by D (dynamic programming in one-minute steps, with the same changeover, the same
  prices and the same work, checkpoints included; see `optimum_cost`). It is a lower bound: it
  is never preempted and never loses work.

Baselines know what a benchmark knows about the job (its step time, checkpoint cost and
interval) and the changeover; they see everything else through the `Situation` the planner
hands them. Where a rule says "when the time left equals the work left", they add two ticks:
the planner asks the policy once a tick, and a move stops the worker on one tick and launches
on the next. A policy that answers "wait" (provider None) for a running attempt keeps it, unless
its Choice says `leave` (then the worker is stopped and the run waits): Uniform Progress says it
once it is ahead of its line with no spot, as its reference code goes idle; greedy never does.

A run meets its deadline when its completion (sim.cloud.completions) is at or before start + D
and the job is Succeeded. Cost is what the providers billed (SimCloud.spent_usd), missed runs
included. Spot traces are synthetic by default: available and unavailable periods alternate,
with exponential durations (means 3 h and 2 h), one trace per seed; --trace FILE replays a
trace in the spot-traces format ({"metadata": {"gap_seconds": S}, "data": [n0, n1, ...]}, n =
instances available, the gap also read at the top level; spot is available while n >= 1) from
seeded start offsets instead.

By default the daemon starts with the job, knowing nothing of spot. With --watched-days N it has
watched spot for N days before: its RoomWatch, which only the lookahead reads (the wait for room,
and how often room that comes back goes again soon), is shown those days of the trace, tick by
tick, before the first tick (for a replayed trace, the days before its offset; for a synthetic one,
days more of the same kind). The job's own record (its rate, spot's MTBF) starts empty either way,
as a new job's does.

    python bench/deadline.py --quick            # W = 8 h, 6 traces, under a minute on 2 cores
    python bench/deadline.py                    # W = 24 h, 12 traces, about 2 minutes
    python bench/deadline.py --trace trace.json # replay a trace instead of the synthetic ones
    python bench/deadline.py --free             # add a free provider with a quota
    python bench/deadline.py --quick --declared-step-time  # ours' manifest states step_seconds
    python bench/deadline.py --quick --breakdown # and, trace by trace, where each policy's money went
    python bench/deadline.py --quick --lookahead # and the reference lookahead, told each trace's mean periods
    python bench/deadline.py --quick --watched-days 7  # the daemon watched spot for a week before the job

Prints a markdown table, then one line: deadline_met=M/N cost_vs_optimum=X
cost_vs_uniform_progress=Y (M/N: ours' runs that met their deadline; X and Y: the worst over the
deadlines of ours' mean cost against the optimum's and against Uniform Progress's), just after the
same line for ours-lookahead. Needs numpy for the optimum.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import os
import random
import sys
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from adapters.sim import JobModel, PreemptionTrace, ProviderModel  # noqa: E402
from reconciler.planner.outlook import lookahead as la  # noqa: E402
from reconciler.planner.outlook.deadline import (  # noqa: E402
    RISK_INFEASIBLE,
    Choice,
    Option,
    PlacementPolicy,
    Situation,
    choose,
)
from reconciler.planner.plan import MOVING  # noqa: E402
from reconciler.sim.driver import START, JobPlan, ProviderPlan, SimConfig, Simulation  # noqa: E402

TICK = 300.0  # s between ticks (and the synthetic traces' gap)
LAUNCH = 120.0  # provider launch delay, s
RESTORE = 60.0  # worker restore, s
CHANGEOVER = LAUNCH + RESTORE
CKPT_COST = 30.0
CKPT_INTERVAL = 600.0
STEP = 1.0  # s of compute per step
SPOT_PRICE = 1.0
ON_DEMAND_PRICE = 3.0
SPOT_UP_MEAN = 3 * 3600.0  # synthetic traces: mean available period
SPOT_DOWN_MEAN = 2 * 3600.0  # mean unavailable period
FREE_QUOTA_FRACTION = 0.25  # --free: quota as a fraction of W
SESSION_LIMIT = 12 * 3600.0
DEADLINES = (1.1, 1.5, 2.0)
POLICIES = ("ours", "ours-lookahead", "greedy", "uniform-progress", "on-demand")
REPORTED = (*POLICIES, "lookahead")  # --lookahead adds the reference: the lookahead told the trace's mean periods
UNIT = 60.0  # the optimum's time step, s
HISTORY_SEED = 10_000  # a synthetic trace's days before the start are drawn with its seed plus this


# ---- what the baselines know about the job ------------------------------------------------------


@dataclass(frozen=True)
class Known:
    """The job and the loop as a benchmark knows them."""

    step_seconds: float = STEP
    checkpoint_cost: float = CKPT_COST
    checkpoint_interval: float = CKPT_INTERVAL
    changeover: float = CHANGEOVER
    tick: float = TICK

    def work_seconds(self, steps: int) -> float:
        """Machine time to compute `steps` from a checkpoint, checkpoints and the final save included."""
        compute = steps * self.step_seconds
        return compute * (1 + self.checkpoint_cost / self.checkpoint_interval) + self.checkpoint_cost

    @property
    def margin(self) -> float:
        """The policy is asked once a tick, and a move takes a tick more (stop, then launch)."""
        return 2 * self.tick


def model() -> JobModel:
    return JobModel(step_seconds=STEP, checkpoint_cost_seconds=CKPT_COST, restart_cost_seconds=RESTORE,
                    checkpoint_interval_seconds=CKPT_INTERVAL)


def cheap(s: Situation) -> list[Option]:
    """Spot, and a free provider treated like spot; free first, then cheapest (the options' order)."""
    return [o for o in s.options if o.interruptible or o.free]


def take_cheap(s: Situation, who: str) -> Choice | None:
    """Both baselines' exploitation rule: stay on spot until preempted, else take spot when it is there."""
    if s.current is not None and any(o.provider == s.current for o in cheap(s)):
        return Choice(s.current, f"{who}: on spot until preempted")
    for o in cheap(s):
        if o.available:
            return Choice(o.provider, f"{who}: spot is available")
    return None


def on_demand(s: Situation) -> Option | None:
    return next((o for o in s.options if not o.interruptible and not o.free), None)


# ---- baselines ----------------------------------------------------------------------------------


class OnDemandOnly:
    name = "on-demand"

    def __init__(self, known: Known) -> None:
        self.known = known

    def __call__(self, s: Situation) -> Choice:
        od = on_demand(s)
        return Choice(od.provider if od else None, "on-demand only")


class Greedy:
    """Spot (or free) whenever it is there; on-demand once the time left is down to the work left
    plus a changeover (and the two ticks a move takes), then on-demand to the end."""

    name = "greedy"

    def __init__(self, known: Known) -> None:
        self.known = known
        self.committed = False

    def __call__(self, s: Situation) -> Choice:
        assert s.deadline is not None and s.remaining_steps is not None
        k = self.known
        od = on_demand(s)
        left = s.deadline - s.now
        if od is not None and (self.committed or left <= k.work_seconds(s.remaining_steps) + k.changeover + k.margin):
            self.committed = True
            return Choice(od.provider, "greedy: on-demand to the end")
        return take_cheap(s, "greedy") or Choice(None, "greedy: waiting for spot")


class UniformProgress:
    """Uniform Progress (Wu et al., NSDI'24), from its rules as the paper's simulator writes them
    (skypilot-org/can-be-late, `sky_spot/strategies`). ep(t) = W (t - start) / (D - start) is the
    straight line from no progress when the job is submitted (the benchmark's start) to all of it at
    the deadline; d is the changeover.

    1. Idle and behind ep(now): on-demand, and stay to catch up (rule 3).
    2. Spot whenever it is available, even when behind; on spot, stay until preempted.
    3. Hysteresis: on on-demand, stay until progress >= ep(now + 2d); then, with no spot and not
       behind ep(now), stop it and wait idle (`Choice.leave`).
    4. Safety net: once the time left < the work left + 2d, on-demand to the end.
    """

    name = "uniform-progress"

    def __init__(self, known: Known) -> None:
        self.known = known
        self.committed = False

    def _expected(self, s: Situation, at: float) -> float:
        assert s.deadline is not None and s.target_steps is not None
        span = max(1.0, s.deadline - START)
        return s.target_steps * min(1.0, max(0.0, (at - START) / span))

    def __call__(self, s: Situation) -> Choice:
        assert s.deadline is not None and s.remaining_steps is not None
        k = self.known
        od = on_demand(s)
        left = s.deadline - s.now
        work = k.work_seconds(s.remaining_steps)
        if od is not None and (self.committed or left < work + 2 * k.changeover + k.margin):
            self.committed = True
            return Choice(od.provider, "uniform progress: safety net, on-demand to the end")
        done = s.done_steps
        on_od = od is not None and s.current == od.provider
        if on_od and done < self._expected(s, s.now + 2 * k.changeover):
            return Choice(s.current, "uniform progress: on on-demand until ahead of ep(t + 2d)")
        taken = take_cheap(s, "uniform progress")
        if taken is not None:
            return taken
        if od is not None and done < self._expected(s, s.now):
            return Choice(od.provider, "uniform progress: behind ep(t), on-demand")
        return Choice(None, "uniform progress: ahead of ep(t), idle until spot", leave=on_od)


class Lookahead:
    """Not a published baseline and not the product's policy: the expected-cost lookahead of
    reconciler.planner.outlook.lookahead, told the trace's mean available and unavailable periods
    (`--lookahead`). It shows what an online policy that knew a zone's statistics, not its future,
    could reach."""

    name = "lookahead"

    def __init__(self, known: Known, up_seconds: float, down_seconds: float) -> None:
        self.known = known
        self.model = la.Model(step_seconds=known.tick, spot_price=SPOT_PRICE, fallback_price=ON_DEMAND_PRICE,
                              changeover_spot=known.changeover, changeover_fallback=known.changeover,
                              up_seconds=up_seconds, down_seconds=down_seconds,
                              unsaved_seconds=known.checkpoint_interval / 2)

    def __call__(self, s: Situation) -> Choice:
        assert s.deadline is not None and s.remaining_steps is not None
        od, spot = on_demand(s), next(o for o in s.options if o.interruptible)
        assert od is not None
        loc = la.NOWHERE if s.current is None else la.SPOT if s.current == spot.provider else la.FALLBACK
        durable, left = self.known.work_seconds(s.remaining_steps), s.deadline - s.now
        act, _ = la.decide(self.model, left, max(0.0, durable - s.unsaved_seconds), durable, loc,
                           spot.available or loc == la.SPOT, spot.available)
        if act == la.RUN_SPOT:
            return Choice(spot.provider, "lookahead: spot")
        if act == la.RUN_FALLBACK:
            return Choice(od.provider, "lookahead: on-demand")
        return Choice(None, "lookahead: wait", leave=s.current is not None)


BASELINES: dict[str, type[OnDemandOnly] | type[Greedy] | type[UniformProgress]] = {
    "greedy": Greedy, "uniform-progress": UniformProgress, "on-demand": OnDemandOnly}


def periods(trace: PreemptionTrace) -> tuple[float, float]:
    """The trace's mean available and unavailable periods, seconds (a whole trace as one period
    where it never changes)."""
    runs: dict[bool, list[int]] = {True: [], False: []}
    for up, group in itertools.groupby(x >= 1 for x in trace.data):
        runs[up].append(sum(1 for _ in group))
    mean = {k: trace.gap_seconds * (sum(v) / len(v)) if v else trace.gap_seconds for k, v in runs.items()}
    return mean[True], mean[False]


def policy_for(name: str, known: Known, case: Case | None = None) -> PlacementPolicy | None:
    """None: the product's own (reconciler.planner.outlook.deadline.choose)."""
    if name == "ours":
        return None
    if name == "ours-lookahead":
        return lambda s: choose(replace(s, lookahead=True))
    if name == "lookahead":
        assert case is not None
        return Lookahead(known, *periods(case.trace))
    return BASELINES[name](known)


# ---- traces -------------------------------------------------------------------------------------


def synthetic_trace(seed: int, seconds: float, gap: float = TICK, up: float = SPOT_UP_MEAN,
                    down: float = SPOT_DOWN_MEAN) -> PreemptionTrace:
    """Available (1) and unavailable (0) periods in turn, exponential durations, whole gaps."""
    rng = random.Random(seed)
    n = int(math.ceil(seconds / gap))
    avail = rng.random() < up / (up + down)
    data: list[int] = []
    while len(data) < n:
        data += [1 if avail else 0] * max(1, round(rng.expovariate(1.0 / (up if avail else down)) / gap))
        avail = not avail
    return PreemptionTrace(gap, tuple(data[:n]))


def load_trace(path: str) -> PreemptionTrace:
    """A trace file, its gap at the top level or under `metadata` (the spot-traces repository's files)."""
    with open(path) as fh:
        obj = json.load(fh)
    gap = obj.get("gap_seconds", obj.get("metadata", {}).get("gap_seconds"))
    return PreemptionTrace.from_json({"gap_seconds": gap, "data": obj.get("data", ())})


def rotated(trace: PreemptionTrace, seed: int) -> PreemptionTrace:
    """The same trace replayed from a seeded offset."""
    k = random.Random(seed).randrange(len(trace.data))
    return PreemptionTrace(trace.gap_seconds, trace.data[k:] + trace.data[:k])


def availability(trace: PreemptionTrace, units: int, unit: float = UNIT) -> list[bool]:
    """Whether spot can hold one worker through each step of `unit` seconds from the start."""
    return [trace.live_at(i * unit) >= 1 and trace.live_at((i + 1) * unit - 1e-6) >= 1 for i in range(units)]


# ---- the offline optimum ------------------------------------------------------------------------


@dataclass(frozen=True)
class Pool:
    """A provider as the optimum sees it."""

    price: float  # $/h
    available: Sequence[bool]  # per step
    quota_seconds: float | None = None  # machine time it gives in all (a free quota)


def optimum_cost(pools: Sequence[Pool], *, deadline: float, work: float, changeover: float, start: float = 0.0,
                 unit: float = UNIT) -> float:
    """The least cost to do `work` seconds of machine time between `start` and `deadline`
    (seconds from the start of the trace), knowing the whole trace. Time moves in steps of
    `unit`; the state is where the job runs (nowhere, or a pool whose changeover is done), the
    work done (in steps) and, with a quota, the quota used. Starting on a pool (or moving to
    another) pays `changeover` of billed time there first; leaving is free and loses nothing. A
    pool runs only through the steps it is available. Work and changeover are rounded down to
    whole steps (a lower bound). math.inf when it cannot finish."""
    import numpy as np

    horizon = int(deadline // unit)
    first = int(math.ceil(start / unit - 1e-9))
    need = int(work // unit + 1e-9)  # rounded down, so that the figure stays a lower bound
    d = int(changeover // unit + 1e-9)
    quota_pools = [p for p in pools if p.quota_seconds is not None]
    if len(quota_pools) > 1:
        raise ValueError("the optimum handles one pool with a quota")
    q_max = int((quota_pools[0].quota_seconds or 0.0) // unit) if quota_pools else 0
    shape = (need + 1, q_max + 1)  # [work done, quota used]
    avail = [np.asarray([bool(x) for x in p.available[:horizon]] + [False] * (horizon - len(p.available)))
             for p in pools]
    runs = [np.concatenate(([0], np.cumsum(a))) for a in avail]  # prefix sums: available through a span
    best = np.full(shape, np.inf)  # anywhere (or nowhere), at the current time
    best[0, 0] = 0.0
    history: deque[Any] = deque([best], maxlen=d + 1)  # best at times t - d .. t
    on = [np.full(shape, np.inf) for _ in pools]  # running on pool i, its changeover done
    for t in range(first, horizon):
        nxt = []
        for i, p in enumerate(pools):
            cost = p.price * unit / 3600.0
            dq = 1 if p.quota_seconds is not None else 0
            new = np.full(shape, np.inf)
            if avail[i][t]:
                _shift_min(new, on[i], dq, cost)
                if len(history) == d + 1 and runs[i][t + 1] - runs[i][t - d] == d + 1:
                    _shift_min(new, history[0], dq * (d + 1), cost * (d + 1))
            nxt.append(new)
        on = nxt
        best = np.minimum.reduce([best, *on]) if on else best
        history.append(best)
    return float(best[need].min())


def _shift_min(dst: Any, src: Any, dq: int, add: float) -> None:
    """dst[w + 1, q + dq] = min(dst[w + 1, q + dq], src[w, q] + add): one step of work done."""
    import numpy as np

    q = dst.shape[1]
    if dq >= q:
        return
    view = dst[1:, dq:]
    np.minimum(view, src[:-1, :q - dq] + add, out=view)


# ---- one run ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    hours: float  # W
    ratio: float  # D / W
    trace: PreemptionTrace
    free: bool = False
    seed: int = 0
    declared: bool = False  # ours' manifest declares the step time (step_seconds), as the baselines know it
    history: PreemptionTrace | None = None  # spot in the days before the start, as the daemon watched it

    @property
    def deadline(self) -> float:
        return self.ratio * self.hours * 3600.0

    @property
    def target_steps(self) -> int:
        return int(round(self.hours * 3600.0 / STEP))


def providers(case: Case) -> list[ProviderPlan]:
    spot = ProviderModel("spot", launch_delay_seconds=LAUNCH, price_per_hour=SPOT_PRICE, trace=case.trace)
    od = ProviderModel("ondemand", launch_delay_seconds=LAUNCH, price_per_hour=ON_DEMAND_PRICE)
    plans = [ProviderPlan(spot, concurrency=1, interruptible=True), ProviderPlan(od, concurrency=1)]
    if case.free:
        free = ProviderModel("free", launch_delay_seconds=LAUNCH, price_per_hour=0.0,
                             quota_seconds=FREE_QUOTA_FRACTION * case.hours * 3600.0,
                             session_limit_seconds=SESSION_LIMIT)
        plans.append(ProviderPlan(free, concurrency=1))
    return plans


def simulate(args: tuple[str, Case]) -> dict[str, Any]:
    """One job, one trace, one deadline, one policy: the real tick in simulated time."""
    name, case = args
    logging.getLogger("reconciler").setLevel(logging.CRITICAL)
    known = Known()
    job = JobPlan("job", target_steps=case.target_steps, model=model(), max_retries=1000,
                  deadline_seconds=case.deadline, step_seconds=STEP if case.declared and name == "ours" else None)
    config = SimConfig(providers=providers(case), jobs=[job], seed=case.seed, tick_seconds=TICK,
                       placement_policy=policy_for(name, known, case))
    sim = Simulation(config)
    watched(sim, case.history)
    t0 = time.perf_counter()
    settled = infeasible = False
    moves = astray = launched = 0
    heading: str | None = None  # where the run was moved to, until the next launch
    for _ in range(int(case.deadline / TICK) + 40):  # Simulation.run_to_completion, watching the verdict
        report = sim.step()
        st = report.statuses.get("job") if report is not None else None
        infeasible = infeasible or (st is not None and st.forecast is not None and st.forecast.risk == RISK_INFEASIBLE)
        workers = list(sim.cloud.workers.values())
        for w in workers[launched:]:
            astray += heading is not None and w.provider.name != heading
            heading = None
        launched = len(workers)
        if heading is None and st is not None and st.message.startswith(MOVING):
            heading = st.message[len(MOVING):].split(":")[0].strip()
            moves += 1
        if not sim.repo.unpushed and sim.all_settled():
            settled = True
            break
    sim.checker.check_final()
    st = sim.statuses().get("job")
    done = [c[3] for c in sim.cloud.completions if c[0] == "job"]
    finished = min(done) if done else None
    succeeded = st is not None and st.phase.value == "Succeeded"
    out = {
        "policy": name, "ratio": case.ratio, "seed": case.seed, "settled": settled, **breakdown(sim),
        "met": succeeded and finished is not None and finished <= START + case.deadline,
        "finish_hours": (finished - START) / 3600.0 if finished is not None else None,
        "cost": sum(sim.cloud.spent_usd(p) for p in sim.cloud.providers),
        "by_provider": {p: sim.cloud.spent_usd(p) for p in sim.cloud.providers},
        "phase": st.phase.value if st else "",
        "held_infeasible": infeasible, "moves": moves, "astray": astray,
        "message": st.message if st else "", "violations": len(sim.checker.violations),
        "tick_exceptions": len(sim.tick_exceptions), "seconds": time.perf_counter() - t0,
    }
    sim.close()
    return out


def watched(sim: Simulation, history: PreemptionTrace | None) -> None:
    """Show the daemon's RoomWatch spot's room in the days before the start, once a tick, as the
    daemon would have seen it had it been running."""
    if history is None:
        return
    seconds = len(history.data) * history.gap_seconds
    for i in range(int(seconds // TICK)):
        sim.reconciler.room.see("spot", START - seconds + i * TICK, history.live_at(i * TICK) >= 1)


def history(trace: PreemptionTrace, seconds: float) -> PreemptionTrace:
    """The `seconds` before a replayed trace's start (the trace wraps around)."""
    n = min(len(trace.data), math.ceil(seconds / trace.gap_seconds))
    return PreemptionTrace(trace.gap_seconds, trace.data[-n:])


def breakdown(sim: Simulation) -> dict[str, float]:
    """Where the money went: billed hours on spot (and free) and on on-demand, the attempts (each
    paid a changeover), and the compute lost to interruptions (work since the last checkpoint)."""
    workers = list(sim.cloud.workers.values())
    hours = {p: sum(w.ledger.billed_seconds for w in workers if w.provider.name == p) / 3600.0
             for p in sim.cloud.providers}
    lost = sum((w.ledger.lost_steps or 0) for w in workers) * STEP / 3600.0
    return {"spot_h": hours.get("spot", 0.0) + hours.get("free", 0.0), "od_h": hours.get("ondemand", 0.0),
            "attempts": len(workers), "lost_h": lost,
            "preempted": sum(1 for w in workers if w.ledger.end_reason in ("preempted", "session-limit"))}


def optimum(case: Case) -> dict[str, Any]:
    """The offline optimum of the case: same providers, changeover, prices and work."""
    units = int(case.deadline // UNIT) + 1
    pools = [Pool(SPOT_PRICE, availability(case.trace, units)), Pool(ON_DEMAND_PRICE, [True] * units)]
    if case.free:
        pools.append(Pool(0.0, [True] * units, FREE_QUOTA_FRACTION * case.hours * 3600.0))
    cost = optimum_cost(pools, deadline=case.deadline, work=Known().work_seconds(case.target_steps),
                        changeover=CHANGEOVER, start=TICK)  # the first tick is the first chance to launch
    return {"policy": "optimum", "ratio": case.ratio, "seed": case.seed, "met": math.isfinite(cost),
            "cost": cost, "finish_hours": None}


def run_task(task: tuple[str, Case]) -> dict[str, Any]:
    return optimum(task[1]) if task[0] == "optimum" else simulate(task)


# ---- the report ---------------------------------------------------------------------------------


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else (1.0 if a == 0 else math.inf)


def summarize(results: list[dict[str, Any]], ratios: Sequence[float], who: str = "ours") -> tuple[list[str], str]:
    """The markdown table and the last line, of `who`."""
    lines = ["| deadline D | policy | deadlines met | mean cost ($) | cost / optimum | mean finish (h) |",
             "|---|---|---|---|---|---|"]
    worst_opt = worst_up = 0.0
    met = total = 0
    for r in ratios:
        rows = {p: [x for x in results if x["ratio"] == r and x["policy"] == p] for p in (*REPORTED, "optimum")}
        mean = {p: sum(x["cost"] for x in xs) / len(xs) for p, xs in rows.items() if xs}
        for p in (*REPORTED, "optimum"):
            xs = rows[p]
            if not xs:
                continue
            finishes = [x["finish_hours"] for x in xs if x["finish_hours"] is not None]
            ratio = _ratio(mean[p], mean["optimum"]) if "optimum" in mean else math.nan
            lines.append(f"| {r:g} W | {p} | {sum(1 for x in xs if x['met'])}/{len(xs)} | {mean[p]:.2f} "
                         f"| {ratio:.2f} | {sum(finishes) / len(finishes) if finishes else math.nan:.1f} |")
        ours = rows[who]
        met += sum(1 for x in ours if x["met"])
        total += len(ours)
        worst_opt = max(worst_opt, _ratio(mean[who], mean["optimum"]))
        worst_up = max(worst_up, _ratio(mean[who], mean["uniform-progress"]))
    last = f"deadline_met={met}/{total} cost_vs_optimum={worst_opt:.2f} cost_vs_uniform_progress={worst_up:.2f}"
    return lines, last


def breakdown_lines(results: list[dict[str, Any]], ratios: Sequence[float]) -> list[str]:
    """Trace by trace, where each policy's money went, beside the optimum's cost."""
    lines = ["| D | trace | policy | cost ($) | x optimum | spot h | on-demand h | attempts | preempted | lost h | "
             "finish (h) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in ratios:
        for seed in sorted({x["seed"] for x in results if x["ratio"] == r}):
            rows = {x["policy"]: x for x in results if x["ratio"] == r and x["seed"] == seed}
            best = rows.get("optimum", {}).get("cost", math.nan)
            for p in REPORTED:
                x = rows.get(p)
                if x is None:
                    continue
                lines.append(f"| {r:g} W | {seed} | {p} | {x['cost']:.2f} | {_ratio(x['cost'], best):.2f} | "
                             f"{x['spot_h']:.2f} | {x['od_h']:.2f} | {x['attempts']} | {x['preempted']} | "
                             f"{x['lost_h']:.2f} | {x['finish_hours'] or math.nan:.1f}"
                             f"{'' if x['met'] else ' missed'} |")
            lines.append(f"| {r:g} W | {seed} | optimum | {best:.2f} | 1.00 | | | | | | |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="W = 8 h and 6 traces")
    ap.add_argument("--trace", help='spot trace JSON {"gap_seconds": S, "data": [n0, n1, ...]}, replayed from '
                                    "seeded offsets")
    ap.add_argument("--free", action="store_true", help="add a free provider (quota W/4, 12 h sessions)")
    ap.add_argument("--hours", type=float, help="W, hours of compute (default 8 with --quick, else 24)")
    ap.add_argument("--traces", type=int, help="how many traces (default 6 with --quick, else 12)")
    ap.add_argument("--breakdown", action="store_true", help="also print, trace by trace, each policy's spot and "
                                                                  "on-demand hours, attempts and lost work")
    ap.add_argument("--declared-step-time", action="store_true",
                    help="ours' manifest states the step time (step_seconds), as the baselines are told it")
    ap.add_argument("--lookahead", action="store_true",
                    help="also run the reference lookahead, told each trace's mean periods")
    ap.add_argument("--watched-days", type=float, default=0.0,
                    help="days the daemon watched spot before the job (its RoomWatch; 0: it starts with the job)")
    ap.add_argument("--processes", type=int, default=min(2, os.cpu_count() or 1))
    a = ap.parse_args()
    hours = a.hours or (8.0 if a.quick else 24.0)
    n = a.traces or (6 if a.quick else 12)
    base = load_trace(a.trace) if a.trace else None
    length = max(DEADLINES) * hours * 3600.0 + 40 * TICK
    traces = [rotated(base, seed) if base else synthetic_trace(seed, length) for seed in range(1, n + 1)]
    days = a.watched_days * 24 * 3600.0
    before = [None if not days else history(tr, days) if base else synthetic_trace(HISTORY_SEED + seed, days)
              for seed, tr in enumerate(traces, start=1)]
    cases = [Case(hours, r, tr, a.free, seed, a.declared_step_time, past)
             for seed, (tr, past) in enumerate(zip(traces, before, strict=True), start=1) for r in DEADLINES]
    if a.lookahead and a.free:
        ap.error("--lookahead models spot and on-demand only, not a free provider")
    tasks = [(p, c) for c in cases for p in (*POLICIES, *(("lookahead",) if a.lookahead else ()), "optimum")]
    tasks.sort(key=lambda t: -t[1].ratio)  # the longest runs first
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=a.processes) as pool:
        results = list(pool.map(run_task, tasks))
    sims = [x for x in results if x["policy"] != "optimum"]
    seen = [tr.live_at(t) >= 1 for tr in traces for t in range(0, int(max(DEADLINES) * hours * 3600), int(TICK))]
    print(f"W = {hours:g} h of compute; spot ${SPOT_PRICE:g}/h (available {100 * sum(seen) / len(seen):.0f}% of the "
          f"time over {n} {'rotations of ' + a.trace if a.trace else 'synthetic traces'}), on-demand "
          f"${ON_DEMAND_PRICE:g}/h{', a free provider (quota W/4)' if a.free else ''}; changeover "
          f"{CHANGEOVER:.0f} s (launch {LAUNCH:.0f} + restore {RESTORE:.0f}); checkpoints {CKPT_COST:.0f} s every "
          f"{CKPT_INTERVAL:.0f} s; tick {TICK:.0f} s")
    print()
    lines, last = summarize(results, DEADLINES)
    print("\n".join(lines))
    print()
    violations = sum(x["violations"] for x in sims)
    raised = sum(x["tick_exceptions"] for x in sims)
    unsettled = sum(1 for x in sims if not x["settled"])
    missed = [x for x in sims if x["policy"] == "ours" and not x["met"]]
    if missed:
        held = sum(1 for x in missed if x["held_infeasible"])
        print(f"ours missed {len(missed)} deadlines (the means above include what those runs spent); in {held} of "
              "them its policy had said at some tick that the deadline was infeasible "
              "(reconciler.planner.outlook.deadline, rule 1)")
    per = {p: [x for x in sims if x["policy"] == p] for p in POLICIES}
    print("moves (a running worker stopped so that the run goes elsewhere), and how many of them relaunched "
          "elsewhere than the move announced: " + "; ".join(
              f"{p} {sum(x['moves'] for x in xs)} ({sum(x['astray'] for x in xs)})" for p, xs in per.items()))
    print(f"runs: {len(sims)} simulated, {sum(x['seconds'] for x in sims) / len(sims):.1f} s each; invariant "
          f"violations: {violations}; ticks that raised: {raised}; runs not settled: {unsettled}; "
          f"wall time {time.perf_counter() - t0:.0f} s")
    if a.breakdown:
        print()
        print("\n".join(breakdown_lines(results, DEADLINES)))
    print(f"ours-lookahead: {summarize(results, DEADLINES, 'ours-lookahead')[1]}")
    print(last)


if __name__ == "__main__":
    main()
