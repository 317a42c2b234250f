"""What merging a change to `desired/` would do, job by job, judged from git alone.

Pure: it takes the desired state at the base and head commits and the statuses recorded in git
at the base, never providers or run storage, so a pull-request check needs no credentials. It
follows the planner's rules (reconciler.planner.plan): a changed command, code, env or secrets is a new
run id and a new run from zero; every other field applies to the current run in place; a deleted
manifest cancels, unless its file merely stopped parsing (then the job is held); a restored
manifest revives its run. Only jobs whose manifest differs are listed: a finished job whose
manifest did not change is never proposed for anything.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field
from typing import Any

from desired.models import Job, default_local_provider
from desired.parse import SETTINGS_FILE, DesiredState, ManifestError
from reconciler.cli.sweeps import plan_lines
from reconciler.planner.outlook.spread import MEASURED, JobSpread, job_spread
from reconciler.planner.plan import CONFIRM_CANCEL_TRAILER
from reconciler.planner.tick import SweepChange
from status.models import JobStatus, Phase, ProviderLedger, cell, hours, iso, money, when
from status.redact import without_credentials
from status.text import one_line

# Fields whose digest is the run id (desired.models.Job.run_id): a change there is a new run.
IDENTITY_FIELDS = ("spec.command", "spec.code", "spec.env", "spec.secrets")
KINDS = {  # change -> how a reviewer reads it, in the order a plan lists them
    "restart": "restart from zero",
    "cancel": "cancel",
    "held": "held (manifest error)",
    "new": "new run",
    "restore": "restore",
    "suspend": "suspend",
    "resume": "resume",
    "drill": "drill",
    "in-place": "in place",
    "removed": "remove finished",
}
QUIET_FIELDS = ("cancel", "removed", "held")  # the text output lists no fields for a manifest that is gone
NOT_CHECKED = ("live progress since the last status commit", "providers (availability, quota, prices now)",
               "run storage (durable checkpoints)")
UNMEASURED = "unknown until measured"


@dataclass(frozen=True)
class FieldChange:
    field: str  # dotted path in the manifest, e.g. spec.budget_usd
    base: Any  # JSON value at the base, None when absent
    head: Any


@dataclass
class JobChange:
    job: str
    change: str  # a key of KINDS
    meaning: str  # one sentence for a reviewer
    file: str = ""
    fields: list[FieldChange] = field(default_factory=list)
    phase: str | None = None  # recorded at the base; None: never reconciled
    step: int | None = None
    target: int | None = None
    spent_usd: float | None = None
    projected_cost_usd: float | None = None
    eta: float | None = None
    outlook: str = ""  # projected cost and ETA in words, or why unknown
    spread: JobSpread | None = None  # P50/P90 from simulated futures (attach_spreads), for an unfinished run
    spread_at: float | None = None  # the moment the futures start from (the status commit's time)


@dataclass
class Review:
    base: str
    head: str
    changes: list[JobChange] = field(default_factory=list)
    unchanged: int = 0
    errors: list[ManifestError] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sweeps: list[str] = field(default_factory=list)  # a line per sweep the change touches

    @property
    def judged_from(self) -> str:
        return (f"judged from the status recorded in git at {self.base[:12]}; "
                "providers and run storage were not asked")

    def matches(self, fail_on: set[str]) -> list[str]:
        """The jobs whose change is one of `fail_on` (restart, cancel)."""
        return [c.job for c in self.changes if c.change in fail_on]

    def exit_code(self, fail_on: set[str]) -> int:
        """1 on manifest errors, 2 when a change is one `fail_on` names, else 0."""
        if self.errors:
            return 1
        return 2 if self.matches(fail_on) else 0


def review(base: DesiredState, head: DesiredState, recorded: dict[str, JobStatus], *,
           base_commit: str, head_commit: str, cancel_confirmed: bool = False,
           fork: DesiredState | None = None) -> Review:
    """Every job that differs between `base` and `head`, classified as the planner would act on it.
    `cancel_confirmed`: a commit between them carries the planner's confirm-cancel trailer.
    `fork`: the desired state at their merge base when `base` has moved on since the head branched
    off; a job the head left as it was there keeps the base's version in the merge, so it is not
    listed (else every job added on the base since would read as a cancel)."""
    out = Review(base=base_commit, head=head_commit, errors=list(head.errors))
    for name in sorted(set(base.jobs) | set(head.jobs)):
        untouched = fork is not None and fork.jobs.get(name) == head.jobs.get(name)
        change = None if untouched else _classify(name, base, head, recorded.get(name))
        if change is None:
            out.unchanged += 1
        else:
            out.changes.append(change)
    out.changes.sort(key=lambda c: (list(KINDS).index(c.change), c.job))  # what a reviewer must see first
    out.sweeps = _sweep_lines(base, head, recorded, out.changes)
    hold = _mass_cancel(out, recorded, cancel_confirmed, head)
    if hold:
        out.notes.append(hold)
    if any(e.file == SETTINGS_FILE for e in head.errors):
        out.notes.append(f"{SETTINGS_FILE} has errors at the head: the reconciler holds every job as it is "
                         "(nothing launched or stopped) until they are fixed")
    out.notes.extend(_provider_notes(base, head, fork))
    if base.settings.storage != head.settings.storage and (fork or base).settings.storage != head.settings.storage:
        old, new = without_credentials(base.settings.storage), without_credentials(head.settings.storage)
        out.notes.append(f"storage changes from {old} to {new}: each run's "
                         "data is copied there (and verified) before its next attempt")
    return out


def _classify(name: str, base: DesiredState, head: DesiredState, st: JobStatus | None) -> JobChange | None:
    old, new = base.jobs.get(name), head.jobs.get(name)
    if new is None:
        assert old is not None
        return _removed(name, base, head, st)
    if old is None:
        return _added(new, head.job_files.get(name, ""), st)
    if old == new:
        return None  # a manifest moved to another file is the same job, the same run
    fields = diff_fields(old, new)
    c = _base_change(name, head.job_files.get(name, ""), st, fields)
    if st is not None and old.run_id() != new.run_id() == st.run_id and not st.phase.terminal:
        c.change = "restore"  # the status never left this run (the base's change was not acted on yet)
        c.meaning = f"run {st.run_id} is the one recorded at the base: it goes on from {_progress(st)}, no restart"
        _recorded_outlook(c, st)
    elif old.run_id() != new.run_id():
        _restart(c, old, new, st)
    elif old.spec.suspend != new.spec.suspend:
        _suspend(c, new.spec.suspend, st)
    elif new.spec.drill_request is not None and old.spec.drill_request != new.spec.drill_request:
        _drill(c, new, st)
    else:
        _in_place(c, st)
    return c


def _base_change(name: str, file: str, st: JobStatus | None, fields: list[FieldChange]) -> JobChange:
    c = JobChange(job=name, change="in-place", meaning="", file=file, fields=fields)
    if st is not None:
        c.phase = st.phase.value
        c.step, c.target = st.progress.step, st.progress.target
    return c


def _restart(c: JobChange, old: Job, new: Job, st: JobStatus | None) -> None:
    c.change = "restart"
    c.outlook = UNMEASURED
    what = f"run {new.run_id()} replaces {old.run_id()} ({_identity_changed(c.fields)} changed)"
    if st is None or st.run_id != old.run_id():
        c.meaning = f"{what}; no progress of the old run is recorded at the base, so none is known to be lost"
    elif st.phase == Phase.SUCCEEDED:
        c.meaning = f"{what}; the finished run stays in storage and a new one starts from zero"
    else:
        c.meaning = f"{what}: {_progress(st, lost=True)}{_stopping(st, 'stopped')}"
    if new.spec.suspend:
        c.meaning += "; the new run is suspended (nothing launches)"


def _suspend(c: JobChange, suspend: bool, st: JobStatus | None) -> None:
    c.change = "suspend" if suspend else "resume"
    _recorded_outlook(c, st)
    if _finished(st):
        c.meaning = _finished_meaning(st)
    elif suspend:
        c.meaning = ("suspended: nothing launches until suspend is false; "
                     f"{_progress(st)} is kept{_stopping(st, 'saves and stops, not charged')}")
    else:
        c.meaning = f"resumes from {_progress(st)}"
    c.meaning += _also_in_place(c)


def _drill(c: JobChange, new: Job, st: JobStatus | None) -> None:
    """A drill asked for (`reconciler drill`): what it does to the running worker, and that it is free."""
    assert new.spec.drill_request is not None
    r = new.spec.drill_request
    c.change = "drill"
    _recorded_outlook(c, st)
    how = ("stopped on the provider's notice, then resumed at its final checkpoint" if r.notice else
           f"killed with no notice {r.lookahead} steps after its next checkpoint, then resumed there")
    c.meaning = (f"drill {r.id}: the worker is {how}{f' on {r.to}' if r.to else ''}, and the steps are compared; "
                 f"charged to nothing, {_progress(st)} is kept")
    rest = [f.field.removeprefix("spec.") for f in c.fields if not f.field.startswith("spec.drill_request")]
    c.meaning += f"; also applied in place: {', '.join(rest)}" if rest else ""


def _in_place(c: JobChange, st: JobStatus | None) -> None:
    _recorded_outlook(c, st)
    fields = ", ".join(f.field.removeprefix("spec.") for f in c.fields)
    if _finished(st):
        c.meaning = f"{fields}: {_finished_meaning(st)}"
    else:
        c.meaning = f"applied in place ({fields}): the run keeps {_progress(st)}"


def _also_in_place(c: JobChange) -> str:
    rest = [f.field.removeprefix("spec.") for f in c.fields if f.field != "spec.suspend"]
    return f"; also applied in place: {', '.join(rest)}" if rest else ""


def _removed(name: str, base: DesiredState, head: DesiredState, st: JobStatus | None) -> JobChange:
    file = base.job_files.get(name, "")
    c = JobChange(job=name, change="cancel", meaning="", file=(st.manifest if st and st.manifest else file),
                  fields=diff_fields(base.jobs[name], None))
    if st is not None:
        c.phase, c.step, c.target = st.phase.value, st.progress.step, st.progress.target
        c.spent_usd = st.cost_usd
    if c.file in head.files_with_errors:
        c.change = "held"
        c.meaning = f"{c.file} has errors at the head: the job is held as it is until they are fixed, never cancelled"
        _recorded_outlook(c, st)
    elif _finished(st) or (st is not None and st.phase == Phase.CANCELLED):
        assert st is not None
        c.change = "removed"
        c.meaning = f"already {st.phase.value}: nothing is stopped; its status file stays as history"
    elif st is None:
        c.meaning = "cancelled before it was ever reconciled: nothing to stop"
    else:
        c.meaning = (f"cancelled{_stopping(st, 'stopped, billed until it is gone')}; {_progress(st)} stays in "
                     "storage, and restoring the manifest resumes it")
        c.outlook = f"{money(st.cost_usd)} spent; nothing more once the worker is gone"
    return c


def _added(new: Job, file: str, st: JobStatus | None) -> JobChange:
    c = JobChange(job=new.name, change="new", meaning="a new run from zero", file=file, outlook=UNMEASURED,
                  fields=diff_fields(None, new))
    if st is not None and st.run_id == new.run_id():
        c.change, c.phase, c.step, c.target = "restore", st.phase.value, st.progress.step, st.progress.target
        _recorded_outlook(c, st)
        if st.phase == Phase.CANCELLED:
            c.meaning = f"manifest restored: run {st.run_id} resumes from {_progress(st)}"
        else:
            c.meaning = f"manifest restored: run {st.run_id} is {st.phase.value}; nothing new starts"
    elif st is not None:
        c.meaning = f"a new run from zero (the earlier run {st.run_id}, {st.phase.value}, is not resumed)"
    if new.spec.suspend:
        c.meaning += "; suspended: nothing launches until suspend is false"
    return c


def _finished(st: JobStatus | None) -> bool:
    return st is not None and st.phase in (Phase.SUCCEEDED, Phase.FAILED)


def _finished_meaning(st: JobStatus | None) -> str:
    assert st is not None
    if st.phase == Phase.SUCCEEDED:
        return "the run already succeeded: nothing to apply, nothing re-runs"
    return "the job stays Failed (a new run needs a change of command, code or env)"


def _progress(st: JobStatus | None, lost: bool = False) -> str:
    """'step 41000 of 100000 (41%)' as recorded; with `lost`, said as what is thrown away."""
    if st is None:
        return "its progress (none recorded yet)"
    step, target = st.progress.step, st.progress.target
    if step <= 0:
        return "no durable progress yet, so nothing is lost" if lost else "its progress (none yet)"
    percent = step * 100 // target if target else 0
    where = f"step {step} of {target} ({percent or '<1'}%)" if target else f"step {step}"
    return f"{where} is thrown away" if lost else where


def _stopping(st: JobStatus | None, how: str) -> str:
    cur = st.current if st is not None else None
    return f"; the live worker on {cur.provider} is {how}" if cur is not None else ""


def _identity_changed(fields: list[FieldChange]) -> str:
    names = {f.field.split(".")[1] for f in fields if f.field.startswith(IDENTITY_FIELDS)}
    return ", ".join(sorted(names)) or "the run identity"


def _recorded_outlook(c: JobChange, st: JobStatus | None) -> None:
    """Cost and ETA as the base's status forecast them (the change itself may move them)."""
    if st is None:
        c.outlook = UNMEASURED
        return
    c.spent_usd = st.cost_usd
    f = st.forecast
    if st.phase.terminal or f is None:
        c.outlook = f"{money(st.cost_usd)} spent ({st.phase.value})" if st.phase.terminal else "no forecast recorded"
        return
    c.spent_usd, c.projected_cost_usd, c.eta = f.spent_usd, f.projected_cost_usd, f.eta
    if f.projected_cost_usd is None or f.eta is None:
        c.outlook = f"{money(f.spent_usd)} spent; unknown ({f.note or 'no rate to project from'})"
        return
    risk = f", {f.risk}" if f.risk else ""
    before = " before this change" if c.fields else ""  # a new budget, deadline or placement may move it
    c.outlook = f"{money(f.projected_cost_usd)} ({money(f.spent_usd)} spent), ETA {when(f.eta)} UTC{risk}{before}"


