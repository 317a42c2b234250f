"""End to end on the fake Kaggle: the real `reconciler run --until-done` in a subprocess, run storage
on an S3 server (moto), a counter job preferring `kaggle` (sessions scaled down to 50 s) with
`local` beside it. The first attempt meets Kaggle's session end: the bootstrap's deadline makes the
worker save and exit 75 before the cut, which is a session end (free); the run then finishes on
either provider from its checkpoint, at exactly the target step. The job has one kernel on Kaggle,
its attempts being versions of it, so the storage credentials attached to it once at the start serve
every session. A GPU job whose weekly quota is spent during its first session is moved to the other
provider by the planner. A kernel whose secrets are not attached fails once, naming the secret and
the kernel's URL, and the planner takes the job elsewhere.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from adapters.hosted import SECRET_NOT_ATTACHED
from adapters.kaggle import kernel_slug
from desired.models import KaggleSettings, LocalSettings
from reconciler.daemon.loop import Reconciler
from status.models import Outcome, Phase
from tests.adapters.e2e import (
    COUNTER,
    daemon_running,
    finish,
    provider_manifest,
    s3_storage,
    start_daemon,
    status,
    wait_for,
)
from tests.conftest import StateRepoFixture
from tests.daemon.test_loop_local import tick_until
from tests.fakes.kaggle import FakeKaggle
from tests.worker.conftest import s3_endpoint  # noqa: F401 - a fixture
from tests.worker.harness import S3_CREDENTIALS

TARGET = 80
STEP_SECONDS = 0.2  # from the second session on: 16 s of counting at most
FIRST_STEP_SECONDS = 1.0  # the first session's 80 s of counting cannot fit in one session
SESSION_SECONDS = 50  # a worker must start and save its first checkpoint well inside a session: in
                      # a CI run on two cores with six test processes, a worker took over 15 s to
                      # start, and sessions of 20 s ended one after another with nothing saved
SAVE_MARGIN_SECONDS = 4  # the bootstrap's deadline is this long before the session's cut...
GRACE_SECONDS = 4  # ...and the worker stops this long before the deadline, to save in time
IDENTITY = "kaggle-e2e"  # the state repository's identity, so the test knows the job's kernel
STORAGE_SECRETS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


def job(name: str, gpus: int = 0, providers: tuple[str, ...] = ("kaggle", "local")) -> str:
    return yaml.safe_dump({
        "apiVersion": "reconciler.dev/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {
            "command": [sys.executable, COUNTER, str(STEP_SECONDS),
                        "--first-attempt-step-seconds", str(FIRST_STEP_SECONDS)],
            "target_steps": TARGET, "checkpoint_every": 5,
            "env": {"RECONCILER_GRACE": str(GRACE_SECONDS)},
            "secrets": ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"],
            "resources": {"gpus": gpus},
            "placement": {"providers": list(providers)},
            "retry": {"max_retries": 1, "backoff_seconds": 0.2, "backoff_max_seconds": 0.5},
        },
    })


def kaggle_with_storage_secrets(tmp_path: Path, attach: bool = True) -> FakeKaggle:
    """The fake Kaggle with the storage credentials as user secrets, attached once (as a person
    would, in the editor) to the job `count`'s kernel, before any attempt."""
    fake = FakeKaggle(tmp_path / "kaggle").start()
    fake.secrets.update({k: S3_CREDENTIALS[k] for k in STORAGE_SECRETS})
    if attach:
        fake.attach(kernel_slug("kaggle", IDENTITY, "count"), *STORAGE_SECRETS)
    return fake


def write_settings(state_repo: StateRepoFixture, s3_endpoint: str, **extra: object) -> None:  # noqa: F811
    s3_storage(state_repo, s3_endpoint, identity=IDENTITY, **extra)


def run_on_fake_kaggle(state_repo: StateRepoFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                       s3_endpoint: str, gpus: int = 0,  # noqa: F811 - a fixture's value
                       during: Callable[[FakeKaggle], None] | None = None,
                       providers: tuple[str, ...] = ("kaggle", "local")) -> tuple[dict, FakeKaggle]:
    """The daemon until done, on the fake Kaggle (50 s sessions) and local; `during` runs once the
    first kernel exists. Returns the job's status and the (stopped) fake."""
    fake = kaggle_with_storage_secrets(tmp_path)
    write_settings(state_repo, s3_endpoint, tick_seconds=0.5)
    kaggle = KaggleSettings(api_url=fake.url, username=fake.username, session_hours=SESSION_SECONDS / 3600,
                            save_margin_seconds=SAVE_MARGIN_SECONDS, request_timeout_seconds=10, min_quota_hours=1)
    state_repo.write("desired/kaggle.yaml", provider_manifest("kaggle", kaggle, concurrency=1))
    local = yaml.safe_load(provider_manifest("local", LocalSettings(), concurrency=1))
    local["spec"]["resources"] = {"gpus": gpus}  # declared: this machine stands in for one with GPUs
    state_repo.write("desired/local.yaml", yaml.safe_dump(local))
    state_repo.write("desired/count.yaml", job("count", gpus, providers))
    state_repo.commit("count on kaggle, local beside it")
    for name in ("KAGGLE_USERNAME", "KAGGLE_KEY", "KAGGLE_CONFIG_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KAGGLE_API_TOKEN", fake.token)
    for key, value in S3_CREDENTIALS.items():
        monkeypatch.setenv(key, value)  # the daemon's own (storage) and the local worker's secrets
    log = tmp_path / "daemon.log"
    try:
        with daemon_running(state_repo, log) as daemon:
            wait_for(lambda: fake.kernels, 120, "the first kernel", daemon, log)
            if during is not None:
                during(fake)
            finish(daemon, log, timeout=360)  # it took 172 s in a clean-clone CI run on 2 cores
    finally:
        fake.stop()
    st: dict = status(state_repo, "count")
    assert st["phase"] == "Succeeded", (st.get("message"), log.read_text()[-3000:])
    return st, fake


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
    st, _ = run_on_fake_kaggle(state_repo, tmp_path, monkeypatch, s3_endpoint)
    check_resumed_from_checkpoints(st)
    assert st["attempts"][-1]["provider"] in ("kaggle", "local")


