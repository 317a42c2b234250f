"""Push webhooks (`reconciler run --listen HOST:PORT`): a push to the reconciled branch starts a
tick at once instead of at the next interval. Polling stays: a webhook that never comes (a
provider outage, a firewall) only costs latency.

Every request must prove it knows the shared secret (`RECONCILER_WEBHOOK_SECRET`): GitHub and
Gitea/Forgejo sign the raw body with HMAC-SHA256, GitLab sends the secret itself as a token. A
delivery id seen before is refused (a captured request cannot be replayed to make us tick), and a
body larger than MAX_BODY is refused from its Content-Length, before a byte of it is read.

What the answers mean (the senders show them in their delivery logs):
  202  accepted: a push to the reconciled branch (a tick starts), or a verified delivery we do not
       act on (another branch, a tag, another event: "ignored"; 2xx so GitLab keeps the hook on)
  200  GitHub's `ping`
  400  not a webhook we know, no delivery id, a Content-Length that is not plain digits, or a body
       that is not JSON (strictly: no NaN, no key twice, nested no deeper than 64 levels)
  401  no signature or token, or a wrong one (one code for both: either way the sender did not
       prove it knows the secret)
  404  another path than / or /webhook;  405  another method than POST
  409  a delivery id already seen (replayed or redelivered)
  411  no Content-Length;  413  a body over MAX_BODY
The body and the secret are never logged: one line per request says sender, event, delivery id
and the answer.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from adapters.wire import WireError, decimal_int, load_json

log = logging.getLogger("reconciler")

SECRET_ENV = "RECONCILER_WEBHOOK_SECRET"
MAX_BODY = 1024 * 1024  # a push payload of GitHub or GitLab is a few KB; they cap theirs at 25 MB
PATHS = ("/", "/webhook")
READ_TIMEOUT = 10.0  # a client that stops sending mid-request holds a thread no longer than this


class WebhookError(Exception):
    """The webhook server cannot start; the message says why in one sentence."""


@dataclass(frozen=True)
class Answer:
    status: int
    text: str
    wake: bool = False  # start a tick


@dataclass(frozen=True)
class Delivery:
    """Who sent a request and what it claims to be, from its headers alone (nothing verified yet)."""

    sender: str  # github, gitlab, gitea
    event: str
    delivery_id: str


# ---- who sent it, and is it genuine -------------------------------------------------------------
def identify(headers: Mapping[str, str]) -> Delivery | None:
    """The sender by its event header. Gitea and Forgejo also send GitHub's headers for
    compatibility, so they are looked for first."""
    h = {k.lower(): v for k, v in headers.items()}
    if "x-forgejo-event" in h or "x-gitea-event" in h:
        event = h.get("x-forgejo-event") or h.get("x-gitea-event", "")
        return Delivery("gitea", event, h.get("x-forgejo-delivery") or h.get("x-gitea-delivery", ""))
    if "x-github-event" in h:
        return Delivery("github", h["x-github-event"], h.get("x-github-delivery", ""))
    if "x-gitlab-event" in h:
        # Idempotency-Key stays the same when GitLab retries or resends a delivery (GitLab 17.4+).
        return Delivery("gitlab", h["x-gitlab-event"], h.get("idempotency-key") or h.get("x-gitlab-event-uuid", ""))
    return None


def sign(secret: bytes, body: bytes) -> str:
    """The hex HMAC-SHA256 of the body, as GitHub (after `sha256=`) and Gitea send it."""
    return hmac.new(secret, body, hashlib.sha256).hexdigest()


def proof(sender: str, headers: Mapping[str, str]) -> str | None:
    """The header a sender proves itself with; None when it sent none."""
    h = {k.lower(): v for k, v in headers.items()}
    if sender == "github":
        return h.get("x-hub-signature-256")
    if sender == "gitlab":
        return h.get("x-gitlab-token")
    return h.get("x-forgejo-signature") or h.get("x-gitea-signature")


def genuine(sender: str, given: str, secret: bytes, body: bytes) -> bool:
    """Constant-time comparison of what the sender gave with what the secret makes."""
    expected = {"github": "sha256=" + sign(secret, body), "gitea": sign(secret, body)}.get(sender)
    if expected is None:  # GitLab sends the secret token itself
        return hmac.compare_digest(given.encode("utf-8", "replace"), secret)
    return hmac.compare_digest(given.strip().lower().encode("ascii", "replace"), expected.encode())


# ---- replays -------------------------------------------------------------------------------------
class Seen:
    """The delivery ids of the last `keep` verified deliveries within `ttl` seconds. A replay of an
    older one would only start one more tick (ticks are level-triggered); the bound keeps memory flat."""

    def __init__(self, keep: int = 1000, ttl: float = 24 * 3600, clock: Callable[[], float] = time.monotonic) -> None:
        self.keep, self.ttl, self.clock = keep, ttl, clock
        self._ids: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def first_time(self, key: str) -> bool:
        """Records `key`; False when it was already recorded (the check and the record are one step,
        so two copies racing on two threads cannot both pass)."""
        now = self.clock()
        with self._lock:
            while self._ids and next(iter(self._ids.values())) < now - self.ttl:
                self._ids.popitem(last=False)
            if key in self._ids:
                return False
            if len(self._ids) >= self.keep:
                self._ids.popitem(last=False)
            self._ids[key] = now
            return True


# ---- what to do with a request -------------------------------------------------------------------
def judge(headers: Mapping[str, str], body: bytes, secret: bytes, branch: Callable[[], str | None],
          seen: Seen) -> tuple[Delivery | None, Answer]:
    """The answer to a request whose body was read in full. Nothing is believed before the
    signature holds; the delivery id is recorded only once it does."""
    delivery = identify(headers)
    if delivery is None:
        return None, Answer(400, "not a GitHub, GitLab or Gitea webhook")
    given = proof(delivery.sender, headers)
    if not given:
        return delivery, Answer(401, "unsigned: set the webhook's secret")
    if not genuine(delivery.sender, given, secret, body):
        return delivery, Answer(401, "bad signature")
    if delivery.sender == "github" and delivery.event == "ping":
        return delivery, Answer(200, "pong")
    if not delivery.delivery_id:
        return delivery, Answer(400, "no delivery id")
    if not seen.first_time(f"{delivery.sender}:{delivery.delivery_id}"):
        return delivery, Answer(409, "replayed delivery")
    return delivery, _push(delivery, body, branch)


def _push(delivery: Delivery, body: bytes, branch: Callable[[], str | None]) -> Answer:
    try:
        payload = load_json(body, limit=MAX_BODY)
    except WireError as exc:
        return Answer(400, f"body is not JSON ({exc}): set the webhook's content type to application/json")
    if delivery.event.lower() not in ("push", "push hook"):
        return Answer(202, f"ignored: {delivery.event} is not a push")
    ref = payload.get("ref") if isinstance(payload, dict) else None
    if not isinstance(ref, str):
        return Answer(400, "push without a ref")
    ours = branch()
    if ours is not None and ref != f"refs/heads/{ours}":
        return Answer(202, f"ignored: {ref} is not refs/heads/{ours}")
    return Answer(202, "accepted: ticking now", wake=True)  # a branch we cannot tell (detached HEAD): the tick says why


# ---- the server ----------------------------------------------------------------------------------
def _printable(text: str, limit: int = 80) -> str:
    """A header value fit for a log line: no control characters (no forged log lines), bounded."""
    return "".join(c if c.isprintable() else "?" for c in text[:limit]) or "-"


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = READ_TIMEOUT
    protocol_version = "HTTP/1.1"
    server_version = "reconciler-webhook"

    def version_string(self) -> str:
        return self.server_version  # no Python version in the Server header

    def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
        if self.path.split("?", 1)[0] not in PATHS:
            return self._finish(None, Answer(404, "not found: POST to / or /webhook"))
        headers = {k.lower(): v for k, v in self.headers.items()}
        length = self._length()
        if isinstance(length, Answer):
            return self._finish(identify(headers), length)
        body = self.rfile.read(length)
        if len(body) < length:
            return self._finish(identify(headers), Answer(400, "body shorter than its Content-Length"))
        delivery, answer = judge(headers, body, self.server.secret, self.server.branch, self.server.seen)
        if answer.wake:
            self.server.wake()
        self._finish(delivery, answer)

    def handle_expect_100(self) -> bool:
        """A client asking `Expect: 100-continue` for an oversized body is refused before it sends it."""
        if self.command == "POST" and isinstance(answer := self._length(), Answer):
            self._finish(identify({k.lower(): v for k, v in self.headers.items()}), answer)
            return False
        return super().handle_expect_100()

    def do_GET(self) -> None:  # noqa: N802
        self._finish(None, Answer(405, "webhooks are POSTed"))

    do_PUT = do_DELETE = do_PATCH = do_HEAD = do_GET  # noqa: N815

    def _length(self) -> int | Answer:
        """The declared body length, or the answer refusing it; an oversized body is never read."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return Answer(411, "a Content-Length is required")
        given = self.headers.get_all("Content-Length") or []
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

    def _finish(self, delivery: Delivery | None, answer: Answer) -> None:
        """Answers, closing the connection unless the whole request was read and accepted."""
        if answer.status >= 400:
            self.close_connection = True  # an unread body must not be taken for the next request
        # Logged before the answer goes out, so that whoever reads the answer finds the line written.
        sender, event, ident = (delivery.sender, delivery.event, delivery.delivery_id) if delivery else ("?", "", "")
        log.info("webhook: %s %s delivery %s from %s: %d %s", sender, _printable(event), _printable(ident),
                 self.client_address[0], answer.status, answer.text)
        data = (json.dumps({"status": answer.status, "result": answer.text}) + "\n").encode()
        self.send_response(answer.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
        """Silences http.server's own access log: `_finish` writes the one line per request."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], *, secret: bytes, wake: Callable[[], None],
                 branch: Callable[[], str | None]) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.secret, self.wake, self.branch, self.seen = secret, wake, branch, Seen()
        super().__init__(address, _Handler)


class WebhookServer:
    """The HTTP server on a daemon thread of its own; `wake` is called for every accepted push."""

    def __init__(self, host: str, port: int, *, secret: str, wake: Callable[[], None],
                 branch: Callable[[], str | None]) -> None:
        if not secret:
            raise WebhookError(missing_secret())
        self.host, self.port = host, port
        self.secret, self.wake, self.branch = secret.encode(), wake, branch
        self._server: _Server | None = None

    def start(self) -> tuple[str, int]:
        """Binds and serves; returns the address bound (port 0 picks a free one)."""
        try:
            self._server = _Server((self.host, self.port), secret=self.secret, wake=self.wake, branch=self.branch)
        except OSError as exc:
            raise WebhookError(f"cannot listen on {self.host}:{self.port}: {exc.strerror or exc}") from exc
        threading.Thread(target=self._server.serve_forever, args=(0.2,), daemon=True, name="webhook").start()
        host, port = self._server.server_address[:2]
        log.info("webhook: listening on http://%s:%d/ (POST / or /webhook)", _bracketed(str(host)), port)
        return str(host), int(port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def missing_secret() -> str:
    return (f"--listen needs a shared secret: set {SECRET_ENV} in the daemon's environment (for example "
            f"`export {SECRET_ENV}=$(openssl rand -hex 32)`) and give the same value to the webhook's settings")


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def parse_listen(value: str) -> tuple[str, int]:
    """HOST:PORT, [IPv6]:PORT or :PORT (loopback). Raises ValueError with a sentence on bad input."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:8080 or :8080)")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything
