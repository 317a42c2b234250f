"""What the reconciler records about each job, and how it is written to `status/`.

Pure: data in, text out. Serialization is canonical (sorted keys, stable float formatting), so
a tick whose status did not change produces byte-identical files and commits nothing.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from status.text import lines, one_line

MAX_ATTEMPTS_KEPT = 10
MAX_REFUSALS_KEPT = 5  # refused launches a job's status remembers (its providers' health reads them)
LOG_TAIL_CHARS = 4000


class Phase(StrEnum):
    PENDING = "Pending"
    LAUNCHING = "Launching"
    RUNNING = "Running"
    BACKOFF = "Backoff"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"
    CANCELLED = "Cancelled"

    @property
    def terminal(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED)


class Outcome(StrEnum):
    """How an attempt ended, by whose fault (DESIGN.md §5)."""

    SUCCEEDED = "succeeded"
    INTERRUPTION = "interruption"  # preempted, host lost, killed from outside: free
    SESSION_END = "session-end"  # the provider's time limit: free
    STALLED = "stalled"  # heartbeat stale while the provider says running: charged
    JOB_ERROR = "job-error"  # exit != 0, or 0 without done.json: charged
    CANCELLED = "cancelled"  # we stopped it: manifest deleted, suspended, run replaced
    SUPERSEDED = "superseded"  # a newer attempt holds the lease

    @property
    def charged(self) -> bool:
        return self in (Outcome.JOB_ERROR, Outcome.STALLED)


class Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


STORAGE_FAULT_DETAIL = "storage fault:"  # how an end the store's fault caused is recorded (planner.judge)
FREE_BY_RULE_DETAIL = "(free by the job's exit_codes rule)"  # an exit the job's own `ignore` rule made free


class Attempt(Model):
    run_id: str = ""  # the run it belonged to: a new run's status keeps the earlier runs' last attempts
    epoch: int
    provider: str
    worker: str
    started: float
    ended: float | None = None
    outcome: Outcome | None = None
    exit_code: int | None = None
    detail: str = ""
    step_start: int = 0
    step_end: int | None = None
    steps_lost: int = 0
    cost_usd: float = 0.0
    unseen_since: float | None = None  # first observation that did not find the worker
    host: str = ""  # the provider's machine, where it names one (per-host cool-down)
    first_beat: float | None = None  # the first heartbeat we saw, by the worker's clock kept within [started, now]
    first_beat_step: int | None = None  # the step that heartbeat reported: rates count from here
    # Why the reconciler asked this attempt to stop while leaving it open (a deleted manifest: it is
    # billed until the worker is gone). However the worker then ends, that end was ours: cancelled.
    stop_reason: str | None = None
    # Ended as an interruption the provider never confirmed (a signal, an exit 75 without its
    # notice): it backs off, and the next such end in a row is charged. None (not written) otherwise.
    unconfirmed: bool | None = None
    running_since: float | None = None  # first seen running: the grace for its first heartbeat counts from here

    @property
    def open(self) -> bool:
        return self.outcome is None

    @property
    def provider_ended(self) -> bool:
        """The provider ended it (preempted, host lost, vanished, its session's end): what counts
        against the provider's failure rate and health. Not an interruption it never confirmed, one
        the run store's fault caused, nor an exit the job's own `exit_codes` rule made free."""
        return (self.outcome in (Outcome.INTERRUPTION, Outcome.SESSION_END) and not self.unconfirmed
                and not self.detail.startswith(STORAGE_FAULT_DETAIL) and FREE_BY_RULE_DETAIL not in self.detail)


class Refusal(Model):
    """A launch the provider refused (no capacity, its working directory could not be made): a
    durable fact every job's planner reads for the provider's health (reconciler.planner.health)."""

    provider: str
    refused: float
    error: str = ""


class Progress(Model):
    step: int = 0  # durable: newest committed checkpoint
    target: int | None = None
    # When the reconciler first saw `step` durable. A running job's step is written in tenths of
    # the target, so a rate taken from the status divides by the time up to here, not up to now.
    seen_at: float | None = None
    # The live worker's heartbeat step at `seen_at` (it runs ahead of the durable step by up to a
    # checkpoint interval): where the forecast's futures start. Written with `seen_at`, never alone.
    heartbeat_step: int | None = None
    # What one save of the run costs, until durable, as its worker last said (whole seconds): the
    # forecast's futures pay it before the completion. Written with `seen_at`, never alone.
    save_seconds: float | None = None
    # Seconds from one of the worker's saves to the next, as it last said (whole seconds; none when
    # a step count pins them): an interruption loses half of it on average. Written with `seen_at`,
    # and at once when the run's first worker first says it.
    save_every_seconds: float | None = None

    def percent(self) -> float | None:
        if not self.target:
            return None
        return min(100.0, 100.0 * self.step / self.target)


class ProviderForecast(Model):
    """Finishing the run on one provider: hours of attempt time and money, at the measured rate."""

    hours: float
    cost_usd: float
    measured: bool  # False: this provider has not run the job yet, the rate is the job's best elsewhere


class Forecast(Model):
    """Time and money for the rest of the run, from its measured progress (reconciler.planner.outlook.forecast)."""

    rate_steps_per_hour: float | None = None  # on the provider the run is on, or will go to
    eta: float | None = None  # when it will finish there
    spent_usd: float = 0.0  # closed attempts plus the live one so far
    projected_cost_usd: float | None = None  # spent plus the rest there
    slack_hours: float | None = None  # time to the deadline beyond what the rest needs on reliable capacity
    risk: str = ""  # "", "on track", "at risk", "infeasible"
    decision: str = ""  # the placement policy's reasoning, one line
    placement: str = ""  # where the policy wants the run now ("" = wait)
    note: str = ""  # what could not be estimated, and why
    providers: dict[str, ProviderForecast] = Field(default_factory=dict)


class Output(Model):
    """A file the run's completing attempt left in RECONCILER_OUTPUT_DIR (`reconciler artifacts pull`)."""

    path: str
    size: int  # bytes


OUTPUTS_LISTED = 50  # outputs a status lists by name; the rest are counted in `outputs_more`


class HandedInput(Model):
    """A completed run of a job this run came `after`, whose outputs its workers are handed."""

    dir: str  # under RECONCILER_INPUT_DIR: the job's name, or <sweep>/<member>
    job: str
    run_id: str
    storage: str = ""  # "" is the settings' storage


class DrillPhase(StrEnum):
    ARMED = "armed"  # the worker was asked to drill after its next durable checkpoint
    RESUMING = "resuming"  # interrupted on purpose; the next attempt must restore the drill's step
    DONE = "done"  # the verdict is in


class Drill(Model):
    """A drill of the run (docs/guides/drills.md): interrupted on purpose after a durable checkpoint,
    then resumed and compared step by step with what it reported before the interruption."""

    id: str
    phase: DrillPhase = DrillPhase.ARMED
    notice: bool = False  # the provider's notice (SIGTERM and its grace) instead of a kill
    lookahead: int = 5
    tolerance: float = 0.0
    to: str | None = None  # the provider the relaunch was sent to
    requested: float = 0.0
    epoch: int = 0  # the attempt that was drilled
    step: int | None = None  # the durable checkpoint it was interrupted after (N)
    killed_at: int | None = None  # the last step the drilled attempt reported before it ended
    resumed_step: int | None = None  # what the next attempt restored
    steps_lost: int | None = None  # notice drills: steps past the final checkpoint that were lost
    grace_used: float | None = None  # notice drills: seconds from the notice to the final checkpoint
    verdict: str | None = None  # exact | within tolerance | diverged | failed resume | not carried out
    detail: str = ""  # the verdict in one sentence (the first differing step, by how much, the usual causes)
    ended: float | None = None

    @property
    def passed(self) -> bool:
        return self.verdict in ("exact", "within tolerance")

    def summary(self) -> str:
        """One line for describe, status and the page: the verdict and its sentence, or where it is."""
        kind = "notice drill" if self.notice else "drill"
        if self.verdict is not None:
            return f"{kind} {self.id}: {self.verdict}: {self.detail}"
        if self.phase == DrillPhase.ARMED:
            return (f"{kind} {self.id}: armed: attempt {self.epoch} runs {self.lookahead} steps past its next "
                    "durable checkpoint, then it is killed with no notice")
        where = f" (checkpoint at step {self.step})" if self.step is not None else ""
        return f"{kind} {self.id}: interrupted{where}; waiting for the next attempt to resume and report"


class JobStatus(Model):
    job: str
    phase: Phase = Phase.PENDING
    run_id: str = ""
    manifest: str = ""  # file under desired/ that defines the job
    sweep: str | None = None  # the job with a matrix this one is a member of (desired.matrix), for roll-ups
    storage: str = ""  # the store the run's folder is in (a changed `storage:` moves it between attempts)
    desired_commit: str = ""
    message: str = ""
    progress: Progress = Field(default_factory=Progress)
    failures: int = 0  # charged to the retry budget
    unproductive: int = 0  # attempts in a row that ended without a new durable checkpoint
    interruptions: int = 0  # free
    total_attempts: int = 0
    steps_lost: int = 0
    cost_usd: float = 0.0
    backoff_until: float | None = None
    # When the job first launched, kept after its oldest attempts are trimmed away (MAX_ATTEMPTS_KEPT):
    # a deadline's Uniform Progress line starts there (None in a status written before it was kept).
    first_launched: float | None = None
    provider_backoff: dict[str, float] = Field(default_factory=dict)  # provider -> until
    attempts: list[Attempt] = Field(default_factory=list)
    refusals: list[Refusal] = Field(default_factory=list)  # the newest few, oldest first
    log_tail: str | None = None
    forecast: Forecast | None = None
    # A newer change to desired/ not acted on, and what releases it: a commit that would cancel most
    # jobs (until confirmed) or one whose signature did not verify (reconciler.yaml `signatures:`).
    held: str | None = None
    storage_fault: str | None = None  # what is wrong with run storage while the job waits for it
    # The completed run's outputs by path, the first OUTPUTS_LISTED of them, and how many more it left
    # (None until a run leaves some, so that a status without any reads as before).
    outputs: list[Output] | None = None
    outputs_more: int | None = None
    # The dependencies' runs this run's first attempt was handed (`after`): every relaunch of the run
    # is handed the same, whatever its dependencies have run since (None until such a run launches).
    inputs: list[HandedInput] | None = None
    drill: Drill | None = None  # the run's newest drill (None until one is asked for)

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts and self.attempts[-1].open else None

    @model_validator(mode="after")
    def _attempts_own_runs(self) -> JobStatus:
        """A status written before attempts named their run: its run's attempts are its last
        `total_attempts` (counted per run, appended after the earlier runs' kept ones); the others
        belonged to earlier runs whose ids it did not record (the page finds them in the history)."""
        unnamed = [i for i, a in enumerate(self.attempts) if not a.run_id]
        if unnamed and self.run_id:
            own = set(range(len(self.attempts) - min(self.total_attempts, len(self.attempts)), len(self.attempts)))
            for i in unnamed:
                if i in own:
                    self.attempts[i] = self.attempts[i].model_copy(update={"run_id": self.run_id})
        return self

    def runs(self) -> list[tuple[str, list[Attempt]]]:
        """The kept attempts by run, this run first, then the earlier ones newest first ("" for a run
        whose id was not recorded)."""
        order: list[str] = [self.run_id]
        by_run: dict[str, list[Attempt]] = {self.run_id: []}
        for a in reversed(self.attempts):
            run = a.run_id
            if run not in by_run:
                order.append(run)
                by_run[run] = []
            by_run[run].insert(0, a)
        return [(r, by_run[r]) for r in order if by_run[r] or r == self.run_id]


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def from_iso(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, datetime):
        return value.replace(tzinfo=value.tzinfo or UTC).timestamp()
    return datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


_TIME_FIELDS = ("started", "ended", "unseen_since", "backoff_until", "first_beat", "eta", "refused",
                "running_since", "seen_at", "requested")


def _times_to_iso(data: Any) -> Any:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            if k in _TIME_FIELDS and isinstance(v, int | float):
                out[k] = iso(v)
            elif k == "provider_backoff" and isinstance(v, dict):
                out[k] = {p: iso(t) for p, t in v.items()}
            else:
                out[k] = _times_to_iso(v)
        return out
    if isinstance(data, list):
        return [_times_to_iso(x) for x in data]
    if isinstance(data, float):
        return round(data, 4)
    return data


def _times_from_iso(data: Any) -> Any:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            if k in _TIME_FIELDS:
                out[k] = from_iso(v)
            elif k == "provider_backoff" and isinstance(v, dict):
                out[k] = {p: from_iso(t) for p, t in v.items()}
            else:
                out[k] = _times_from_iso(v)
        return out
    if isinstance(data, list):
        return [_times_from_iso(x) for x in data]
    return data


# libyaml when present (about 10x faster; a tick renders and reads every status file).
_Dumper: type = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_Loader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_ANCHOR = re.compile(rb"(?:^|[:\-\[,{]\s)&\S", re.MULTILINE)
MAX_STATUS_BYTES = 1_000_000


class _LiteralDumper(_Dumper):  # type: ignore[misc, valid-type]
    pass


def _str_presenter(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_LiteralDumper.add_representer(str, _str_presenter)


def _dump(data: Any) -> str:
    """YAML keeping non-ASCII text as it is, unless some value holds a character a terminal acts on
    that YAML counts as printable (a bidirectional override): then every non-ASCII character is
    written as an escape, as control characters always are. It reads back the same either way."""
    text: str = yaml.dump(data, Dumper=_LiteralDumper, sort_keys=True, allow_unicode=True, width=100)
    if lines(text) == text:
        return text
    ascii_only: str = yaml.dump(data, Dumper=_LiteralDumper, sort_keys=True, width=100)
    return ascii_only


def render_status(status: JobStatus) -> str:
    """Canonical YAML for `status/<job>.yaml`. Whole seconds, so re-rendering is stable."""
    data = status.model_dump(mode="json", exclude_none=True)
    data = _times_to_iso(data)
    header = "# Written by the reconciler; do not edit. History: git log -- status/" + status.job + ".yaml\n"
    return header + _dump(data)


def parse_status(text: str | bytes) -> JobStatus | None:
    """Reads a status file back; a damaged one is treated as absent (status is ours to rewrite).
    We never write anchors, so a file with one (a possible alias bomb) counts as damaged."""
    raw = text.encode() if isinstance(text, str) else text
    if len(raw) > MAX_STATUS_BYTES or _ANCHOR.search(raw):
        return None
    try:
        data = yaml.load(raw, Loader=_Loader)  # noqa: S506 - a safe loader
        if not isinstance(data, dict):
            return None
        return JobStatus.model_validate(_times_from_iso(data))
    except (yaml.YAMLError, ValidationError, ValueError):
        return None


def render_index(statuses: list[JobStatus], errors: list[str], ledger: list[ProviderLedger] | None = None,
                 deadlines: dict[str, float] | None = None, store_fault: str | None = None,
                 room: dict[str, str] | None = None) -> str:
    """`status/README.md`: one table of all jobs (and the provider ledger), for people browsing the
    repository; `store_fault` says what is wrong with run storage, when something is; `room` what the
    daemon has seen of each provider's room (status.room.room_words)."""
    lines = [
        "# Status",
        "",
        "Written by the reconciler on every change; do not edit.",
        "",
        *([f"**Run storage fault:** {cell(store_fault)}. Nothing is charged or launched until it is back; "
           "live workers keep training and retry their saves.", ""] if store_fault else []),
        "| job | phase | progress | attempts | interruptions | failures | ETA (UTC) | spent / projected | risk "
        "| message |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for st in sorted(statuses, key=lambda s: s.job):
        pct = st.progress.percent()
        prog = f"{st.progress.step}/{st.progress.target} ({pct:.0f}%)" if pct is not None else str(
            st.progress.step)
        eta, cost, risk = forecast_cells(st, (deadlines or {}).get(st.job))
        msg = cell(st.message)
        lines.append(
            f"| {st.job} | {st.phase.value} | {prog} | {st.total_attempts} | {st.interruptions} | "
            f"{st.failures} | {eta} | {cost} | {cell(risk)} | {msg} |"
        )
    lines += render_ledger_table(ledger or [], room or {})
    # A held change (a cancel waiting for its confirmation), once; one already among the errors is not repeated.
    held = sorted({st.held for st in statuses if st.held and not any(st.held in e for e in errors)})
    if held:
        lines += ["", "## Held", ""] + [f"- {note}" for note in held]
    if errors:
        lines += ["", "## Manifest errors", ""]
        lines += [f"- {one_line(e)}" for e in errors]
    return "\n".join(lines) + "\n"


def cell(text: str) -> str:
    """Text fit for one markdown table cell: no column break, control characters visible."""
    return one_line(text.replace("|", "\\|").replace("\n", " "))


# ---- time and money, as the job table and `reconciler status` / `plan` show them ----------------


def when(ts: float) -> str:
    """A moment to the minute, UTC, compact: 2026-12-04 18:30."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M")


def money(x: float) -> str:
    """Dollars: cents under $10, whole dollars above (projections are rounded to two figures anyway)."""
    return f"${x:,.0f}" if abs(x) >= 10 else f"${x:.2f}"


def size_text(n: int) -> str:
    """Bytes as people read them: 512 B, 1.5 KiB, 2.0 GiB (binary units, one decimal)."""
    if n < 1024:
        return f"{n} B"
    value, units = n / 1024, ["KiB", "MiB", "GiB", "TiB"]
    while value >= 1024 and len(units) > 1:
        value, units = value / 1024, units[1:]
    return f"{value:.1f} {units[0]}"


def hours(h: float) -> str:
    """A duration in hours, to the precision the forecast has: 14 h, 2.5 h, 40 min."""
    if abs(h) < 1:
        return f"{h * 60:.0f} min"
    return f"{h:.0f} h" if abs(h) >= 10 else f"{h:.1f} h".replace(".0 h", " h")


_NOTE_SHORT = {"rate not measured yet": "not measured", "no target_steps": "no target_steps"}


def short_note(note: str) -> str:
    """The few words before the note's colon ("rate not measured yet: ..." -> "not measured")."""
    head = note.split(":", 1)[0].strip()
    return _NOTE_SHORT.get(head, head[:40])


def eta_text(st: JobStatus) -> str:
    """When the run should finish, or why that is unknown; empty for a finished job."""
    f = st.forecast
    if st.phase.terminal or f is None:
        return ""
    if f.eta is not None:
        return when(f.eta)
    return short_note(f.note) if f.note else "unknown"


def cost_text(st: JobStatus) -> str:
    """Spent / projected: "$3.20 / $11"; a finished job shows what it cost."""
    f = st.forecast
    if st.phase.terminal or f is None:
        return money(st.cost_usd) if st.cost_usd or st.phase.terminal else ""
    return f"{money(f.spent_usd)} / {money(f.projected_cost_usd) if f.projected_cost_usd is not None else '?'}"


def risk_text(st: JobStatus, deadline: float | None = None) -> str:
    """"on track (14 h slack)"; with the deadline when the caller knows it (the manifest has it)."""
    f = st.forecast
    if st.phase.terminal or f is None or not f.risk:
        return f"due {when(deadline)}" if deadline is not None and not st.phase.terminal else ""
    extra = []
    if f.slack_hours is not None:
        extra.append(f"{hours(f.slack_hours)} slack" if f.slack_hours >= 0 else f"{hours(-f.slack_hours)} short")
    if deadline is not None:
        extra.append(f"due {when(deadline)}")
    return f"{f.risk} ({', '.join(extra)})" if extra else f.risk


def forecast_cells(st: JobStatus, deadline: float | None = None) -> tuple[str, str, str]:
    """ETA, spent / projected, risk: the job table's three forecast cells."""
    return eta_text(st), cost_text(st), risk_text(st, deadline)


# ---- the provider ledger ------------------------------------------------------------------------


class ProviderLedger(Model):
    """One provider's line in `status/providers.yaml`: what its own API says is left (quota or
    credits, as read this tick) beside our own count of what this repository's workers used in
    the current period (the provider's refill week when it has one, else the ISO week)."""

    provider: str
    type: str
    unit: str | None = None  # "gpu-hours" or "credits", when the provider reports an allowance
    remaining: float | None = None
    total: float | None = None
    used: float | None = None
    resets_at: float | None = None
    period_start: float
    worker_hours: float = 0.0  # this period, all our workers here
    gpu_hours: float = 0.0  # this period, workers of jobs that asked for GPUs (times their GPU count)
    cost_usd: float = 0.0  # this period, billed or priced
    running: int = 0
    answers: str | None = None  # set while the provider is slow or does not answer (reconciler.daemon.asking)


def render_ledger(ledger: list[ProviderLedger]) -> str:
    """Canonical YAML for `status/providers.yaml` (figures rounded so a tick rarely changes them)."""
    rows = []
    for line in sorted(ledger, key=lambda x: x.provider):
        data = line.model_dump(mode="json", exclude_none=True)
        for key in ("resets_at", "period_start"):
            if key in data:
                data[key] = iso(data[key])
        money = {"cost_usd"} | ({"remaining", "total", "used"} if line.unit == "credits" else set())
        for key in ("remaining", "total", "used", "worker_hours", "gpu_hours", "cost_usd"):
            if key in data:
                data[key] = round(float(data[key]), 2 if key in money else 1)
        rows.append(data)
    header = "# Written by the reconciler; do not edit. Quota and credits as each provider reports them,\n" \
             "# beside this repository's own use in the current period.\n"
    return header + yaml.dump({"providers": rows}, Dumper=_LiteralDumper, sort_keys=True, width=100)


def render_ledger_table(ledger: list[ProviderLedger], room: dict[str, str] | None = None) -> list[str]:
    """The ledger as markdown lines for `status/README.md`, with what the daemon has seen of each
    provider's room where it has (`room`)."""
    if not ledger:
        return []
    lines = ["", "## Providers", "",
             "| provider | left (provider's word) | refills | used this period | cost | answers | room for a worker |",
             "|---|---|---|---|---|---|---|"]
    for x in sorted(ledger, key=lambda x: x.provider):
        left = "" if x.remaining is None else (f"${x.remaining:.2f} credits" if x.unit == "credits"
                                              else f"{x.remaining:.1f} {x.unit}")
        used = f"{x.worker_hours:.1f} h" + (f" ({x.gpu_hours:.1f} GPU h)" if x.gpu_hours else "")
        lines.append(f"| {x.provider} | {left} | {iso(x.resets_at) or ''} | {used} | ${x.cost_usd:.2f} "
                     f"| {cell(x.answers or '')} | {cell((room or {}).get(x.provider, ''))} |")
    return lines
