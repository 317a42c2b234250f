"""Moving between unlike providers (issue 10): the real `reconciler run --until-done`, run storage
on S3 (moto), a counter job preferring the fake Vast.ai (cheaper) over the fake RunPod. Vast outbids
the instance once; the run continues on RunPod at its exact durable step and finishes, and the
status history shows each attempt with its provider, steps and cost from that provider's price."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from desired.models import RunpodSettings, VastSettings
from tests.adapters import e2e
from tests.conftest import StateRepoFixture
from tests.fakes.runpod import API_KEY, FakeRunpod
from tests.fakes.vast import DEFAULT_OFFERS, FakeVast
from tests.worker.conftest import s3_endpoint  # noqa: F401 - a fixture

TARGET = 60


@pytest.fixture
def markets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeVast, FakeRunpod]]:
    vast = FakeVast(tmp_path / "vast", offers=[{**DEFAULT_OFFERS[0], "dph_total": 36.0, "min_bid": 36.0}])
    vast.serve()
    pods = FakeRunpod(tmp_path / "runpod", kill_grace=5.0)
    e2e.storage_secrets(pods.set_secret)
    e2e.daemon_env(monkeypatch, VAST_API_KEY=vast.key, RUNPOD_API_KEY=API_KEY)
    yield vast, pods
    vast.close()
    pods.close()


@pytest.mark.slow
def test_a_run_outbid_on_vast_finishes_on_runpod_at_the_exact_step_with_each_providers_cost(
        markets: tuple[FakeVast, FakeRunpod], state_repo: StateRepoFixture, tmp_path: Path,
        s3_endpoint: str) -> None:  # noqa: F811 - a fixture
    vast, pods = markets
    bucket = e2e.s3_storage(state_repo, s3_endpoint, tick_seconds=0.5)
    state_repo.write("desired/vast.yaml", e2e.priced(
        "vast", VastSettings(api_url=vast.url, request_timeout_seconds=5, max_price_per_hour=40), 0.4))
    state_repo.write("desired/pods.yaml", e2e.priced(
        "pods", RunpodSettings(api_url=pods.url, interruptible=True, request_timeout_seconds=10), 0.7))
    job = e2e.s3_job("count", "vast", 0.1, TARGET)
    job["spec"]["placement"]["providers"] = ["vast", "pods"]
    st = e2e.interrupted_count(state_repo, tmp_path / "daemon.log", s3_endpoint, bucket, job,
                               "count on the spot markets, storage on s3", e2e.outbid_only_instance(vast), timeout=180)
    attempts = st["attempts"]
    assert [(a["provider"], a["outcome"]) for a in attempts] == [("vast", "interruption"), ("pods", "succeeded")]
    assert attempts[1]["step_start"] == attempts[0]["step_end"] >= 10, "the move resumes at the exact durable step"
    assert st["progress"]["step"] == TARGET and st["failures"] == 0
    assert attempts[0]["host"] == str(DEFAULT_OFFERS[0]["machine_id"])  # Vast's machine, for its cool-down
    assert attempts[0]["cost_usd"] > 0.02  # Vast's dph_total ($36/h) over the instance's running time
    assert attempts[1]["cost_usd"] > 0  # RunPod's costPerHr over the pod's running time
    assert st["cost_usd"] == pytest.approx(attempts[0]["cost_usd"] + attempts[1]["cost_usd"], abs=1e-3)
