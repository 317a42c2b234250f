"""A local HTTP receiver for notification tests: apprise's json:// posts to it on 127.0.0.1.

Modes: "ok" answers 200, "error" answers 500, "hang" holds every request until `release()`.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.received: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.arrived = threading.Event()  # a request came in (set before a hang)
        self._released = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                owner.paths.append(self.path)
                owner.arrived.set()
                if owner.mode == "hang":
                    owner._released.wait(120)
                owner.received.append(json.loads(body or b"{}"))
                code = 500 if owner.mode == "error" else 200
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, token: str) -> str:
        """An apprise URL whose path carries `token`, as a real webhook URL carries its secret."""
        return f"json://127.0.0.1:{self.port}/hooks/{token}"

    def titles(self) -> list[str]:
        return [m.get("title", "") for m in self.received]

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()
