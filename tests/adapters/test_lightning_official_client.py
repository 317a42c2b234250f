"""The fake Lightning server, driven by lightning-sdk's own generated REST client
(`lightning_sdk.lightning_cloud.openapi`, lightning-sdk 2026.10.13): its answers must deserialize into
the SDK's model types with the right values, and what our adapter sends must use the SDK's field
names. This is what ties the fake (and so the adapter) to the real wire format; it is not a test
against the live service.

Why the odd import: `import lightning_sdk` loads the whole SDK (fastapi, textual, uvicorn, backoff,
...), none of which the generated client needs. The package is installed with `--no-deps`, and the
test registers empty parent packages so that only `lightning_sdk.lightning_cloud.openapi` (which
needs six, urllib3, certifi and python-dateutil) is imported.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import types
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.compute import LaunchSpec
from adapters.lightning import LightningAdapter
from desired.models import LightningSettings
from tests.fakes.lightning import API_KEY, USER_ID, FakeLightning, basic_header

REQUIREMENT = "lightning-sdk==2026.10.13 (installed with --no-deps)"


def openapi() -> Any:
    """`lightning_sdk.lightning_cloud.openapi` alone, without running lightning_sdk/__init__.py."""
    if "lightning_sdk.lightning_cloud.openapi" in sys.modules:
        return sys.modules["lightning_sdk.lightning_cloud.openapi"]
    found = importlib.util.find_spec("lightning_sdk")
    if found is None or found.origin is None:
        if os.environ.get("CI"):
            pytest.fail(f"{REQUIREMENT} is a dev dependency and must be installed in CI")
        pytest.skip(f"needs {REQUIREMENT}")
    root = Path(found.origin).parent
    for name, path in (("lightning_sdk", root), ("lightning_sdk.lightning_cloud", root / "lightning_cloud")):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(path)]
            sys.modules[name] = package
    sys.modules["lightning_sdk"].lightning_cloud = sys.modules["lightning_sdk.lightning_cloud"]  # type: ignore[attr-defined]
    import lightning_sdk.lightning_cloud.openapi as api

    return api


@pytest.fixture
def sdk() -> Any:
    return openapi()


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeLightning]:
    server = FakeLightning(tmp_path / "machines", stop_grace=2.0)
    yield server
    server.close()


def client(sdk: Any, fake: FakeLightning) -> tuple[Any, Any]:
    config = sdk.Configuration()
    config.host = fake.url
    api_client = sdk.ApiClient(config)
    api_client.set_default_header("Authorization", basic_header())
    return sdk.JobsServiceApi(api_client), sdk.BillingServiceApi(api_client)


def create(sdk: Any, jobs: Any, fake: FakeLightning, name: str, command: str) -> Any:
    spec = sdk.V1JobSpec(command=command, entrypoint="sh -c", image="python:3.11-slim", instance_name="lit-t4-1",
                         spot=True, max_run_attempts=1,
                         env=[sdk.V1EnvVar(name="PLAIN", value="v"), sdk.V1EnvVar(name="TOKEN", from_secret="TOKEN")])
    return jobs.jobs_service_create_job(sdk.JobsServiceCreateJobBody(name=name, spec=spec), fake.project_id)


def wait_state(jobs: Any, fake: FakeLightning, job_id: str, states: set[str]) -> Any:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        job = jobs.jobs_service_get_job(fake.project_id, job_id)
        if job.state in states:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} is still {job.state}")


def test_create_get_find_list_and_logs_deserialize_into_the_sdk_s_models(sdk: Any, fake: FakeLightning) -> None:
    jobs, _ = client(sdk, fake)
    fake.set_secret("TOKEN", "teamspace-secret")
    made = create(sdk, jobs, fake, "sdk-job-1", 'echo "hello $PLAIN"; test "$TOKEN" = teamspace-secret')
    assert isinstance(made, sdk.V1Job) and made.name == "sdk-job-1" and made.state == "pending"
    assert isinstance(made.spec, sdk.V1JobSpec) and made.spec.instance_name == "lit-t4-1" and made.spec.spot
    assert made.spec.env[1].from_secret == "TOKEN" and made.spec.env[0].value == "v"
    sent = json.loads(next(b for m, _, b in fake.requests if m == "POST"))
    assert sent["spec"]["instanceName"] == "lit-t4-1" and sent["spec"]["maxRunAttempts"] == 1
    done = wait_state(jobs, fake, made.id, {"completed", "failed"})
    assert done.state == "completed", done.message
    assert done.started_at is not None and done.stopped_at >= done.started_at and done.total_cost >= 0
    found = jobs.jobs_service_find_job(fake.project_id, name="sdk-job-1")
    assert isinstance(found, sdk.V1Job) and found.id == made.id
    create(sdk, jobs, fake, "sdk-job-2", "sleep 30")
    first = jobs.jobs_service_list_jobs(fake.project_id, limit=1)
    assert isinstance(first, sdk.V1ListJobsResponse) and len(first.jobs) == 1 and first.next_page_token
    rest = jobs.jobs_service_list_jobs(fake.project_id, limit=1, page_token=first.next_page_token)
    assert {first.jobs[0].name, rest.jobs[0].name} == {"sdk-job-1", "sdk-job-2"} and not rest.next_page_token
    logs = jobs.jobs_service_get_job_logs(fake.project_id, made.id)
    assert isinstance(logs, sdk.V1JobLogsResponse) and isinstance(logs.pages[0], sdk.V1JobLogsPage)
    with urllib.request.urlopen(logs.pages[0].url) as page:
        entries = json.loads(page.read())
    assert [e["message"] for e in entries] == ["hello v"] and {"line", "timestamp", "resource_id"} <= set(entries[0])


def test_stop_and_not_found_and_balance(sdk: Any, fake: FakeLightning) -> None:
    jobs, billing = client(sdk, fake)
    made = create(sdk, jobs, fake, "sdk-stop", "sleep 60")
    wait_state(jobs, fake, made.id, {"running"})
    answer = jobs.jobs_service_update_job(sdk.JobsServiceUpdateJobBody(state="stop"), fake.project_id, made.id)
    assert isinstance(answer, sdk.V1Job) and answer.state in ("stopping", "stopped")
    assert wait_state(jobs, fake, made.id, {"stopped"}).stopped_at is not None
    with pytest.raises(sdk.rest.ApiException) as caught:
        jobs.jobs_service_find_job(fake.project_id, name="no-such-job")
    assert caught.value.status == 404 and json.loads(caught.value.body)["code"] == 5
    fake.set_balance(7.25)
    balance = billing.billing_service_get_project_balance(fake.project_id)
    assert isinstance(balance, sdk.V1GetProjectBalanceResponse) and balance.balance == 7.25


def test_wrong_credentials_are_refused_with_401(sdk: Any, fake: FakeLightning) -> None:
    jobs, _ = client(sdk, fake)
    jobs.api_client.set_default_header("Authorization", "Bearer wrong")
    with pytest.raises(sdk.rest.ApiException) as caught:
        jobs.jobs_service_list_jobs(fake.project_id)
    assert caught.value.status == 401


def test_the_adapter_s_create_body_uses_only_the_sdk_s_field_names(
        sdk: Any, fake: FakeLightning, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIGHTNING_USER_ID", USER_ID)
    monkeypatch.setenv("LIGHTNING_API_KEY", API_KEY)
    settings = LightningSettings(api_url=fake.url, project_id=fake.project_id, machine="lit-l4-1")
    adapter = LightningAdapter("lightning", settings, owner="repo-a")
    ref = adapter.launch(LaunchSpec(job="j", run_id="r", epoch=1, command=["true"], secret_env={"S": "x"}))
    body = json.loads(next(b for m, _, b in fake.requests if m == "POST"))
    assert set(body) <= set(sdk.JobsServiceCreateJobBody.attribute_map.values())
    assert set(body["spec"]) <= set(sdk.V1JobSpec.attribute_map.values())
    for entry in body["spec"]["env"]:
        assert set(entry) <= set(sdk.V1EnvVar.attribute_map.values())
    jobs, _ = client(sdk, fake)
    seen = jobs.jobs_service_get_job(fake.project_id, ref.id)
    assert seen.spec.instance_name == "lit-l4-1" and seen.spec.max_run_attempts == 1


def test_the_secret_list_deserializes_into_the_sdks_models_with_names_only(sdk: Any, fake: FakeLightning) -> None:
    """doctor's read of the teamspace's secrets (`GET /v1/projects/{projectId}/secrets`)."""
    fake.set_secret("HF_TOKEN", "hf-value")
    config = sdk.Configuration()
    config.host = fake.url
    api_client = sdk.ApiClient(config)
    api_client.set_default_header("Authorization", basic_header())
    listed = sdk.SecretServiceApi(api_client).secret_service_list_secrets(project_id=fake.project_id)
    assert isinstance(listed, sdk.V1ListSecretsResponse)
    assert [(s.name, s.project_id) for s in listed.secrets] == [("HF_TOKEN", fake.project_id)]
    assert "hf-value" not in json.dumps(api_client.sanitize_for_serialization(listed))


def strict(sdk: Any, kind: str, data: Any, where: str = "") -> None:
    """`data` as the SDK's generated model `kind` reads it, strictly: a field the model does not
    define, or a value of another type, fails (the generated deserializer would drop or coerce it)."""
    where = where or kind
    if kind.startswith("list["):
        assert isinstance(data, list), f"{where}: {data!r} is not a list"
        for i, item in enumerate(data):
            strict(sdk, kind[5:-1], item, f"{where}[{i}]")
        return
    if kind.startswith("dict("):
        assert isinstance(data, dict), f"{where}: {data!r} is not an object"
        for key, item in data.items():
            strict(sdk, kind[5:-1].split(", ", 1)[1], item, f"{where}.{key}")
        return
    plain = {"str": str, "bool": bool, "int": int, "float": (int, float), "datetime": str, "object": object}
    if kind in plain:
        assert isinstance(data, plain[kind]) and not (kind in ("int", "float") and isinstance(data, bool)), \
            f"{where}: {data!r} is not {kind}"
        return
    model = getattr(sdk, kind)
    if not getattr(model, "swagger_types", None):  # a generated enum: its allowed values are constants
        allowed = {v for k, v in vars(model).items() if k.isupper() and isinstance(v, str)}
        assert data in allowed, f"{where}: {data!r} is not one of {kind}'s values"
        return
    assert isinstance(data, dict), f"{where}: {data!r} is not a {kind}"
    names = {json_name: attr for attr, json_name in model.attribute_map.items()}
    unknown = set(data) - set(names)
    assert not unknown, f"{where}: {sorted(unknown)} are not fields of {kind}"
    for key, value in data.items():
        if value is not None:
            strict(sdk, model.swagger_types[names[key]], value, f"{where}.{key}")


def test_what_the_adapter_sends_and_the_fake_answers_parse_strictly_as_the_sdk_s_models(
        sdk: Any, fake: FakeLightning, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every request body our adapter sends (create with `fromSecret` env entries, stop) and every
    answer of the fake (job, list, find, logs, balance, secrets) against lightning-sdk's models."""
    with pytest.raises(AssertionError, match="not fields of V1EnvVar"):  # the check is strict
        strict(sdk, "V1EnvVar", {"name": "HF_TOKEN", "secretRef": "HF_TOKEN"})
    monkeypatch.setenv("LIGHTNING_USER_ID", USER_ID)
    monkeypatch.setenv("LIGHTNING_API_KEY", API_KEY)
    fake.set_secret("HF_TOKEN", "hf-value")
    adapter = LightningAdapter("lightning", LightningSettings(api_url=fake.url, project_id=fake.project_id,
                                                              machine="lit-l4-1"), owner="repo-a")
    ref = adapter.launch(LaunchSpec(job="j", run_id="r", epoch=1, command=["sleep", "30"],
                                    secret_env={"HF_TOKEN": "hf-value"}))
    adapter.terminate(ref)
    sent = {(m, p.split("?")[0]): json.loads(b) for m, p, b in fake.requests if b}
    create = sent[("POST", f"/v1/projects/{fake.project_id}/jobs")]
    strict(sdk, "JobsServiceCreateJobBody", create)
    assert {"name": "HF_TOKEN", "fromSecret": "HF_TOKEN"} in create["spec"]["env"]
    assert "hf-value" not in json.dumps(create)
    strict(sdk, "JobsServiceUpdateJobBody", sent[("PUT", f"/v1/projects/{fake.project_id}/jobs/{ref.id}")])
    base = f"{fake.url}/v1/projects/{fake.project_id}"
    answers = {f"/jobs/{ref.id}": "V1Job", "/jobs": "V1ListJobsResponse", f"/jobs/find?name={create['name']}": "V1Job",
               f"/jobs/{ref.id}/page-logs": "V1JobLogsResponse", "/billing/balance": "V1GetProjectBalanceResponse",
               "/secrets": "V1ListSecretsResponse"}
    for path, kind in answers.items():
        asked = urllib.request.Request(base + path, headers={"Authorization": basic_header()})
        with urllib.request.urlopen(asked) as answer:
            strict(sdk, kind, json.loads(answer.read()), path)
