"""A Prometheus endpoint for `reconciler run --metrics HOST:PORT` (prometheus_client).

Nothing deep in the loop touches a metric: after each tick the daemon hands its report to
`Metrics.record`, which keeps the report's statuses for the collector (the per-job gauges are
built from them at scrape time), observes the tick's duration and counts its errors by class and
the attempts that started or ended since the previous report. Each provider's health (cool-downs
after refusals and lost workers, reconciler.planner.health) is computed from the same statuses at scrape
time, and each job's worker metrics (the newest value of each, from the heartbeat the tick read)
are kept per job and run. Counters count from the daemon's start, as Prometheus counters do: attempts that started or
ended before it are not counted.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from adapters.notify import Notifier
from desired.models import Provider
from reconciler.daemon.loop import TickReport
from reconciler.planner.health import provider_health
from reconciler.planner.outlook.forecast import provider_reliabilities
from status.models import JobStatus, Phase

ERROR_CLASSES = ("manifest", "git", "provider", "storage", "other")
# Checked in order on the error's text; the first that matches names its class.
_RULES = (
    ("manifest", re.compile(r"^(desired/|reconciler\.yaml)")),
    ("storage", re.compile(r"storage|lease|run folder|checkpoint|s3://|file://|bucket", re.IGNORECASE)),
    ("git", re.compile(r"\bgit\b|commit|push|pull|remote|detached HEAD|repository", re.IGNORECASE)),
    ("provider", re.compile(r"provider|launch|terminate|worker|quota|capacity", re.IGNORECASE)),
)
TICK_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
CALL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60)


def error_class(message: str) -> str:
    """One of ERROR_CLASSES for an error line of a tick report."""
    return next((name for name, rule in _RULES if rule.search(message)), "other")


class Metrics(Collector):
    """The reconciler's metrics in a registry of their own (so that tests can make several)."""

    def __init__(self, registry: CollectorRegistry | None = None, since: float | None = None,
                 notifier: Notifier | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.notifier = notifier
        self.since = time.time() if since is None else since  # attempts before this are not counted
        self._lock = threading.Lock()
        self._statuses: dict[str, JobStatus] = {}
        self._providers: dict[str, Provider] = {}
        self._attempts: dict[tuple[str, str, int], bool] = {}  # (job, run, epoch) -> ended
        self._reported: dict[str, tuple[str, dict[str, float]]] = {}  # job -> its run, the worker's metrics
        self.tick_seconds = Histogram("reconciler_tick_duration_seconds", "Time one tick took",
                                      buckets=TICK_BUCKETS, registry=self.registry)
        self.errors = Counter("reconciler_errors", "Errors reported by ticks, by class", ["class"],
                              registry=self.registry)
        self.started = Counter("reconciler_attempts_started", "Attempts launched, by provider", ["provider"],
                               registry=self.registry)
        self.ended = Counter("reconciler_attempts_ended", "Attempts that ended, by provider and outcome "
                             "(interruption, session-end, stalled, job-error, ...)", ["provider", "outcome"],
                             registry=self.registry)
        self.last_tick = Gauge("reconciler_last_tick_timestamp_seconds", "When the last tick ended (Unix time)",
                               registry=self.registry)
        self.call_seconds = Histogram("reconciler_provider_call_duration_seconds", "Time a provider took to answer "
                                      "the observe step's call (calls past the deadline are not in it)", ["provider"],
                                      buckets=CALL_BUCKETS, registry=self.registry)
        self.unanswered = Counter("reconciler_provider_unanswered", "Ticks in which a provider did not answer within "
                                  "its deadline (its jobs kept their last view)", ["provider"], registry=self.registry)
        self.responsive = Gauge("reconciler_provider_responsive", "1 when the provider answered the last tick within "
                                "its deadline, 0 when it did not", ["provider"], registry=self.registry)
        self.last_call = Gauge("reconciler_provider_last_call_seconds", "How long the provider's last call took, "
                               "or had taken when the tick stopped waiting", ["provider"], registry=self.registry)
        for name in ERROR_CLASSES:
            self.errors.labels(name)  # every class is exported, at 0 until it happens
        self.registry.register(self)

    def record(self, report: TickReport) -> None:
        self.tick_seconds.observe(report.seconds)
        self.last_tick.set_to_current_time()
        for message in report.errors:
            self.errors.labels(error_class(message)).inc()
        for provider, call in report.provider_calls.items():
            if call.answered:
                self.call_seconds.labels(provider).observe(call.seconds)
            else:
                self.unanswered.labels(provider).inc()
            self.responsive.labels(provider).set(1.0 if call.answered else 0.0)
            self.last_call.labels(provider).set(call.seconds)
        if report.statuses or not report.errors:  # a tick held by broken settings keeps the last view
            with self._lock:
                self._statuses = dict(report.statuses)
                self._reported = _reported(report, self._reported)
                if report.desired is not None:
                    self._providers = dict(report.desired.providers)
            self._count_attempts(report.statuses.values())

    def _count_attempts(self, statuses: Iterable[JobStatus]) -> None:
        """Counts each attempt once when it starts and once when it ends, if that happened while
        this process was watching (an attempt adopted from an earlier daemon counts only its end)."""
        now: dict[tuple[str, str, int], bool] = {}
        for st in statuses:
            for att in st.attempts:
                key = (st.job, st.run_id, att.epoch)
                ended = not att.open
                if key not in self._attempts and att.started >= self.since:
                    self.started.labels(att.provider).inc()
                if ended and not self._attempts.get(key, False) and (att.ended or 0) >= self.since:
                    self.ended.labels(att.provider, att.outcome.value if att.outcome else "unknown").inc()
                now[key] = ended
        self._attempts = now

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            statuses = sorted(self._statuses.values(), key=lambda s: s.job)
            providers = self._providers
        phase = GaugeMetricFamily("reconciler_job_phase", "1 for the job's current phase, 0 for the others",
                                  labels=["job", "phase"])
        steps = GaugeMetricFamily("reconciler_job_progress_steps", "Durable progress: the newest checkpoint's step",
                                  labels=["job"])
        target = GaugeMetricFamily("reconciler_job_target_steps", "The job's completion target", labels=["job"])
        ratio = GaugeMetricFamily("reconciler_job_progress_ratio", "Durable progress as a fraction of the target",
                                  labels=["job"])
        cost = GaugeMetricFamily("reconciler_job_cost_usd", "Money spent on the job's run (USD)", labels=["job"])
        attempts = GaugeMetricFamily("reconciler_job_attempts", "Attempts of the job's run", labels=["job"])
        interruptions = GaugeMetricFamily("reconciler_job_interruptions", "Free interruptions of the job's run",
                                          labels=["job"])
        recent = GaugeMetricFamily("reconciler_job_recent_attempts",
                                   "Attempts kept in the job's status (the last few), by provider and outcome",
                                   labels=["job", "provider", "outcome"])
        for st in statuses:
            for p in Phase:
                phase.add_metric([st.job, p.value], 1.0 if st.phase == p else 0.0)
            steps.add_metric([st.job], st.progress.step)
            if st.progress.target:
                target.add_metric([st.job], st.progress.target)
                ratio.add_metric([st.job], min(1.0, st.progress.step / st.progress.target))
            spent = max(st.cost_usd, st.forecast.spent_usd if st.forecast else 0.0)
            cost.add_metric([st.job], spent)
            attempts.add_metric([st.job], st.total_attempts)
            interruptions.add_metric([st.job], st.interruptions)
            kept: dict[tuple[str, str], int] = {}
            for att in st.attempts:
                outcome = att.outcome.value if att.outcome else "running"
                kept[(att.provider, outcome)] = kept.get((att.provider, outcome), 0) + 1
            for (provider, outcome), n in sorted(kept.items()):
                recent.add_metric([st.job, provider, outcome], n)
        yield from (phase, steps, target, ratio, cost, attempts, interruptions, recent)
        yield self._worker_metrics()
        yield from _reliability(providers, statuses)
        yield from self._health(statuses)
        if self.notifier is not None:
            notes = CounterMetricFamily("reconciler_notifications", "Notifications sent since the daemon started, "
                                        "by result", labels=["result"])
            notes.add_metric(["delivered"], self.notifier.sent)
            notes.add_metric(["failed"], self.notifier.failed)
            yield notes

    def _worker_metrics(self) -> Metric:
        gauge = GaugeMetricFamily("reconciler_job_worker_metric", "The newest value of each metric the job's "
                                  "worker reports (loss, accuracy, throughput: what heartbeat() is given)",
                                  labels=["job", "run", "metric"])
        with self._lock:
            reported = sorted(self._reported.items())
        for job, (run, values) in reported:
            for name, value in sorted(values.items()):
                gauge.add_metric([job, run, name], value)
        return gauge

    def _health(self, statuses: list[JobStatus]) -> Iterator[Metric]:
        now = time.time()
        with self._lock:
            names = list(self._providers)
        state = GaugeMetricFamily("reconciler_provider_state", "1 for the provider's health now (healthy, "
                                  "tried-last after lost workers, cooling-down after a refusal), 0 for the others",
                                  labels=["provider", "state"])
        until = GaugeMetricFamily("reconciler_provider_cooldown_until_timestamp_seconds",
                                  "When the provider's cool-down ends (Unix time); absent when none",
                                  labels=["provider"])
        strikes = GaugeMetricFamily("reconciler_provider_strikes", "Refusals and lost workers that still lengthen "
                                    "the provider's next cool-down", labels=["provider"])
        refusals = GaugeMetricFamily("reconciler_provider_recent_refusals", "Launches the provider refused in the "
                                     "last hour", labels=["provider"])
        losses = GaugeMetricFamily("reconciler_provider_recent_lost_workers", "Workers the provider lost in the "
                                   "last hour", labels=["provider"])
        for name, h in provider_health(statuses, now, names).items():
            for s in ("healthy", "tried last", "cooling down"):
                state.add_metric([name, s.replace(" ", "-")], 1.0 if h.state(now) == s else 0.0)
            ends = h.until(now)
            if ends is not None:
                until.add_metric([name], ends)
            strikes.add_metric([name], h.strikes)
            refusals.add_metric([name], h.refusals)
            losses.add_metric([name], h.losses)
        yield from (state, until, strikes, refusals, losses)


def _reported(report: TickReport, before: dict[str, tuple[str, dict[str, float]]]
              ) -> dict[str, tuple[str, dict[str, float]]]:
    """Each job's worker metrics as storage gave them this tick; a job whose run was not read this
    tick (finished, or storage not answering) keeps what was read last for the same run."""
    out: dict[str, tuple[str, dict[str, float]]] = {}
    for job, st in report.statuses.items():
        run = report.runs.get((job, st.run_id))
        if run is not None and run.error is None and run.heartbeat_metrics:
            out[job] = (st.run_id, dict(run.heartbeat_metrics))
        elif job in before and before[job][0] == st.run_id:
            out[job] = before[job]
    return out


def _reliability(providers: dict[str, Provider], statuses: list[JobStatus]) -> Iterator[Metric]:
    """Each declared provider's learned failure rate, as the planner would hand it out now."""
    mtbf = GaugeMetricFamily("reconciler_provider_mtbf_seconds", "Mean time between interruptions the next "
                             "worker on the provider is told (RECONCILER_MTBF_SECONDS), learned from every job's "
                             "attempts there", labels=["provider"])
    seen = GaugeMetricFamily("reconciler_provider_recent_interruptions", "Interruptions the provider confirmed, "
                             "each weighed by its age (half after the estimate's half-life)", labels=["provider"])
    for name, rel in sorted(provider_reliabilities(providers, statuses, time.time()).items()):
        mtbf.add_metric([name], float(round(rel.mtbf_seconds)))
        seen.add_metric([name], rel.interruptions)
    yield from (mtbf, seen)


def serve(metrics: Metrics, host: str, port: int) -> tuple[WSGIServer, int]:
    """Starts the endpoint on a thread of its own; returns the server and the port it bound."""
    server, _thread = start_http_server(port, addr=host, registry=metrics.registry)
    return server, server.server_address[1]