STARTS = ("restart", "new", "restore", "resume")  # changes after which a member's run starts (again)


def _sweep_lines(base: DesiredState, head: DesiredState, recorded: dict[str, JobStatus],
                 changes: list[JobChange]) -> list[str]:
    """For each sweep with a changed member, what merging does to its members (start, stop, keep
    going, finished) and its projected cost, in the words `plan` uses."""
    changed = {c.job: c.change for c in changes}
    touched = sorted({name for name, sw in (*base.sweeps.items(), *head.sweeps.items())
                      if any(m in changed for m in sw.members)})
    out = []
    for name in touched:
        sc = SweepChange(name)
        for member in head.sweeps[name].members if name in head.sweeps else []:
            st = recorded.get(member)
            kind = changed.get(member)
            if kind in STARTS or st is None:
                sc.start.append(member)
            elif st.phase.terminal and kind is None:
                sc.done.append(member)
            elif kind not in ("cancel", "removed"):
                sc.keep.append(member)
        head_members = set(head.sweeps[name].members) if name in head.sweeps else set()
        sc.stop = [m for m in (base.sweeps[name].members if name in base.sweeps else [])
                   if m not in head_members and changed.get(m) == "cancel"]
        out.append(sc)
    return plan_lines(out, recorded)


def _mass_cancel(out: Review, recorded: dict[str, JobStatus], confirmed: bool, head: DesiredState) -> str:
    """The planner holds a change that cancels most active jobs at once (reconciler.planner.plan); say so.
    Members an edit of their sweep's matrix removes are not counted, as the planner does not."""
    active = [st for st in recorded.values() if not st.phase.terminal]
    sweep = {name: st.sweep for name, st in recorded.items()}
    doomed = [c for c in out.changes if c.change == "cancel" and c.phase is not None
              and sweep.get(c.job) not in head.sweeps]
    if confirmed or len(doomed) < 2 or len(doomed) * 2 <= len(active):
        return ""
    return (f"the {len(doomed)} cancels (of {len(active)} active jobs) are held by the reconciler until a commit "
            f"carries the trailer '{CONFIRM_CANCEL_TRAILER}'")


