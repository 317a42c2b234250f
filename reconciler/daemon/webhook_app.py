"""The webhook as a Starlette route (POST / or /webhook), deciding with reconciler.daemon.webhook.judge.

The body is read only up to MAX_BODY and only after the headers allow it: a declared length over
the limit is answered 413 before a byte is read (a client that asked `Expect: 100-continue` never
gets its 100), a chunked body 411. One line per request in the log, as `judge` explains.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from adapters.wire import WireError, decimal_int
from reconciler.daemon.webhook import MAX_BODY, PATHS, Answer, Delivery, Seen, identify, judge, log, printable


class Hook:
    """What a request is judged against, and what an accepted push calls."""

    def __init__(self, secret: bytes, wake: Callable[[], None], branch: Callable[[], str | None],
                 seen: Seen | None = None, clock: Callable[[], float] = time.time) -> None:
        self.secret, self.wake, self.branch, self.seen = secret, wake, branch, seen or Seen()
        self.clock = clock  # for the push-time window

    async def handle(self, request: Request) -> Response:
        headers = {k.lower(): v for k, v in request.headers.items()}
        length = _length(request)
        if isinstance(length, Answer):
            return _answer(request, identify(headers), length)
        try:
            body = await _read(request, length)
        except ClientDisconnect:
            return Response(status_code=400)  # the connection is gone; it logged the line
        if len(body) != length:
            return _answer(request, identify(headers), Answer(400, "body length differs from its Content-Length"))
        delivery, answer = judge(headers, body, self.secret, self.branch, self.seen, now=self.clock())
        if answer.wake:
            self.wake()
        return _answer(request, delivery, answer)

    def routes(self) -> list[BaseRoute]:
        return [Route(path, self.handle, methods=["POST"]) for path in PATHS]


def webhook_app(hook: Hook, mounts: Mapping[str, ASGIApp] | None = None) -> ASGIApp:
    """The webhook's routes, and `mounts` beside them on the same address: each at its exact path
    ("/metrics"), and the one at "/" for everything else (the status page, which keeps its own
    token check: the webhook proves itself by its signature)."""
    beside = dict(mounts or {})
    root = beside.pop("/", None)
    routes = hook.routes() + [Route(path, _Asgi(app)) for path, app in beside.items()]
    routes += [Mount("", app=root)] if root is not None else []
    return Starlette(routes=routes, exception_handlers={HTTPException: _refused})


class _Asgi:
    """An ASGI application as a route's endpoint (a bare async function, as prometheus_client's is,
    would be taken for a request handler)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


async def _refused(request: Request, exc: Exception) -> Response:
    """Another path or method: answered and logged like any other request."""
    code = exc.status_code if isinstance(exc, HTTPException) else 400
    text = "webhooks are POSTed" if code == 405 else f"not found: POST to {' or '.join(PATHS)}"
    return _answer(request, None, Answer(code, text))


async def _read(request: Request, length: int) -> bytes:
    """At most `length` bytes (one more tells a body longer than declared)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        chunks.append(chunk)
        size += len(chunk)
        if size > length:
            break
    return b"".join(chunks)


def _length(request: Request) -> int | Answer:
    """The declared body length, or the answer refusing it; an oversized body is never read."""
    if "chunked" in request.headers.get("transfer-encoding", "").lower():
        return Answer(411, "a Content-Length is required")
    given = request.headers.getlist("content-length")
    if not given:
        return Answer(411, "a Content-Length is required")
    try:  # ASCII digits only (int() would take "1_0", "+10", " 10"), and one value (RFC 9112 §6.3)
        lengths = {decimal_int(raw.strip(" \t")) for raw in given}
    except WireError:
        return Answer(400, "bad Content-Length: it must be digits only")
    if len(lengths) != 1:
        return Answer(400, "bad Content-Length: it is given more than once, with different values")
    length = lengths.pop()
    if length > MAX_BODY:
        return Answer(413, f"body of {length} bytes; the limit is {MAX_BODY}")
    return length


def _answer(request: Request, delivery: Delivery | None, answer: Answer) -> Response:
    """The JSON answer; logged before it goes out, so that whoever reads the answer finds the line."""
    sender, event, ident = (delivery.sender, delivery.event, delivery.delivery_id) if delivery else ("?", "", "")
    client = request.client.host if request.client else "?"
    log.info("webhook: %s %s delivery %s from %s: %d %s", sender, printable(event), printable(ident), client,
             answer.status, answer.text)
    data = (json.dumps({"status": answer.status, "result": answer.text}) + "\n").encode()
    # An unread body must not be taken for the next request: a refusal closes the connection.
    headers = {"Connection": "close"} if answer.status >= 400 else {}
    return Response(data, status_code=answer.status, media_type="application/json", headers=headers)
