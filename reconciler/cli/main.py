"""The command line: init, validate, plan, run, status, schema, demo, exec, serve (describe, suspend, resume,
cancel and --version are in cli/jobs.py, logs in cli/logs.py, reconcile in cli/reconcile.py; status's
tables in cli/status.py; the app, its shared options and logging in cli/common.py)."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from reconciler.cli.common import RepoOption, VerboseOption, _fail, _reconciler, _setup_logging, app, console, err
from reconciler.cli.pr_check import WORKFLOW_PATH
from reconciler.cli.status import StatusOutput, ledger_rows, ledger_table, room_lines
from reconciler.cli.status import show as show_status
from reconciler.daemon.source import BranchOption, PathOption, UrlOption
from reconciler.trust.shown import escape

if TYPE_CHECKING:
    from adapters.gitrepo import StateRepo
    from desired.models import Job
    from desired.parse import DesiredState
    from reconciler.cli.review import Review
    from reconciler.daemon.loop import Reconciler, TickReport
    from status.models import JobStatus, ProviderLedger

EXAMPLE_JOB = """\
# A job the reconciler drives to completion. See `reconciler schema` for every field.
apiVersion: reconciler.dev/v1
kind: Job
metadata:
  name: hello
spec:
  command: ["python", "-c", "from reconciler.worker import open_run; r = open_run(); r.complete(1)"]
  target_steps: 1
