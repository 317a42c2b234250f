"""`reconciler reconcile`: make the running daemon of a clone tick now and print what the tick did
(as `flux reconcile` does), without a webhook (reconciler.daemon.nudge)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from reconciler.cli.common import RepoOption, _fail, app, console, err
from reconciler.trust.shown import escape


@app.command()
def reconcile(repo: RepoOption = Path("."),
              timeout: Annotated[float, typer.Option(help="seconds to wait for the tick to finish")] = 300.0) -> None:
    """Ask the daemon running on this clone (`reconciler run`) to tick now, wait for that tick and
    print what it did: the commit it acted on, its actions, the jobs it changed and the status
    commit. Exit 1 when no daemon runs here, the tick failed, or it did not finish within --timeout."""
    from adapters.gitrepo import GitError, StateRepo
    from reconciler.daemon.nudge import NudgeError, nudge

    if timeout <= 0:
        raise _fail("--timeout must be more than 0", 2)
    try:
        git_dir = StateRepo(repo).repo.git_dir
    except GitError as exc:
        raise _fail(str(exc)) from exc
    err.print(f"asking the daemon on {escape(str(repo.resolve()))} to reconcile now")
    try:
        answer = nudge(git_dir, timeout)
    except NudgeError as exc:
        raise _fail(str(exc)) from exc
    if "standby" in answer:
        raise _fail(f"this daemon stands by ({answer['standby']}): the leader acts, not it")
    if "error" in answer:
        raise _fail(str(answer["error"]))
    status = answer.get("status_commit")
    seconds = float(answer.get("seconds", 0))
    took = f"{seconds:.1f}s" if seconds >= 0.1 else "under 0.1s"
    console.print(f"reconciled commit {str(answer.get('commit', ''))[:12]} in {took}; "
                  + (f"status committed as {status[:12]}" if status else "no status changed"))
    for line in answer.get("actions", []):
        console.print(f"- {escape(str(line))}")
    for line in answer.get("changed", []):
        console.print(f"  {escape(str(line))}")
    for line in answer.get("errors", []):
        err.print(f"[yellow]warning:[/yellow] {escape(str(line))}")
