"""What the status page shows, computed from statuses: the overview's rows, and for each run of a
job its attempt timeline, progress chart and the charts of the metrics its worker reports, as
shapes in SVG coordinates. Pure: data in, data out (the templates draw).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

from markupsafe import Markup

from adapters.drills import Side
from reconciler.planner.health import ProviderHealth, clock
from reconciler.planner.outlook.forecast import Reliability
from reconciler.planner.outlook.reliability import HALF_LIFE_SECONDS
from status.models import Attempt, JobStatus, Outcome, Phase, cost_text, eta_text, money, risk_text, when
from status.text import lines

# How an attempt ended, as the page colours it (DESIGN.md §5 classes, folded into five colours).
OUTCOME_CLASS = {
    Outcome.SUCCEEDED: "succeeded",
    Outcome.INTERRUPTION: "interrupted",
    Outcome.SESSION_END: "interrupted",
    Outcome.STALLED: "stalled",
    Outcome.JOB_ERROR: "failed",
    Outcome.CANCELLED: "cancelled",
    Outcome.SUPERSEDED: "cancelled",
}
OUTCOME_LEGEND = ("running", "succeeded", "interrupted", "stalled", "failed", "cancelled")


def outcome_class(outcome: Outcome | None) -> str:
    return "running" if outcome is None else OUTCOME_CLASS[outcome]


# ---- the overview --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    job: str
    phase: str
    percent: float | None  # of the target, None when the job has no target
    progress: str  # "1200/5000 (saved 1000)"
    attempts: int
    interruptions: int
    failures: int
    eta: str
    cost: str
    risk: str
    message: str
    held: str = ""  # a change not acted on until it is confirmed (or signed), and what releases it
    spent_usd: float = 0.0  # closed attempts plus the live one so far (as `status --json` says)


def overview_row(name: str, st: JobStatus | None, target: int | None, live_step: int | None,
                 deadline: float | None) -> Row:
    """One line of the overview. `live_step` is the worker's last heartbeat, when storage has one."""
    if st is None:
        return Row(name, "New", 0.0 if target else None, f"0/{target}" if target else "0", 0, 0, 0, "", "", "",
                   "not reconciled yet")
    target = target or st.progress.target
    durable = st.progress.step
    step = max(durable, live_step) if live_step is not None and not st.phase.terminal else durable
    percent = min(100.0, 100.0 * step / target) if target else None
    if st.phase == Phase.SUCCEEDED and target:
        percent = 100.0
    saved = f" (saved {durable})" if step != durable else ""
    progress = f"{step}/{target}{saved}" if target else f"{step}{saved}"
    spent = st.forecast.spent_usd if st.forecast else st.cost_usd
    return Row(name, st.phase.value, percent, progress, st.total_attempts, st.interruptions, st.failures,
               eta_text(st), cost_text(st), risk_text(st, deadline), st.message, st.held or "", spent)


@dataclass(frozen=True)
class SweepRow:
    sweep: str
    members: int
    phases: list[tuple[str, int]]  # members counted by phase, in the overview's phase order
    spent: str


def sweep_rows(rows: list[Row], sweep_of: dict[str, str]) -> list[SweepRow]:
    """Each sweep's members (jobs its matrix makes) rolled up: how many, in which phase, and what
    they have spent; the members are also rows of their own."""
    by: dict[str, list[Row]] = {}
    for r in rows:
        if r.job in sweep_of:
            by.setdefault(sweep_of[r.job], []).append(r)
    return [SweepRow(sweep, len(members), phase_counts(members), money(sum(r.spent_usd for r in members)))
            for sweep, members in sorted(by.items())]


@dataclass(frozen=True)
class ProviderRow:
    """One provider on the overview: its health (reconciler.planner.health) and its learned failure rate
    (reconciler.planner.outlook.reliability)."""

    provider: str
    state: str  # healthy, tried last, cooling down
    until: str  # when the cool-down ends, "" when none
    refusals: int  # in the last hour
    losses: int  # in the last hour
    kind: str  # "interruptible" or "reliable": which prior its failure rate starts from
    mtbf: str  # what the next worker there is told (RECONCILER_MTBF_SECONDS)
    interruptions: str  # the provider's ends, weighed by their age
    machine_time: str  # weighed by its age
    prior: str
    why: str  # the latest trouble, while a cool-down is in force
    room: str = ""  # what the daemon has seen of its room for a worker (status/room.yaml), in words


