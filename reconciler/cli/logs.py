"""`reconciler logs JOB`: the command line face of reconciler.daemon.logs (registered on the typer app)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from reconciler.cli.common import RepoOption, _fail, _reconciler, app, err
from reconciler.daemon.source import BranchOption, PathOption, UrlOption
from reconciler.trust.shown import escape
from status.text import lines

if TYPE_CHECKING:
    from status.models import Attempt


@app.command()
def logs(
    job: Annotated[str, typer.Argument(help="the job whose worker log to show")],
    repo: RepoOption = Path("."),
    attempt: Annotated[int | None, typer.Option(
        help="the attempt's number, as `describe` lists them (default: the newest)")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing new lines until the worker "
                                                                "ends (Ctrl-C stops)")] = False,
    tail: Annotated[int, typer.Option(help="how many of the last lines to show")] = 100,
    poll: Annotated[float, typer.Option(help="with --follow: seconds between reads")] = 2.0,
    raw: Annotated[bool, typer.Option("--raw", help="print control characters (escape sequences, carriage "
                                                     "returns) as the worker wrote them, not as visible escapes; "
                                                     "only for a log you trust")] = False,
    repo_url: UrlOption = None, branch: BranchOption = None, path: PathOption = "",
) -> None:
    """Show a worker's log, read through its provider (a local or SSH worker's folder, Slurm's output
    file, a hosted provider's log API, or the copy the worker wrote to the run folder where the
    provider has none). Secret values are masked."""
    from reconciler.daemon.logs import LogError, locate
    from reconciler.daemon.logs import follow as follow_log

    if tail < 0 or poll <= 0:
        raise _fail("--tail must be 0 or more and --poll more than 0", 2)
    rec = _reconciler(repo, repo_url, branch, path)

    def shown(text: str) -> str:
        return text if raw else lines(text.replace("\r\n", "\n"))

    try:
        source = locate(rec, job, attempt, fetch=repo_url is not None)
        where = f"{source.ref.provider} (worker {source.ref.id})"
        err.print(f"{escape(job)}: attempt {source.number} on {escape(where)}, "
                  f"{escape(_attempt_state(source.attempt))}")
        if follow:
            # Ctrl-C (SIGINT) stops it even when started from a shell that runs background jobs with
            # SIGINT ignored, which Python would otherwise inherit.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            follow_log(source, tail, lambda text: typer.echo(shown(text), nl=False), poll=poll)
        else:
            text = shown(source.read(tail))
            if text:
                typer.echo(text, nl=not text.endswith("\n"))
            else:
                err.print("(no log lines)")
    except LogError as exc:
        raise _fail(str(exc)) from exc
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def _attempt_state(att: Attempt) -> str:
    """The attempt's end in its own words ("suspended by the manifest", not the outcome "cancelled")."""
    return "still open" if att.open else f"ended: {att.detail or (att.outcome.value if att.outcome else 'unknown')}"
