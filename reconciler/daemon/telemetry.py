"""What `reconciler run` adds around its ticks for people and monitoring: notifications of job
events (reconciler.daemon.notices decides, adapters.notify sends) and the Prometheus endpoint
(reconciler.daemon.metrics). The CLI only passes its options here."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from adapters.notify import Notifier
from reconciler.daemon.loop import Reconciler, TickReport
from reconciler.daemon.webhook import is_loopback, missing_web_extra, parse_listen

if TYPE_CHECKING:
    from reconciler.daemon.metrics import Metrics

log = logging.getLogger("reconciler")


def _announce(host: str, port: int) -> None:
    where = f"{host}:{port}"
    if is_loopback(host):
        log.info("metrics: http://%s/metrics", where)
    else:
        log.warning("metrics: serving %s to other machines, without authentication: job names, phases and "
                    "costs are readable by anyone who can reach it", where)


def serve_metrics(metrics: Metrics, host: str, port: int) -> tuple[Callable[[], None], int]:
    """The endpoint on a server of its own, and how to stop it: uvicorn as for the webhook (a deep
    backlog, a deadline per request, one log line per bad client) when the web extra is installed,
    else prometheus_client's own."""
    if missing_web_extra("--metrics") is None:
        from prometheus_client import make_asgi_app

        from reconciler.daemon.serving import Served, bind

        served = Served(make_asgi_app(metrics.registry), bind(host, port), name="metrics")
        return served.stop, served.address[1]
    from reconciler.daemon.metrics import serve

    server, bound = serve(metrics, host, port)

    def stop() -> None:
        server.shutdown()
        server.server_close()

    return stop, bound


class TelemetryError(Exception):
    """A bad --metrics value or an address the endpoint cannot bind: one sentence for the user."""


DRAIN_SECONDS = 5.0  # at exit, messages still queued get this long to go out


def metrics_address(value: str | None, once: bool) -> tuple[str, int] | None:
    """`--metrics HOST:PORT` (or :PORT, loopback), checked before anything starts."""
    if value is None:
        return None
    if once:
        raise TelemetryError("--metrics serves the daemon; `run --once` does one tick and exits")
    try:
        return parse_listen(value)
    except ValueError as exc:
        raise TelemetryError(f"--metrics: {exc}") from exc


@contextmanager
def telemetry(rec: Reconciler, metrics_at: tuple[str, int] | None, show: Callable[[TickReport], None],
              beside: tuple[tuple[str, int] | None, dict[str, object]] | None = None,
              ) -> Iterator[Callable[[TickReport], None]]:
    """Gives the reconciler its notifier and starts the metrics endpoint; yields the callback for
    each tick's report. On the way out, queued notifications get DRAIN_SECONDS to be sent.
    `beside`: the webhook's address and what its server will mount; metrics asked for at that
    same address are mounted there at /metrics instead of on a server of their own."""
    rec.notifier = Notifier(rec.environ)
    stop: Callable[[], None] | None = None
    record: Callable[[TickReport], None] | None = None
    if metrics_at is not None:
        try:
            from reconciler.daemon.metrics import Metrics
        except ImportError as exc:
            raise TelemetryError("--metrics needs prometheus_client: pip install 'reconciler[metrics]'") from exc
        metrics = Metrics(notifier=rec.notifier, since=rec.clock.now())
        record = metrics.record
        if beside is not None and beside[0] == metrics_at and metrics_at[1] != 0:
            from prometheus_client import make_asgi_app

            beside[1]["/metrics"] = make_asgi_app(metrics.registry)
            port = metrics_at[1]
        else:
            try:
                stop, port = serve_metrics(metrics, *metrics_at)
            except OSError as exc:
                raise TelemetryError(f"--metrics: cannot listen on {metrics_at[0]}:{metrics_at[1]} "
                                     f"({exc.strerror or exc}); choose another port") from exc
        _announce(metrics_at[0], port)

    def on_tick(report: TickReport) -> None:
        show(report)
        if record is not None:
            record(report)

    try:
        yield on_tick
    finally:
        if stop is not None:
            stop()
        if not rec.notifier.close(DRAIN_SECONDS):
            log.warning("notifications still queued after %gs were not sent", DRAIN_SECONDS)
