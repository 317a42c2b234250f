"""Helpers for the end-to-end tests: a state repository whose jobs run on an ssh or slurm provider,
driven by the real `reconciler run --until-done` in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml
from pydantic import BaseModel

from tests.conftest import StateRepoFixture

COUNTER = str(Path(__file__).parents[1] / "loop" / "workloads" / "counter.py")


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
    """The daemon as users run it, watching the repository as well as ticking on an interval."""
    cmd = [sys.executable, "-m", "reconciler", "run", "--repo", str(repo.path), "--until-done", "--tick-seconds", "0.5"]
    return subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT)


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


def s3_step(endpoint: str, bucket: str, job: str) -> int:
    """The live worker's heartbeat step, from the run folder on S3 (0 before the first beat), for
    the hosted providers' end-to-end tests (their run storage is S3 on the moto server)."""
    import boto3

    from tests.worker.harness import S3_CREDENTIALS

    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                          region_name=S3_CREDENTIALS["AWS_DEFAULT_REGION"])
    for item in client.list_objects_v2(Bucket=bucket, Prefix=f"runs/{job}/").get("Contents", []):
        if item["Key"].endswith("/progress.json"):
            try:
                return int(json.loads(client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()).get("step", 0))
            except ValueError:
                return 0
    return 0
