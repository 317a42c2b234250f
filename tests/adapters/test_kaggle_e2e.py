"""End to end on the fake Kaggle: the real `reconciler run --until-done` in a subprocess, run storage
on an S3 server (moto), a counter job preferring `kaggle` (sessions scaled down to seconds) with
`local` beside it. The first attempt meets Kaggle's session end: the bootstrap's deadline makes the
worker save and exit 75 before the cut, which is a session end (free); the run then finishes on
either provider from its checkpoint, at exactly the target step. A GPU job whose weekly quota is
spent during its first session is moved to the other provider by the planner.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from desired.models import KaggleSettings, LocalSettings
from tests.adapters.e2e import COUNTER, finish, provider_manifest, start_daemon, status, wait_for
from tests.conftest import StateRepoFixture
from tests.fakes.kaggle import FakeKaggle
from tests.worker.conftest import make_bucket, s3_endpoint  # noqa: F401 - a fixture
from tests.worker.harness import S3_CREDENTIALS

TARGET = 50


def job(name: str, gpus: int = 0) -> str:
    return yaml.safe_dump({
        "apiVersion": "reconciler.dev/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {
            "command": [sys.executable, COUNTER, "0.1"],
            "target_steps": TARGET, "checkpoint_every": 5,
            "env": {"RECONCILER_GRACE": "3"},
            "secrets": ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"],
            "resources": {"gpus": gpus},
            "placement": {"providers": ["kaggle", "local"]},
            "retry": {"max_retries": 1, "backoff_seconds": 0.2, "backoff_max_seconds": 0.5},
        },
    })


def run_on_fake_kaggle(state_repo: StateRepoFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                       s3_endpoint: str, gpus: int = 0,  # noqa: F811 - a fixture's value
                       during: Callable[[FakeKaggle], None] | None = None) -> dict:
    """The daemon until done, on the fake Kaggle (12 s sessions) and local; `during` runs once the
    first kernel exists. Returns the job's status."""
    fake = FakeKaggle(tmp_path / "kaggle").start()
    fake.secrets.update({k: S3_CREDENTIALS[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
    bucket = make_bucket(s3_endpoint)
    options = {"endpoint_url": s3_endpoint, "key": S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
               "secret": S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"]}
    state_repo.write("reconciler.yaml", yaml.safe_dump({"storage": f"s3://{bucket}/runs", "storage_options": options,
                                                        "tick_seconds": 0.5}))
    kaggle = KaggleSettings(api_url=fake.url, username=fake.username, session_hours=12 / 3600,
                            save_margin_seconds=2, request_timeout_seconds=10, min_quota_hours=1)
    state_repo.write("desired/kaggle.yaml", provider_manifest("kaggle", kaggle, concurrency=1))
    local = yaml.safe_load(provider_manifest("local", LocalSettings(), concurrency=1))
    local["spec"]["resources"] = {"gpus": gpus}  # declared: this machine stands in for one with GPUs
    state_repo.write("desired/local.yaml", yaml.safe_dump(local))
    state_repo.write("desired/count.yaml", job("count", gpus))
    state_repo.commit("count on kaggle, local beside it")
    for name in ("KAGGLE_USERNAME", "KAGGLE_KEY", "KAGGLE_CONFIG_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KAGGLE_API_TOKEN", fake.token)
    for key, value in S3_CREDENTIALS.items():
        monkeypatch.setenv(key, value)  # the daemon's own (storage) and the local worker's secrets
    log = tmp_path / "daemon.log"
    daemon = start_daemon(state_repo, log)
    try:
        wait_for(lambda: fake.kernels, 60, "the first kernel", daemon, log)
        if during is not None:
            during(fake)
        finish(daemon, log, timeout=90)
    finally:
        if daemon.poll() is None:
            daemon.kill()
        fake.stop()
    st: dict = status(state_repo, "count")
    assert st["phase"] == "Succeeded", (st.get("message"), log.read_text()[-3000:])
    return st


def check_resumed_from_checkpoints(st: dict) -> None:
    first, last = st["attempts"][0], st["attempts"][-1]
    assert first["provider"] == "kaggle" and first["outcome"] == "session-end", st["attempts"]
    assert last["outcome"] == "succeeded"
    assert st["failures"] == 0 and st["interruptions"] == len(st["attempts"]) - 1
    assert first["step_end"] > 0 and first["steps_lost"] == 0, "the first session saved its last step before its end"
    for before, after in zip(st["attempts"], st["attempts"][1:], strict=False):
        assert after["step_start"] == before["step_end"], "each session resumes from the last checkpoint"
    assert last["step_end"] == TARGET


@pytest.mark.slow
def test_end_to_end_a_kaggle_session_ends_and_the_run_finishes_from_its_checkpoint(
        state_repo: StateRepoFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        s3_endpoint: str) -> None:  # noqa: F811 - a fixture
    st = run_on_fake_kaggle(state_repo, tmp_path, monkeypatch, s3_endpoint)
    check_resumed_from_checkpoints(st)
    assert st["attempts"][-1]["provider"] in ("kaggle", "local")


@pytest.mark.slow
def test_end_to_end_a_gpu_job_moves_off_kaggle_once_the_weekly_quota_is_spent(
        state_repo: StateRepoFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        s3_endpoint: str) -> None:  # noqa: F811 - a fixture
    st = run_on_fake_kaggle(state_repo, tmp_path, monkeypatch, s3_endpoint, gpus=1,
                            during=lambda fake: fake.exhaust_quota())
    check_resumed_from_checkpoints(st)
    assert [a["provider"] for a in st["attempts"]] == ["kaggle", "local"], st["attempts"]


@pytest.mark.slow
def test_end_to_end_a_suspended_job_stops_on_kaggle_through_the_run_folder(
        state_repo: StateRepoFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        s3_endpoint: str) -> None:  # noqa: F811 - a fixture
    """Kaggle has no cancel: suspending the job writes a stop request into the run folder, and the
    worker saves and exits 75 at its next heartbeat; the kernel ends without any call to Kaggle."""
    fake = FakeKaggle(tmp_path / "kaggle").start()
    fake.secrets.update({k: S3_CREDENTIALS[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
    bucket = make_bucket(s3_endpoint)
    options = {"endpoint_url": s3_endpoint, "key": S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
               "secret": S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"]}
    state_repo.write("reconciler.yaml", yaml.safe_dump({"storage": f"s3://{bucket}/runs", "storage_options": options,
                                                        "tick_seconds": 0.5}))
    kaggle = KaggleSettings(api_url=fake.url, username=fake.username, request_timeout_seconds=10)
    state_repo.write("desired/kaggle.yaml", provider_manifest("kaggle", kaggle, concurrency=1))
    manifest = yaml.safe_load(job("count"))
    manifest["spec"]["target_steps"] = 100000
    manifest["spec"]["placement"]["providers"] = ["kaggle"]
    state_repo.write("desired/count.yaml", yaml.safe_dump(manifest))
    state_repo.commit("a long count on kaggle")
    monkeypatch.setenv("KAGGLE_API_TOKEN", fake.token)
    for key, value in S3_CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    log = tmp_path / "daemon.log"
    daemon = start_daemon(state_repo, log)
    try:
        wait_for(lambda: any(k.running for k in fake.kernels.values()), 60, "a running kernel", daemon, log)
        kernel = next(iter(fake.kernels.values()))
        time.sleep(3)  # a few steps and checkpoints
        manifest["spec"]["suspend"] = True
        state_repo.write("desired/count.yaml", yaml.safe_dump(manifest))
        state_repo.commit("suspend count")
        wait_for(lambda: kernel.machine is not None and not kernel.machine.alive, 30, "the kernel's end", daemon, log)
        assert kernel.machine is not None and '"code": 75' in kernel.machine.log_text()
        wait_for(lambda: status(state_repo, "count").get("phase") == "Suspended", 30, "Suspended", daemon, log)
    finally:
        if daemon.poll() is None:
            daemon.terminate()
            daemon.wait(30)
        fake.stop()
    assert "CancelKernelSession" not in fake.calls and len(fake.kernels) == 1
