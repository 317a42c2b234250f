"""The HTTP side every fake provider shares, so that each fake keeps only its provider's behaviour.

`FakeServer` serves on 127.0.0.1 in a thread: it reads each request's body as a real server does
(`read_body`: a bad Content-Length is answered 400), hands the request to the fake's `respond`,
and writes the `Reply` back (a client that gave up is not an error). A second thread calls the
fake's `tick` every `tick_seconds`, which moves its world on (machines start, bills grow).
Only the methods a fake names in `http_methods` are served (others get the stdlib's 501), with the
HTTP version its provider's server speaks.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

from tests.fakes import read_body


@dataclass
class Request:
    """One request as a fake sees it: `path` without the query, `query` with each name's last value."""

    method: str
    target: str  # the path as sent, with its query
    headers: Message  # case-insensitive, as the stdlib reads them
    body: bytes

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def query(self) -> dict[str, str]:
        return {k: v[-1] for k, v in parse_qs(urlsplit(self.target).query).items()}

    def lower_headers(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.headers.items()}


@dataclass
class Reply:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # the fake has acted already; the answer leaves this many seconds later


def json_reply(status: int, data: Any, headers: Mapping[str, str] | None = None) -> Reply:
    return Reply(status, json.dumps(data).encode(), {"Content-Type": "application/json", **(headers or {})})


def raw_reply(status: int, data: bytes, content_type: str, headers: Mapping[str, str] | None = None) -> Reply:
    return Reply(status, data, {"Content-Type": content_type, **(headers or {})})


class FakeServer:
    """A fake provider's server and clock; subclasses answer `respond` and move on in `tick`."""

    http_methods: ClassVar[tuple[str, ...]] = ("GET", "POST", "PUT", "DELETE")
    protocol_version: ClassVar[str] = "HTTP/1.0"
    tick_seconds: ClassVar[float] = 0.1
    server: ThreadingHTTPServer | None = None

    def respond(self, request: Request) -> Reply:
        raise NotImplementedError

    def tick(self) -> None:
        """One step of the fake's world, from its clock thread."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}" if self.server is not None else ""

    def start_serving(self, port: int = 0) -> str:
        """Serve on 127.0.0.1:`port` (0: any free one) and start the clock; returns the base URL."""
        self._serving_ends = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        threading.Thread(target=self._clock, daemon=True).start()
        return self.url

    def stop_serving(self) -> None:
        if self.server is not None:
            self._serving_ends.set()
            self.server.shutdown()
            self.server.server_close()

    def _clock(self) -> None:
        while not self._serving_ends.wait(self.tick_seconds):
            self.tick()


def _handler(fake: FakeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = fake.protocol_version

        def serve(self) -> None:
            body = read_body(self)
            if body is None:
                return
            reply = fake.respond(Request(self.command, self.path, self.headers, body))
            if reply.delay:
                time.sleep(reply.delay)  # acted already: the client may have given up by now
            try:
                self.send_response(reply.status)
                for key, value in reply.headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                if self.command != "HEAD":  # a HEAD answer has the GET's headers and no body
                    self.wfile.write(reply.body)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
            pass  # quiet: the tests read each fake's own record of requests

    for method in fake.http_methods:
        setattr(Handler, f"do_{method}", Handler.serve)
    return Handler