def _provider_notes(base: DesiredState, head: DesiredState, fork: DesiredState | None) -> list[str]:
    notes = []
    for name in sorted(set(base.providers) | set(head.providers)):
        old, new = base.providers.get(name), head.providers.get(name)
        if fork is not None and fork.providers.get(name) == new:
            continue  # the head did not touch it: the merge keeps the base's
        if old is None:
            default = " (the default when no provider is declared)" if new == default_local_provider() else ""
            notes.append(f"provider {name}{default} is added")
        elif new is None:
            notes.append(f"provider {name} is removed (workers still on it are stopped through its last definition)")
        elif old != new:
            changed = ", ".join(f.field for f in _diff(old.model_dump(mode="json"), new.model_dump(mode="json")))
            notes.append(f"provider {name} changes: {changed}")
    return notes


def diff_fields(old: Job | None, new: Job | None) -> list[FieldChange]:
    """The manifest fields that differ, as dotted paths (a mapping is walked, a list is one value)."""
    a = old.model_dump(mode="json", exclude_defaults=True) if old else {}
    b = new.model_dump(mode="json", exclude_defaults=True) if new else {}
    return [f for f in _diff(a, b) if f.field not in ("kind", "apiVersion", "metadata.name")]


def _diff(a: Any, b: Any, prefix: str = "") -> list[FieldChange]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[FieldChange] = []
        for key in sorted(set(a) | set(b), key=str):
            out += _diff(a.get(key), b.get(key), f"{prefix}.{key}" if prefix else str(key))
        return out
    if isinstance(a, dict) and b is None:
        return _diff(a, {}, prefix)
    if isinstance(b, dict) and a is None:
        return _diff({}, b, prefix)
    return [] if a == b else [FieldChange(prefix, a, b)]