def provider_rows(health: dict[str, ProviderHealth], reliability: dict[str, Reliability],
                  now: float, room: dict[str, str] | None = None) -> list[ProviderRow]:
    """One line per declared provider: its health now, and the MTBF its next worker is told, in whole
    seconds as the worker reads it, with the evidence it was learned from (older counts less)."""
    rows = []
    for name in sorted(set(health) | set(reliability)):
        h, rel = health.get(name), reliability.get(name)
        until = h.until(now) if h is not None else None
        rate = _rate_cells(rel) if rel is not None else ("", "", "", "", "")
        rows.append(ProviderRow(name, h.state(now) if h is not None else "healthy",
                                clock(until) if until is not None else "",
                                h.refusals if h is not None else 0, h.losses if h is not None else 0, *rate,
                                h.reason if h is not None and until is not None else "",
                                (room or {}).get(name, "")))
    return rows


def phase_counts(rows: list[Row]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.phase] = counts.get(r.phase, 0) + 1
    order = [p.value for p in Phase] + ["New"]
    return sorted(counts.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))


# ---- the providers' failure rates -----------------------------------------------------------------


def span(seconds: float) -> str:
    """A duration as a person reads it: 49 s, 12 min, 5.5 h, 30 d."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h".replace(".0 h", " h")
    return f"{seconds / 86400:.1f} d".replace(".0 d", " d")


def _rate_cells(rel: Reliability) -> tuple[str, str, str, str, str]:
    """Kind, MTBF told, interruptions and machine time (HALF_LIFE_SECONDS: older counts less), prior."""
    told = round(rel.mtbf_seconds)
    mtbf = f"{told} s" if told < 120 else f"{span(told)} ({told:,} s)"
    return ("interruptible" if rel.interruptible else "reliable", mtbf, f"{rel.interruptions:.1f}",
            span(rel.exposure_seconds) if rel.measured else "none", span(rel.prior_seconds))


HALF_LIFE_TEXT = span(HALF_LIFE_SECONDS)


# ---- the attempt timeline ------------------------------------------------------------------------

LANE_HEIGHT = 34
LABEL_WIDTH = 120
PLOT_WIDTH = 760
AXIS_HEIGHT = 22


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    cls: str  # running, succeeded, interrupted, stalled, failed, cancelled
    provider: str
    epoch: int
    outcome: str  # the recorded outcome ("" while running)
    label: str  # steps gained and lost, drawn on the bar when it fits
    title: str  # the tooltip: everything about the attempt


@dataclass(frozen=True)
class Tick:
    x: float
    text: str


@dataclass
class Timeline:
    width: int
    height: int
    lanes: list[tuple[str, float]] = field(default_factory=list)  # provider, y of the lane's middle
    bars: list[Bar] = field(default_factory=list)
    ticks: list[Tick] = field(default_factory=list)


def merge_attempts(versions: list[JobStatus]) -> list[Attempt]:
    """Every attempt the status history mentions, oldest first, each once with its run: a status
    keeps only its last few attempts, so the page reads them from every recorded version (the
    newest record of each wins), and a new run's status keeps the earlier runs' last attempts, so
    an attempt that does not name its run (written before attempts did) belongs to the run of the
    oldest version that recorded it."""
    seen: dict[tuple[str, str, int, float], Attempt] = {}
    for st in versions:  # oldest to newest
        for a in st.attempts:
            key = (a.provider, a.worker, a.epoch, a.started)
            run = a.run_id or (seen[key].run_id if key in seen else "")
            seen[key] = a if a.run_id == run else a.model_copy(update={"run_id": run})
    return sorted(seen.values(), key=lambda a: (a.started, a.epoch))


def timeline(attempts: list[Attempt], now: float) -> Timeline:
    """One lane per provider (in order of first use), one bar per attempt from its start to its end."""
    providers: list[str] = []
    for a in attempts:
        if a.provider not in providers:
            providers.append(a.provider)
    height = AXIS_HEIGHT + LANE_HEIGHT * max(1, len(providers)) + 6
    tl = Timeline(width=LABEL_WIDTH + PLOT_WIDTH + 10, height=height)
    if not attempts:
        return tl
    t0 = min(a.started for a in attempts)
    ends = [a.ended if a.ended is not None else now for a in attempts]
    t1 = now if any(a.ended is None for a in attempts) else max(ends)  # a finished job ends at its last attempt
    span = max(t1 - t0, 1.0)

    def x(t: float) -> float:
        return round(LABEL_WIDTH + PLOT_WIDTH * (t - t0) / span, 1)

    tl.lanes = [(p, AXIS_HEIGHT + LANE_HEIGHT * i + LANE_HEIGHT / 2) for i, p in enumerate(providers)]
    for a in attempts:
        lane = providers.index(a.provider)
        end = a.ended if a.ended is not None else now
        left = x(a.started)
        gained = max(0, (a.step_end if a.step_end is not None else a.step_start) - a.step_start)
        label = (f"+{gained}" + (f" −{a.steps_lost}" if a.steps_lost else "")) if gained or a.steps_lost else ""
        tl.bars.append(Bar(x=left, y=AXIS_HEIGHT + LANE_HEIGHT * lane + 5, width=max(3.0, round(x(end) - left, 1)),
                           height=LANE_HEIGHT - 10, cls=outcome_class(a.outcome), provider=a.provider,
                           epoch=a.epoch, outcome=a.outcome.value if a.outcome else "", label=label,
                           title=_attempt_title(a, gained)))
    tl.ticks = [Tick(x(t), text) for t, text in time_ticks(t0, t1)]
    return tl


def _attempt_title(a: Attempt, gained: int) -> str:
    ended = when(a.ended) if a.ended is not None else "running"
    end_step = a.step_end if a.step_end is not None else "?"
    parts = [f"attempt e{a.epoch} on {a.provider} ({a.worker})", f"{when(a.started)} → {ended}",
             a.outcome.value if a.outcome else "running",
             f"steps {a.step_start}→{end_step} (+{gained}, lost {a.steps_lost})"]
    if a.cost_usd:
        parts.append(f"${a.cost_usd:.2f}")
    if a.exit_code is not None:
        parts.append(f"exit {a.exit_code}")
    if a.detail:
        parts.append(a.detail)
    return "\n".join(parts)


def time_ticks(t0: float, t1: float, most: int = 6) -> list[tuple[float, str]]:
    """Round moments between t0 and t1 to label an axis: minutes, hours or days as the span needs."""
    span = max(t1 - t0, 1.0)
    steps = [60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400, 7 * 86400]
    step = next((s for s in steps if span / s <= most), steps[-1])
    first = (int(t0) // step + 1) * step
    fmt = "%H:%M" if step < 86400 else "%m-%d"
    out = []
    t = first
    while t <= t1:
        dt = datetime.fromtimestamp(t, UTC)
        text = dt.strftime("%m-%d") if step < 86400 and dt.hour == 0 and dt.minute == 0 else dt.strftime(fmt)
        out.append((float(t), text))
        t += step
    return out


# ---- progress over time --------------------------------------------------------------------------

CHART_WIDTH = 880
CHART_HEIGHT = 220
MARGIN_LEFT = 64
MARGIN_BOTTOM = 24
MARGIN_TOP = 10


@dataclass
class Chart:
    width: int
    height: int
    line: str = ""  # SVG polyline points: durable progress (a step function)
    checkpoints: list[tuple[float, float, str]] = field(default_factory=list)  # x, y, tooltip
    live: tuple[float, float, str] | None = None  # the last heartbeat
    target_y: float | None = None
    y_ticks: list[Tick] = field(default_factory=list)  # x holds the y coordinate here
    x_ticks: list[Tick] = field(default_factory=list)
    empty: bool = True


def progress_chart(points: list[tuple[float, int]], checkpoints: list[tuple[float, int]], target: int | None,
                   live: tuple[float, int] | None, now: float) -> Chart:
    """Durable step over time (from the status history), checkpoints marked where they were saved,
    and the live heartbeat as a dot. Points are (time, step); the chart runs to `now` (pass the last
    commit's time for a finished job)."""
    chart = Chart(CHART_WIDTH, CHART_HEIGHT)
    times = [t for t, _ in points] + [t for t, _ in checkpoints] + ([live[0]] if live else [])
    if not times or not (live or checkpoints or any(s for _, s in points)):
        return chart  # nothing but zeros: no chart
    chart.empty = False
    t0, t1 = min(times), max([now, *times])
    span = max(t1 - t0, 1.0)
    top = max([1, target or 0, *(s for _, s in points), *(s for _, s in checkpoints), *([live[1]] if live else [])])
    plot_w, plot_h = CHART_WIDTH - MARGIN_LEFT - 10, CHART_HEIGHT - MARGIN_TOP - MARGIN_BOTTOM

    def xy(t: float, s: float) -> tuple[float, float]:
        return (round(MARGIN_LEFT + plot_w * (t - t0) / span, 1), round(MARGIN_TOP + plot_h * (1 - s / top), 1))

    coords: list[tuple[float, float]] = []
    for t, s in sorted(points):
        if coords:
            coords.append((xy(t, 0)[0], coords[-1][1]))  # hold the previous step until this commit
        coords.append(xy(t, s))
    if coords:
        coords.append((xy(now, 0)[0], coords[-1][1]))
    chart.line = " ".join(f"{cx},{cy}" for cx, cy in coords)
    chart.checkpoints = [(*xy(t, s), f"checkpoint at step {s}, {when(t)}") for t, s in sorted(checkpoints)]
    if live:
        chart.live = (*xy(*live), f"last heartbeat: step {live[1]}, {when(live[0])}")
    if target:
        chart.target_y = xy(t0, target)[1]
    chart.y_ticks = [Tick(xy(t0, v)[1], f"{v:,}") for v in _round_ticks(top)]
    chart.x_ticks = [Tick(xy(t, 0)[0], text) for t, text in time_ticks(t0, t1)]
    return chart


def _round_ticks(top: int) -> list[int]:
    for step in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 2500, 5000, 10_000, 20_000, 50_000,
                 100_000, 250_000, 500_000, 1_000_000, 10_000_000, 100_000_000):
        if top / step <= 5:
            return list(range(0, top + 1, step))
    return [0, top]


