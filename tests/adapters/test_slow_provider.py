"""A provider that does not answer, inside the real loop: a fake Vast server on loopback whose
instance list hangs. Providers are asked at once, each within `provider_deadline_seconds`: the
tick stays bounded, the other provider's job runs to the end, the hung provider is asked once (not
once more per tick) and nothing of it is declared lost, and the status ledger, the status page and
the metrics name it."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import yaml

from desired.models import VastSettings
from reconciler.daemon.loop import Reconciler, TickReport
from reconciler.daemon.metrics import Metrics
from status.models import Phase
from tests.adapters.e2e import provider_manifest
from tests.conftest import StateRepoFixture
from tests.daemon.test_loop_local import counter, job, phase
from tests.fakes.vast import FakeVast
from tests.web.conftest import start_server, stop_server
from tests.worker.conftest import make_bucket, s3_endpoint  # noqa: F401 - a fixture
from tests.worker.harness import S3_CREDENTIALS

LOCAL = yaml.safe_dump({"apiVersion": "reconciler.dev/v1", "kind": "Provider", "metadata": {"name": "box"},
                        "spec": {"settings": {"type": "local"}, "concurrency": 1}})
COUNT_ON_BOX = ("placement: {providers: [box]}\nsecrets: [AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY]\n"
                "env: {AWS_DEFAULT_REGION: us-east-1}")
UNANSWERED = "no answer within 1 s: its jobs keep their last view"


def test_a_provider_that_does_not_answer_delays_only_its_own_jobs(
        state_repo: StateRepoFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        s3_endpoint: str) -> None:  # noqa: F811 - a fixture
    fake = FakeVast(tmp_path / "vast")
    fake.serve()
    try:
        for name, value in {**S3_CREDENTIALS, "VAST_API_KEY": fake.key}.items():
            monkeypatch.setenv(name, value)
        fake.fail("list", kind="hang", seconds=300, times=1000)  # answers only once released
        state_repo.write("reconciler.yaml", f"storage: s3://{make_bucket(s3_endpoint)}/runs\n"
                                            f"storage_options: {{endpoint_url: '{s3_endpoint}'}}\n"
                                            "tick_seconds: 0.5\nprovider_deadline_seconds: 1\n")
        state_repo.write("desired/spot.yaml", provider_manifest("spot", VastSettings(api_url=fake.url,
                                                                                    request_timeout_seconds=600)))
        state_repo.write("desired/box.yaml", LOCAL)
        state_repo.write("desired/count.yaml", job("count", counter(0.02), COUNT_ON_BOX))
        state_repo.commit("a job on the local box, and a Vast provider that does not answer")
        rec, metrics = Reconciler(state_repo.path), Metrics()
        reports: list[TickReport] = []
        longest, give_up = 0.0, time.monotonic() + 120
        while not reports or not phase("count")(reports[-1]):
            assert time.monotonic() < give_up, reports[-1].errors
            began = time.monotonic()
            reports.append(rec.tick())
            longest = max(longest, time.monotonic() - began)
            metrics.record(reports[-1])
            time.sleep(0.2)
        final = reports[-1]
        assert final.statuses["count"].phase == Phase.SUCCEEDED
        assert longest < 30, longest  # each tick waited 1 s for the provider, never its 300 s
        assert fake.count("list") == 1  # one call out at a time: no thread piles up per tick
        assert [r.provider_calls["box"].answered for r in reports] == [True] * len(reports)
        assert [r.provider_calls["spot"].answered for r in reports] == [False] * len(reports)
        first, later = reports[0].errors, reports[-1].errors
        assert "cannot observe provider spot: no answer within 1 s" in first
        assert any(e.startswith("cannot observe provider spot: still answering a call made ") for e in later), later

        ledger = yaml.safe_load(rec.repo.read_file(rec.status_source(rec.repo.head()), "status/providers.yaml") or b"")
        answers = {line["provider"]: line.get("answers") for line in ledger["providers"]}
        assert answers == {"box": None, "spot": UNANSWERED}
        server = start_server(state_repo.path)  # the status page, as `reconciler serve`
        try:
            html = httpx.get(server.url + "/", timeout=10).text
        finally:
            stop_server(server)
        assert f"<li>provider <b>spot</b>: {UNANSWERED}</li>" in html and "provider <b>box</b>" not in html
        sample = metrics.registry.get_sample_value
        assert sample("reconciler_provider_responsive", {"provider": "spot"}) == 0
        assert sample("reconciler_provider_responsive", {"provider": "box"}) == 1
        assert sample("reconciler_provider_unanswered_total", {"provider": "spot"}) == len(reports)
        assert sample("reconciler_provider_call_duration_seconds_count", {"provider": "box"}) == len(reports)

        fake.released.set()  # the provider answers again: the next tick hears it
        deadline = time.monotonic() + 30
        while not (report := rec.tick()).provider_calls["spot"].answered:
            assert time.monotonic() < deadline, report.errors
            time.sleep(0.2)
        assert not [e for e in report.errors if "spot" in e]
    finally:
        fake.close()
