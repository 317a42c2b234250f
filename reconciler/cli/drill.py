"""`reconciler drill JOB`: interrupt a running job on purpose and check that the resumed run is the
same run (docs/guides/drills.md). Like `suspend`, the request is a commit to the job's manifest
(`spec.drill_request`, a new id each time); the daemon carries it out and writes the verdict into
the job's status, which this command waits for (unless `--no-wait`). Exit 0 when the resumed run
matched (exact or within tolerance), 1 when it diverged, its resume failed, or the drill was refused.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from reconciler.cli.common import RepoOption, _fail, _reconciler, app, console
from reconciler.daemon.source import PathOption
from reconciler.trust.shown import escape

if TYPE_CHECKING:
    from desired.parse import DesiredState
    from reconciler.daemon.loop import Reconciler
    from status.models import Drill, JobStatus

POLL_SECONDS = 2.0


@app.command()
def drill(
    job: Annotated[str, typer.Argument(help="the running job to drill")],
    lookahead: Annotated[int, typer.Option(min=1, max=1000, help=(
        "steps the worker runs past its checkpoint before it is killed, compared after the resume"))] = 5,
    tolerance: Annotated[float, typer.Option(min=0.0, help=(
        "largest relative difference of a metric that still counts as the same run (GPU kernels that are "
        "not deterministic); 0 = exact"))] = 0.0,
    notice: Annotated[bool, typer.Option("--notice", help=(
        "stop through the provider's notice (SIGTERM and its grace) instead of a kill: 0 steps may be lost"))] = False,
    to: Annotated[str | None, typer.Option("--to", help="the provider the relaunch goes to")] = None,
    no_wait: Annotated[bool, typer.Option("--no-wait", help="return once the request is committed")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the request and the verdict as JSON")] = False,
    force: Annotated[bool, typer.Option("--force", help=(
        "drill even when the forecast puts the deadline or budget at risk, or before the first checkpoint"))] = False,
    timeout: Annotated[float, typer.Option(min=1.0, help="seconds to wait for the verdict")] = 3600.0,
    repo: RepoOption = Path("."), path: PathOption = "",
) -> None:
    """Interrupt the job's worker on purpose after a durable checkpoint (with no notice, as a machine
    that vanishes), let the next attempt resume, and compare the metrics of the steps it ran before
    and after, step by step: exact, within tolerance, or where it diverged and what usually causes it.
    The interruption is charged to nothing (no retry, no crash-loop count)."""
    from reconciler.cli.manifest_edit import Change, EditError, change_job

    rec = _reconciler(repo, path=path)
    recorded = rec.read_recorded(rec.fresh_status(False))
    desired = rec.read_desired(rec.repo.head())
    st = recorded.get(job)
    refusal = refused(job, st, desired, to, force, lookahead)
    if refusal:
        raise _fail(refusal)
    assert st is not None
    if not as_json:
        console.print(escape(estimate(st, desired, lookahead)))
    request: dict[str, Any] = {"id": new_id(), "run": st.run_id, "lookahead": lookahead}
    request.update({k: v for k, v in (("tolerance", tolerance), ("notice", notice), ("to", to)) if v})
    try:
        edited = change_job(repo, job, Change.DRILL, path, drill=request)
    except EditError as exc:
        raise _fail(str(exc)) from exc
    if not as_json:
        console.print(f"drill {request['id']} of {escape(job)} requested: committed "
                      f"{(edited.commit or '')[:12]} ({escape(edited.file)}); the daemon carries it out")
    if edited.pushed_to and edited.push_error:
        raise _fail(f"the commit stays local: pushing it to {edited.pushed_to} failed ({edited.push_error}); "
                    "push it with `git push` when the remote answers")
    if no_wait:
        if as_json:
            console.print_json(json.dumps({"job": job, "request": request, "commit": edited.commit}))
        return
    done = wait_for(rec, job, request["id"], timeout, bool(edited.pushed_to))
    report(job, request, done, as_json)
    raise typer.Exit(0 if done is not None and done.passed else 1)


def new_id() -> str:
    """A fresh request id: the time, and a few random characters (two drills in one second differ)."""
    return f"d{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


def refused(job: str, st: JobStatus | None, desired: DesiredState, to: str | None, force: bool,
            lookahead: int) -> str:
    """Why this drill is not requested, in one sentence; "" when it may go ahead."""
    from status.models import Phase

    if job not in desired.jobs:
        return f"no job named {job} in desired/ at HEAD; drill a job that is defined and running"
    if st is None or st.phase != Phase.RUNNING or st.current is None:
        phase = st.phase.value if st else "not reconciled yet"
        return f"{job} is not running ({phase}); a drill interrupts a running worker, so start the job first"
    if to is not None and to not in desired.providers:
        return f"--to {to}: no provider of that name in desired/ (providers: {', '.join(sorted(desired.providers))})"
    if force:
        return ""
    if durable_step(st, desired) <= 0:
        return (f"{job} has no durable checkpoint yet, so there is nothing to resume from; wait for its first "
                "checkpoint (`reconciler describe`) or pass --force to drill after it")
    risk = st.forecast.risk if st.forecast else ""
    if risk in ("at risk", "infeasible"):
        return (f"the forecast already says {job}'s deadline is {risk}, and a drill costs it {lookahead} steps and "
                "a relaunch; pass --force to drill anyway")
    budget = desired.jobs[job].spec.budget_usd
    projected = st.forecast.projected_cost_usd if st.forecast else None
    if budget is not None and projected is not None and projected + drill_cost(st, desired, lookahead)[1] > budget:
        return (f"{job}'s projected cost (${projected:.2f}) and the drill's would pass its budget of ${budget:g}; "
                "pass --force to drill anyway")
    return ""


def durable_step(st: JobStatus, desired: DesiredState) -> int:
    """The run's newest durable checkpoint, read from run storage (the status keeps it in tenths of
    the target); the status's figure when storage cannot be read now."""
    from adapters.storage import RunFolder, StorageError
    from reconciler.daemon.execute import store_options

    store = st.storage or desired.settings.storage
    try:
        return RunFolder.for_run(store, st.job, st.run_id, store_options(store, desired.settings)).durable_step()
    except (StorageError, OSError, ValueError):
        return st.progress.step