def durable_points(versions: list[tuple[float, JobStatus]]) -> tuple[list[tuple[float, int]], list[tuple[float, int]]]:
    """From the status history (commit time, status), oldest first: the durable step at each commit,
    and the commits where it rose (a new checkpoint had been saved by then)."""
    points: list[tuple[float, int]] = []
    rises: list[tuple[float, int]] = []
    last: tuple[str, int] | None = None
    for t, st in versions:
        points.append((t, st.progress.step))
        if st.progress.step > 0 and (last is None or last[0] != st.run_id or st.progress.step > last[1]):
            rises.append((t, st.progress.step))
        last = (st.run_id, st.progress.step)
    return points, rises


# ---- links to commits ----------------------------------------------------------------------------

_REMOTE = re.compile(r"^(?:https?://(?:[^@/]+@)?|ssh://(?:[^@/]+@)?|[^@/]+@)(?P<host>[^/:]+)(?::\d+)?[:/]"
                     r"(?P<path>[^\s]+?)(?:\.git)?/?$")
_COMMIT_PATH = {"github.com": "{base}/commit/{sha}", "codeberg.org": "{base}/commit/{sha}",
                "gitlab.com": "{base}/-/commit/{sha}", "bitbucket.org": "{base}/commits/{sha}"}


def commit_url_template(remote_url: str | None) -> str | None:
    """`https://github.com/o/r/commit/{sha}` for a remote on a forge whose web URLs we know, else None."""
    m = _REMOTE.match(remote_url or "")
    if not m or m["host"] not in _COMMIT_PATH:
        return None
    return _COMMIT_PATH[m["host"]].format(base=f"https://{m['host']}/{m['path']}", sha="{sha}")