# ---- the spread: simulated futures of each unfinished run ----------------------------------------

NO_FUTURES = {"restart": "a new run: unknown until measured", "new": "a new run: unknown until measured",
              "suspend": "suspended: no progress until suspend is false"}


def attach_spreads(r: Review, head: DesiredState, recorded: dict[str, JobStatus],
                   ledger: dict[str, ProviderLedger], now: float, futures: int = 400) -> None:
    """For every unfinished run the change touches, its futures as the head's manifest would run
    them, from what the base's status measured at `now` (its commit's time)."""
    for c in r.changes:
        job, st = head.jobs.get(c.job), recorded.get(c.job)
        if job is None or c.change in ("cancel", "removed", "held") or _finished(st):
            continue
        fresh = c.change in NO_FUTURES or st is None or st.run_id != job.run_id()
        if job.spec.suspend or (fresh and not job.spec.step_seconds):
            c.spread = JobSpread(c.job, note=NO_FUTURES.get(c.change, "no run recorded yet"))
            continue
        # A new run with a stated step time: its futures from that and what the providers measured.
        c.spread = job_spread(job, None if fresh else st, head.providers, recorded.values(), now, ledger, futures)
        c.spread_at = now


def spread_text(c: JobChange) -> str:
    """P50 and P90 of time and cost, and the chance of meeting deadline and budget, in words."""
    sp = c.spread
    if sp is None:
        return ""
    if sp.spread is None or c.spread_at is None:
        return f"futures: none ({sp.note})"
    s = sp.spread
    t50, t90 = (_finish(c.spread_at, x) for x in s.seconds)
    words = [f"finish P50 {t50}, P90 {t90}", f"cost P50 {_usd(s.cost_usd[0])}, P90 {_usd(s.cost_usd[1])}"]
    if s.p_deadline is not None:
        words.append(f"deadline met in {_share(s.p_deadline)} of futures")
    if s.p_budget is not None:
        words.append(f"budget kept in {_share(s.p_budget)}")
    where = sp.provider + (f", {sp.fallback} as fallback" if sp.fallback else "")
    return f"{'; '.join(words)} ({s.futures} futures on {where})"


