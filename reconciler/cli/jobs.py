"""Commands about one job (describe, suspend, resume, cancel), `--version`, and the pieces `status`
and `run` borrow (a progress bar cell, the start-up summary). Registered on the typer app of
reconciler.cli.main when it is imported."""

from __future__ import annotations

import logging
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from reconciler.cli.common import RepoOption, _fail, _reconciler, app, console
from reconciler.daemon.source import BranchOption, PathOption, UrlOption
from reconciler.trust.shown import block, escape

if TYPE_CHECKING:
    from desired.parse import DesiredState
    from reconciler.daemon.loop import Reconciler
    from status.models import Attempt, JobStatus

BAR_WIDTH = 12  # characters: narrow enough that a 200-column table keeps its other cells on one line
EVENTS_SHOWN = 15


# ---- --version ------------------------------------------------------------------------------------
def _version(value: bool) -> None:
    if value:
        try:
            console.print(f"reconciler {version('reconciler')}")
        except PackageNotFoundError:
            console.print("reconciler (version unknown: not installed as a package)")
        raise typer.Exit()


@app.callback()
def _options(show_version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="print the version and exit")] = False) -> None:
    pass


# ---- pieces of `status` and `run` -----------------------------------------------------------------
def progress_cell(step: int, target: int | None, durable: int | None) -> Table | str:
    """A bar (the heartbeat step of the target) beside `step/target pct (saved N)`; no target: the step."""
    if not target:
        return str(step)
    bar = ProgressBar(total=float(target), completed=float(min(step, target)), width=BAR_WIDTH)
    pct = 100.0 * min(step, target) / target
    cell = Table.grid(padding=(0, 1))
    cell.add_column(width=BAR_WIDTH, no_wrap=True)  # fixed: a flexible column pads the bar with blanks
    cell.add_column(no_wrap=True)
    cell.add_row(bar, Text(f"{step}/{target} {pct:.0f}% (saved {durable})", no_wrap=True))
    return cell


def announce(rec: Reconciler, tick_seconds: float | None) -> None:
    """Two log lines at start: what this daemon reconciles, and where it writes on this machine or
    elsewhere (run storage, local workers' folders), with credentials in the storage URL masked."""
    from adapters.gitrepo import GitError

    try:
        head = rec.repo.head()
        branch = rec.repo.branch()
    except GitError:
        return  # an empty or detached repository: the first tick says what is wrong
    desired = rec.read_desired(head)
    s = desired.settings
    providers = ", ".join(f"{n} ({p.spec.type})" for n, p in sorted(desired.providers.items())) or "none"
    remote = f", remote {s.remote}" if s.remote else ""
    log = logging.getLogger("reconciler")
    log.info("reconciling %s, branch %s%s; providers: %s; %d job(s); tick every %gs", rec.repo.path, branch, remote,
             providers, len(desired.jobs), tick_seconds if tick_seconds is not None else s.tick_seconds)
    log.info("%s", where_data_goes(rec, desired))


def where_data_goes(rec: Reconciler, desired: DesiredState) -> str:
    """One sentence: the run storage (a folder named in full, and whether it is outside the
    repository) and the folders of local providers' workers."""
    from adapters.local import workers_root
    from desired.models import LocalSettings
    from desired.parse import on_this_machine
    from status.redact import without_credentials

    storage = desired.settings.storage
    url = without_credentials(storage)
    if on_this_machine(storage) and url.startswith("file://"):
        folder = Path(url[len("file://"):]).expanduser().absolute()
        inside = folder.is_relative_to(Path(rec.repo.path).absolute())
        said = f"{folder} on this machine{'' if inside else ', outside the repository'}"
    else:
        said = url
    local = sorted({str(workers_root(p.spec.settings)) for p in desired.providers.values()
                    if isinstance(p.spec.settings, LocalSettings)})
    workers = f"; local workers' folders in {', '.join(local)}" if local else ""
    return f"run data (checkpoints, progress, leases) is stored in {said} (`storage:` in reconciler.yaml){workers}"