"""

EXAMPLE_SETTINGS = """\
# Reconciler settings; every field has a safe default.
# storage: s3://bucket/prefix        # where run data (checkpoints, leases) lives; unset: a folder of this
#                                    # repository's own on this machine, ~/.reconciler/repos/<identity>/runs
tick_seconds: 30
# remote: origin                     # a shared remote: fetch it every tick; status then goes to its own branch
# status_branch: reconciler/status   # (the default with a remote; "" = commit status onto the reconciled branch)
"""


def _initialise(path: Path, workflow: str | None) -> list[str]:
    """The repository, its example job and settings (and the workflow) where missing: what it created."""
    import secrets

    from adapters.gitrepo import init_repo
    from reconciler.cli.pr_check import write_workflow

    repo = init_repo(path)
    (path / "desired").mkdir(exist_ok=True)
    (path / "status").mkdir(exist_ok=True)
    created = []
    identity = f"identity: \"{secrets.token_hex(6)}\"   # this repository's name on workers; keep it unique\n"
    for rel, text in (("desired/hello.yaml", EXAMPLE_JOB), ("reconciler.yaml", EXAMPLE_SETTINGS + identity)):
        target = path / rel
        if not target.exists():
            target.write_text(text)
            created.append(rel)
    if workflow is not None and write_workflow(path, workflow):
        created.append(WORKFLOW_PATH)
    if created:
        repo.git.add(*created)
        repo.git.commit("-q", "-m", "reconciler init", env={
            "GIT_AUTHOR_NAME": "reconciler", "GIT_AUTHOR_EMAIL": "reconciler@localhost",
            "GIT_COMMITTER_NAME": "reconciler", "GIT_COMMITTER_EMAIL": "reconciler@localhost"})
    return created


@app.command()
def init(path: Annotated[Path, typer.Argument(help="folder for the new state repository")] = Path("."),
         github_actions: Annotated[bool, typer.Option(help=f"also write the PR check, {WORKFLOW_PATH}")] = False,
         fail_on: Annotated[str, typer.Option(help="with --github-actions: fail the check on restart, cancel")] = "",
         package: Annotated[str | None, typer.Option(help="with --github-actions: what the check pip-installs "
                                                          "(default: this version)")] = None) -> None:
    """Create a state repository with an example job and default settings (and, with
    --github-actions, a GitHub Actions workflow that comments `plan --base` on pull requests)."""
    from git import GitCommandError

    from reconciler.cli.pr_check import WorkflowError, render_workflow

    if not github_actions and (fail_on or package):
        raise _fail("--fail-on and --package go with --github-actions", 2)
    try:
        workflow = render_workflow(package, fail_on) if github_actions else None
    except WorkflowError as exc:
        raise _fail(str(exc), 2) from exc
    try:
        created = _initialise(path, workflow)
    except (OSError, GitCommandError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).strip().splitlines()[-1]
        raise _fail(f"cannot create a state repository at {path}: {why}; choose a folder you can write to") from exc
    console.print(f"state repository ready at {escape(str(path.resolve()))}; created: "
                  f"{escape(', '.join(created)) or 'nothing'}")
    console.print(f"next: edit desired/*.yaml, commit, then `reconciler run --repo {escape(str(path))}`",
                  soft_wrap=True)  # a command to copy: on one line whatever the width


@app.command()
def validate(repo: RepoOption = Path("."), path: PathOption = "") -> None:
    """Check every manifest under desired/ in the working tree; exit 1 naming file and field on errors."""
    from adapters.gitrepo import GitError, clean_subdir
    from adapters.localfiles import Refused, inside
    from desired.parse import SETTINGS_FILE, parse_desired

    top = repo
    try:
        repo = repo / clean_subdir(path)
        inside(repo, top, f"--path {path}")
    except (GitError, Refused) as exc:
        raise _fail(str(exc), 2) from exc
    if path and not repo.is_dir():
        raise _fail(f"--path {path}: no such folder ({repo}); name the folder that holds desired/ and reconciler.yaml")
    root = repo / "desired"
    if not root.is_dir():
        raise _fail(f"{root} does not exist; run this in a state repository or pass --repo")
    try:  # a folder named x.yaml is walked into, not read; anything else named so is read or refused
        manifests = [p for p in sorted(root.rglob("*")) if p.suffix in (".yaml", ".yml")
                     and not (p.is_dir() and not p.is_symlink())]
    except OSError as exc:
        raise _fail(f"cannot list {root}: {exc.strerror or exc}") from exc
    files, unreadable = _read_manifests(repo, manifests, top)
    found = [repo / SETTINGS_FILE] if os.path.lexists(repo / SETTINGS_FILE) else []
    settings, bad_settings = _read_manifests(repo, found, top)
    state = parse_desired(files, settings.get(SETTINGS_FILE))
    _check_backend(state.settings.storage)
    errors = unreadable + bad_settings + [str(e) for e in state.errors]
    for e in errors:
        err.print(f"[red]error:[/red] {escape(e)}")
    console.print(f"{len(state.jobs)} job(s), {len(state.providers)} provider(s), {len(errors)} error(s) in the "
                  "working tree (uncommitted changes included; the daemon and `plan` read the last commit)")
    if errors:
        raise typer.Exit(1)


def _read_manifests(repo: Path, paths: list[Path], top: Path) -> tuple[dict[str, bytes], list[str]]:
    """Contents by path relative to `repo`; a file too big, unreadable, not a regular file or a
    link leaving the repository `top` is an error of its own."""
    from adapters.localfiles import Refused, read_regular
    from desired.parse import MAX_FILE_BYTES

    files: dict[str, bytes] = {}
    errors: list[str] = []
    for path in paths:
        rel = str(path.relative_to(repo))
        try:
            files[rel] = read_regular(path, MAX_FILE_BYTES, rel, root=top)
        except Refused as exc:
            errors.append(str(exc))
        except OSError as exc:
            errors.append(f"{rel}: cannot be read ({exc.strerror or exc})")
    return files, errors


class PlanFormat(StrEnum):
    TEXT = "text"
    MARKDOWN = "markdown"
    JSON = "json"


@app.command()
def plan(
    repo: RepoOption = Path("."),
    verbose: VerboseOption = False,
    base: Annotated[str | None, typer.Option(
        help="review a change: what merging HEAD (or --head) into this ref would do, job by job, from git "
             "alone (no provider or storage access)")] = None,
    head: Annotated[str, typer.Option(help="with --base: the ref to review")] = "HEAD",
    output: Annotated[PlanFormat, typer.Option("--format", help="with --base: text, markdown (one pull-request "
                                                                "comment) or json")] = PlanFormat.TEXT,
    fail_on: Annotated[str, typer.Option(help="with --base: exit 2 when a change is one of these "
                                              "(comma-separated: restart, cancel)")] = "",
    repo_url: UrlOption = None, branch: BranchOption = None, path: PathOption = "",
) -> None:
    """Show what the next tick would do, without doing it, and each job's projected cost and ETA
    (or why they are unknown); for each sweep (a job with a matrix), which members start, stop and
    keep going, and its projected cost. Exit 1 when a manifest has errors (a pull-request check built on it
    fails on a broken change); provider trouble is only a warning.

    With --base REF: review a change instead. Each job whose manifest differs between REF and --head
    is listed as a new run, a restart from zero (progress thrown away), an in-place change, a suspend
    or resume, or a cancel, with its projected cost and ETA from the status recorded in git at REF.
    Providers and run storage are not asked, so it runs in CI without credentials. Exit codes: 0 ok;
    1 manifest errors at --head or a ref that does not resolve; 2 a change that --fail-on names (or
    a usage error)."""
    if base is not None:
        _plan_review(repo, base, head, output, fail_on, path)
        return
    if head != "HEAD" or output is not PlanFormat.TEXT or fail_on:
        raise _fail("--head, --format and --fail-on review a change: pass --base REF too", 2)
    from reconciler.cli.sweeps import plan_lines as sweep_plan_lines
    from reconciler.planner.health import plan_lines
    from reconciler.trust.redaction import secret_values
    from status.redact import Redactor

    _setup_logging(verbose)
    rec = _reconciler(repo, repo_url, branch, path)
    _check_storage(rec)
    the_plan, report = rec.preview()
    redactor = Redactor(secret_values(report.desired, rec.environ))

    def show(text: str) -> str:  # no secret value, and no rich markup from a message
        return escape(redactor.redact(text))

    manifest_errors = [str(e) for e in report.desired.errors] if report.desired else []
    if report.commit and not the_plan.statuses and not manifest_errors \
            and rec.repo.tree_id(report.commit, "desired") is None:  # as `validate` says: nothing to plan from
        raise _fail(f"desired/ does not exist at commit {report.commit[:12]} of {rec.repo.path}: commit job "
                    "manifests under desired/, or run this in a state repository (--repo; --path for a subfolder)")
    which = ("the last commit" if report.commit == report.head
             else f"the newest trusted commit (the last, {report.head[:12]}, is held)")
    console.print(f"plan for commit {report.commit[:12]}, {which}; uncommitted changes are not read "
                  "(`validate` checks the working tree)")
    for e in report.errors:
        if e in manifest_errors:
            err.print(f"[red]error:[/red] {show(e)}")
        else:
            err.print(f"[yellow]warning:[/yellow] {show(e)}")
    held = any(st.held for st in the_plan.statuses.values())
    for line in plan_lines(the_plan.statuses.values(), the_plan.health, rec.clock.now(), bool(report.actions), held):
        console.print(show(line))
    for a in report.actions:
        console.print(f"- {show(a)}")
    for line in sweep_plan_lines(the_plan.sweeps, the_plan.statuses):
        console.print(show(line))
    for name, st in sorted(the_plan.statuses.items()):
        console.print(f"  {name}: {st.phase.value} — {show(st.message)}")
        order = _plan_after(name, st, report.desired, the_plan.statuses)
        if order:
            console.print(f"    {show(order)}")
        outlook = _plan_outlook(st)
        if outlook:
            console.print(f"    {show(outlook)}")
        futures = _plan_futures(name, st, report.desired, the_plan.statuses, rec.clock.now())
        if futures:
            console.print(f"    {show(futures)}")
    if manifest_errors:
        err.print(f"{len(manifest_errors)} manifest error(s); the other jobs are planned as shown")
        raise typer.Exit(1)


def _plan_after(name: str, st: JobStatus, desired: DesiredState | None, planned: dict[str, JobStatus]) -> str:
    """The jobs this one runs after, each as this plan leaves it: the order, and what it waits for."""
    from reconciler.planner.dependencies import WAITING, dependencies

    job = desired.jobs.get(name) if desired is not None else None
    if desired is None or job is None or not job.spec.after:
        return ""
    deps = dependencies(job, desired.jobs, planned, desired.sweeps)
    said = f"after: {', '.join(map(str, deps))}"
    if st.message.startswith(WAITING) and all(d.done for d in deps):  # they succeed in this tick
        return f"{said}; it stops waiting at the next tick"
    return said


def _plan_outlook(st: JobStatus) -> str:
    """The planned status's forecast in one line: projected cost and ETA, or why they are unknown."""
    from status.models import money, risk_text, when

    f = st.forecast
    if st.phase.terminal or f is None:
        return ""
    spent = f"{money(f.spent_usd)} spent"
    if f.projected_cost_usd is None or f.eta is None:
        return f"forecast: {spent}; cost and ETA unknown ({f.note or 'no rate to project from'})"
    risk = risk_text(st)
    return (f"forecast: {money(f.projected_cost_usd)} projected ({spent}), ETA {when(f.eta)} UTC"
            + (f", {risk}" if risk else ""))


