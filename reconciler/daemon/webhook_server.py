"""The webhook's server: reconciler.daemon.webhook_app on uvicorn (reconciler.daemon.serving), started
only once the web extra is known to be installed."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from reconciler.daemon.webhook import WebhookError, bracketed, log, missing_secret, missing_web_extra


class WebhookServer:
    """The webhook on uvicorn (reconciler.daemon.serving), on a daemon thread; `wake` is called for
    every accepted push. `mounts` (a path -> an ASGI application) are served on the same address:
    `run --serve` or `--metrics` naming the same HOST:PORT as `--listen` ("/" the status page,
    "/metrics" the metrics); POST / and /webhook stay the webhook's."""

    def __init__(self, host: str, port: int, *, secret: str, wake: Callable[[], None],
                 branch: Callable[[], str | None], mounts: Mapping[str, object] | None = None) -> None:
        if not secret:
            raise WebhookError(missing_secret())
        self.host, self.port, self.mounts = host, port, dict(mounts or {})
        self.secret, self.wake, self.branch = secret.encode(), wake, branch
        self._served: Any = None

    def start(self) -> tuple[str, int]:
        """Binds and serves; returns the address bound (port 0 picks a free one)."""
        if (missing := missing_web_extra("--listen")) is not None:
            raise WebhookError(missing)
        from reconciler.daemon.serving import Served, bind
        from reconciler.daemon.webhook_app import Hook, webhook_app

        try:
            sock = bind(self.host, self.port)
        except OSError as exc:
            raise WebhookError(f"cannot listen on {self.host}:{self.port}: {exc.strerror or exc}") from exc
        app = webhook_app(Hook(self.secret, self.wake, self.branch), self.mounts)  # type: ignore[arg-type]
        self._served = Served(app, sock, name="webhook")
        if not self._served.wait_started():
            self.stop()
            raise WebhookError(f"the webhook server on {self.host}:{self.port} did not start")
        host, port = self._served.address
        log.info("webhook: listening on http://%s:%d/ (POST / or /webhook)", bracketed(host), port)
        return host, port

    def stop(self) -> None:
        if self._served is not None:
            self._served.stop()
            self._served = None
