"""Hosted providers inside the real loop (in-process ticks, a real git repository, S3 on moto):
a provider whose credentials are refused is named in one sentence and the job goes on elsewhere,
and the ledger in the status carries the provider's own credit balance."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from desired.models import LightningSettings
from reconciler.daemon.loop import Reconciler
from status.models import Phase
from tests.adapters.e2e import provider_manifest
from tests.conftest import StateRepoFixture
from tests.daemon.test_loop_local import counter, tick_until
from tests.fakes.lightning import USER_ID, FakeLightning
from tests.worker.conftest import make_bucket, s3_endpoint  # noqa: F401 - a fixture
from tests.worker.harness import S3_CREDENTIALS

WRONG_KEY = "wrong-key-9f2c81d0"


def lightning_provider(state_repo: StateRepoFixture, endpoint: str, monkeypatch: pytest.MonkeyPatch,
                       fake: FakeLightning, api_key: str, **settings: object) -> None:
    """Runs kept in a new bucket (the daemon's own S3 credentials in its environment) and provider
    `lit` on the fake, whose key the daemon reads from LIGHTNING_API_KEY."""
    bucket = make_bucket(endpoint)
    for name, value in {**S3_CREDENTIALS, "LIGHTNING_USER_ID": USER_ID, "LIGHTNING_API_KEY": api_key}.items():
        monkeypatch.setenv(name, value)
    state_repo.write("reconciler.yaml", f"storage: s3://{bucket}/runs\n"
                                        f"storage_options: {{endpoint_url: '{endpoint}'}}\n")
    values: dict = {"api_url": fake.url, "project_id": fake.project_id, **settings}
    state_repo.write("desired/lit.yaml", provider_manifest("lit", LightningSettings(**values)))


def test_refused_credentials_name_the_provider_once_and_the_job_finishes_elsewhere(
        state_repo: StateRepoFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        s3_endpoint: str) -> None:  # noqa: F811 - a fixture
    fake = FakeLightning(tmp_path / "machines")
    try:
        lightning_provider(state_repo, s3_endpoint, monkeypatch, fake, WRONG_KEY, request_timeout_seconds=5)
        state_repo.write("desired/local.yaml", yaml.safe_dump({
            "apiVersion": "reconciler.dev/v1", "kind": "Provider", "metadata": {"name": "box"},
            "spec": {"settings": {"type": "local"}, "concurrency": 1}}))
        state_repo.write("desired/count.yaml", yaml.safe_dump({
            "apiVersion": "reconciler.dev/v1", "kind": "Job", "metadata": {"name": "count"},
            "spec": {"command": counter(0.02), "target_steps": 20, "checkpoint_every": 5,
                     "secrets": ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"],
                     "env": {"AWS_DEFAULT_REGION": "us-east-1"},
                     "placement": {"providers": ["lit", "box"]}}}))
        state_repo.commit("a job that prefers Lightning, whose key is wrong")
        errors: list[str] = []
        final = tick_until(Reconciler(state_repo.path), lambda r: r.all_terminal, timeout=90,
                           each=lambda r: errors.extend(r.errors))
        st = final.statuses["count"]
        assert st.phase == Phase.SUCCEEDED, st
        assert {a.provider for a in st.attempts} == {"box"}
        refused = [e for e in errors if "lightning provider 'lit'" in e and "credentials" in e]
        assert refused, errors
        assert "LIGHTNING_API_KEY" in refused[0]  # where the key is read from
        history = subprocess.run(["git", "-C", str(state_repo.path), "log", "-p", "--all"], capture_output=True,
                                 text=True, check=True).stdout
        assert WRONG_KEY not in history and all(WRONG_KEY not in e for e in errors)
    finally:
        fake.close()


def test_the_status_ledger_holds_the_providers_balance(
        state_repo: StateRepoFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        s3_endpoint: str) -> None:  # noqa: F811 - a fixture
    from tests.fakes.lightning import API_KEY

    fake = FakeLightning(tmp_path / "machines")
    try:
        fake.set_balance(12.5)
        lightning_provider(state_repo, s3_endpoint, monkeypatch, fake, API_KEY, min_credits=20)
        state_repo.write("desired/job.yaml", yaml.safe_dump({
            "apiVersion": "reconciler.dev/v1", "kind": "Job", "metadata": {"name": "job"},
            "spec": {"command": [sys.executable, "-c", "pass"], "placement": {"providers": ["lit"]}}}))
        state_repo.commit("a job on Lightning with too few credits")
        report = Reconciler(state_repo.path).tick()
        st = report.statuses["job"]
        assert st.phase == Phase.PENDING and not report.actions
        assert "lit: credits: $12.50 left" in st.message and "$20 kept aside" in st.message
        ledger = yaml.safe_load(state_repo.git("show", "HEAD:status/providers.yaml"))
        line = next(x for x in ledger["providers"] if x["provider"] == "lit")
        assert (line["unit"], line["remaining"]) == ("credits", 12.5)
    finally:
        fake.close()


class NoLogAdapter:
    """A provider with no log API (RunPod): its worker ended with code 1 and it can show nothing."""

    name, owner, foreign_workers = "nolog", "repo", 0

    def __init__(self, ref: object) -> None:
        self.ref = ref

    def observe(self) -> dict:
        from adapters.compute import WorkerPhase, WorkerState

        return {self.ref: WorkerState(WorkerPhase.EXITED, 1, "EXITED")}

    def logs(self, ref: object, tail: int = 50) -> str:
        return ""


def test_a_failed_attempt_s_log_tail_comes_from_the_run_folder_when_the_provider_has_no_log_api(
        state_repo: StateRepoFixture) -> None:
    from adapters.compute import WorkerRef
    from adapters.storage import RunFolder
    from desired.parse import parse_desired
    from status.models import Attempt, JobStatus

    job = yaml.safe_dump({"apiVersion": "reconciler.dev/v1", "kind": "Job", "metadata": {"name": "train"},
                          "spec": {"command": ["python", "train.py"]}})
    provider = yaml.safe_dump({"apiVersion": "reconciler.dev/v1", "kind": "Provider", "metadata": {"name": "nolog"},
                               "spec": {"settings": {"type": "local"}}})
    store = f"file://{state_repo.storage}"
    desired = parse_desired({"desired/j.yaml": job, "desired/p.yaml": provider}, f"storage: {store}\n")
    run_id = desired.jobs["train"].run_id()
    RunFolder.for_run(store, "train", run_id).write_attempt_log(1, "step 9\nTraceback: boom\n")
    ref = WorkerRef("nolog", "pod-1", "train", run_id, 1)
    st = JobStatus(job="train", run_id=run_id, phase=Phase.RUNNING,
                   attempts=[Attempt(epoch=1, provider="nolog", worker="pod-1", started=0.0)])
    observed = Reconciler(state_repo.path).observe(desired, {"train": st}, {"nolog": NoLogAdapter(ref)}, [], 10.0)
    assert observed.logs[ref] == "step 9\nTraceback: boom"
