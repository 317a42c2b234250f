"""`reconciler serve`: the command's options and its start-up checks (cli.py only registers it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from reconciler.trust.shown import escape

err = Console(stderr=True)


def _fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


def start_beside_daemon(repo: Path, listen: str, webhook_at: tuple[str, int] | None = None) -> object | None:
    """`reconciler run --serve HOST:PORT`: the same checks as `serve`, then the page in a thread; or,
    when the address is the webhook's (`--listen`), the page's application for the webhook's server
    to serve beside it (one server, one port)."""
    from adapters.gitrepo import GitError
    from reconciler.daemon.webhook import parse_listen

    try:
        host, port = parse_listen(listen)
    except ValueError as exc:
        raise _fail(f"--serve: {exc}", 2) from exc
    try:
        from reconciler.web.app import TOKEN_ENV, check_bind, create_app, serve_in_background
    except ImportError as exc:
        raise _fail(f"--serve needs the web extra ({exc.name} is missing): pip install 'reconciler[web]'") from exc
    token = os.environ.get(TOKEN_ENV) or None
    shared = webhook_at is not None and (host, port) == webhook_at and port != 0
    try:
        if shared:
            check_bind(host, token)
            page = create_app(repo, token=token)
        else:
            serve_in_background(repo, host, port, token=token)
    except (ValueError, GitError, OSError) as exc:
        raise _fail(str(exc)) from exc
    where = f"[{host}]" if ":" in host else host
    err.print(f"status page: http://{where}:{port}/" + (" (token required)" if token else "")
              + (", with the webhook (POST /webhook)" if shared else ""), soft_wrap=True, markup=False)
    return page if shared else None


def serve(
    repo: Annotated[Path, typer.Option("--repo", "-r", help="the state repository (a git checkout)")] = Path("."),
    listen: Annotated[str, typer.Option(metavar="HOST:PORT", help="where to serve; :PORT is loopback; any other "
                                        "address needs RECONCILER_WEB_TOKEN")] = "127.0.0.1:8080",
    refresh: Annotated[int, typer.Option(min=1, help="seconds between the page's own reloads")] = 10,
    commit_url: Annotated[str | None, typer.Option(
        metavar="URL", help="link for a status commit, with {sha} (e.g. https://git.example.com/o/r/commit/{sha}); "
                            "found from the origin remote on GitHub, GitLab, Codeberg and Bitbucket")] = None,
) -> None:
    """Serve a read-only status page: every job's phase, progress, ETA and cost; per job its attempt
    timeline, progress over time, status commits and log tail. It reloads itself."""
    from reconciler.daemon.webhook import parse_listen

    try:
        host, port = parse_listen(listen)
    except ValueError as exc:
        raise _fail(f"--listen: {exc}", 2) from exc
    if commit_url is not None and "{sha}" not in commit_url:
        raise _fail("--commit-url must contain {sha}, where the commit id goes", 2)
    try:
        from reconciler.web.app import TOKEN_ENV, check_bind
        from reconciler.web.app import serve as run_server
    except ImportError as exc:
        raise _fail(f"the status page needs its web extra ({exc.name} is missing): "
                    "pip install 'reconciler[web]'") from exc
    token = os.environ.get(TOKEN_ENV) or None
    try:
        check_bind(host, token)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    from adapters.gitrepo import GitError

    def ready() -> None:
        where = f"[{host}]" if ":" in host else host
        err.print(f"status page for {repo.resolve()}: http://{where}:{port}/" + (" (token required)" if token else ""),
                  soft_wrap=True, markup=False)

    try:
        run_server(repo, host, port, token=token, refresh_seconds=refresh, commit_url=commit_url, on_ready=ready)
    except (GitError, ValueError) as exc:
        raise _fail(str(exc)) from exc
