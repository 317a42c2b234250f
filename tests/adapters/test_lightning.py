"""The Lightning AI adapter against the fake Lightning server (tests/fakes/lightning.py), one test per
fault the server injects: what the adapter reports, in the planner's words. The common behaviour
(launch, observe, stop, logs, owners) is in the contract suite (tests/adapters/test_contract.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from adapters import compute
from adapters.compute import LaunchSpec, ProviderConfigError, ProviderUnavailable, WorkerPhase, WorkerRef, WorkerState
from adapters.hosted import STORAGE_UNREACHABLE
from adapters.lightning import LightningAdapter, auth_header, job_name, machine_capacity
from desired.models import Capacity, LightningSettings
from tests.adapters.test_contract import ended, running, wait_state
from tests.fakes.lightning import API_KEY, USER_ID, FakeLightning, basic_header

SLEEP = "import sys, time; print('started', flush=True); time.sleep(float(sys.argv[1]))"


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLightning]:
    server = FakeLightning(tmp_path / "machines", stop_grace=3.0)
    monkeypatch.setenv("LIGHTNING_USER_ID", USER_ID)
    monkeypatch.setenv("LIGHTNING_API_KEY", API_KEY)
    monkeypatch.delenv("LIGHTNING_AUTH_TOKEN", raising=False)
    yield server
    server.close()


def make(fake: FakeLightning, **settings: object) -> LightningAdapter:
    values: dict = {"api_url": fake.url, "project_id": fake.project_id, "machine": "lit-t4-1",
                    "request_timeout_seconds": 5, **settings}
    return LightningAdapter("lightning", LightningSettings(**values), owner="repo-a")


def spec(*args: str, code: str = SLEEP, job: str = "train", epoch: int = 1, env: dict | None = None,
         secrets: dict | None = None) -> LaunchSpec:
    return LaunchSpec(job=job, run_id="r-1", epoch=epoch, command=[sys.executable, "-c", code, *args],
                      env=env or {}, secret_env=secrets or {})


def wait(adapter: LightningAdapter, ref: WorkerRef, accept: Callable[[WorkerState], bool],
         timeout: float = 30) -> WorkerState:
    return wait_state(adapter, ref, accept, timeout, every=0.1)


def started(adapter: LightningAdapter, ref: WorkerRef) -> None:
    wait(adapter, ref, running)
    deadline = time.monotonic() + 20
    while "started" not in adapter.logs(ref, 20) and time.monotonic() < deadline:
        time.sleep(0.1)


# ---- launch -----------------------------------------------------------------------------------


def test_out_of_capacity_is_unavailable_not_a_configuration_error(fake: FakeLightning) -> None:
    fake.out_of_capacity = True
    with pytest.raises(ProviderUnavailable, match=r"lightning provider 'lightning' cannot start a lit-t4-1.*capacity"):
        make(fake).launch(spec("1"))
    assert fake.jobs == {}


def test_the_create_request_matches_lightning_s_job_body(fake: FakeLightning) -> None:
    adapter = make(fake, interruptible=True, image="pytorch/pytorch:latest")
    adapter.launch(spec("1", env={"PLAIN": "x"}, secrets={"HF_TOKEN": "hf-secret-value"}))
    body = json.loads(next(b for m, p, b in fake.requests if m == "POST"))
    assert set(body) == {"name", "spec"} and body["name"] == "rc-repo-a-train-r-1-e1"
    s = body["spec"]
    assert (s["instanceName"], s["spot"], s["maxRunAttempts"], s["image"]) == ("lit-t4-1", True, 1,
                                                                              "pytorch/pytorch:latest")
    assert {"name": "HF_TOKEN", "fromSecret": "HF_TOKEN"} in s["env"]
    assert all(set(e) in ({"name", "value"}, {"name", "fromSecret"}) for e in s["env"])


def test_a_studio_job_runs_the_bootstrap_under_bash_set_e(fake: FakeLightning, tmp_path: Path) -> None:
    adapter = make(fake, cloudspace_id="cs-123")
    out = tmp_path / "argv.json"
    code = "import json, sys; open(sys.argv[1], 'w').write(json.dumps(sys.argv[2:]))"
    hostile = ["it's", '"q"', "$(id)", "`x`", "a\nb", "\\", "!*"]
    ref = adapter.launch(spec(str(out), *hostile, code=code))
    body = json.loads(next(b for m, p, b in fake.requests if m == "POST"))
    assert body["spec"]["cloudspaceId"] == "cs-123" and "image" not in body["spec"]
    assert wait(adapter, ref, ended).exit_code == 0
    assert json.loads(out.read_text()) == hostile
    assert len(body["spec"]["command"]) < 100_000, "sh -c takes at most 128 KB in one argument"


def _code_repo(tmp_path: Path) -> str:
    repo = tmp_path / "code"
    repo.mkdir()
    (repo / "main.py").write_text("print('code fetched', flush=True)\n")
    for step in (["init", "-q"], ["add", "main.py"],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "code"]):
        subprocess.run(["git", "-C", str(repo), *step], check=True)
    return f"file://{repo}"


def test_a_job_whose_code_is_a_git_url_fetches_it_on_the_default_image(fake: FakeLightning, tmp_path: Path) -> None:
    adapter = make(fake)
    launch = replace(spec(), command=[sys.executable, "main.py"], code_git=_code_repo(tmp_path))
    ref = adapter.launch(launch)
    state = wait(adapter, ref, ended)
    assert (state.phase, state.exit_code) == (WorkerPhase.EXITED, 0), state
    assert "code fetched" in adapter.logs(ref, 50)


def test_an_image_without_git_ends_the_job_with_one_clear_reason(fake: FakeLightning, tmp_path: Path) -> None:
    adapter = make(fake, image="python:3.11-slim")
    launch = replace(spec(), command=[sys.executable, "main.py"], code_git=_code_repo(tmp_path))
    state = wait(adapter, adapter.launch(launch), ended)
    assert state.phase is WorkerPhase.EXITED and state.exit_code == 1
    assert "the image has no git" in state.detail and "code.git" in state.detail


def test_429_is_honoured_with_its_retry_after(fake: FakeLightning) -> None:
    fake.fail_next("GET", r"/jobs$", 429, headers={"Retry-After": "1"})
    began = time.monotonic()
    assert make(fake).observe() == {}
    assert time.monotonic() - began >= 0.9


@pytest.mark.parametrize("fault", ["500", "garbage"])
def test_a_server_error_or_garbage_json_is_unavailable(fake: FakeLightning, fault: str) -> None:
    if fault == "500":
        fake.fail_next("GET", r"/jobs$", 500)
    else:
        fake.fail_next("GET", r"/jobs$", 200, body=b"<html>upstream hiccup</html>")
    with pytest.raises(ProviderUnavailable, match="lightning provider 'lightning'"):
        make(fake).observe()


def test_a_create_that_timed_out_after_acting_is_adopted_by_the_next_launch(fake: FakeLightning) -> None:
    adapter = make(fake, request_timeout_seconds=1)
    fake.act_then_stall(3)
    with pytest.raises(ProviderUnavailable, match="may have acted"):
        adapter.launch(spec("30"))
    ref = make(fake).launch(spec("30"))
    assert len(fake.jobs) == 1 and ref.id in fake.jobs
    assert list(adapter.observe()) == [ref]


def test_a_name_that_exists_after_all_is_adopted_and_a_stranger_s_is_refused(fake: FakeLightning) -> None:
    adapter = make(fake)
    ref = adapter.launch(spec("30"))
    fake.fail_next("GET", r"/jobs/find$", 404, body={"code": 5, "message": "job not found", "details": []})
    assert make(fake).launch(spec("30")) == ref and len(fake.jobs) == 1  # create said 409: looked up again
    stranger = {"name": "rc-repo-a-train-r-1-e2", "spec": {"command": "sleep 1", "image": "busybox"}}
    httpx.post(f"{fake.url}/v1/projects/{fake.project_id}/jobs", json=stranger,
               headers={"Authorization": basic_header()}).raise_for_status()
    with pytest.raises(ProviderConfigError, match="does not carry our labels already has the name"):
        adapter.launch(spec("30", epoch=2))


def test_lightning_cloud_url_is_the_base_when_the_manifest_sets_none(
        fake: FakeLightning, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIGHTNING_CLOUD_URL", fake.url)
    settings = LightningSettings(project_id=fake.project_id)
    assert LightningAdapter("lightning", settings, owner="repo-a").observe() == {}
    explicit = LightningSettings(api_url="http://127.0.0.1:9", project_id=fake.project_id)
    assert LightningAdapter("lightning", explicit, owner="repo-a").base_url == "http://127.0.0.1:9"


# ---- credentials ------------------------------------------------------------------------------


def test_missing_credentials_are_one_sentence_naming_lightning_and_where_they_are_read(
        fake: FakeLightning, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("LIGHTNING_USER_ID", "LIGHTNING_API_KEY", "LIGHTNING_AUTH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LIGHTNING_CREDENTIAL_PATH", str(tmp_path / "none.json"))
    with pytest.raises(ProviderConfigError) as caught:
        make(fake).observe()
    message = str(caught.value)
    assert message.startswith("lightning") and "LIGHTNING_API_KEY" in message and "credentials.json" in message
    assert message.count(". ") == 0 and "\n" not in message


def test_refused_credentials_name_where_they_are_read_and_never_the_key(
        fake: FakeLightning, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIGHTNING_API_KEY", "wrong-key-0123456789")
    with pytest.raises(ProviderConfigError) as caught:
        make(fake).launch(spec("1"))
    message = str(caught.value)
    assert "lightning provider 'lightning'" in message and "refused" in message and "LIGHTNING_API_KEY" in message
    assert "wrong-key-0123456789" not in message and USER_ID not in message


def test_credentials_follow_lightning_s_rules(tmp_path: Path) -> None:
    assert auth_header({"LIGHTNING_USER_ID": "u", "LIGHTNING_API_KEY": "k"}) == "Basic dTpr"
    assert auth_header({"LIGHTNING_API_KEY": "k"}) == "Bearer k"
    assert auth_header({"LIGHTNING_API_KEY": "k", "LIGHTNING_AUTH_TOKEN": "jwt"}) == "Bearer jwt"
    path = tmp_path / "credentials.json"
    path.write_text(json.dumps({"user_id": "u", "api_key": "k", "auth_token": None}))
    assert auth_header({"LIGHTNING_CREDENTIAL_PATH": str(path)}) == "Basic dTpr"
    (tmp_path / ".lightning").mkdir()
    (tmp_path / ".lightning" / "credentials.json").write_text(json.dumps({"api_key": "k2"}))
    assert auth_header({"HOME": str(tmp_path)}) == "Bearer k2"


def test_a_credentials_file_is_enough(fake: FakeLightning, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("LIGHTNING_USER_ID", "LIGHTNING_API_KEY"):
        monkeypatch.delenv(name)
    path = tmp_path / "creds.json"
    path.write_text(json.dumps({"user_id": USER_ID, "api_key": API_KEY}))
    monkeypatch.setenv("LIGHTNING_CREDENTIAL_PATH", str(path))
    assert make(fake).observe() == {}


# ---- money ------------------------------------------------------------------------------------


def test_the_balance_is_read_as_an_allowance_in_credits(fake: FakeLightning) -> None:
    fake.set_balance(12.5)
    allowance = make(fake, min_credits=2).allowance()
    assert allowance == compute.Allowance(unit="credits", remaining=12.5, minimum=2.0, applies_to_cpu=True)


def test_credits_running_out_mid_job_end_the_worker_with_the_reason(fake: FakeLightning) -> None:
    adapter = make(fake)
    ref = adapter.launch(spec("60"))
    started(adapter, ref)
    fake.set_balance(0)
    state = wait(adapter, ref, ended)
    assert state.phase is WorkerPhase.PREEMPTED, state
    assert "credits ran out" in state.detail and state.provider_state.startswith("stopped")
    assert (adapter.cost(ref) or 0) > 0
    assert adapter.allowance().remaining == 0
    with pytest.raises(ProviderUnavailable, match="insufficient balance"):
        adapter.launch(spec("1", job="next"))


# ---- interruptions ----------------------------------------------------------------------------


def test_an_interruption_with_notice_is_shown_then_reported_preempted(fake: FakeLightning) -> None:
    adapter = make(fake)
    ref = adapter.launch(spec("60"))
    started(adapter, ref)
    fake.interrupt(ref.id, notice_seconds=3)
    noticed = adapter.observe()[ref]
    assert noticed.phase is WorkerPhase.RUNNING and noticed.provider_state == "running (interruption notice)"
    assert "taken away" in noticed.detail
    state = wait(adapter, ref, ended)
    assert state.phase is WorkerPhase.PREEMPTED and "interrupted" in state.detail, state


def test_an_interruption_without_notice_is_reported_preempted(fake: FakeLightning) -> None:
    adapter = make(fake)
    ref = adapter.launch(spec("60"))
    started(adapter, ref)
    fake.interrupt(ref.id)
    state = wait(adapter, ref, ended)
    assert state.phase is WorkerPhase.PREEMPTED and state.provider_state.startswith("failed"), state
    assert state.ended_at is not None


def test_a_restart_by_lightning_is_still_running_at_the_same_epoch(fake: FakeLightning) -> None:
    """maxRunAttempts is 1, so Lightning should not restart; should it, the worker runs on."""
    adapter = make(fake)
    ref = adapter.launch(spec("60"))
    started(adapter, ref)
    fake.jobs[ref.id].spec["maxRunAttempts"] = 2  # as if Lightning ignored our 1
    fake.interrupt(ref.id)
    state = wait(adapter, ref, lambda s: "restarted" in s.detail)
    assert state.phase is WorkerPhase.RUNNING and list(adapter.observe()) == [ref]


# ---- secrets, storage, logs -------------------------------------------------------------------


def test_secrets_reach_the_worker_from_the_teamspace_and_never_travel_or_show(
        fake: FakeLightning, tmp_path: Path) -> None:
    secret = "tok-9c1d-never-shown"
    fake.set_secret("API_TOKEN", secret)
    out = tmp_path / "seen"
    code = "import os, sys; open(sys.argv[1], 'w').write(os.environ['API_TOKEN']); print('done')"
    adapter = make(fake)
    ref = adapter.launch(spec(str(out), code=code, secrets={"API_TOKEN": secret}))
    assert wait(adapter, ref, ended).exit_code == 0
    assert out.read_text() == secret
    assert all(secret.encode() not in body for _, _, body in fake.requests)
    assert secret not in adapter.logs(ref, 1000) and "done" in adapter.logs(ref, 1000)


def test_a_worker_that_cannot_reach_storage_ends_with_the_bootstrap_s_reason(fake: FakeLightning) -> None:
    fake.set_secret("AWS_ACCESS_KEY_ID", "a")
    fake.set_secret("AWS_SECRET_ACCESS_KEY", "b")
    env = {"RECONCILER_RUN_URI": "s3://no-such-bucket/runs/train/r-1", "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9"}
    adapter = make(fake)
    ref = adapter.launch(spec("1", env=env, secrets={"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}))
    state = wait(adapter, ref, ended, timeout=120)
    assert (state.phase, state.exit_code) == (WorkerPhase.EXITED, STORAGE_UNREACHABLE), state
    assert "cannot reach run storage s3://no-such-bucket" in state.detail


def test_an_ended_job_s_logs_are_read_once(fake: FakeLightning) -> None:
    adapter = make(fake)
    ref = adapter.launch(spec("0"))
    wait(adapter, ref, ended)
    for _ in range(3):
        adapter.observe()
        adapter.logs(ref, 5)
    assert sum(1 for m, p, _ in fake.requests if p.endswith("/page-logs")) == 1


# ---- names and machines -----------------------------------------------------------------------


def test_job_names_are_deterministic_and_cut_with_a_hash() -> None:
    assert job_name("repo-a", "train", "r-1", 3) == "rc-repo-a-train-r-1-e3"
    long = job_name("repo-a", "x" * 80, "r-1", 3)
    assert len(long) == 63 and long == job_name("repo-a", "x" * 80, "r-1", 3) != job_name("repo-a", "x" * 80, "r-1", 4)


def test_capacity_is_read_from_the_machine_slug() -> None:
    assert machine_capacity("lit-t4-1") == Capacity(gpus=1, gpu_models=["T4"])
    assert machine_capacity("lit-a100-4") == Capacity(gpus=4, gpu_models=["A100"])
    assert machine_capacity("lit-rtx-6000-pro-2") == Capacity(gpus=2, gpu_models=["RTX-6000-PRO"])
    assert machine_capacity("cpu-4") == Capacity(cpus=4, gpus=0)
    assert machine_capacity("data-prep-mid") is None and machine_capacity("lit-zz9-1") is None


def test_the_fake_runs_standalone_and_prints_its_url(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "tests.fakes.lightning", "--root", str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        answer = httpx.get(f"{url}/v1/projects/proj-fake-01/billing/balance", headers={"Authorization": basic_header()})
        assert answer.status_code == 200 and answer.json()["balance"] > 0
    finally:
        proc.terminate()
        proc.wait(10)
