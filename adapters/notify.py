"""Sends notifications through apprise (Slack, Discord, Telegram, e-mail, JSON webhooks... one URL
scheme for all), from a worker thread of its own, so that a slow or failing target never holds a
tick: `submit` only puts the message on a bounded queue and returns.

Each target is named by the environment variable that holds its URL; the URL itself (it carries a
token) is never logged: apprise's own log, which prints URLs and parts of them, is kept out of the
daemon's, and a failure is reported in our words, naming the variable. A target that keeps
failing is reported once, and once more when it works again. Each send is bounded by apprise's
socket timeouts (`timeout` seconds to connect and to read, unless the URL sets `cto`/`rto`).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger("reconciler")

QUEUE_SIZE = 1000


@dataclass(frozen=True)
class Outgoing:
    url_env: str
    title: str
    body: str
    level: str = "info"


class Notifier:
    def __init__(self, environ: Mapping[str, str], *, timeout: float = 5.0) -> None:
        self.environ = environ
        self.timeout = timeout
        self._queue: queue.Queue[Outgoing | None] = queue.Queue(QUEUE_SIZE)
        self._thread: threading.Thread | None = None
        self._failing: set[str] = set()  # targets whose last send failed (reported once)
        self._dropped = False
        self.sent = 0  # messages a target accepted (exported by reconciler.daemon.metrics)
        self.failed = 0  # messages not delivered

    def submit(self, url_env: str, title: str, body: str, level: str = "info") -> None:
        """Queues one message; never blocks (a full queue drops it, reported once). `level` is
        apprise's notify type (info, success, warning, failure)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="notify")
            self._thread.start()
        try:
            self._queue.put_nowait(Outgoing(url_env, title, body, level))
        except queue.Full:
            if not self._dropped:
                log.warning("notifications: %d messages are waiting to be sent; dropping new ones until they "
                            "go out", QUEUE_SIZE)
            self._dropped = True

    def close(self, wait: float = 5.0) -> bool:
        """Sends what is queued for up to `wait` seconds, then stops; True when nothing was left behind."""
        if self._thread is None:
            return True
        try:
            self._queue.put(None, timeout=wait)
        except queue.Full:
            return False
        self._thread.join(wait)
        return not self._thread.is_alive()

    def _run(self) -> None:
        _quiet_apprise()
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._dropped = False
            try:
                self._send(item)
            except Exception as exc:  # noqa: BLE001 - a notifier must never end the daemon's thread
                self._report(item.url_env, f"unexpected {type(exc).__name__}")

    def _send(self, item: Outgoing) -> None:
        try:
            import apprise
        except ImportError:
            self._report(item.url_env, "notifications need apprise: pip install 'reconciler[notify]'")
            return
        url = self.environ.get(item.url_env, "")
        if not url:
            self._report(item.url_env, f"the environment variable {item.url_env} is not set in the reconciler's "
                                       "environment; set it to the target's apprise URL")
            return
        sender = apprise.Apprise()
        if not sender.add(url):
            self._report(item.url_env, f"the URL in {item.url_env} is not one apprise understands; see "
                                       "https://github.com/caronc/apprise/wiki for the URL of each service")
            return
        asked = parse_qs(urlsplit(url).query)
        for plugin in sender:
            if "cto" not in asked:
                plugin.socket_connect_timeout = self.timeout
            if "rto" not in asked:
                plugin.socket_read_timeout = self.timeout
        if sender.notify(body=item.body, title=item.title, notify_type=item.level):
            self.sent += 1
            if item.url_env in self._failing:
                self._failing.discard(item.url_env)
                log.info("notifications to %s are delivered again", item.url_env)
        else:
            self._report(item.url_env, "the target refused it or did not answer in time")

    def _report(self, url_env: str, why: str) -> None:
        self.failed += 1
        if url_env not in self._failing:
            self._failing.add(url_env)
            log.warning("notification to %s not delivered: %s (further failures there are not logged until "
                        "one succeeds)", url_env, why)


def _quiet_apprise() -> None:
    """apprise logs URLs and their parts (tokens included) as it works: none of it reaches our log."""
    logger = logging.getLogger("apprise")
    logger.propagate = False
    logger.setLevel(logging.CRITICAL + 1)
