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
import yaml

from desired.models import RunpodSettings
from tests.adapters.e2e import finish, job_manifest, provider_manifest, s3_step, start_daemon, status, wait_for
from tests.conftest import StateRepoFixture
from tests.fakes.runpod import API_KEY, FakeRunpod
from tests.worker.conftest import make_bucket, s3_endpoint  # noqa: F401 - a fixture
from tests.worker.harness import S3_CREDENTIALS

TARGET = 60



@pytest.mark.slow
def test_an_outbid_runpod_pod_is_relaunched_and_resumes_at_its_exact_step(
        state_repo: StateRepoFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        s3_endpoint: str) -> None:  # noqa: F811 - a fixture
    fake = FakeRunpod(tmp_path / "machines", kill_grace=5.0)
    try:
        bucket = make_bucket(s3_endpoint)
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            fake.set_secret(name, S3_CREDENTIALS[name])
        for name, value in {**S3_CREDENTIALS, "RUNPOD_API_KEY": API_KEY}.items():
            monkeypatch.setenv(name, value)
        options = {"endpoint_url": s3_endpoint, "key": S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                   "secret": S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"]}
        state_repo.write("reconciler.yaml", yaml.safe_dump(
            {"storage": f"s3://{bucket}/runs", "tick_seconds": 0.5, "storage_options": options}))
        settings = RunpodSettings(api_url=fake.url, interruptible=True, request_timeout_seconds=10)
        state_repo.write("desired/pods.yaml", provider_manifest("pods", settings))
        job = yaml.safe_load(job_manifest("count", "pods", step_seconds=0.1, target=TARGET))
        job["spec"]["secrets"] = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
        job["spec"]["env"] = {"AWS_DEFAULT_REGION": S3_CREDENTIALS["AWS_DEFAULT_REGION"]}
        state_repo.write("desired/count.yaml", yaml.safe_dump(job))
        state_repo.commit("count on runpod, storage on s3")
        log = tmp_path / "daemon.log"
        daemon = start_daemon(state_repo, log)
        try:
            wait_for(lambda: s3_step(s3_endpoint, bucket, "count") >= 12, 60, "checkpoints", daemon, log)
            first = next(p for p in fake.pods.values() if "-count-" in p.input["name"] and p.status == "RUNNING")
            fake.outbid(first.id)
            finish(daemon, log, timeout=90)
        finally:
            if daemon.poll() is None:
                daemon.kill()
        st = status(state_repo, "count")
        assert st["phase"] == "Succeeded", st.get("message")
        attempts = st["attempts"]
        assert [a["outcome"] for a in attempts] == ["interruption", "succeeded"], attempts
        assert st["interruptions"] == 1 and st["failures"] == 0
        assert "stopped by RunPod (Outbid)" in attempts[0]["detail"] and attempts[0]["exit_code"] == 75, attempts[0]
        assert attempts[1]["step_start"] == attempts[0]["step_end"] > 0, "the relaunch resumes at the exact step"
        assert s3_step(s3_endpoint, bucket, "count") == TARGET
        assert st["cost_usd"] > 0 and all(a["cost_usd"] > 0 for a in attempts), attempts
        bodies = "".join(str(r) for r in fake.requests)
        assert S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in bodies, "a storage credential travelled in a request"
        assert len([p for p in fake.pods.values() if "-count-" in p.input["name"]]) == 2
    finally:
        fake.close()