def _plan_futures(name: str, st: JobStatus, desired: DesiredState | None, planned: dict[str, JobStatus],
                  now: float) -> str:
    """The planned run's P50/P90 from its simulated futures (reconciler.planner.outlook.spread), and
    which inputs were not measured; quota from the providers' declared allowance (no ledger read)."""
    from reconciler.cli.review import JobChange, inputs_text, spread_text
    from reconciler.planner.outlook.spread import job_spread

    job = desired.jobs.get(name) if desired is not None else None
    if job is None or st.phase.terminal or job.spec.suspend or st.run_id != job.run_id():
        return ""
    sp = job_spread(job, st, desired.providers, planned.values(), now) if desired is not None else None
    if sp is None or sp.spread is None:
        return ""
    change = JobChange(job=name, change="in-place", meaning="", spread=sp, spread_at=now)
    return f"{spread_text(change)}\n    inputs: {inputs_text(sp)}"


FAIL_ON_CHOICES = ("restart", "cancel")


def _plan_review(repo: Path, base: str, head: str, output: PlanFormat, fail_on: str, path: str = "") -> None:
    """`plan --base`: the review of a change, from git alone (reconciler.cli.review)."""
    from reconciler.cli.review import render_json, render_markdown, render_text

    wanted = {w.strip() for w in fail_on.split(",") if w.strip()}
    unknown = sorted(wanted - set(FAIL_ON_CHOICES))
    if unknown:
        raise _fail(f"--fail-on takes {', '.join(FAIL_ON_CHOICES)} or both (comma-separated), "
                    f"not {', '.join(unknown)}")
    the_review = _review_refs(repo, base, head, path)
    if output is PlanFormat.JSON:
        typer.echo(json.dumps(render_json(the_review, wanted), indent=2))
    elif output is PlanFormat.MARKDOWN:
        typer.echo(render_markdown(the_review), nl=False)
    else:
        typer.echo(render_text(the_review))
    code = the_review.exit_code(wanted)
    if code == 2:
        err.print(f"failing on --fail-on {','.join(sorted(wanted))}: {', '.join(the_review.matches(wanted))}")
    raise typer.Exit(code)


