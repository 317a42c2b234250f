"""`reconciler doctor` against the fake Vast, RunPod and Kaggle servers, a real OCI registry
(Debian's docker-registry) on 127.0.0.1 and run storage on disk: one row per check, exit 1 when a
check fails, and nothing is ever rented, launched or pushed (the fakes saw only reads)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapters.preflight import Check, Outcome
from adapters.registry import make_adapter
from adapters.stores import open_store
from desired.parse import parse_desired
from reconciler.cli.doctor import examine
from tests import zygote
from tests.conftest import StateRepoFixture
from tests.fakes.kaggle import FakeKaggle
from tests.fakes.lightning import API_KEY as LIGHTNING_KEY
from tests.fakes.lightning import USER_ID as LIGHTNING_USER
from tests.fakes.lightning import FakeLightning
from tests.fakes.runpod import API_KEY as RUNPOD_KEY
from tests.fakes.runpod import FakeRunpod
from tests.fakes.vast import FakeVast
from tests.worker.conftest import make_bucket, s3_endpoint  # noqa: F401 - a fixture
from tests.worker.harness import S3_CREDENTIALS

WORKER_KEYS = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]


@pytest.fixture
def storage(state_repo: StateRepoFixture, s3_endpoint: str,  # noqa: F811 - a fixture
            monkeypatch: pytest.MonkeyPatch) -> str:
    """Run storage in a bucket of a local S3 (moto), as hosted workers need; its keys in the environment."""
    for name, value in S3_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    url = f"s3://{make_bucket(s3_endpoint)}/runs"
    use_storage(state_repo, url, s3_endpoint)
    return url


def use_storage(repo: StateRepoFixture, url: str, endpoint: str) -> None:
    repo.write("reconciler.yaml", f"storage: {url}\nstorage_options: {{endpoint_url: '{endpoint}'}}\n")


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, storage: str,
          s3_endpoint: str) -> Iterator[dict[str, Any]]:  # noqa: F811 - a fixture
    vast, runpod, kaggle = FakeVast(tmp_path / "vast"), FakeRunpod(tmp_path / "runpod"), FakeKaggle(tmp_path / "kg")
    vast.serve()
    kaggle.start()
    for name in ("KAGGLE_USERNAME", "KAGGLE_KEY", "KAGGLE_CONFIG_DIR"):
        monkeypatch.delenv(name, raising=False)
    keys = {"VAST_API_KEY": vast.key, "RUNPOD_API_KEY": RUNPOD_KEY, "KAGGLE_API_TOKEN": kaggle.token}
    for name, value in keys.items():
        monkeypatch.setenv(name, value)
    yield {"vast": vast, "runpod": runpod, "kaggle": kaggle, "env": keys, "storage": storage,
           "endpoint": s3_endpoint}
    vast.close()
    runpod.close()
    kaggle.stop()


def provider(name: str, **settings: Any) -> str:
    return yaml.safe_dump({"apiVersion": "reconciler.dev/v1", "kind": "Provider", "metadata": {"name": name},
                           "spec": {"settings": settings}})


def job(name: str, providers: list[str], **spec: Any) -> str:
    return yaml.safe_dump({"apiVersion": "reconciler.dev/v1", "kind": "Job", "metadata": {"name": name},
                           "spec": {"command": ["python", "train.py"], "target_steps": 100,
                                    "placement": {"providers": providers, **spec.pop("placement", {})}, **spec}})


def write_scenario(repo: StateRepoFixture, fakes: dict[str, Any], registry: str, *, cap: float = 1.0) -> None:
    repo.write("desired/providers.yaml", "---\n".join([
        provider("vast", api_url=fakes["vast"].url, type="vast", request_timeout_seconds=5),
        provider("runpod", api_url=fakes["runpod"].url, type="runpod", request_timeout_seconds=5),
        provider("kaggle", api_url=fakes["kaggle"].url, type="kaggle", username=fakes["kaggle"].username,
                 request_timeout_seconds=5),
    ]))
    repo.write("desired/train-a.yaml", job("train-a", ["vast", "runpod"], resources={"gpus": 1},
                                           code={"image": f"{registry}/team/trainer:v1"},
                                           secrets=["HF_TOKEN", *WORKER_KEYS],
                                           placement={"max_price_per_hour": cap}))
    repo.write("desired/train-b.yaml", job("train-b", ["runpod"], resources={"gpus": 1},
                                           code={"image": f"{registry}/team/trainer:v9"}))
    repo.write("desired/notebook.yaml", job("notebook", ["kaggle"], resources={"gpus": 1},
                                            secrets=["WANDB_API_KEY"]))
    repo.commit("three providers, three jobs")


def run_examine(repo: StateRepoFixture, environ: dict[str, str]) -> dict[tuple[str, str], Check]:
    files = {str(p.relative_to(repo.path)): p.read_bytes() for p in (repo.path / "desired").iterdir()}
    desired = parse_desired(files, (repo.path / "reconciler.yaml").read_text())
    assert not desired.errors, desired.errors
    return {(c.target, c.what): c for c in examine(desired, "repo-a", make_adapter, environ=environ)}


def outcome(checks: dict[tuple[str, str], Check], target: str, what: str) -> Outcome:
    assert (target, what) in checks, sorted(checks)
    return checks[(target, what)].outcome


def test_doctor_reads_every_provider_and_finds_the_missing_image(
        state_repo: StateRepoFixture, fakes: dict[str, Any], oci_registry: Any) -> None:
    oci_registry.push("team/trainer", "v1")
    write_scenario(state_repo, fakes, oci_registry.host)
    env = {**os.environ, "HF_TOKEN": "hf-secret-value", "COLUMNS": "118"}  # S3 keys set by `storage`
    res = zygote.run([sys.executable, "-m", "reconciler", "doctor", "--repo", str(state_repo.path)],
                     capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "does not exist" in res.stdout and "team/trainer:v9" in res.stdout
    assert "hf-secret-value" not in res.stdout
    as_json = zygote.run([sys.executable, "-m", "reconciler", "doctor", "--json", "--repo",
                          str(state_repo.path)], capture_output=True, text=True, env=env, timeout=120)
    answer = json.loads(as_json.stdout)
    assert as_json.returncode == 1 and answer["ok"] is False
    rows = {(c["target"], c["what"]): c["outcome"] for c in answer["checks"]}
    assert rows[("vast", "credentials")] == rows[("vast", "balance")] == rows[("vast", "offers for train-a")] == "ok"
    assert rows[("vast", "secrets of train-a")] == "ok"
    assert rows[("runpod", "price for train-a")] == rows[("runpod", "price for train-b")] == "ok"
    assert rows[("runpod", f"image {oci_registry.host}/team/trainer:v1")] == "ok"
    assert rows[("runpod", f"image {oci_registry.host}/team/trainer:v9")] == "fail"
    assert rows[("runpod", "secrets of train-a")] == rows[("kaggle", "secrets of notebook")] == "warn"
    assert rows[("kaggle", "quota")] == rows[("kaggle", "fits notebook")] == "ok"
    assert rows[("storage", "run storage (the reconciler's credentials)")] == "ok"
    assert rows[("storage", "run storage (the credentials train-a's workers get)")] == "ok"
    assert [c["outcome"] for c in answer["checks"]].count("fail") == 1  # only the missing image
    # read-only: Vast was searched and asked its balance, RunPod queried, Kaggle read; nothing made
    assert {route for route, _ in fakes["vast"].requests} <= {"search", "user"}
    assert not any("mutation" in r["query"] for r in fakes["runpod"].requests)
    assert set(fakes["kaggle"].calls) <= {"GetAcceleratorQuotaStatistics", "GetKernel"}
    assert open_store(fakes["storage"], {"endpoint_url": fakes["endpoint"]}).list() == {}  # probes deleted


def test_a_refused_key_fails_its_provider_with_where_the_key_is_read(
        state_repo: StateRepoFixture, fakes: dict[str, Any], oci_registry: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    oci_registry.push("team/trainer", "v1")
    write_scenario(state_repo, fakes, oci_registry.host)
    monkeypatch.setenv("VAST_API_KEY", "not-the-key")
    checks = run_examine(state_repo, {"HF_TOKEN": "x", **S3_CREDENTIALS})
    refused = checks[("vast", "credentials")]
    assert refused.outcome is Outcome.FAIL and "VAST_API_KEY" in refused.detail
    assert not [key for key in checks if key[0] == "vast" and key[1] != "credentials"]  # nothing more asked
    assert outcome(checks, "runpod", "credentials") is Outcome.OK


def test_a_secret_missing_from_the_daemons_environment_fails(
        state_repo: StateRepoFixture, fakes: dict[str, Any], oci_registry: Any) -> None:
    oci_registry.push("team/trainer", "v1")
    write_scenario(state_repo, fakes, oci_registry.host)
    checks = run_examine(state_repo, S3_CREDENTIALS)
    missing = checks[("vast", "secrets of train-a")]
    assert missing.outcome is Outcome.FAIL and "HF_TOKEN" in missing.detail and "HF_TOKEN" in missing.fix


def test_no_offer_or_price_under_the_cap_fails_with_what_to_change(
        state_repo: StateRepoFixture, fakes: dict[str, Any], oci_registry: Any) -> None:
    oci_registry.push("team/trainer", "v1")
    write_scenario(state_repo, fakes, oci_registry.host, cap=0.01)
    checks = run_examine(state_repo, {"HF_TOKEN": "x", **S3_CREDENTIALS})
    assert outcome(checks, "vast", "offers for train-a") is Outcome.FAIL
    over = checks[("runpod", "price for train-a")]
    assert over.outcome is Outcome.FAIL and "above the job's cap of $0.01/h" in over.detail


def test_spent_quota_and_balance_fail(state_repo: StateRepoFixture, fakes: dict[str, Any], oci_registry: Any) -> None:
    oci_registry.push("team/trainer", "v1")
    write_scenario(state_repo, fakes, oci_registry.host)
    fakes["kaggle"].exhaust_quota()
    fakes["runpod"].drain_balance()
    checks = run_examine(state_repo, {"HF_TOKEN": "x", **S3_CREDENTIALS})
    assert outcome(checks, "kaggle", "quota") is Outcome.FAIL
    assert outcome(checks, "runpod", "balance") is Outcome.FAIL
    assert outcome(checks, "kaggle", "fits notebook") is Outcome.FAIL


def test_storage_that_cannot_be_reached_fails(state_repo: StateRepoFixture, fakes: dict[str, Any],
                                              oci_registry: Any) -> None:
    use_storage(state_repo, "s3://no-such-bucket-here/runs", fakes["endpoint"])
    oci_registry.push("team/trainer", "v1")
    write_scenario(state_repo, fakes, oci_registry.host)
    checks = run_examine(state_repo, {"HF_TOKEN": "x", **S3_CREDENTIALS})
    for whose in ("the reconciler's credentials", "the credentials train-a's workers get"):
        probe = checks[("storage", f"run storage ({whose})")]
        assert probe.outcome is Outcome.FAIL and "s3://no-such-bucket-here/runs" in probe.detail


def test_lightning_secrets_are_looked_up_among_the_teamspaces_by_name(
        state_repo: StateRepoFixture, storage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeLightning(tmp_path / "lightning")
    monkeypatch.setenv("LIGHTNING_USER_ID", LIGHTNING_USER)
    monkeypatch.setenv("LIGHTNING_API_KEY", LIGHTNING_KEY)
    monkeypatch.delenv("LIGHTNING_AUTH_TOKEN", raising=False)
    try:
        state_repo.write("desired/providers.yaml", provider("studio", type="lightning", api_url=fake.url,
                                                           project_id=fake.project_id, machine="cpu-4",
                                                           request_timeout_seconds=5))
        state_repo.write("desired/finetune.yaml", job("finetune", ["studio"], secrets=["HF_TOKEN", "WANDB_API_KEY"]))
        state_repo.commit("a Lightning teamspace")
        fake.set_secret("HF_TOKEN", "hf-value")
        missing = run_examine(state_repo, {})[("studio", "secrets of finetune")]
        assert missing.outcome is Outcome.FAIL and missing.detail.endswith("no secret named WANDB_API_KEY")
        fake.set_secret("WANDB_API_KEY", "wandb-value")
        assert outcome(run_examine(state_repo, {}), "studio", "secrets of finetune") is Outcome.OK
        assert {method for method, _, _ in fake.requests} == {"GET"}
    finally:
        fake.close()


def test_a_provider_that_cannot_be_asked_fails_and_the_others_are_still_checked(
        state_repo: StateRepoFixture, fakes: dict[str, Any], oci_registry: Any) -> None:
    oci_registry.push("team/trainer", "v1")
    write_scenario(state_repo, fakes, oci_registry.host)
    fakes["vast"].close()  # the API is down
    checks = run_examine(state_repo, {"HF_TOKEN": "x", **S3_CREDENTIALS})
    down = checks[("vast", "credentials")]
    assert down.outcome is Outcome.FAIL and "try again later" in down.fix
    assert outcome(checks, "runpod", "price for train-a") is Outcome.OK
    assert outcome(checks, "storage", "run storage (the reconciler's credentials)") is Outcome.OK
