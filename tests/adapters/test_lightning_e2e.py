"""End to end on the fake Lightning server: the real `reconciler run --until-done`, run storage on
S3 (the moto server), a counter job on a `lightning` provider whose storage credentials are
teamspace secrets (only their names travel in the launch). The fake reclaims the spot machine once
(with a short notice); the reconciler relaunches and the counter resumes from its checkpoint and
finishes at exactly its target."""

from __future__ import annotations

from pathlib import Path

import pytest

from desired.models import LightningSettings
from tests.adapters import e2e
from tests.conftest import StateRepoFixture
from tests.fakes.lightning import API_KEY, USER_ID, FakeLightning
from tests.worker.conftest import make_bucket, s3_endpoint  # noqa: F401 - a fixture

TARGET = 60



@pytest.mark.slow
def test_a_spot_reclaim_on_lightning_is_relaunched_and_resumes_to_the_exact_target(
        state_repo: StateRepoFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        s3_endpoint: str) -> None:  # noqa: F811 - a fixture
    fake = FakeLightning(tmp_path / "machines", stop_grace=3.0)
    try:
        bucket = make_bucket(s3_endpoint)
        e2e.storage_secrets(fake.set_secret)
        e2e.daemon_env(monkeypatch, LIGHTNING_USER_ID=USER_ID, LIGHTNING_API_KEY=API_KEY)
        state_repo.write("reconciler.yaml", f"storage: s3://{bucket}/runs\ntick_seconds: 0.5\n"
                                            f"storage_options: {{endpoint_url: '{s3_endpoint}'}}\n")
        settings = LightningSettings(api_url=fake.url, project_id=fake.project_id, machine="lit-t4-1",
                                     interruptible=True, request_timeout_seconds=10)
        state_repo.write("desired/lit.yaml", e2e.provider_manifest("lit", settings))
        job = e2e.s3_job("count", "lit", 0.1, TARGET)

        def reclaim() -> None:
            first = next(j for j in fake.jobs.values() if "-count-" in j.name and j.state == "running")
            fake.interrupt(first.id, notice_seconds=0.5)

        st = e2e.interrupted_count(state_repo, tmp_path / "daemon.log", s3_endpoint, bucket, job,
                                   "count on lightning, storage on s3", reclaim, timeout=180)
        assert [a["outcome"] for a in st["attempts"]] == ["interruption", "succeeded"], st["attempts"]
        assert st["interruptions"] == 1 and st["failures"] == 0
        assert st["attempts"][1]["step_start"] > 0, "the relaunch must resume from a checkpoint"
        assert e2e.s3_step(s3_endpoint, bucket, "count") == TARGET
        bodies = b"".join(body for _, _, body in fake.requests)
        assert b"testing" not in bodies, "a storage credential travelled in a request"
        assert len([j for j in fake.jobs.values() if "-count-" in j.name]) == 2
    finally:
        fake.close()