def _review_refs(repo: Path, base: str, head: str, path: str = "") -> Review:
    """Reads both commits' desired state and the base's recorded statuses; a bad ref is one sentence."""
    from adapters.gitrepo import GitError, StateRepo
    from reconciler.cli.review import attach_spreads, review
    from reconciler.daemon.loop import Reconciler
    from reconciler.planner.plan import confirms_cancel

    try:
        reader = Reconciler(StateRepo(repo, subdir=path), environ={})  # reads git as a tick does; asks no provider
    except GitError as exc:
        raise _fail(str(exc)) from exc
    state = reader.repo
    commits = [_resolve(state, ref) for ref in (base, head)]
    if not any(state.has_folder(c) for c in commits):
        raise _fail(f"--path {path}: no such folder at {base} nor at {head}; name the folder that holds desired/")
    sides = [reader.read_desired(c, cache=False) for c in commits]
    reader.configure_repo()  # where status is recorded: the status branch's newest, when there is one
    recorded = reader.read_recorded(reader.status_source(commits[0]))
    confirmed = any(confirms_cancel(m) for m in _messages(state, *commits))
    fork = _merge_base(state, *commits)
    at_fork = reader.read_desired(fork, cache=False) if fork else None
    the_review = review(sides[0], sides[1], recorded, base_commit=commits[0], head_commit=commits[1],
                        cancel_confirmed=confirmed, fork=at_fork)
    source = reader.status_source(commits[0])
    attach_spreads(the_review, sides[1], recorded, _ledger(state.read_file(source, "status/providers.yaml")),
                   float(state.repo.commit(source).committed_date))
    if fork:
        the_review.notes.append(f"{base} has moved on since {head} branched off at {fork[:12]}: only the jobs "
                                "the head changes since then are judged (a check on the merge commit is exact)")
    return the_review


def _ledger(text: bytes | None) -> dict[str, ProviderLedger]:
    """status/providers.yaml as ProviderLedger lines by provider; a line that does not parse is left out."""
    from pydantic import ValidationError

    from reconciler.cli.status import ledger_rows
    from status.models import ProviderLedger, from_iso

    out = {}
    for row in ledger_rows(text):
        try:
            line = ProviderLedger.model_validate({**row, "resets_at": from_iso(row.get("resets_at")),
                                                  "period_start": from_iso(row.get("period_start")) or 0.0})
        except (ValidationError, ValueError):
            continue
        out[line.provider] = line
    return out


def _merge_base(state: StateRepo, base: str, head: str) -> str | None:
    """Where the head branched off, when the base has commits the head lacks; else None."""
    import git

    try:
        fork: str = state.repo.git.merge_base(base, head).strip()
    except git.GitCommandError:
        return None  # unrelated histories: compare the two commits as they are
    return fork if fork and fork != base else None


def _resolve(state: StateRepo, ref: str) -> str:
    import git

    try:
        out: str = state.repo.git.rev_parse("--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")
    except git.GitCommandError:
        out = ""
    if not out.strip():
        raise _fail(f"{ref!r} is not a commit in {state.path}; in CI, fetch it first (git fetch origin {ref})")
    return out.strip()