@pytest.mark.slow
def test_end_to_end_every_session_on_kaggle_is_a_version_of_one_kernel_with_secrets_attached_once(
        state_repo: StateRepoFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        s3_endpoint: str) -> None:  # noqa: F811 - a fixture
    st, fake = run_on_fake_kaggle(state_repo, tmp_path, monkeypatch, s3_endpoint, providers=("kaggle",))
    check_resumed_from_checkpoints(st)
    attempts = st["attempts"]
    assert len(attempts) >= 2 and {a["provider"] for a in attempts} == {"kaggle"}, attempts
    kernel = kernel_slug("kaggle", IDENTITY, "count")
    assert list(fake.kernels) == [kernel] and fake.versions(kernel) == len(attempts) == fake.pushes
    assert {a["worker"] for a in attempts} == {f"{fake.username}/{kernel}"}
    assert fake.attached == {kernel: set(STORAGE_SECRETS)}  # attached once, before the first attempt


@pytest.mark.slow
def test_end_to_end_a_gpu_job_moves_off_kaggle_once_the_weekly_quota_is_spent(
        state_repo: StateRepoFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        s3_endpoint: str) -> None:  # noqa: F811 - a fixture
    st, _ = run_on_fake_kaggle(state_repo, tmp_path, monkeypatch, s3_endpoint, gpus=1,
                            during=lambda fake: fake.exhaust_quota())
    check_resumed_from_checkpoints(st)
    assert [a["provider"] for a in st["attempts"]] == ["kaggle", "local"], st["attempts"]


@pytest.mark.slow
def test_end_to_end_a_suspended_job_stops_on_kaggle_through_the_run_folder(
        state_repo: StateRepoFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        s3_endpoint: str) -> None:  # noqa: F811 - a fixture
    """Kaggle has no cancel: suspending the job writes a stop request into the run folder, and the
    worker saves and exits 75 at its next heartbeat; the kernel ends without any call to Kaggle."""
    fake = kaggle_with_storage_secrets(tmp_path)
    write_settings(state_repo, s3_endpoint, tick_seconds=0.5)
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


def test_a_kernel_without_its_secrets_fails_once_naming_them_and_the_job_goes_elsewhere(
        state_repo: StateRepoFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        s3_endpoint: str) -> None:  # noqa: F811 - a fixture
    """In-process ticks: nobody attached the storage credentials to the job's kernel."""
    fake = kaggle_with_storage_secrets(tmp_path, attach=False)
    try:
        write_settings(state_repo, s3_endpoint)
        kaggle = KaggleSettings(api_url=fake.url, username=fake.username, request_timeout_seconds=10)
        state_repo.write("desired/kaggle.yaml", provider_manifest("kaggle", kaggle, concurrency=1))
        state_repo.write("desired/local.yaml", provider_manifest("local", LocalSettings(), concurrency=1))
        manifest = yaml.safe_load(job("count"))
        manifest["spec"]["retry"] = {"max_retries": 2, "backoff_seconds": 0.2, "backoff_max_seconds": 0.5}
        state_repo.write("desired/count.yaml", yaml.safe_dump(manifest))
        state_repo.commit("count prefers kaggle, whose kernel lacks the storage secrets")
        for name in ("KAGGLE_USERNAME", "KAGGLE_KEY", "KAGGLE_CONFIG_DIR"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("KAGGLE_API_TOKEN", fake.token)
        for key, value in S3_CREDENTIALS.items():
            monkeypatch.setenv(key, value)
        avoided: list[str] = []  # providers the job avoided along the way (cleared once it succeeds)
        final = tick_until(Reconciler(state_repo.path), lambda r: r.all_terminal, timeout=120,
                           each=lambda r: avoided.extend(r.statuses["count"].provider_backoff))
        st = final.statuses["count"]
        assert st.phase == Phase.SUCCEEDED, st
        assert [a.provider for a in st.attempts] == ["kaggle", "local"], st.attempts
        first, kernel = st.attempts[0], kernel_slug("kaggle", IDENTITY, "count")
        assert (first.outcome, first.exit_code, st.failures) == (Outcome.JOB_ERROR, SECRET_NOT_ATTACHED, 1)
        url = f"https://www.kaggle.com/code/{fake.username}/{kernel}"
        assert "secret AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY is not attached" in first.detail
        assert f"to kernel {url} in the Kaggle editor" in first.detail, first.detail
        assert "kaggle" in avoided and fake.pushes == 1  # tried once, then avoided: no loop
    finally:
        fake.stop()
