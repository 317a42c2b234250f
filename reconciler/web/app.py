"""The status page's web application: Starlette routes rendering Jinja2 templates (autoescaped),
its own small stylesheet, and a token check for anyone who is not on this machine.

`reconciler serve` binds to 127.0.0.1 by default. Bound to any other address it needs a token in
RECONCILER_WEB_TOKEN and refuses to start without one; a request then carries it as
`Authorization: Bearer TOKEN`, or once as `?token=TOKEN` (which sets a cookie and redirects to the
same page without it, so that the token does not stay in the address bar or the refresh).
"""

from __future__ import annotations

import hmac
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from adapters.artifacts import Artifact, ArtifactError, download
from adapters.gitrepo import GitError
from adapters.storage import RunFolder, StorageError
from reconciler.planner.health import provider_health
from reconciler.planner.outlook.forecast import provider_reliabilities
from reconciler.trust.redaction import file_holds_secret
from reconciler.web import views
from reconciler.web.data import PageData, Snapshot
from status.models import Attempt, JobStatus, size_text
from status.redact import Redactor
from status.text import one_line

HERE = Path(__file__).parent
TOKEN_ENV = "RECONCILER_WEB_TOKEN"
COOKIE = "reconciler_token"


class TokenGate:
    """Lets a request through only with the token (header, cookie, or once in the query)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    def _matches(self, candidate: str | None) -> bool:
        return candidate is not None and hmac.compare_digest(candidate.encode(), self.token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        auth = request.headers.get("authorization", "")
        bearer = auth[7:] if auth.lower().startswith("bearer ") else None
        if self._matches(bearer) or self._matches(request.cookies.get(COOKIE)):
            await self.app(scope, receive, send)
            return
        response: Response
        if self._matches(request.query_params.get("token")):
            query = request.url.remove_query_params("token").query
            response = RedirectResponse(local_path(request.url.path) + (f"?{query}" if query else ""), status_code=303)
            response.set_cookie(COOKIE, self.token.decode(), httponly=True, samesite="strict")
        else:
            response = PlainTextResponse("a token is required: send Authorization: Bearer <token> or open "
                                         "the page once with ?token=<token>", status_code=401)
        await response(scope, receive, send)


def local_path(path: str) -> str:
    """`path` as a redirect that cannot leave this site, or "/" when it would: a browser reads
    `//host` and `/\\host` as another host, and drops tabs and newlines anywhere in an address
    before reading it (so `/<TAB>/host` is `//host`); a scheme (`https:host`) or anything not
    starting with "/" (a leading space, which a browser would strip) is no path of ours. What stays
    is percent-encoded, control characters and spaces included."""
    kept = path.replace("\t", "").replace("\n", "").replace("\r", "")
    if not kept.startswith("/") or kept[1:2] in ("/", "\\"):
        return "/"
    return quote(kept, safe="/!$&'()*+,;=:@-._~")


def create_app(repo: str | Path, *, token: str | None = None, refresh_seconds: int = 10,
               commit_url: str | None = None, environ: Mapping[str, str] | None = None) -> ASGIApp:
    """The page for the state repository at `repo`. With a token, every request must carry it."""
    data = PageData(repo, environ=environ)
    try:
        data.snapshot()  # read every status once now, so that the first visitor does not wait for it
    except GitError:
        pass  # no commit yet: each request says so until there is one
    commit_url = commit_url or views.commit_url_template(data.remote_url())
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(default=True),
                      trim_blocks=True, lstrip_blocks=True, finalize=views.visible)
    env.filters["urlpart"] = lambda s: quote(str(s), safe="")
    env.filters["urlpath"] = lambda s: quote(str(s), safe="/")
    env.filters["size"] = size_text
    env.filters["when"] = views.when
    env.globals.update(refresh=refresh_seconds, legend=views.OUTCOME_LEGEND)

    def render(snap: Snapshot, template: str, **context: Any) -> HTMLResponse:
        html = env.get_template(template).render(head=snap.head, **context)
        return HTMLResponse(snap.redactor.redact(html), headers=_HEADERS)

    def overview(request: Request) -> Response:
        snap = data.snapshot()
        rows = [_row(data, snap, name) for name in snap.names]
        now = time.time()
        health = provider_health(snap.statuses.values(), now, snap.desired.providers)
        learned = provider_reliabilities(snap.desired.providers, snap.statuses.values(), now)
        return render(snap, "overview.html", rows=rows, counts=views.phase_counts(rows),
                      sweeps=views.sweep_rows(rows, snap.desired.sweep_of),
                      slow=snap.slow_providers,
                      providers=views.provider_rows(health, learned, now, snap.room), half_life=views.HALF_LIFE_TEXT,
                      held=sorted({r.held for r in rows if r.held}),
                      errors=[snap.redactor.redact(str(e)) for e in snap.desired.errors],
                      storage_faults=sorted({st.storage_fault for st in snap.statuses.values() if st.storage_fault}))

    def job_page(request: Request) -> Response:
        name = request.path_params["name"]
        snap = data.snapshot()
        if name not in snap.names:
            return PlainTextResponse(one_line(f"no job named {name}"), status_code=404, headers=_HEADERS)
        return render(snap, "job.html", **_job_context(data, snap, name, commit_url))

    def output_file(request: Request) -> Response:
        name, path = request.path_params["name"], request.path_params["path"]
        snap = data.snapshot()
        try:
            found = data.output(snap, name, path) if name in snap.names else None
        except (StorageError, OSError, ValueError) as exc:
            why = f"the outputs of {name} cannot be read from run storage now ({exc}); try again later"
            return PlainTextResponse(one_line(snap.redactor.redact(why)), status_code=503, headers=_HEADERS)
        if found is None:
            return PlainTextResponse(one_line(f"{name} has no completed run with an output {path}; its page lists "
                                              "the outputs there are"), status_code=404, headers=_HEADERS)
        return _stream_output(*found, snap.redactor, name)

    routes = [
        Route("/", overview),
        Route("/job/{name:str}", job_page),
        Route("/job/{name:str}/outputs/{path:path}", output_file),
        Route("/healthz", lambda request: PlainTextResponse("ok")),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app: ASGIApp = Starlette(routes=routes, middleware=[Middleware(GZipMiddleware, minimum_size=2000)],
                             exception_handlers={GitError: _unreadable})
    return TokenGate(app, token) if token else app


async def _unreadable(request: Request, exc: Exception) -> Response:
    """The repository cannot be read now (no commit yet, a damaged clone): its sentence, not a traceback."""
    return PlainTextResponse(one_line(str(exc)), status_code=503, headers=_HEADERS)


# Read-only pages: nothing may frame them, and the page loads nothing from elsewhere.
_HEADERS = {"Content-Security-Policy": "default-src 'self'; style-src 'self'; img-src 'self' data:; "
                                       "frame-ancestors 'none'",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}


def _stream_output(folder: RunFolder, item: Artifact, redactor: Redactor, name: str) -> Response:
    """The output, downloaded from run storage and verified against its completion record, sent as
    a download (never rendered by the browser as a page of this site); the copy is removed after.
    An output that holds a secret value in any form the redaction knows is not sent: whoever can
    read the page could read the secret."""
    tmp = tempfile.mkdtemp(prefix="reconciler-output-")
    try:
        [path] = download(folder, [item], Path(tmp))
        leaks = file_holds_secret(redactor, path)
    except (StorageError, OSError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, ArtifactError):
            why, code = f"{exc}: restore it in run storage, or change the job's manifest so that it runs again", 502
        else:
            why, code = f"{item.path} cannot be read from run storage now ({exc}); try again later", 503
        return PlainTextResponse(one_line(redactor.redact(why)), status_code=code, headers=_HEADERS)
    if leaks:
        shutil.rmtree(tmp, ignore_errors=True)
        why = (f"{item.path} holds the value of a secret (one that a job's or provider's `secrets:` names, or a "
               "credential in the environment of this page's server), so this page does not send it; "
               f"`reconciler artifacts pull {name} DEST` copies the outputs to a machine you trust")
        return PlainTextResponse(one_line(redactor.redact(why)), status_code=403, headers=_HEADERS)
    return FileResponse(path, media_type="application/octet-stream", filename=PurePosixPath(item.path).name,
                        headers=_HEADERS, background=BackgroundTask(shutil.rmtree, tmp, ignore_errors=True))


def _row(data: PageData, snap: Snapshot, name: str) -> views.Row:
    live = data.live(snap, name)
    return views.overview_row(name, snap.statuses.get(name), snap.target(name), live.step if live else None,
                              snap.deadline(name))


def _job_context(data: PageData, snap: Snapshot, name: str, commit_url: str | None) -> dict[str, Any]:
    now = time.time()
    st = snap.statuses.get(name)
    history = data.history(snap, name)
    recorded = [(v.time, v.status) for v in reversed(history) if v.status is not None]
    attempts = views.merge_attempts([s for _, s in recorded] + ([st] if st else []))
    current = st.run_id if st else ""
    runs = [_run_view(data, snap, name, run, run == current, attempts, recorded, now)
            for run in views.run_order(current, attempts, recorded)]
    commits = [{"sha": v.sha, "short": v.sha[:10], "time": views.when(v.time), "subject": v.subject,
                "url": commit_url.format(sha=v.sha) if commit_url else None,
                "phase": v.status.phase.value if v.status else "removed",
                "step": v.status.progress.step if v.status else None} for v in history]
    log_tail = st.log_tail if st and st.log_tail else ""
    storage_log = "" if log_tail else data.attempt_log(snap, name)
    return {"name": name, "st": st, "row": _row(data, snap, name), "runs": runs, "commits": commits,
            "log_tail": log_tail, "storage_log": storage_log, "outcome_class": views.outcome_class,
            "drill": _drill(data, snap, name, st)}


def _drill(data: PageData, snap: Snapshot, name: str, st: JobStatus | None) -> dict[str, Any] | None:
    if st is None or st.drill is None:
        return None
    seen = data.drill(snap, name)
    return views.drill_view(snap.redactor.redact(st.drill.summary()),
                            st.drill.passed if st.drill.verdict is not None else None,
                            seen.before if seen else None, seen.after if seen else None)


def _run_view(data: PageData, snap: Snapshot, name: str, run: str, current: bool, attempts: list[Attempt],
              recorded: list[tuple[float, JobStatus]], now: float) -> dict[str, Any]:
    """One run's attempts, durable progress and reported metrics. The live heartbeat and the stored
    checkpoints are the current run's; an earlier run's chart ends where its record does."""
    mine = [a for a in attempts if a.run_id == run]
    versions = [(t, s) for t, s in recorded if s.run_id == run]
    points, rises = views.durable_points(versions)
    marks = {step: t for t, step in rises}
    live = data.live(snap, name) if current else None
    st = snap.statuses.get(name)
    if current:
        marks.update({step: t for t, step in data.checkpoints(snap, name)})
        end = max(t for t, _ in points) if points and st is not None and st.phase.terminal else now
    else:
        end = max([t for t, _ in points] + [a.ended for a in mine if a.ended is not None] or [now])
    chart = views.progress_chart(points, [(t, s) for s, t in marks.items()], snap.target(name),
                                 (live.time, live.step) if live else None, end)
    reported = data.reported(snap, name, run)
    return {"run_id": run, "current": current, "timeline": views.timeline(mine, end),
            "attempts": list(reversed(mine)), "chart": chart, "summary": views.run_summary(mine, versions),
            "metrics": views.metric_charts({run or "earlier run": reported}) if reported else []}


def check_bind(host: str, token: str | None) -> None:
    """Refuses, in one sentence, to serve beyond this machine without a token."""
    from reconciler.daemon.webhook import is_loopback

    if not is_loopback(host) and not token:
        raise ValueError(f"serving on {host} makes the page reachable from other machines: set {TOKEN_ENV} "
                         "to a long random token first (or bind to 127.0.0.1)")


def serve_in_background(repo: str | Path, host: str, port: int, *, token: str | None) -> threading.Thread:
    """The page beside the daemon (`reconciler run --serve`): a thread that ends with the process.
    ValueError, in a sentence, when it may not or cannot listen there."""
    from reconciler.daemon.serving import Served, bound

    check_bind(host, token)
    app = create_app(repo, token=token)
    return Served(app, bound(host, port), name="status-page").thread


def serve(repo: str | Path, host: str, port: int, *, token: str | None, refresh_seconds: int = 10,
          commit_url: str | None = None, on_ready: Callable[[], None] | None = None) -> None:
    """Runs the page until interrupted (uvicorn); `on_ready` once the repository has been opened."""
    from reconciler.daemon.serving import bound, server

    check_bind(host, token)
    app = create_app(repo, token=token, refresh_seconds=refresh_seconds, commit_url=commit_url)
    sock = bound(host, port)
    if on_ready is not None:
        on_ready()
    server(app).run(sockets=[sock])
