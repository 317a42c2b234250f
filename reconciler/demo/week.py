"""`reconciler demo --scenario week`: the project's story in simulated time.

A 60-hour training job is due in five days. Four providers could run it: a free notebook service
with a weekly quota and 12-hour sessions (Kaggle-like), prepaid credits (Lightning-like), a spot
pool that vanishes for hours at a time (Vast-like) and a reliable on-demand machine. The real
planner, placement policy, loop, status rendering and git (in memory) drive the job; the
providers, the workers and time are simulated (reconciler.sim), so a week takes seconds.

The figures (prices, credits, quota, the spot pool's trace) are invented for the demo; they are
plausible, not quotes. The same job is then run again with a policy that only uses the on-demand
machine, to say what the week would have cost without the reconciler's choices.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.padding import Padding
from rich.text import Text

from adapters.sim import JobModel, PreemptionTrace, ProviderModel
from reconciler.planner.outlook.deadline import Choice, Situation
from reconciler.sim.driver import START, JobPlan, ProviderPlan, SimConfig, Simulation
from status.models import JobStatus

JOB = "train-60h"
HOUR = 3600.0
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")

# provider -> (letter in the strip, colour)
LOOK = {
    "kaggle": ("K", "cyan"),
    "lightning": ("L", "magenta"),
    "vast": ("V", "green"),
    "ondemand": ("O", "red"),
}


@dataclass(frozen=True)
class Week:
    """The scenario's figures (invented for the demo: plausible, not quotes)."""

    job_hours: float = 60.0
    deadline_hours: float = 5 * 24.0
    kaggle_quota_hours: float = 30.0
    kaggle_session_hours: float = 12.0
    lightning_price: float = 0.90
    lightning_credits: float = 15.0
    vast_price: float = 0.35
    ondemand_price: float = 1.20
    tick_seconds: float = 300.0
    seed: int = 7


def spot_trace(rng: random.Random, hours: int, gap_seconds: float) -> PreemptionTrace:
    """A pool of up to three machines that is there for 3-12 hours, then gone for 2-10."""
    data: list[int] = []
    while len(data) < hours:
        data += [rng.choice((1, 2, 3))] * rng.randint(3, 12)
        data += [0] * rng.randint(2, 10)
    return PreemptionTrace(gap_seconds, tuple(data[:hours]))


def build_config(week: Week, *, ondemand_only: bool = False) -> SimConfig:
    rng = random.Random(week.seed)
    providers = [
        ProviderPlan(ProviderModel(
            "kaggle", launch_delay_seconds=120.0, price_per_hour=0.0, quota_seconds=week.kaggle_quota_hours * HOUR,
            session_limit_seconds=week.kaggle_session_hours * HOUR), concurrency=1),
        ProviderPlan(ProviderModel(
            "lightning", launch_delay_seconds=90.0, price_per_hour=week.lightning_price,
            credits_usd=week.lightning_credits), concurrency=1),
        ProviderPlan(ProviderModel(
            "vast", launch_delay_seconds=180.0, price_per_hour=week.vast_price,
            trace=spot_trace(rng, int(week.deadline_hours) + 48, HOUR)), concurrency=1, interruptible=True),
        ProviderPlan(ProviderModel("ondemand", launch_delay_seconds=60.0, price_per_hour=week.ondemand_price),
                     concurrency=1),
    ]
    job = JobPlan(
        JOB, target_steps=int(week.job_hours * HOUR),
        providers=[p.model.name for p in providers],
        model=JobModel(step_seconds=1.0, checkpoint_cost_seconds=30.0, restart_cost_seconds=60.0,
                       checkpoint_interval_seconds=300.0),
        max_retries=3, deadline_seconds=week.deadline_hours * HOUR)
    return SimConfig(providers=providers, jobs=[job], seed=week.seed, tick_seconds=week.tick_seconds,
                     placement_policy=only_ondemand if ondemand_only else None)


def only_ondemand(s: Situation) -> Choice:
    """The comparison: what a person with one on-demand machine would do."""
    return Choice("ondemand", "on-demand only (the comparison run)")


@dataclass
class Sample:
    t: float  # simulated seconds since the start
    status: JobStatus


@dataclass
class WeekRun:
    week: Week
    samples: list[Sample] = field(default_factory=list)
    finished: float | None = None  # simulated seconds since the start, from the worker's completion
    phase: str = ""
    cost: float = 0.0  # what the providers billed
    cost_by_provider: dict[str, float] = field(default_factory=dict)
    spans: list[tuple[str, float, float]] = field(default_factory=list)  # provider, from, to (seconds)
    interruptions: int = 0
    attempts: int = 0
    spot: tuple[int, ...] = ()  # machines in the spot pool, per simulated hour
    prices: dict[str, float] = field(default_factory=dict)  # provider -> $/h
    wall_seconds: float = 0.0

    @property
    def deadline(self) -> float:
        return self.week.deadline_hours * HOUR

    @property
    def end(self) -> float:
        return self.finished if self.finished is not None else (self.samples[-1].t if self.samples else 0.0)