def _messages(state: StateRepo, base: str, head: str) -> list[str]:
    """Messages of the commits the change brings (base..head)."""
    import git

    try:
        out: str = state.repo.git.log("--format=%B%x00", f"{base}..{head}")
    except git.GitCommandError:
        return []
    return out.split("\x00")


@app.command()
def run(
    repo: RepoOption = Path("."),
    once: Annotated[bool, typer.Option(help="do one tick and exit")] = False,
    until_done: Annotated[bool, typer.Option(help="exit when every job is terminal (0 if all succeeded)")] = False,
    tick_seconds: Annotated[float | None, typer.Option(help="override the interval of reconciler.yaml")] = None,
    watch: Annotated[bool, typer.Option(
        help="tick at once when desired/ changes, a commit during a tick included "
             "(--no-watch: only the interval, a webhook or `reconciler reconcile` tick)")] = True,
    listen: Annotated[str | None, typer.Option(
        metavar="HOST:PORT", help="accept push webhooks (GitHub, GitLab, Gitea) here and tick at once on a push to "
                                  "the reconciled branch; :PORT is loopback; needs RECONCILER_WEBHOOK_SECRET")] = None,
    metrics: Annotated[str | None, typer.Option(
        metavar="HOST:PORT", help="serve Prometheus metrics here (/metrics); :PORT is loopback")] = None,
    serve_at: Annotated[str | None, typer.Option("--serve", metavar="HOST:PORT", help="serve the status page "
                                                 "too (as `reconciler serve` does)")] = None,
    verbose: VerboseOption = False,
    repo_url: UrlOption = None, branch: BranchOption = None, path: PathOption = "",
) -> None:
    """Reconcile: launch and relaunch workers until every job is done, committing status to git.

    Only one daemon acts on a repository: a lock in .git/ for one clone, a leader lease in run
    storage across clones (the others stand by and take over when it expires)."""
    from adapters.leader import Election
    from reconciler.daemon.loop import AlreadyRunning
    from reconciler.daemon.service import Daemon
    from reconciler.daemon.telemetry import TelemetryError, metrics_address, telemetry
    from reconciler.daemon.webhook import SECRET_ENV, WebhookError
    from reconciler.web.command import start_beside_daemon

    _setup_logging(verbose)
    address = _listen_address(listen, once)
    try:
        metrics_at = metrics_address(metrics, once)
    except TelemetryError as exc:
        raise _fail(str(exc), 2) from exc
    rec = _reconciler(repo, repo_url, branch, path)
    _check_storage(rec)
    jobs.announce(rec, tick_seconds)
    rec.election = Election(tick_seconds, clone=str(rec.repo.path))
    page = None if serve_at is None or once else start_beside_daemon(repo, serve_at, address)
    mounts: dict[str, object] = {} if page is None else {"/": page}  # served by the webhook's server

    def show(report: TickReport) -> None:
        for line in report.changed:
            logging.getLogger("reconciler").info("%s", line)

    try:
        with telemetry(rec, metrics_at, show, beside=(address, mounts)) as on_tick:
            if once:
                _run_once(rec, on_tick)
                return
            daemon = Daemon(rec, tick_seconds=tick_seconds, until_done=until_done, on_tick=on_tick, watch=watch,
                            listen=address, webhook_secret=os.environ.get(SECRET_ENV, ""), mounts=mounts)
            final = daemon.run()
    except (AlreadyRunning, WebhookError, TelemetryError) as exc:
        raise _fail(str(exc)) from exc
    if until_done and final is not None and final.standby is None:
        failed = [n for n, s in final.statuses.items() if s.phase.value != "Succeeded"]
        if failed:
            raise _fail(f"not all jobs succeeded: {', '.join(sorted(failed))}")


def _listen_address(listen: str | None, once: bool) -> tuple[str, int] | None:
    """Checks `--listen` before anything starts: its form, the secret it needs, and who can reach it."""
    from reconciler.daemon.webhook import is_loopback, listen_problem, parse_listen

    if listen is None:
        return None
    if once:
        raise _fail("--listen serves the daemon; `run --once` does one tick and exits", 2)
    try:
        host, port = parse_listen(listen)
    except ValueError as exc:
        raise _fail(f"--listen: {exc}", 2) from exc
    if (problem := listen_problem(os.environ)) is not None:
        raise _fail(problem)
    if not is_loopback(host):
        logging.getLogger("reconciler").warning(
            "webhook: listening on %s, reachable from other machines; requests are signed but not encrypted, "
            "so put TLS in front (a reverse proxy)", host)
    return host, port