# ---- describe -------------------------------------------------------------------------------------
@app.command()
def describe(job: Annotated[str, typer.Argument(help="the job to describe")], repo: RepoOption = Path("."),
             repo_url: UrlOption = None, branch: BranchOption = None, path: PathOption = "") -> None:
    """One job in detail: its phase and message, each attempt (provider, start and end, outcome,
    steps gained and lost, cost) and its recent events (the status commits that changed it)."""
    from reconciler.trust.redaction import secret_values
    from status.models import money, size_text, when
    from status.redact import Redactor

    rec = _reconciler(repo, repo_url, branch, path)
    recorded = rec.read_recorded(rec.fresh_status(False))  # the status branch's, when there is one
    head = rec.repo.head()
    desired = rec.read_desired(head)
    st = recorded.get(job)
    if st is None and job not in desired.jobs:
        raise _fail(f"no job named {job} (jobs: {', '.join(sorted(set(recorded) | set(desired.jobs))) or 'none'})")
    redactor = Redactor(secret_values(desired, rec.environ))

    def show(text: str) -> str:
        return escape(redactor.redact(text))

    manifest = desired.job_files.get(job) or (st.manifest if st else "")
    suspended = job in desired.jobs and desired.jobs[job].spec.suspend
    console.print(f"[bold]{escape(job)}[/bold]: {st.phase.value if st else 'New'}"
                  + (" (suspended in the manifest)" if suspended else "")
                  + f" — {show(st.message if st else 'not reconciled yet')}")
    if manifest:
        console.print(f"  manifest: {escape(manifest)}" + ("" if job in desired.jobs else " (removed)"))
    if st is not None and st.held:
        console.print(f"  held: {show(st.held)}")
    if st is None:
        return
    console.print(f"  run: {st.run_id}   progress: {st.progress.step}"
                  + (f"/{st.progress.target}" if st.progress.target else "")
                  + f"   attempts this run: {st.total_attempts}   interruptions: {st.interruptions}   "
                  f"failures: {st.failures}   steps lost: {st.steps_lost}   cost: {money(st.cost_usd)}")
    if st.drill is not None:
        console.print(f"  {show(st.drill.summary())}")
    _attempt_tables(st, show)
    _reported_metrics(st, desired)
    if st.refusals:  # launches that never became attempts: they have no number
        refused = Table("when (UTC)", "provider", "refused with", title="refused launches (the newest few)")
        for r in st.refusals:
            refused.add_row(when(r.refused), escape(r.provider), show(r.error))
        console.print(refused)
    if st.outputs:
        more = f" and {st.outputs_more} more" if st.outputs_more else ""
        listed = ", ".join(f"{show(o.path)} ({size_text(o.size)})" for o in st.outputs)
        console.print(f"  outputs: {listed}{more}   (reconciler artifacts pull {escape(job)} DEST)")
    _events(rec, job, show)
    if st.log_tail:
        console.print("last log lines of a failed attempt:")
        console.print(block(redactor.redact(st.log_tail)))


def _attempt_tables(st: JobStatus, show: Callable[[str], str]) -> None:
    """The kept attempts, one table per run: this run first, then the earlier runs (a changed
    command starts a new run; its status keeps their last attempts). `#` is the number
    `reconciler logs --attempt` takes."""
    from reconciler.cli.status import natural_width
    from reconciler.daemon.logs import attempt_numbers

    number = {id(a): n for n, a in zip(attempt_numbers(st), st.attempts, strict=True)}
    for run, attempts in st.runs():
        name = run or "(id not recorded)"
        title = f"attempts of run {name} (this run)" if run == st.run_id else f"attempts of earlier run {name}"
        table = Table("#", "provider", "worker", "started (UTC)", "ended (UTC)", "outcome", "steps",
                      "gained", "lost", "cost", "detail", title=title)
        rows = [_attempt_cells(st, a, number[id(a)], show) for a in attempts]
        for cells in rows:
            table.add_row(*cells)
        if rows and natural_width(console, table) <= console.width:
            console.print(table)
        elif rows:  # a narrow terminal: a table would cut every cell to a few letters
            console.print(f"[italic]{title}[/italic]")
            for n, provider, worker, started, ended, outcome, steps, gained, lost, cost, detail in rows:
                console.print(f"  {n}. {outcome} on {provider}, steps {steps} (gained {gained or '?'}, lost {lost}), "
                              f"{cost}; {started} to {ended}; worker {worker}")
                if detail:
                    console.print(f"     {detail}")


def _attempt_cells(st: JobStatus, a: Attempt, number: int, show: Callable[[str], str]) -> tuple[str, ...]:
    from status.models import money, when

    end = a.step_end if a.step_end is not None else (st.progress.step if a.open else None)
    gained = "" if end is None else str(max(0, end - a.step_start))
    return (str(number), escape(a.provider), escape(a.worker), when(a.started),
            when(a.ended) if a.ended else "running", a.outcome.value if a.outcome else "open",
            f"{a.step_start}→{end if end is not None else '?'}", gained, str(a.steps_lost), money(a.cost_usd),
            show(a.detail))