def simulate(week: Week, *, ondemand_only: bool = False, margin_hours: float = 24.0) -> WeekRun:
    """Runs the job until it settles, or until the deadline plus a margin."""
    started = time.monotonic()
    config = build_config(week, ondemand_only=ondemand_only)
    sim = Simulation(config)
    out = WeekRun(week)
    trace = next(p.model.trace for p in config.providers if p.model.trace is not None)
    out.spot = trace.data
    out.prices = {p.model.name: p.model.price_per_hour for p in config.providers}
    limit = out.deadline + margin_hours * HOUR
    try:
        while sim.phys - START < limit:
            report = sim.step()
            st = report.statuses.get(JOB) if report is not None else None
            if st is None:
                st = sim.statuses().get(JOB)
            if st is None:
                continue
            out.samples.append(Sample(sim.phys - START, st))
            if st.phase.terminal:
                break
        out.phase = out.samples[-1].status.phase.value if out.samples else "Pending"
        done = [c[3] for c in sim.cloud.completions if c[0] == JOB]
        out.finished = min(done) - START if done else None
        out.cost_by_provider = {p: sim.cloud.spent_usd(p) for p in sim.cloud.providers}
        out.cost = sum(out.cost_by_provider.values())
        for w in sim.cloud.workers.values():
            end = w.ledger.ended if w.ledger.ended is not None else sim.phys
            out.spans.append((w.provider.name, w.launched - START, end - START))
        last = out.samples[-1].status if out.samples else None
        out.interruptions = last.interruptions if last else 0
        out.attempts = last.total_attempts if last else 0
    finally:
        sim.close()
    out.wall_seconds = time.monotonic() - started
    return out


# ---- rendering ------------------------------------------------------------------------------


def when(seconds: float) -> str:
    """Simulated time as a weekday and hour, the week starting on Monday 00:00."""
    minutes = int(round(seconds / 60.0))
    day, rest = divmod(minutes, 24 * 60)
    return f"{DAYS[day % 7]} {rest // 60:02d}:{rest % 60:02d}"


def hour_strip(run: WeekRun, start_h: int, end_h: int) -> Text:
    """One character per simulated hour: the provider that ran the job most of that hour, or '.'
    (a quarter of an hour at least; launches and restarts count, as they are billed)."""
    text = Text()
    for h in range(start_h, end_h):
        lo, hi = h * HOUR, (h + 1) * HOUR
        if lo >= run.end:
            text.append(" ")
            continue
        share: dict[str, float] = {}
        for prov, a, b in run.spans:
            overlap = min(b, hi) - max(a, lo)
            if overlap > 0:
                share[prov] = share.get(prov, 0.0) + overlap
        best = max(share.items(), key=lambda kv: kv[1], default=None)
        if best is None or best[1] < (min(hi, run.end) - lo) / 4:
            text.append(".", style="dim")
        else:
            letter, colour = LOOK.get(best[0], (best[0][:1].upper(), "white"))
            text.append(letter, style=f"bold {colour}")
    return text


def _shape(decision: str) -> str:
    """A decision without its figures: a new line is shown only when the reasoning changes."""
    return re.sub(r"[\d.]+", "#", decision)


def hours_of(run: WeekRun) -> dict[str, float]:
    """Hours each provider held a worker of the job (billed time, launches included)."""
    out: dict[str, float] = {}
    for prov, a, b in run.spans:
        out[prov] = out.get(prov, 0.0) + max(0.0, b - a) / HOUR
    return out