def visible(value: object) -> object:
    """Every value a template shows (Jinja's finalize, before autoescape): control characters in
    untrusted text (a message, a log tail, a file name) become visible escapes, newlines kept for
    the log tail's <pre>."""
    if isinstance(value, Markup):
        return Markup(lines(str(value)))  # noqa: S704 - escaping control characters keeps it safe markup
    if isinstance(value, str):
        return lines(value)
    return value


# ---- runs: a changed command starts a new run --------------------------------------------------


def run_order(current: str, attempts: list[Attempt], recorded: list[tuple[float, JobStatus]]) -> list[str]:
    """The job's runs, this run first, then the earlier ones newest first ("": attempts of a run
    whose id no recorded status names any more)."""
    last: dict[str, float] = {}
    for t, st in recorded:
        last[st.run_id] = max(last.get(st.run_id, t), t)
    for a in attempts:
        t = a.ended if a.ended is not None else a.started
        last[a.run_id] = max(last.get(a.run_id, t), t)
    earlier = sorted((r for r in last if r != current), key=lambda r: -last[r])
    return [current, *earlier] if current else earlier


def run_summary(attempts: list[Attempt], versions: list[tuple[float, JobStatus]]) -> str:
    """One line for a folded earlier run: its attempts, how far it got, when it was last recorded."""
    step = max([st.progress.step for _, st in versions] + [a.step_end or 0 for a in attempts] + [0])
    ends = [t for t, _ in versions] + [a.ended for a in attempts if a.ended is not None]
    n = len(attempts)
    return (f"{n} attempt{'s' if n != 1 else ''} kept, reached step {step:,}"
            + (f", last recorded {when(max(ends))} UTC" if ends else ""))


