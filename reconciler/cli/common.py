"""What every verb of the command line shares: the typer app, the consoles, the options that name
the state repository, logging through the redacting filter, and how a verb fails."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler

from reconciler.cli import helptext  # noqa: F401 - help without placeholders, before any command is built
from reconciler.trust.shown import VisibleFilter, escape

if TYPE_CHECKING:
    from reconciler.daemon.loop import Reconciler
    from reconciler.trust.redaction import RedactingFilter

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Drive compute jobs to completion on executors that owe you nothing, GitOps-style.\n\n"
                       "Exit codes: 0 ok; 1 an error a user can fix (a manifest error from validate or plan, "
                       "a missing dependency, another daemon holds the repository, not all jobs succeeded "
                       "with --until-done); 2 a usage error, or a change `plan --base --fail-on` names; "
                       "130 interrupted.")
console = Console()
err = Console(stderr=True)

RepoOption = Annotated[Path, typer.Option("--repo", "-r", help="the state repository (a git checkout)")]
VerboseOption = Annotated[bool, typer.Option("--verbose", "-v", help="also log debug messages")]


def _setup_logging(verbose: bool) -> None:
    """Every record passes the redacting filter: until a Reconciler exists it knows the values of
    credential variables; `_reconciler` points it at the Reconciler's, which adds the secrets the
    manifests name."""
    from reconciler.trust.redaction import RedactingFilter, secret_values
    from status.redact import Redactor

    global _LOG_FILTER
    start = Redactor(secret_values(None, os.environ))
    _LOG_FILTER = RedactingFilter(lambda: start)
    handler = RichHandler(console=err, show_path=False, rich_tracebacks=False)
    handler.addFilter(_LOG_FILTER)
    handler.addFilter(VisibleFilter())  # after the redaction: control characters become visible escapes
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(message)s", handlers=[handler])
    for noisy in ("git", "watchfiles", "fsspec", "botocore", "s3fs", "urllib3", "aiobotocore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # A tick that is still running when the next is due is skipped on purpose (one at a time).
    logging.getLogger("apscheduler").setLevel(logging.ERROR)


_LOG_FILTER: RedactingFilter | None = None


def _fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[red]error:[/red] {escape(message)}")  # a message may hold brackets: [s3], [0]
    return typer.Exit(code)


def _reconciler(repo: Path, url: str | None = None, branch: str | None = None, path: str = "") -> Reconciler:
    from adapters.gitrepo import GitError
    from reconciler.daemon.loop import Reconciler
    from reconciler.daemon.source import Source, open_state, remote_of

    try:
        source = Source(repo, url, branch, path)
        rec = Reconciler(open_state(source), remote=remote_of(source))
    except GitError as exc:
        raise _fail(str(exc)) from exc
    if _LOG_FILTER is not None:
        _LOG_FILTER.source = lambda: rec.redactor
    return rec
