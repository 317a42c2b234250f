"""End to end on the fake RunPod server: the real `reconciler run --until-done`, run storage on S3
(the moto server, reconciler.yaml's storage_options naming endpoint, key and secret), a counter job
on a spot `runpod` provider whose storage credentials are RunPod secrets (only `{{ RUNPOD_SECRET_<name> }}`
references travel in the launch). The pod is outbid once: SIGTERM, SIGKILL 5 s later, as RunPod
does; the worker saves and exits 75 within the grace, the reconciler relaunches, and the counter
resumes at its exact durable step and finishes at its target, the cost billed at the pods' prices.
The daemon's own environment holds the S3 credentials too: the adapter reads each pod's exit record
from the run folder with them."""

from __future__ import annotations

from pathlib import Path

import pytest

from desired.models import RunpodSettings
from tests.adapters import e2e
from tests.conftest import StateRepoFixture
from tests.fakes.runpod import API_KEY, FakeRunpod
from tests.worker.conftest import s3_endpoint  # noqa: F401 - a fixture
from tests.worker.harness import S3_CREDENTIALS

TARGET = 60


def pods_on_s3(state_repo: StateRepoFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               s3_endpoint: str, interruptible: bool) -> tuple[FakeRunpod, str]:  # noqa: F811 - a fixture's value
    """The fake RunPod holding the storage credentials as secrets, a provider `pods` on it, and run
    storage on S3 (its bucket returned). RunPod's own grace is 5 s; on a CI machine running six test
    processes on two cores a worker's final save can take longer, so the fake waits 15 s."""
    fake = FakeRunpod(tmp_path / "machines", kill_grace=15.0)
    try:
        e2e.storage_secrets(fake.set_secret)
        e2e.daemon_env(monkeypatch, RUNPOD_API_KEY=API_KEY)
        bucket = e2e.s3_storage(state_repo, s3_endpoint, tick_seconds=0.5)
        settings = RunpodSettings(api_url=fake.url, interruptible=interruptible, request_timeout_seconds=10)
        state_repo.write("desired/pods.yaml", e2e.provider_manifest("pods", settings))
    except BaseException:
        fake.close()
        raise
    return fake, bucket



@pytest.mark.slow
def test_an_outbid_runpod_pod_is_relaunched_and_resumes_at_its_exact_step(
        state_repo: StateRepoFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        s3_endpoint: str) -> None:  # noqa: F811 - a fixture
    fake, bucket = pods_on_s3(state_repo, tmp_path, monkeypatch, s3_endpoint, interruptible=True)
    try:
        job = e2e.s3_job("count", "pods", 0.1, TARGET)

        def outbid() -> None:
            first = next(p for p in fake.pods.values() if "-count-" in p.input["name"] and p.status == "RUNNING")
            fake.outbid(first.id)

        st = e2e.interrupted_count(state_repo, tmp_path / "daemon.log", s3_endpoint, bucket, job,
                                   "count on runpod, storage on s3", outbid, timeout=180)
        attempts = st["attempts"]
        assert [a["outcome"] for a in attempts] == ["interruption", "succeeded"], attempts
        assert st["interruptions"] == 1 and st["failures"] == 0
        assert "stopped by RunPod (Outbid)" in attempts[0]["detail"] and attempts[0]["exit_code"] == 75, attempts[0]
        assert attempts[1]["step_start"] == attempts[0]["step_end"] > 0, "the relaunch resumes at the exact step"
        assert e2e.s3_step(s3_endpoint, bucket, "count") == TARGET
        assert st["cost_usd"] > 0 and all(a["cost_usd"] > 0 for a in attempts), attempts
        bodies = "".join(str(r) for r in fake.requests)
        assert S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in bodies, "a storage credential travelled in a request"
        assert len([p for p in fake.pods.values() if "-count-" in p.input["name"]]) == 2
    finally:
        fake.close()