def _reported_metrics(st: JobStatus, desired: DesiredState) -> None:
    """What the run's worker reported besides its step (loss, accuracy, ...), from the series it
    keeps in run storage: each metric's newest value, and its range over the run."""
    from adapters import series
    from adapters.storage import RunFolder, StorageError
    from reconciler.daemon.execute import store_options

    store = st.storage or desired.settings.storage
    try:
        found = series.read(RunFolder.for_run(store, st.job, st.run_id, store_options(store, desired.settings)).store)
    except (StorageError, OSError, ValueError) as exc:
        console.print(f"  metrics: cannot be read from run storage now ({escape(str(exc))})")
        return
    if not found:
        return
    table = Table("metric", "newest", "at step", "lowest", "highest", "points",
                  title=f"metrics the worker reported (run {st.run_id})")
    for name, points in found.items():
        values = [v for _, v in points]
        table.add_row(escape(name), f"{values[-1]:.6g}", str(points[-1][0]), f"{min(values):.6g}",
                      f"{max(values):.6g}", str(len(points)))
    console.print(table)


def _events(rec: Reconciler, job: str, show: Callable[[str], str]) -> None:
    """The lines about `job` in the newest status commits that changed its status file."""
    import git

    try:
        out = rec.repo.repo.git.log(f"-{EVENTS_SHOWN}", "--format=%x01%h%x00%ct%x00%B", "--",
                                    f"status/{job}.yaml")
    except git.GitCommandError:
        return
    from status.models import when

    table = Table("when (UTC)", "commit", "event", title="events (status commits, newest first)")
    for entry in out.split("\x01"):
        sha, _, rest = entry.strip().partition("\x00")
        stamp, _, body = rest.partition("\x00")
        if not sha:
            continue
        lines = body.strip().splitlines()
        # A subject with a body of "- job: ..." lines is their summary: the lines are told, whole, once.
        told = [ln[2:].strip() for ln in lines if ln.startswith("- ")] or lines[:1]
        mine = [ln for ln in told if ln.startswith(f"{job}:")] or told[:1]
        for line in mine:
            table.add_row(when(float(stamp)), sha, show(line))
    if table.row_count:
        console.print(table)


# ---- suspend / resume / cancel: a commit to the manifest ------------------------------------------
def _change(job: str, repo: Path, what: str, subdir: str = "") -> None:
    from reconciler.cli.manifest_edit import Change, EditError, change_job

    change = Change(what)
    try:
        edited = change_job(repo, job, change, subdir)
    except EditError as exc:
        raise _fail(str(exc)) from exc
    if edited.commit is None:
        console.print(f"{escape(job)} is already {'suspended' if change is Change.SUSPEND else 'resumed'} "
                      f"in {escape(edited.file)}; nothing to commit")
        return
    done = {"suspend": "suspended", "resume": "resumed", "cancel": "cancelled"}[what]
    console.print(f"{escape(job)} {done}: committed {edited.commit[:12]} ({escape(edited.file)})")
    if edited.pushed_to and edited.push_error:
        raise _fail(f"the commit stays local: pushing it to {edited.pushed_to} failed ({edited.push_error}); "
                    f"push it with `git push` when the remote answers")
    if edited.pushed_to:
        console.print(f"pushed to {escape(edited.pushed_to)}")
    console.print("the daemon acts on it at its next tick")


@app.command()
def suspend(job: Annotated[str, typer.Argument(help="the job, or a sweep with all its members, to suspend")],
            repo: RepoOption = Path("."), path: PathOption = "") -> None:
    """Set `suspend: true` in the job's manifest and commit it (and push it, when a remote is set): the
    daemon stops its worker after a final checkpoint and keeps its progress."""
    _change(job, repo, "suspend", path)


@app.command()
def resume(job: Annotated[str, typer.Argument(help="the job, or a sweep with all its members, to resume")],
           repo: RepoOption = Path("."), path: PathOption = "") -> None:
    """Set `suspend: false` in the job's manifest and commit it (and push it): the run continues from
    its last checkpoint."""
    _change(job, repo, "resume", path)


@app.command()
def cancel(job: Annotated[str, typer.Argument(help="the job, or a sweep with all its members, to cancel")],
           repo: RepoOption = Path("."), path: PathOption = "") -> None:
    """Remove the job's manifest (its document; the file when it was the only one) and commit it (and
    push it): the daemon stops the run; its status file stays as history."""
    _change(job, repo, "cancel", path)