def _finish(at: float, seconds: float) -> str:
    return f"{hours(seconds / 3600.0)} ({when(at + seconds)} UTC)" if seconds < float("inf") else "never"


def _usd(x: float) -> str:
    return money(x) if x < float("inf") else "unbounded"


def _share(p: float) -> str:
    """A share of futures, never rounded to a certainty it is not: 399 of 400 is 99.75%, not 100%."""
    percent = p * 100.0
    text = f"{percent:.0f}%"
    if text in ("0%", "100%") and 0.0 < p < 1.0:
        text = f"{percent:.2f}%"
    return text


def inputs_text(sp: JobSpread) -> str:
    """Which inputs are not measured here: 'borrowed: spot mtbf (the prior ...); declared: ...'."""
    parts = []
    for source in ("borrowed", "declared"):
        said = [f"{i.provider} {i.name} ({i.how})" for i in sp.inputs if i.source == source]
        if said:
            parts.append(f"{source}: {', '.join(said)}")
    measured = sum(i.source == MEASURED for i in sp.inputs)
    return f"{measured} of {len(sp.inputs)} inputs measured" + (f"; {'; '.join(parts)}" if parts else "")


# ---- output ---------------------------------------------------------------------------------------


def value_text(value: Any) -> str:
    return "(unset)" if value is None else json.dumps(value, ensure_ascii=False)


