"""The Prometheus endpoint, scraped over HTTP on 127.0.0.1 and read with prometheus_client's own
parser: per-job gauges from the last tick report, tick durations, errors by class, attempts by
provider; and `reconciler run --metrics` serving it from the real daemon."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from adapters.notify import Notifier
from reconciler.daemon.loop import Reconciler, TickReport
from reconciler.daemon.metrics import Metrics, error_class, serve
from tests import zygote
from tests.conftest import StateRepoFixture
from tests.daemon.receiver import Receiver
from tests.daemon.test_loop_local import counter, job, phase
from tests.daemon.test_notify import SDK, notifying

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def test_error_lines_are_classed_by_what_failed() -> None:
    assert error_class("desired/train.yaml (document 1) field spec.command: Field required") == "manifest"
    assert error_class("reconciler.yaml: tick_seconds must be > 0") == "manifest"
    assert error_class("cannot push status to 'origin' after 3 tries: rejected") == "git"
    assert error_class("cannot update from remote 'origin': connection refused") == "git"
    assert error_class("cannot observe provider spot: 503 Service Unavailable") == "provider"
    assert error_class("terminate w1 on spot failed: timeout") == "provider"
    assert error_class("cannot read the lease in storage s3://bucket/runs: AccessDenied") == "storage"
    assert error_class("something else entirely") == "other"


def test_the_endpoint_shows_each_jobs_phase_progress_cost_and_attempts_from_the_real_loop(
        state_repo: StateRepoFixture) -> None:
    receiver = Receiver()
    notifying(state_repo)
    state_repo.write("desired/count.yaml", job("count", counter(0.02), SDK))
    state_repo.write("desired/broken.yaml", "apiVersion: reconciler.dev/v1\nkind: Job\nmetadata: {name: broken}\n")
    state_repo.commit("count, and a manifest with an error")
    environ = {**os.environ, "HOOK_URL": receiver.url("t0ken-for-metrics")}
    rec = Reconciler(state_repo.path, environ=environ)
    rec.notifier = Notifier(environ)
    metrics = Metrics(notifier=rec.notifier)
    server, port = serve(metrics, "127.0.0.1", 0)
    try:
        mid: Samples = {}
        ticks = 0
        deadline = time.time() + 60
        while True:
            started = time.monotonic()
            report: TickReport = rec.tick()
            report.seconds = time.monotonic() - started
            metrics.record(report)
            ticks += 1
            if not mid and "count" in report.statuses and not report.statuses["count"].phase.terminal:
                mid = scrape(port)
            if phase("count")(report):
                break
            assert time.time() < deadline, report.statuses
            time.sleep(0.2)
        assert rec.notifier.close(10)
        done = scrape(port)
    finally:
        server.shutdown()
        server.server_close()
        receiver.close()
    assert value(mid, "reconciler_job_phase", job="count", phase="Succeeded") == 0
    assert value(done, "reconciler_job_phase", job="count", phase="Succeeded") == 1
    assert value(done, "reconciler_job_phase", job="count", phase="Running") == 0
    assert value(done, "reconciler_job_progress_steps", job="count") == 60
    assert value(done, "reconciler_job_target_steps", job="count") == 60
    assert value(done, "reconciler_job_progress_ratio", job="count") == 1.0
    assert value(done, "reconciler_job_cost_usd", job="count") == 0.0  # the local machine costs nothing
    assert value(done, "reconciler_job_attempts", job="count") == 1
    assert value(done, "reconciler_job_recent_attempts", job="count", provider="local", outcome="succeeded") == 1
    assert value(done, "reconciler_attempts_started_total", provider="local") == 1
    assert value(done, "reconciler_attempts_ended_total", provider="local", outcome="succeeded") == 1
    tick_count = value(done, "reconciler_tick_duration_seconds_count")
    assert tick_count == ticks
    assert (value(done, "reconciler_tick_duration_seconds_sum") or 0) > 0
    assert (value(done, "reconciler_errors_total", **{"class": "manifest"}) or 0) == ticks  # one per tick
    assert value(done, "reconciler_errors_total", **{"class": "git"}) == 0
    assert (value(done, "reconciler_last_tick_timestamp_seconds") or 0) > time.time() - 60
    assert value(done, "reconciler_notifications_total", result="delivered") == 1
    assert value(done, "reconciler_notifications_total", result="failed") == 0
    run_id = report.statuses["count"].run_id  # what the worker reported with its last heartbeat (issue 27 item 3)
    assert value(done, "reconciler_job_worker_metric", job="count", run=run_id, metric="total") == 60 * 61 / 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_run_with_metrics_serves_the_daemons_jobs_on_loopback(state_repo: StateRepoFixture, tmp_path: Path) -> None:
    state_repo.write("desired/sleepy.yaml", job("sleepy", [sys.executable, "-c", "import time; time.sleep(600)"]))
    state_repo.commit("a job that runs a while")
    port = free_port()
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        proc = zygote.popen([sys.executable, "-m", "reconciler", "run", "--repo", str(state_repo.path),
                             "--tick-seconds", "0.5", "--metrics", f":{port}"], stdout=out,
                            stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "300"})
    try:
        deadline = time.time() + 60
        samples: Samples = {}
        while value(samples, "reconciler_job_phase", job="sleepy", phase="Running") != 1:
            assert time.time() < deadline, log.read_text()
            assert proc.poll() is None, log.read_text()
            time.sleep(0.3)
            try:
                samples = scrape(port)
            except OSError:
                samples = {}
        assert (value(samples, "reconciler_tick_duration_seconds_count") or 0) >= 1
        assert value(samples, "reconciler_notifications_total", result="delivered") == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert f"metrics: http://127.0.0.1:{port}/metrics" in log.read_text()


def test_metrics_with_once_or_a_bad_address_is_one_clear_error(state_repo: StateRepoFixture) -> None:
    base = [sys.executable, "-m", "reconciler", "run", "--repo", str(state_repo.path)]
    once = zygote.run([*base, "--once", "--metrics", ":9108"], capture_output=True, text=True, timeout=60)
    assert once.returncode == 2 and "--metrics serves the daemon" in once.stderr
    bad = zygote.run([*base, "--metrics", "nonsense"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "is not HOST:PORT" in bad.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = zygote.run([*base, "--metrics", f"127.0.0.1:{port}"], capture_output=True, text=True,
                          timeout=60)
    assert busy.returncode == 1 and "cannot listen on 127.0.0.1" in busy.stderr, busy.stderr


def test_each_provider_s_learned_mtbf_is_a_gauge() -> None:
    from reconciler.planner.outlook.reliability import PRIOR_RELIABLE_MTBF_SECONDS
    from status.models import Outcome
    from tests.planner.test_plan import PROVIDERS, desired, job_yaml
    from tests.planner.test_plan_interval import SPOT, history

    d = desired(job_yaml(), providers=PROVIDERS + "---" + SPOT)
    stormy = history("old", "spot", [3 / 3600] * 5, Outcome.INTERRUPTION, end=time.time() - 1)  # 3 s each
    metrics = Metrics()
    metrics.record(TickReport(statuses={"old": stormy}, desired=d))
    server, port = serve(metrics, "127.0.0.1", 0)
    try:
        samples = scrape(port)
    finally:
        server.shutdown()
    spot = value(samples, "reconciler_provider_mtbf_seconds", provider="spot")
    assert spot is not None and 3 <= spot <= 30  # five interruptions 3 s apart: within ten times that
    assert value(samples, "reconciler_provider_recent_interruptions", provider="spot") == pytest.approx(5, rel=1e-3)
    assert value(samples, "reconciler_provider_mtbf_seconds", provider="free") == PRIOR_RELIABLE_MTBF_SECONDS
    assert value(samples, "reconciler_provider_recent_interruptions", provider="free") == 0