def _run_once(rec: Reconciler, show: Callable[[TickReport], None]) -> None:
    """One tick under the same lock and leader lease as the daemon, which it gives back after."""
    from adapters.storage import StorageError

    rec.acquire_lock()
    try:
        report = rec.tick()
    except StorageError as exc:  # the leader lease could not be read: nobody may act
        raise _fail(str(exc)) from exc
    finally:
        rec.resign()
        rec.release_lock()
    if report.standby is not None:
        console.print(f"standby: {report.standby.describe()}; nothing done")
    show(report)


def _check_storage(rec: Reconciler) -> None:
    """A storage backend that cannot be imported is one error at start-up, not a job stuck Pending."""
    from adapters.gitrepo import GitError

    try:
        settings = rec.settings_at(rec.repo.head())
    except GitError:
        return  # no commit yet: the daemon says so at its first tick
    _check_backend(settings.storage)


def _check_backend(storage: str) -> None:
    from adapters.storage import StorageError, check_backend

    try:
        check_backend(storage)
    except StorageError as exc:
        raise _fail(str(exc)) from exc


@app.command()
def status(repo: RepoOption = Path("."),
           output: Annotated[StatusOutput, typer.Option(
               "--output", "-o", help="table: fits the terminal, messages on lines of their own; wide: every "
                                      "column, rows as long as they need; plain: tab-separated; json")
           ] = StatusOutput.TABLE,
           as_json: Annotated[bool, typer.Option("--json", help="the same as --output json")] = False,
           job_name: Annotated[str | None, typer.Option("--job", help="one job in detail: its forecast on "
                                                         "each provider and the placement decision")] = None,
           providers: Annotated[bool, typer.Option(
               "--providers", help="the providers instead of the jobs: the ledger of the last status commit and "
                                   "what the daemon has seen of each one's room (with --json: both as JSON)")
           ] = False,
           repo_url: UrlOption = None, branch: BranchOption = None, path: PathOption = "") -> None:
    """A table of every job with its phase and progress (live progress from storage), its ETA, cost
    spent and projected, and deadline risk (the forecast of the last status commit), then each sweep's
    members rolled up (counts by phase, cost spent), then the provider ledger of the last status commit
    (quota or credits left, hours and cost this period) and, under it, what the daemon has seen of each
    provider's room for a worker (how long it stays without room; how many room periods end soon)."""
    from reconciler.cli.sweeps import rollup_rows, rollup_table
    from reconciler.daemon.loop import read_run

    as_json = as_json or output is StatusOutput.JSON
    if providers and job_name is not None:
        raise _fail("--providers shows the providers and --job one job; pass one of them")
    rec = _reconciler(repo, repo_url, branch, path)
    status_at = rec.fresh_status(repo_url is not None)
    if providers:
        _show_providers(rec.repo.read_file(status_at, "status/providers.yaml"),
                        rec.repo.read_file(status_at, "status/room.yaml"), as_json)
        return
    commit = rec.repo.head()
    recorded = rec.read_recorded(status_at)
    desired = rec.read_desired(commit)
    names = sorted(set(recorded) | set(desired.jobs))
    if job_name is not None:
        if job_name not in names:
            raise _fail(f"no job named {job_name} (jobs: {', '.join(names) or 'none'})")
        names = [job_name]
    rows = []
    for name in names:
        st = recorded.get(name)
        job = desired.jobs.get(name)
        run_id = st.run_id if st else (job.run_id() if job else "")
        live = read_run(desired.settings.storage, name, run_id, dict(desired.settings.storage_options))
        target = (job.spec.target_steps if job else None) or (st.progress.target if st else None)
        step = live.heartbeat_step if live.heartbeat_step is not None else (st.progress.step if st else 0)
        deadline = job.spec.deadline.timestamp() if job and job.spec.deadline else None
        rows.append({
            "job": name, "sweep": desired.sweep_of.get(name) or (st.sweep if st else None),
            "phase": st.phase.value if st else "New", "run": run_id,
            "step": step, "durable": live.durable_step, "target": target,
            "attempts": st.total_attempts if st else 0, "interruptions": st.interruptions if st else 0,
            "failures": st.failures if st else 0, "message": st.message if st else "not reconciled yet",
            "held": st.held if st else None,
            "metrics": dict(live.heartbeat_metrics),  # the worker's newest reported values (loss, ...)
            "drill": st.drill.summary() if st and st.drill else None,  # the run's newest drill and its verdict
            **_forecast_fields(st, deadline),
        })
    if job_name is not None:
        _show_job(rows[0], recorded.get(job_name), desired.jobs.get(job_name), as_json)
        return
    if as_json:
        console.print_json(json.dumps(rows))
        return
    for r in rows:
        r["eta_cell"], r["cost_cell"], r["risk_cell"] = _forecast_cells(recorded.get(str(r["job"])), r["deadline"])
    show_status(console, rows, output,
                lambda r: jobs.progress_cell(int(r["step"]), r["target"], r["durable"]))
    rollups = rollup_rows(rows)
    if rollups and output is not StatusOutput.PLAIN:  # plain is one line a job, for scripts
        console.print(rollup_table(rollups))
    ledger = ledger_rows(rec.repo.read_file(status_at, "status/providers.yaml"))
    if ledger and output is not StatusOutput.PLAIN:  # plain is one line a job, for scripts
        console.print(ledger_table(ledger))
        for line in room_lines(rec.repo.read_file(status_at, "status/room.yaml")):
            console.print(line, overflow="fold")
    for note in sorted({st.held for st in recorded.values() if st.held}):
        err.print(f"[yellow]held:[/yellow] {escape(note)}")
    for e in desired.errors:
        err.print(f"[red]error:[/red] {escape(str(e))}")