def render_text(r: Review) -> str:
    lines = [f"plan {r.base[:12]}..{r.head[:12]}: {r.judged_from}",
             f"not checked: {'; '.join(NOT_CHECKED)}",
             _summary(r)]
    for c in r.changes:
        lines.append(f"- {c.job}: {KINDS[c.change]}: {c.meaning}")
        for f in [] if c.change in QUIET_FIELDS else c.fields:
            lines.append(f"    {f.field}: {value_text(f.base)} -> {value_text(f.head)}")
        if c.outlook:
            lines.append(f"    projected: {c.outlook}")
        if c.spread is not None:
            lines.append(f"    futures: {spread_text(c).removeprefix('futures: ')}")
            if c.spread.spread is not None:
                lines.append(f"    inputs: {inputs_text(c.spread)}")
    lines += r.sweeps
    lines += [f"note: {n}" for n in r.notes]
    lines += [f"error: {e}" for e in r.errors]
    return "\n".join(map(one_line, lines))  # names, values and errors come from the change under review


def _summary(r: Review) -> str:
    counts: dict[str, int] = {}
    for c in r.changes:
        counts[KINDS[c.change]] = counts.get(KINDS[c.change], 0) + 1
    parts = [f"{n} {kind}" for kind, n in counts.items()] or ["no job changes"]
    errors = f", {len(r.errors)} manifest error(s)" if r.errors else ""
    return f"{', '.join(parts)}; {r.unchanged} job{'' if r.unchanged == 1 else 's'} unchanged{errors}"


def render_markdown(r: Review) -> str:
    """One pull-request comment: a summary table, then the changed fields of each job folded away."""
    lines = ["### reconciler plan", "", f"{_summary(r)}.", "",
             f"_{r.judged_from[0].upper()}{r.judged_from[1:]} (not checked: {'; '.join(NOT_CHECKED)})._", ""]
    if r.errors:
        lines += ["**Manifest errors** (the check fails):", ""]
        lines += [f"- `{one_line(e.file)}`: {cell(str(e).removeprefix(e.file + ': '))}" for e in r.errors] + [""]
    if r.changes:
        lines += ["| job | change | what it means | projected cost / ETA | P50 / P90 (simulated futures) |",
                  "|---|---|---|---|---|"]
        for c in r.changes:
            kind = f"**{KINDS[c.change]}**" if c.change in ("restart", "cancel") else KINDS[c.change]
            lines.append(f"| `{c.job}` | {kind} | {cell(c.meaning)} | {cell(c.outlook)} "
                         f"| {cell(spread_text(c).removeprefix('futures: '))} |")
        lines.append("")
        if any(c.spread is not None and c.spread.spread is not None for c in r.changes):
            lines += [f"_{FUTURES_NOTE}_", ""]
    lines += [f"- {cell(line)}" for line in r.sweeps] + ([""] if r.sweeps else [])
    for c in r.changes:
        lines += _details(c)
    lines += [f"- {cell(n)}" for n in r.notes]
    return "\n".join(lines).rstrip() + "\n"