def drill_cost(st: JobStatus, desired: DesiredState, lookahead: int) -> tuple[float | None, float]:
    """(hours, dollars) the drill adds: the lookahead steps done twice at the measured rate, and a
    relaunch as long as this run's attempts took to report their first heartbeat (None: not measured)."""
    rate = st.forecast.rate_steps_per_hour if st.forecast else None
    starts = [a.first_beat - a.started for a in st.attempts if a.first_beat is not None and a.run_id == st.run_id]
    if not rate or not starts:
        return None, 0.0
    hours = lookahead / rate + sum(starts) / len(starts) / 3600
    provider = desired.providers.get(st.current.provider if st.current else "")
    return hours, hours * (provider.spec.price_per_hour if provider else 0.0)


def estimate(st: JobStatus, desired: DesiredState, lookahead: int) -> str:
    hours, usd = drill_cost(st, desired, lookahead)
    provider = st.current.provider if st.current else "its provider"
    if hours is None:
        return (f"the drill costs {lookahead} steps done twice and one relaunch on {provider} "
                "(not yet measured for this run)")
    return (f"the drill costs {lookahead} steps done twice and one relaunch on {provider}: about "
            f"{hours * 60:.1f} min, ${usd:.2f} at the provider's price")


def wait_for(rec: Reconciler, job: str, drill_id: str, timeout: float, fetch: bool) -> Drill | None:
    """The drill's status once its verdict is in; None when `timeout` passes first."""
    from status.models import DrillPhase

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = rec.read_recorded(rec.fresh_status(fetch)).get(job)
        if st is not None and st.drill is not None and st.drill.id == drill_id and st.drill.phase == DrillPhase.DONE:
            return st.drill
        time.sleep(POLL_SECONDS)
    return None


def report(job: str, request: dict[str, Any], done: Drill | None, as_json: bool) -> None:
    if as_json:
        console.print_json(json.dumps({"job": job, "request": request,
                                       "drill": done.model_dump(mode="json") if done else None}))
        return
    if done is None:
        console.print(f"no verdict yet for drill {request['id']}: see `reconciler describe {escape(job)}` later")
        return
    console.print(f"{escape(job)}: drill {done.verdict}: {escape(done.detail)}")