def _show_providers(ledger_text: bytes | None, room_text: bytes | None, as_json: bool) -> None:
    """`status --providers`: the ledger (status/providers.yaml) and the room seen (status/room.yaml)."""
    from status.room import room_rows_of

    ledger = ledger_rows(ledger_text)
    if as_json:
        console.print_json(json.dumps({"providers": ledger, "room": room_rows_of(room_text)}, default=_json_value))
        return
    if not ledger:
        console.print("no provider ledger yet: the daemon writes status/providers.yaml with its first status "
                      "commit")
    else:
        console.print(ledger_table(ledger))
    for line in room_lines(room_text):
        console.print(line, overflow="fold")


def _json_value(value: Any) -> str:
    """What YAML read as a date or time (a hand-edited ledger), in ISO 8601."""
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    raise TypeError(f"{type(value).__name__} is not JSON")


def _forecast_fields(st: JobStatus | None, deadline: float | None) -> dict[str, Any]:
    """The forecast of the job's recorded status, as `status --json` gives it. A finished job has
    none (a failed or cancelled one may still carry its last): it shows what it cost."""
    from status.models import iso

    f = st.forecast if st is not None and not st.phase.terminal else None
    return {
        "eta": iso(f.eta) if f else None,
        "spent_usd": f.spent_usd if f else (st.cost_usd if st else 0.0),
        "projected_cost_usd": f.projected_cost_usd if f else None,
        "slack_hours": f.slack_hours if f else None,
        "risk": f.risk if f else "",
        "decision": f.decision if f else "",
        "note": f.note if f else "",
        "deadline": iso(deadline),
    }


def _forecast_cells(st: JobStatus | None, deadline_iso: str | None) -> tuple[str, str, str]:
    from status.models import forecast_cells, from_iso, risk_text, when

    deadline = from_iso(deadline_iso)
    if st is None:
        return "", "", f"due {when(deadline)}" if deadline is not None else ""
    eta, cost, _ = forecast_cells(st)
    return eta, cost, risk_text(st, deadline)


def _show_job(row: dict[str, Any], st: JobStatus | None, job: Job | None, as_json: bool) -> None:
    """`status --job NAME`: the job's forecast on each provider (hours and cost to finish there,
    measured or borrowed from its best measured rate elsewhere) and the placement decision."""
    from status.models import hours, money

    f = st.forecast if st is not None and not st.phase.terminal else None
    per = f.providers if f else {}
    if as_json:
        console.print_json(json.dumps({
            **row, "rate_steps_per_hour": f.rate_steps_per_hour if f else None,
            "placement": f.placement if f else "",
            "budget_usd": job.spec.budget_usd if job else None,
            "providers": {n: p.model_dump(mode="json") for n, p in sorted(per.items())}}))
        return
    eta, cost, risk = _forecast_cells(st, row["deadline"])
    prog = f"{row['step']}/{row['target']} (saved {row['durable']})" if row["target"] else str(row["step"])
    console.print(f"{escape(str(row['job']))}: {row['phase']} — {escape(str(row['message']))}")
    lines = [("run", str(row["run"])), ("progress", prog)]
    if f is not None and f.rate_steps_per_hour is not None:
        lines.append(("rate", f"{f.rate_steps_per_hour:,.0f} steps/h"))
    lines += [("ETA", f"{eta} UTC" if f is not None and f.eta is not None else eta),
              ("spent / projected", cost)]
    if job is not None and job.spec.budget_usd is not None:
        lines.append(("budget", money(job.spec.budget_usd)))
    lines += [("risk", risk), ("placement", f.placement if f else ""), ("decision", f.decision if f else ""),
              ("note", f.note if f else ""), ("held", str(row["held"] or "")), ("drill", row["drill"] or "")]
    for label, value in lines:
        if value:
            console.print(f"  {label}: {escape(value)}")
    if per:
        table = Table("provider", "hours to finish", "cost to finish", "rate", title="finishing on each provider")
        for name, p in sorted(per.items(), key=lambda kv: kv[1].hours):
            table.add_row(escape(name), hours(p.hours), money(p.cost_usd),
                          "measured" if p.measured else "borrowed (the job's rate over all its attempts)")
        console.print(table)