def _details(c: JobChange) -> list[str]:
    """The job's changed fields as a diff, folded; the fence outgrows any backticks in a value."""
    body = []
    for f in c.fields:
        if f.base is not None:
            body.append(f"- {f.field}: {value_text(f.base)}")
        if f.head is not None:
            body.append(f"+ {f.field}: {value_text(f.head)}")
    body = [one_line(line) for line in body]
    fence = "`" * max([3, *(len(run) + 1 for line in body for run in re.findall("`+", line))])
    file = html.escape(one_line(c.file or "no file"))
    return [f"<details><summary><code>{c.job}</code>: {KINDS[c.change]} ({file})</summary>", "",
            f"{fence}diff", *body, fence, "", *_inputs_table(c), "</details>", ""]


FUTURES_NOTE = ("P50 and P90: half and nine in ten of the simulated futures of the rest of the run finish "
                "(or cost) at most this; each job's inputs below say which were measured here, which borrowed "
                "(other providers, a prior) and which declared (settings)")


def _inputs_table(c: JobChange) -> list[str]:
    """What the job's futures were fed, each input measured, borrowed or declared."""
    sp = c.spread
    if sp is None or sp.spread is None:
        return []
    rows = [f"| {i.provider} | {i.name} | {_value(i.value, i.unit)} | {i.source} | {cell(i.how)} |"
            for i in sp.inputs]
    return ["| provider | input | value | source | from |", "|---|---|---|---|---|", *rows, ""]


def _value(value: float | None, unit: str) -> str:
    if value is None:
        return "no limit"
    if unit == "s":
        return hours(value / 3600.0)
    if unit == "$/h":
        return f"${value:g}/h"
    return f"{value:,.4g} {unit}"


def render_json(r: Review, fail_on: set[str]) -> dict[str, Any]:
    """The documented shape (docs/guides/pull-requests.md); keys are only ever added."""
    return {
        "base": r.base, "head": r.head, "judged_from": r.judged_from, "not_checked": list(NOT_CHECKED),
        "jobs": [{
            "job": c.job, "change": c.change, "meaning": c.meaning, "file": c.file, "phase_at_base": c.phase,
            "step": c.step, "target": c.target, "spent_usd": c.spent_usd,
            "projected_cost_usd": c.projected_cost_usd, "eta": iso(c.eta), "outlook": c.outlook,
            "fields": [{"field": f.field, "base": f.base, "head": f.head} for f in c.fields],
            "spread": _spread_json(c),
        } for c in r.changes],
        "unchanged": r.unchanged,
        "errors": [{"file": e.file, "document": e.document, "field": e.field, "message": e.message}
                   for e in r.errors],
        "notes": r.notes,
        "sweeps": r.sweeps,
        "fail_on": sorted(fail_on), "failed_on": r.matches(fail_on), "exit_code": r.exit_code(fail_on),
    }


def _spread_json(c: JobChange) -> dict[str, Any] | None:
    """The futures' figures, unrounded: seconds and dollars; None for a job with no run to simulate."""
    sp = c.spread
    if sp is None:
        return None
    out: dict[str, Any] = {"note": sp.note, "provider": sp.provider, "fallback": sp.fallback or None}
    s, at = sp.spread, c.spread_at
    if s is not None and at is not None:
        finite = [x if x < float("inf") else None for x in s.seconds]
        cost = [round(x, 2) if x < float("inf") else None for x in s.cost_usd]
        out.update({
            "futures": s.futures, "unfinished": s.unfinished, "from": iso(at),
            "p50_seconds": finite[0], "p90_seconds": finite[1],
            "p50_finish": iso(at + finite[0]) if finite[0] is not None else None,
            "p90_finish": iso(at + finite[1]) if finite[1] is not None else None,
            "p50_cost_usd": cost[0], "p90_cost_usd": cost[1],
            "p_deadline": s.p_deadline, "p_budget": s.p_budget,
            "inputs": [{"provider": i.provider, "input": i.name, "value": i.value, "unit": i.unit,
                        "source": i.source, "from": i.how} for i in sp.inputs]})
    return out