def render(run: WeekRun, base: WeekRun | None, console: Console, block_hours: int = 6) -> str:
    """Prints one line per block of simulated time (where each hour ran, progress, money, ETA and
    slack as the job's status forecast said at the block's end), the policy's reasoning under it
    when it changed, then the week at a glance; returns the summary line."""
    week = run.week
    console.print(f"[bold]{JOB}[/bold]: {week.job_hours:g} h of training from {when(0)}, due {when(run.deadline)}. "
                  "One character per hour: [bold cyan]K[/] kaggle, [bold magenta]L[/] lightning, "
                  "[bold green]V[/] vast, [bold red]O[/] on-demand, [dim].[/] idle.")
    console.print(Text(f"{'block':<10}  {'hours':<{block_hours}}  {'done':>4}  {'spent':>7}  {'ETA':<9}  "
                       f"{'slack':>5}", style="bold"))
    last_shape = ""
    total_h = int(-(-run.end // HOUR))
    for h0 in range(0, total_h, block_hours):
        h1 = h0 + block_hours
        in_block = [s for s in run.samples if h0 * HOUR < s.t <= h1 * HOUR]
        if not in_block:
            continue
        end = in_block[-1]
        fc = end.status.forecast
        live = fc is not None and not end.status.phase.terminal
        target = end.status.progress.target or 1
        spent = sum(_billed(run, p, min(h1 * HOUR, run.end)) * price for p, price in run.prices.items())
        eta = when(fc.eta - START) if live and fc and fc.eta else ""
        slack = f"{fc.slack_hours:g} h" if live and fc and fc.slack_hours is not None else ""
        row = Text(f"{when(h0 * HOUR):<10}  ")
        row.append_text(hour_strip(run, h0, h1))
        row.append(f"  {100.0 * end.status.progress.step / target:>3.0f}%  {f'${spent:.2f}':>7}  {eta:<9}  {slack:>5}")
        row.rstrip()
        console.print(row)
        for s in in_block:
            fc = s.status.forecast
            if fc is None or not fc.decision or _shape(fc.decision) == last_shape:
                continue
            last_shape = _shape(fc.decision)
            console.print(Padding(Text(f"{when(s.t)[-5:]} {fc.decision}", style="dim"), (0, 0, 0, 12), expand=False))
    console.print("[bold]The week at a glance[/bold] (job: where it ran; vast pool: [green]+[/] machines "
                  "to rent, [dim].[/] gone):")
    per_day = 24
    for d in range(int(-(-run.deadline // (per_day * HOUR)))):
        row = Text(f"  {when(d * per_day * HOUR)[:3]:<5} job   ")
        pool = Text(f"  {'':<5} vast  ")
        for q in range(4):
            lo = d * per_day + 6 * q
            row.append_text(hour_strip(run, lo, lo + 6))
            row.append(" ")
            for h in range(lo, lo + 6):
                there = run.spot[h] > 0 if h < len(run.spot) else False
                pool.append("+" if there else ".", style="green" if there else "dim")
            pool.append(" ")
        if run.finished is not None and d * per_day * HOUR <= run.finished < (d + 1) * per_day * HOUR:
            row.append(f" finished {when(run.finished)[-5:]}", style="bold")
        row.rstrip()
        pool.rstrip()
        console.print(row)
        console.print(pool)
    by = hours_of(run)
    console.print("hours held: " + ", ".join(f"{p} {by[p]:.1f} h (${run.cost_by_provider.get(p, 0.0):.2f})"
                                             for p in LOOK if p in by)
                  + f"; {run.attempts} attempts, {run.interruptions} interruptions (spot gone, session or quota ended)")
    return summary(run, base)


def _billed(run: WeekRun, provider: str, upto: float) -> float:
    """Hours billed by `provider` up to `upto` seconds (billing runs from launch to end)."""
    secs = sum(max(0.0, min(b, upto) - a) for p, a, b in run.spans if p == provider and a < upto)
    return secs / HOUR


def summary(run: WeekRun, base: WeekRun | None) -> str:
    if run.finished is None:
        head = f"deadline missed: not finished by {when(run.end)} ({run.phase})"
    else:
        diff = (run.deadline - run.finished) / HOUR
        met = "met" if diff >= 0 else "missed"
        side = "before" if diff >= 0 else "after"
        head = f"deadline {met}: finished {when(run.finished)} ({abs(diff):.1f} h {side} the deadline)"
    line = f"{head}, cost ${run.cost:.2f}"
    if base is not None:
        line += f", on-demand only would cost ${base.cost:.2f}"
    return line


def run_week_demo(console: Console | None = None, *, week: Week | None = None, compare: bool = True) -> int:
    console = console or Console()
    week = week or Week()
    console.print("[bold]Simulated providers.[/bold] The planner, placement policy, loop, status and git "
                  "(in memory) are the real ones; the providers, their workers and time are simulated "
                  "(reconciler.sim), and their prices, credits, quota and spot trace are invented for the demo.")
    console.print(f"kaggle: free, {week.kaggle_quota_hours:g} h a week, {week.kaggle_session_hours:g} h sessions; "
                  f"lightning: ${week.lightning_price:.2f}/h from ${week.lightning_credits:g} of credits; "
                  f"vast: spot at ${week.vast_price:.2f}/h, a pool that vanishes for hours; "
                  f"ondemand: ${week.ondemand_price:.2f}/h, always there. "
                  f"One tick = {week.tick_seconds:g} s of simulated time.")
    started = time.monotonic()
    run = simulate(week)
    base = simulate(week, ondemand_only=True) if compare else None
    line = render(run, base, console)
    if base is not None and base.finished is not None:
        console.print(f"[dim]on-demand only: finished {when(base.finished)}, "
                      f"{hours_of(base).get('ondemand', 0.0):.1f} h billed at ${week.ondemand_price:.2f}/h[/dim]")
    console.print(f"[dim]{len(run.samples) + (len(base.samples) if base else 0)} real ticks in "
                  f"{time.monotonic() - started:.1f} s of wall time[/dim]")
    print(line, flush=True)
    return 0 if run.finished is not None and run.finished <= run.deadline else 1