@app.command()
def doctor(repo: RepoOption = Path("."),
           as_json: Annotated[bool, typer.Option("--json", help="One JSON object: ok, and every check.")] = False,
           repo_url: UrlOption = None, branch: BranchOption = None, path: PathOption = "") -> None:
    """Before the first paid run: read-only checks of every provider in desired/ with the daemon's
    credentials (key, quota or credits, offers and prices, images, secrets) and of run storage (a
    probe object written, read back, deleted). Rents, launches and pushes nothing. Exit 1 if a check fails."""
    from reconciler.cli.doctor import run as run_doctor

    raise typer.Exit(run_doctor(_reconciler(repo, repo_url, branch, path), console, as_json))


@app.command()
def schema() -> None:
    """Print the JSON schema of manifests (Job, Provider) and settings (reconciler.yaml)."""
    from pydantic import TypeAdapter

    from desired.models import Job, Provider, Settings

    doc = {
        "Job": Job.model_json_schema(),
        "Provider": Provider.model_json_schema(),
        "Settings": TypeAdapter(Settings).json_schema(),
    }
    console.print_json(json.dumps(doc))


class DemoScenario(StrEnum):
    CHAOS = "chaos"
    WEEK = "week"


@app.command()
def demo(
    directory: Annotated[Path, typer.Option("--dir", help="where the demo state repository goes")] = Path(
        "demo-state"),
    chaos: Annotated[bool, typer.Option(help="kill the worker with SIGKILL at random moments")] = True,
    seed: Annotated[int | None, typer.Option(help="seed of the chaos")] = None,
    steps: Annotated[int, typer.Option(help="training steps of the demo job")] = 400,
    scenario: Annotated[DemoScenario, typer.Option(
        help="chaos: a real PyTorch job on this machine, its worker killed at random; week: a 60 h job due in "
             "five days on simulated free, credit, spot and on-demand providers (the real planner and loop, in "
             "seconds)")] = DemoScenario.CHAOS,
) -> None:
    """Run a small PyTorch training job to completion on this machine while chaos kills its worker
    (or, with --scenario week, a week of placement decisions in simulated time)."""
    if scenario is DemoScenario.WEEK:  # no log lines: the simulated week is told by its table
        from reconciler.demo.week import Week, run_week_demo

        raise typer.Exit(run_week_demo(console, week=Week() if seed is None else Week(seed=seed)))
    from reconciler.demo.local import run_demo

    _setup_logging(False)

    code = run_demo(directory, chaos=chaos, seed=seed, steps=steps, console=console)
    raise typer.Exit(code)


@app.command(context_settings={"ignore_unknown_options": True})
def exec(command: Annotated[list[str] | None, typer.Argument(  # noqa: A001 - the command's name is `exec`
        metavar="-- CMD ARGS", show_default=False,
        help="the command to run and its arguments, after `--` (so that its own options are not read as "
             "exec's)")] = None) -> None:
    """Run a non-Python command as a worker: `reconciler exec -- CMD ARGS...`. It heartbeats while the
    command runs (its step: a line written to the file $RECONCILER_STEP_FILE names), passes SIGTERM,
    SIGINT and the reconciler's stop request on to it, and exits with its exit code (75: interrupted)."""
    from reconciler.execwrap import main as exec_main

    args = list(command or [])
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        raise _fail("nothing to run: use `reconciler exec -- CMD ARGS...`", 2)
    raise typer.Exit(exec_main(args))


from reconciler.web.command import serve as _serve  # noqa: E402 - the status page (reconciler/web)

app.command(name="serve")(_serve)

# Commands kept in modules of their own register themselves on `app` when imported.
from reconciler.cli import artifacts, drill, jobs, logs, reconcile  # noqa: E402,F401
from reconciler.cli.helptext import flow_command_help  # noqa: E402

flow_command_help(app)


def main() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
