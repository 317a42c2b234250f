"""Push webhooks (`reconciler run --listen HOST:PORT`): a push to the reconciled branch starts a
tick at once instead of at the next interval. Polling stays: a webhook that never comes (a
provider outage, a firewall) only costs latency.

Every request must prove it knows the shared secret (`RECONCILER_WEBHOOK_SECRET`): GitHub and
Gitea/Forgejo sign the raw body with HMAC-SHA256, GitLab sends the secret itself as a token. A
captured request cannot be replayed to make us tick: a delivery id seen before is refused (GitHub's
X-GitHub-Delivery GUID, GitLab's Idempotency-Key or X-Gitlab-Event-UUID, Gitea's X-Gitea-Delivery),
so is a payload whose SHA-256 was seen before under any delivery id (the id is not signed, the body
is), and so is a push whose signed push time is older than WINDOW (GitHub's repository.pushed_at).
GitHub recommends the GUID for this:
https://docs.github.com/en/webhooks/using-webhooks/best-practices-for-using-webhooks#use-the-x-github-delivery-header
GitLab's delivery headers: https://docs.gitlab.com/user/project/integrations/webhooks/#delivery-headers
Gitea's: https://docs.gitea.com/features/webhooks. A body larger than MAX_BODY is refused from its
Content-Length, before a byte of it is read. The HTTP side is reconciler.daemon.webhook_app on uvicorn.

What the answers mean (the senders show them in their delivery logs):
  202  accepted: a push to the reconciled branch (a tick starts), or a verified delivery we do not
       act on (another branch, a tag, another event: "ignored"; 2xx so GitLab keeps the hook on)
  200  GitHub's `ping`
  400  not a webhook we know, no delivery id, a Content-Length that is not plain digits, or a body
       that is not JSON (strictly: no NaN, no key twice, nested no deeper than 64 levels)
  401  no signature or token, or a wrong one (one code for both: either way the sender did not
       prove it knows the secret)
  404  another path than / or /webhook;  405  another method than POST
  409  a delivery id or a payload already seen (replayed or redelivered), or a push time
       outside the window (older than WINDOW, or more than SKEW ahead of our clock)
  411  no Content-Length;  413  a body over MAX_BODY
The body and the secret are never logged: one line per request says sender, event, delivery id
and the answer.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from adapters.wire import WireError, load_json

log = logging.getLogger("reconciler")

SECRET_ENV = "RECONCILER_WEBHOOK_SECRET"
MAX_BODY = 1024 * 1024  # a push payload of GitHub or GitLab is a few KB; they cap theirs at 25 MB
PATHS = ("/", "/webhook")
WINDOW = 600.0  # a push older than this (by the time in its payload) is refused as a replay
SKEW = 120.0  # how far the forge's clock may run ahead of ours


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
    """The delivery ids and payload digests of the last verified deliveries (`keep` keys) within
    `ttl` seconds. A replay of an older one would only start one more tick (ticks are
    level-triggered); the bound keeps memory flat."""

    def __init__(self, keep: int = 4096, ttl: float = 24 * 3600, clock: Callable[[], float] = time.monotonic) -> None:
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
          seen: Seen, now: float | None = None) -> tuple[Delivery | None, Answer]:
    """The answer to a request whose body was read in full. Nothing is believed before the
    signature holds; the delivery id and the payload's digest are recorded only once it does."""
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
    if not seen.first_time("sha256:" + hashlib.sha256(body).hexdigest()):
        return delivery, Answer(409, "replayed delivery: this payload came before under another delivery id")
    return delivery, _push(delivery, body, branch, time.time() if now is None else now)


def _push(delivery: Delivery, body: bytes, branch: Callable[[], str | None], now: float) -> Answer:
    try:
        payload = load_json(body, limit=MAX_BODY)
    except WireError as exc:
        return Answer(400, f"body is not JSON ({exc}): set the webhook's content type to application/json")
    if delivery.event.lower() not in ("push", "push hook"):
        return Answer(202, f"ignored: {delivery.event} is not a push")
    if not isinstance(payload, dict) or not isinstance(payload.get("ref"), str):
        return Answer(400, "push without a ref")
    if (stale := _outside_window(pushed_at(payload), now)) is not None:
        return Answer(409, stale)
    ref, ours = payload["ref"], branch()
    if ours is not None and ref != f"refs/heads/{ours}":
        return Answer(202, f"ignored: {ref} is not refs/heads/{ours}")
    return Answer(202, "accepted: ticking now", wake=True)  # a branch we cannot tell (detached HEAD): the tick says why


def pushed_at(payload: Mapping[str, Any]) -> float | None:
    """When the push happened, by the payload: GitHub's `repository.pushed_at` (Unix seconds in a
    push event; https://docs.github.com/en/webhooks/webhook-events-and-payloads#push). GitLab and
    Gitea send no push time, only each commit's own (which can be days older than its push: a
    commit made offline), so for them None and the payload digest alone refuses a replay."""
    repository = payload.get("repository")
    value = repository.get("pushed_at") if isinstance(repository, dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):  # an ISO time, as GitHub writes it in other events
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def _outside_window(pushed: float | None, now: float) -> str | None:
    """Why a push time is refused: older than WINDOW, or further than SKEW ahead of our clock."""
    if pushed is None:
        return None
    if pushed < now - WINDOW:
        return f"stale delivery: pushed {now - pushed:.0f} s ago, more than the {WINDOW:.0f} s allowed"
    if pushed > now + SKEW:
        return f"stale delivery: pushed {pushed - now:.0f} s ahead of this machine's clock (more than {SKEW:.0f} s)"
    return None


# ---- the server ----------------------------------------------------------------------------------
def printable(text: str, limit: int = 80) -> str:
    """A header value fit for a log line: no control characters (no forged log lines), bounded."""
    return "".join(c if c.isprintable() else "?" for c in text[:limit]) or "-"


def missing_web_extra(option: str) -> str | None:
    """The sentence saying what to install when the web extra is missing; None when it is there."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        return f"{option} needs the web extra ({exc.name} is missing): pip install 'reconciler[web]'"
    return None


def listen_problem(environ: Mapping[str, str]) -> str | None:
    """Why `--listen` cannot start here, in one sentence (no secret, or no web extra); None when it can."""
    return missing_web_extra("--listen") if environ.get(SECRET_ENV) else missing_secret()


def missing_secret() -> str:
    return (f"--listen needs a shared secret: set {SECRET_ENV} in the daemon's environment (for example "
            f"`export {SECRET_ENV}=$(openssl rand -hex 32)`) and give the same value to the webhook's settings")


def bracketed(host: str) -> str:
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
