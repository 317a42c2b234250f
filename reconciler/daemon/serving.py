"""One uvicorn server on a thread of the daemon, for whatever the daemon serves over HTTP (the
webhook, and the status page when it shares the address).

A burst of hundreds of connections must all be answered and a stray or hostile client must cost
one log line, not a traceback and not a thread: the socket is bound here with a deep backlog
(BACKLOG), every connection gets READ_TIMEOUT to deliver a whole request, and uvicorn's own
warnings about a connection ("Invalid HTTP request received.", an exception in the application)
become one line of the `reconciler` log naming the client (the traceback only at debug level).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from typing import Any

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("reconciler")

BACKLOG = 2048  # connections the kernel queues before we accept them (http.server's was 5)
READ_TIMEOUT = 10.0  # seconds a connection has to deliver its whole request, headers and body
KEEP_ALIVE = 5  # seconds an idle kept-alive connection stays open after an answer
MAX_HEADERS = 64 * 1024  # bytes of request line and headers; more is answered 400
MAX_CONNECTIONS = 4096  # open at once; beyond it new requests are answered 503


class _OneLine:
    """Stands in for uvicorn's per-connection logger: each message becomes one line of ours."""

    level = logging.INFO  # above uvicorn's TRACE, so that it never asks for its trace lines

    def __init__(self, protocol: Guarded) -> None:
        self.protocol = protocol

    def log(self, level: int, msg: str, *args: Any, exc_info: Any = None, **_: Any) -> None:
        text = (msg % args if args else msg).strip().rstrip(".")
        if isinstance(exc_info, BaseException):
            text += f": {type(exc_info).__name__}: {exc_info}"
            log.debug("http: traceback of the error above", exc_info=exc_info)
        self.protocol.note(text, level)

    def debug(self, msg: str, *args: Any, **kw: Any) -> None:
        self.log(logging.DEBUG, msg, *args, **kw)

    def info(self, msg: str, *args: Any, **kw: Any) -> None:
        self.log(logging.INFO, msg, *args, **kw)

    def warning(self, msg: str, *args: Any, **kw: Any) -> None:
        self.log(logging.WARNING, msg, *args, **kw)

    def error(self, msg: str, *args: Any, **kw: Any) -> None:
        self.log(logging.ERROR, msg, *args, **kw)


class Guarded(H11Protocol):
    """uvicorn's HTTP/1.1 connection with a deadline for each request, and one line in our log
    for a connection that ends without one (sent nothing, or closed or stalled part-way)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.logger = _OneLine(self)  # type: ignore[assignment]
        self._deadline: asyncio.TimerHandle | None = None
        self._pending = 0  # bytes received towards a request not answered yet
        self._answered = 0
        self._cut = False

    def note(self, text: str, level: int = logging.WARNING) -> None:
        who = self.client[0] if self.client else "?"
        log.log(level, "http: connection from %s: %s", who, text)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        self._pending += len(data)
        if self._deadline is None:  # the first bytes of the next request on a kept-alive connection
            self._arm()
        super().data_received(data)

    def on_response_complete(self) -> None:
        self._answered += 1
        self._pending = 0
        self._disarm()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if not self._cut:
            midway = self.cycle is not None and not self.cycle.response_complete
            if midway or self._pending:
                self.note(f"closed by the client after {self._pending} bytes, before its request was complete")
            elif not self._answered:
                self.note("closed by the client without sending a request")
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """uvicorn answers a request it cannot parse with 400 and closes: its warning was this
        connection's one line, so the close that follows is not a second one."""
        self._cut = True
        super().send_400_response(msg)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(READ_TIMEOUT, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        self._cut = True
        self.note(f"no complete request within {READ_TIMEOUT:g}s ({self._pending} bytes received): closed")
        self.transport.close()


def bind(host: str, port: int) -> socket.socket:
    """A listening socket with BACKLOG (port 0 picks a free one); OSError when it cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def server(app: ASGIApp) -> uvicorn.Server:
    """uvicorn with the limits above, its access log off and its warnings through Guarded."""
    return uvicorn.Server(uvicorn.Config(
        app, http=Guarded, lifespan="off", log_config=None, log_level="warning", access_log=False,
        server_header=False, backlog=BACKLOG, timeout_keep_alive=KEEP_ALIVE,
        h11_max_incomplete_event_size=MAX_HEADERS, limit_concurrency=MAX_CONNECTIONS))


def bound(host: str, port: int) -> socket.socket:
    """`bind`, with a sentence for the user when the address cannot be had."""
    try:
        return bind(host, port)
    except OSError as exc:
        raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another port") from exc


class Served:
    """`app` served by uvicorn from `sock` on a daemon thread, until `stop`."""

    def __init__(self, app: ASGIApp, sock: socket.socket, name: str) -> None:
        self.sock = sock
        self.server = server(app)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, name=name, daemon=True)
        self.thread.start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.sock.getsockname()[:2]
        return str(host), int(port)

    def wait_started(self, timeout: float = 10.0) -> bool:
        end = time.monotonic() + timeout
        while not self.server.started and self.thread.is_alive() and time.monotonic() < end:
            time.sleep(0.01)
        return self.server.started

    def stop(self, timeout: float = 5.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()