# ---- the metrics a worker reports, over steps ----------------------------------------------------

METRIC_WIDTH = 430
METRIC_HEIGHT = 190
METRIC_LEFT = 58


@dataclass(frozen=True)
class Line:
    label: str  # the run (or a sweep's member) the line belongs to
    index: int  # its colour
    points: str  # SVG polyline points
    last: tuple[float, float, str]  # the newest point and its tooltip


@dataclass
class MetricChart:
    name: str
    width: int = METRIC_WIDTH
    height: int = METRIC_HEIGHT
    lines: list[Line] = field(default_factory=list)
    y_ticks: list[Tick] = field(default_factory=list)  # x holds the y coordinate here
    x_ticks: list[Tick] = field(default_factory=list)  # steps


def metric_charts(series: dict[str, dict[str, list[tuple[int, float]]]]) -> list[MetricChart]:
    """One chart per metric name, one line per label (a run; a sweep's members side by side), each
    value over its step. `series` is label -> metric name -> (step, value), steps ascending."""
    names = sorted({n for by_name in series.values() for n in by_name})
    return [_metric_chart(name, {label: pts[name] for label, pts in series.items() if pts.get(name)})
            for name in names]


def _metric_chart(name: str, lines: dict[str, list[tuple[int, float]]]) -> MetricChart:
    chart = MetricChart(name)
    steps = [s for pts in lines.values() for s, _ in pts]
    values = [v for pts in lines.values() for _, v in pts]
    s0, s1 = min(steps), max(max(steps), min(steps) + 1)
    lo, hi = value_range(values)
    plot_w, plot_h = METRIC_WIDTH - METRIC_LEFT - 10, METRIC_HEIGHT - MARGIN_TOP - MARGIN_BOTTOM

    def xy(s: float, v: float) -> tuple[float, float]:
        return (round(METRIC_LEFT + plot_w * (s - s0) / (s1 - s0), 1),
                round(MARGIN_TOP + plot_h * (1 - (v - lo) / (hi - lo)), 1))

    for i, (label, pts) in enumerate(lines.items()):
        coords = [xy(s, v) for s, v in pts]
        step, value = pts[-1]
        chart.lines.append(Line(label, i % 6, " ".join(f"{x},{y}" for x, y in coords),
                                (*coords[-1], f"{label}: {name} {value:.6g} at step {step:,}")))
    chart.y_ticks = [Tick(xy(s0, v)[1], f"{v:.4g}") for v in nice_ticks(lo, hi)]
    chart.x_ticks = [Tick(xy(s, lo)[0], f"{s:,}") for s in nice_ticks(s0, s1) if s == int(s)]
    return chart


def value_range(values: list[float]) -> tuple[float, float]:
    """The y range of a metric chart: its values with a little room, never empty."""
    lo, hi = min(values), max(values)
    if hi == lo:
        pad = abs(hi) * 0.1 or 1.0
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.05
    return lo - pad, hi + pad


def nice_ticks(lo: float, hi: float, most: int = 5) -> list[float]:
    """Round values between lo and hi (1, 2 or 5 times a power of ten apart) to label an axis."""
    raw = (hi - lo) / most
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step) * step
    count = int((hi - first) // step) + 1
    return [round(first + i * step, 12) for i in range(max(0, count))]


# ---- a drill: the steps after its checkpoint, before the interruption and after the resume ---------

def drill_view(summary: str, passed: bool | None, before: Side | None, after: Side | None) -> dict[str, object]:
    """The drill's line and its charts: one per metric, the killed attempt's line and the resumed
    one's over the same steps (on an exact drill they lie on each other). `passed` None: no verdict yet."""
    lines = {label: _by_name(side) for label, side in (("before the interruption", before),
                                                        ("after the resume", after)) if side is not None}
    lines = {label: by_name for label, by_name in lines.items() if by_name}
    verdict = "pending" if passed is None else "passed" if passed else "failed"
    return {"summary": summary, "verdict_class": verdict, "metrics": metric_charts(lines) if lines else []}


def _by_name(side: Side) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for step in sorted(side.points):
        for name, value in side.points[step].items():
            out.setdefault(name, []).append((step, value))
    return out
