"""Helpers for the end-to-end tests: a state repository whose jobs run on an ssh or slurm provider,
driven by the real `reconciler run --until-done` in a subprocess."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from tests import zygote
from tests.conftest import StateRepoFixture

COUNTER = str(Path(__file__).parents[1] / "daemon" / "workloads" / "counter.py")


def provider_manifest(name: str, settings: BaseModel, concurrency: int = 2) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "reconciler.dev/v1",
            "kind": "Provider",
            "metadata": {"name": name},
            "spec": {"settings": settings.model_dump(mode="json"), "concurrency": concurrency},
        }
    )


def job_manifest(name: str, provider: str, step_seconds: float, target: int, every: int = 5) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "reconciler.dev/v1",
            "kind": "Job",
            "metadata": {"name": name},
            "spec": {
                "command": [sys.executable, COUNTER, str(step_seconds)],
                "target_steps": target,
                "checkpoint_every": every,
                "placement": {"providers": [provider]},
                "retry": {"max_retries": 1, "backoff_seconds": 0.2, "backoff_max_seconds": 0.5},
            },
        }
    )


def start_daemon(repo: StateRepoFixture, log: Path) -> subprocess.Popen:
    """The daemon as users run it, watching the repository as well as ticking on an interval (1 s:
    at 0.5 s the daemons of these tests spent a tenth more CPU, on store reads, for the same runs)."""
    cmd = [sys.executable, "-m", "reconciler", "run", "--repo", str(repo.path), "--until-done", "--tick-seconds", "1"]
    return zygote.popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT)


@contextmanager
def daemon_running(repo: StateRepoFixture, log: Path) -> Iterator[subprocess.Popen]:
    """`start_daemon`, and the daemon killed on the way out if it is still running (a failed wait)."""
    daemon = start_daemon(repo, log)
    try:
        yield daemon
    finally:
        if daemon.poll() is None:
            daemon.kill()


def wait_for(check: Callable[[], object], timeout: float, what: str, daemon: subprocess.Popen, log: Path) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if daemon.poll() is not None:
            raise AssertionError(f"the daemon exited ({daemon.returncode}) before {what}: {log.read_text()[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}: {log.read_text()[-3000:]}")


def finish(daemon: subprocess.Popen, log: Path, timeout: float) -> None:
    try:
        code = daemon.wait(timeout)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait()
        raise AssertionError(f"the daemon did not finish in {timeout}s: {log.read_text()[-3000:]}") from None
    assert code == 0, log.read_text()[-3000:]


def progress_step(repo: StateRepoFixture, job: str) -> int:
    """The live worker's heartbeat step, from the run folder in storage (0 before the first beat)."""
    for path in (repo.storage / job).glob("*/progress.json"):
        try:
            return int(json.loads(path.read_text()).get("step", 0))
        except (OSError, ValueError):
            return 0
    return 0


def status(repo: StateRepoFixture, job: str) -> dict:
    return yaml.safe_load(repo.status_text(job))


@functools.cache
def _s3_client(endpoint: str) -> Any:
    """One client per S3 server: `s3_step` is polled every 0.2 s, and a new client costs 20 ms of CPU."""
    import boto3

    from tests.worker.harness import S3_CREDENTIALS

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                        region_name=S3_CREDENTIALS["AWS_DEFAULT_REGION"])


def s3_step(endpoint: str, bucket: str, job: str) -> int:
    """The live worker's heartbeat step, from the run folder on S3 (0 before the first beat), for
    the hosted providers' end-to-end tests (their run storage is S3 on the moto server)."""
    client = _s3_client(endpoint)
    for item in client.list_objects_v2(Bucket=bucket, Prefix=f"runs/{job}/").get("Contents", []):
        if item["Key"].endswith("/progress.json"):
            try:
                return int(json.loads(client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()).get("step", 0))
            except ValueError:
                return 0
    return 0


STORAGE_KEYS = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]


def s3_storage(repo: StateRepoFixture, endpoint: str, **extra: object) -> str:
    """A new bucket on the moto server and reconciler.yaml keeping the runs in it (endpoint, key and
    secret in `storage_options`, with `extra` settings); returns the bucket."""
    from tests.worker.conftest import make_bucket
    from tests.worker.harness import S3_CREDENTIALS

    bucket = make_bucket(endpoint)
    options = {"endpoint_url": endpoint, "key": S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
               "secret": S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"]}
    repo.write("reconciler.yaml", yaml.safe_dump({"storage": f"s3://{bucket}/runs", "storage_options": options,
                                                  **extra}))
    return bucket


def storage_secrets(set_secret: Callable[[str, str], None]) -> None:
    """The storage credentials put in a provider's own secret store: a job names them, and they never
    travel in a launch."""
    from tests.worker.harness import S3_CREDENTIALS

    for name in STORAGE_KEYS:
        set_secret(name, S3_CREDENTIALS[name])


def daemon_env(monkeypatch: Any, **more: str) -> None:
    """The daemon's environment: the S3 credentials (for its own run storage) and `more` (a
    provider's key)."""
    from tests.worker.harness import S3_CREDENTIALS

    for name, value in {**S3_CREDENTIALS, **more}.items():
        monkeypatch.setenv(name, value)


def outbid_only_instance(vast: Any) -> Callable[[], None]:
    """An interruption for `interrupted_count`: the fake Vast's one live instance is outbid."""

    def outbid() -> None:
        [first] = vast.live()
        vast.outbid(first.id)

    return outbid


def s3_job(name: str, provider: str, step_seconds: float, target: int) -> dict:
    """A counter job whose storage credentials are secrets (the provider's own store keeps them;
    they never travel in a launch) and whose region is plain env."""
    from tests.worker.harness import S3_CREDENTIALS

    job = yaml.safe_load(job_manifest(name, provider, step_seconds=step_seconds, target=target))
    job["spec"]["secrets"] = list(STORAGE_KEYS)
    job["spec"]["env"] = {"AWS_DEFAULT_REGION": S3_CREDENTIALS["AWS_DEFAULT_REGION"]}
    return job


def priced(name: str, settings: BaseModel, price: float) -> str:
    """A provider manifest with its `price_per_hour`, for placements that compare providers."""
    manifest = yaml.safe_load(provider_manifest(name, settings))
    manifest["spec"]["price_per_hour"] = price
    return yaml.safe_dump(manifest)


def interrupted_count(repo: StateRepoFixture, log: Path, endpoint: str, bucket: str, job: dict, message: str,
                      interrupt: Callable[[], None], timeout: float) -> dict:
    """Commits `job` (the counter `count`), runs the daemon until done and calls `interrupt()` once
    the count has checkpointed past step 12 in the bucket; returns the Succeeded status of `count`."""
    repo.write("desired/count.yaml", yaml.safe_dump(job))
    repo.commit(message)
    with daemon_running(repo, log) as daemon:
        wait_for(lambda: s3_step(endpoint, bucket, "count") >= 12, 180, "checkpoints", daemon, log)
        interrupt()
        finish(daemon, log, timeout=timeout)
    return succeeded(repo, "count")


def succeeded(repo: StateRepoFixture, job: str) -> dict:
    """The job's status, once it says Succeeded (else its message fails the test)."""
    st = status(repo, job)
    assert st["phase"] == "Succeeded", st.get("message")
    return st
