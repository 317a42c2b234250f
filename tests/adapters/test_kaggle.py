"""The Kaggle adapter against the fake Kaggle API (tests/fakes/kaggle.py), one fault at a time.

Every test runs the real adapter over real sockets against a server that speaks Kaggle's documented
RPC shape; kernels run as real local processes with the real bootstrap and SDK. What the live
service does beyond the reference notes (exact failure messages, the terminal status at the session
limit) is not verified here; see the README's Kaggle section.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from adapters.compute import LaunchSpec, ProviderConfigError, ProviderUnavailable, WorkerPhase, WorkerState
from adapters.hosted import SECRET_NOT_ATTACHED, STORAGE_UNREACHABLE
from adapters.kaggle import KaggleAdapter, kernel_slug, kernel_state, log_attempt, log_text, read_credentials, seconds
from adapters.wire import Numbers
from desired.models import KaggleSettings
from tests.adapters.test_contract import PROBE, ended, probe_records, running, wait_state
from tests.fakes.kaggle import FakeKaggle


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKaggle]:
    server = FakeKaggle(tmp_path / "kaggle").start()
    for name in ("KAGGLE_USERNAME", "KAGGLE_KEY", "KAGGLE_CONFIG_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KAGGLE_API_TOKEN", server.token)
    yield server
    server.stop()


def adapter(fake: FakeKaggle, owner: str = "repo-a", **settings: object) -> KaggleAdapter:
    values: dict[str, object] = {"api_url": fake.url, "username": fake.username, "request_timeout_seconds": 5}
    values.update(settings)
    return KaggleAdapter("kaggle", KaggleSettings(**values), owner=owner)  # type: ignore[arg-type]


def probe(tmp_path: Path, name: str = "p", *, gpus: int = 0, epoch: int = 1, secrets: dict[str, str] | None = None,
          **env: str) -> LaunchSpec:
    plain = {"PROBE_OUT": str(tmp_path / f"{name}.jsonl"), **{f"PROBE_{k.upper()}": v for k, v in env.items()}}
    return LaunchSpec(job=name, run_id="r-1", epoch=epoch, command=[sys.executable, "-u", PROBE], env=plain,
                      secret_env=secrets or {}, gpus=gpus)


def slug(ref_id: str) -> str:
    return ref_id.rsplit("/", 1)[1]


def job_kernel(name: str = "p", owner: str = "repo-a") -> str:
    return kernel_slug("kaggle", owner, name)


# ---- launch -----------------------------------------------------------------------------------


def test_launch_pushes_a_private_script_kernel_with_the_settings(fake: FakeKaggle, tmp_path: Path) -> None:
    kaggle = adapter(fake, session_hours=2, enable_internet=False, machine_shape="NvidiaL4")
    cpu, gpu = kaggle.launch(probe(tmp_path, "cpu")), kaggle.launch(probe(tmp_path, "gpu", gpus=1))
    sent = fake.kernels[slug(cpu.id)].request
    assert sent["slug"] == cpu.id and sent["newTitle"] == slug(cpu.id) and len(sent["newTitle"]) >= 5
    assert (sent["language"], sent["kernelType"], sent["isPrivate"]) == ("python", "script", True)
    assert sent["sessionTimeoutSeconds"] == 7200 and sent["enableInternet"] is False  # optional: false is sent
    assert "machineShape" not in sent
    assert fake.kernels[slug(gpu.id)].request["machineShape"] == "NvidiaL4"
    assert "reconciler bootstrap for kaggle" in sent["text"]


def test_a_first_launch_reads_kaggles_403_for_the_missing_kernel_as_none_and_pushes(
        fake: FakeKaggle, tmp_path: Path) -> None:
    kaggle = adapter(fake)
    ref = kaggle.launch(probe(tmp_path, "first"))  # GetKernel of a kernel not there yet: Kaggle's 403
    assert fake.calls.index("GetKernel") < fake.calls.index("SaveKernel")
    assert fake.versions(slug(ref.id)) == 1


def test_slugs_are_one_per_job_valid_short_deterministic_and_differ_by_owner_and_provider() -> None:
    one = kernel_slug("kaggle", "Repo_A", "Train.Big_Model-with-a-long-name-that-goes-on")
    assert one == kernel_slug("kaggle", "Repo_A", "Train.Big_Model-with-a-long-name-that-goes-on")
    assert one != kernel_slug("kaggle", "repo_a", "Train.Big_Model-with-a-long-name-that-goes-on")
    assert one != kernel_slug("kaggle-2", "Repo_A", "Train.Big_Model-with-a-long-name-that-goes-on")
    assert one.startswith("rc-repo-a-train-big-model-") and len(one) <= 49
    assert all(c.isdigit() or c == "-" or "a" <= c <= "z" for c in one) and "--" not in one


def test_a_full_batch_gpu_session_count_is_unavailable_not_a_config_error(fake: FakeKaggle, tmp_path: Path) -> None:
    fake.max_gpu_sessions = 0
    with pytest.raises(ProviderUnavailable, match="Maximum batch GPU session count of 0 reached") as err:
        adapter(fake).launch(probe(tmp_path, gpus=1))
    assert not isinstance(err.value, ProviderConfigError)
    assert fake.kernels == {}


def test_a_push_error_answered_with_http_200_is_an_error_in_kaggles_words(fake: FakeKaggle, tmp_path: Path) -> None:
    fake.push_error("Notebook title must be at least 5 characters")
    with pytest.raises(ProviderConfigError, match="kaggle provider 'kaggle'.*Notebook title must be at least 5"):
        adapter(fake).launch(probe(tmp_path))


def test_a_push_that_times_out_after_acting_is_adopted_not_repeated(fake: FakeKaggle, tmp_path: Path) -> None:
    spec = probe(tmp_path, sleep="30")
    fake.push_timeout(3)
    with pytest.raises(ProviderUnavailable, match="may have acted"):
        adapter(fake, request_timeout_seconds=1).launch(spec)
    ref = adapter(fake).launch(spec)  # the next tick, from a fresh adapter: looked up, found, adopted
    assert fake.pushes == 1 and fake.versions(slug(ref.id)) == 1
    wait_state(adapter(fake), ref, running)
    time.sleep(1)
    assert len(probe_records(spec)) == 1


# ---- the HTTP convention over real sockets ----------------------------------------------------


def test_429_is_honoured_after_retry_after(fake: FakeKaggle) -> None:
    fake.fail_next("GetAcceleratorQuotaStatistics", 429, retry_after="1")
    started = time.monotonic()
    assert adapter(fake).allowance().total == 30
    assert time.monotonic() - started >= 1.0
    assert fake.calls.count("GetAcceleratorQuotaStatistics") == 1  # the 429 never reached the RPC


def test_a_500_is_unavailable(fake: FakeKaggle) -> None:
    fake.fail_next("ListKernels", 500)
    with pytest.raises(ProviderUnavailable, match="kaggle provider 'kaggle' is unavailable.*HTTP 500"):
        adapter(fake).observe()


def test_garbage_json_is_unavailable(fake: FakeKaggle) -> None:
    fake.fail_next("ListKernels", garbage=True)
    with pytest.raises(ProviderUnavailable, match="not JSON"):
        adapter(fake).observe()


def test_a_redirect_is_unavailable_and_a_running_kernel_is_not_lost(fake: FakeKaggle, tmp_path: Path) -> None:
    """A 3xx with an empty body once read as "no kernels": every running worker was lost."""
    kaggle = adapter(fake)
    ref = kaggle.launch(probe(tmp_path, sleep="60"))
    assert ref in kaggle.observe()
    fake.fail_next("ListKernels", 302)
    with pytest.raises(ProviderUnavailable, match="answered HTTP 302 to https://www.kaggle.com/account/login"):
        kaggle.observe()
    assert kaggle.observe()[ref].phase in (WorkerPhase.PENDING, WorkerPhase.RUNNING)


def test_a_quota_that_is_not_a_duration_refuses_the_answer(fake: FakeKaggle, caplog: pytest.LogCaptureFixture) -> None:
    fake.set_quota(-5)
    with caplog.at_level("WARNING", logger="reconciler"), pytest.raises(ProviderUnavailable, match="not a duration"):
        adapter(fake).allowance()
    assert [r.getMessage() for r in caplog.records] == [
        "kaggle provider 'kaggle' answered a bad gpuQuota totalTimeAllowed: '-18000' is not a number from 0 to "
        "31622400; what carried it is refused"]


# ---- credentials ------------------------------------------------------------------------------


def test_missing_credentials_are_one_sentence_naming_kaggle_and_where_they_are_read(
        fake: FakeKaggle, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAGGLE_API_TOKEN")
    with pytest.raises(ProviderConfigError) as err:
        adapter(fake).observe()
    text = str(err.value)
    assert text.startswith("kaggle provider 'kaggle': no Kaggle credentials found")
    for place in ("$KAGGLE_API_TOKEN", "~/.kaggle/access_token", "$KAGGLE_KEY", "kaggle.json"):
        assert place in text
    assert text.count(". ") == 0 and "\n" not in text


def test_a_refused_token_names_kaggle_and_the_places_and_never_the_token(
        fake: FakeKaggle, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAGGLE_API_TOKEN", "kt-wrong-token-1234")
    with pytest.raises(ProviderConfigError) as err:
        adapter(fake).observe()
    text = str(err.value)
    assert "kaggle provider 'kaggle'" in text and "refused" in text and "$KAGGLE_API_TOKEN" in text
    assert "kt-wrong-token-1234" not in text and fake.token not in text


def test_credentials_are_read_from_kaggles_standard_places(fake: FakeKaggle, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(fake.token + "\n")
    assert read_credentials({"KAGGLE_API_TOKEN": str(token_file)}).header == f"Bearer {fake.token}"  # type: ignore[union-attr]
    home = tmp_path / "home2"
    (home / ".kaggle").mkdir(parents=True)
    (home / ".kaggle" / "access_token").write_text("from-file")
    assert read_credentials({"HOME": str(home)}).header == "Bearer from-file"  # type: ignore[union-attr]
    legacy = read_credentials({"HOME": str(tmp_path), "KAGGLE_USERNAME": "u", "KAGGLE_KEY": "k"})
    assert legacy is not None and legacy.username == "u"
    assert legacy.header == "Basic " + base64.b64encode(b"u:k").decode()
    assert read_credentials({"HOME": str(tmp_path / "nobody")}) is None
    # kaggle.json in $KAGGLE_CONFIG_DIR, HTTP Basic, and the username taken from it
    config = tmp_path / "config"
    config.mkdir()
    (config / "kaggle.json").write_text(json.dumps({"username": fake.username, "key": fake.key}))
    monkeypatch.delenv("KAGGLE_API_TOKEN")
    monkeypatch.setenv("KAGGLE_CONFIG_DIR", str(config))
    assert adapter(fake, username=None).observe() == {}


def test_a_bare_token_finds_its_user_by_introspection(fake: FakeKaggle, tmp_path: Path) -> None:
    kaggle = adapter(fake, username=None)
    ref = kaggle.launch(probe(tmp_path))
    assert ref.id.startswith(f"{fake.username}/") and "IntrospectToken" in fake.calls


# ---- state ------------------------------------------------------------------------------------


def test_a_status_without_status_is_pending(fake: FakeKaggle, tmp_path: Path) -> None:
    fake.queue_delay = 60
    ref = adapter(fake).launch(probe(tmp_path))
    raw = httpx.post(f"{fake.url}/v1/kernels.KernelsApiService/GetKernelSessionStatus",
                     json={"userName": fake.username, "kernelSlug": slug(ref.id)},
                     headers={"Authorization": f"Bearer {fake.token}"}).json()
    assert raw == {}  # QUEUED is the default, left out on the wire
    state = adapter(fake).observe()[ref]
    assert (state.phase, state.provider_state) == (WorkerPhase.PENDING, "QUEUED")


def test_status_lag_delays_the_end_but_does_not_change_it(fake: FakeKaggle, tmp_path: Path) -> None:
    kaggle = adapter(fake)
    ref = kaggle.launch(probe(tmp_path, sleep="1"))
    wait_state(kaggle, ref, running)
    fake.lag_status(5)
    time.sleep(1.5)
    lagged = [kaggle.observe()[ref].phase for _ in range(5)]
    assert lagged == [WorkerPhase.RUNNING] * 5
    assert (kaggle.observe()[ref].phase, kaggle.observe()[ref].exit_code) == (WorkerPhase.EXITED, 0)


def test_the_session_limit_kills_the_kernel_and_is_reported_as_session_limit(fake: FakeKaggle, tmp_path: Path) -> None:
    fake.session_limit = 2
    kaggle = adapter(fake)
    ref = kaggle.launch(probe(tmp_path, sleep="60"))
    state = wait_state(kaggle, ref, ended)
    assert state.phase is WorkerPhase.SESSION_LIMIT and state.provider_state == "ERROR", state
    assert "max allowed execution duration" in state.detail


def test_an_exit_75_near_the_session_end_is_a_session_end_and_far_from_it_is_not(fake: FakeKaggle,
                                                                                 tmp_path: Path) -> None:
    near = adapter(fake, session_hours=5 / 3600, save_margin_seconds=1)
    state = wait_state(near, near.launch(probe(tmp_path, "near", exit="75")), ended)
    assert (state.phase, state.exit_code) == (WorkerPhase.SESSION_LIMIT, 75), state
    far = adapter(fake)  # twelve hours left: a stop notice, not the session's end
    state = wait_state(far, far.launch(probe(tmp_path, "far", exit="75")), ended)
    assert (state.phase, state.exit_code) == (WorkerPhase.EXITED, 75), state


def test_kaggle_states_map_onto_worker_states() -> None:
    assert kernel_state("", "", "", 600).phase is WorkerPhase.PENDING
    assert kernel_state("NEW_SCRIPT", "", "", 600).phase is WorkerPhase.PENDING
    assert kernel_state("RUNNING", "", "", 600).phase is WorkerPhase.RUNNING
    cancelled = kernel_state("CANCEL_ACKNOWLEDGED", "", "", 600)
    assert cancelled.phase is WorkerPhase.PREEMPTED and "not by the reconciler" in cancelled.detail
    assert kernel_state("COMPLETE", "", "", 600) == WorkerState(WorkerPhase.EXITED, 0, "COMPLETE")
    assert kernel_state("ERROR", "Kernel ran out of time limit", "", 600).phase is WorkerPhase.SESSION_LIMIT
    failed = kernel_state("ERROR", "Something broke", "", 600)
    assert (failed.phase, failed.exit_code, failed.detail) == (WorkerPhase.EXITED, 1, "Something broke")
    record = 'reconciler-bootstrap: exit {"code": -11, "signal": "SIGSEGV"}\n'
    crashed = kernel_state("ERROR", "whatever", record, 600)
    assert (crashed.exit_code, crashed.signal) == (-11, "SIGSEGV")


def test_kaggles_json_log_becomes_plain_lines_and_durations_parse() -> None:
    raw = json.dumps([{"stream_name": "stdout", "time": 0.5, "data": "a\n"},
                      {"stream_name": "stderr", "time": 1.0, "data": "b\n"}])
    assert log_text(raw) == "a\nb\n" and log_text("plain text") == "plain text" and log_text(None) == ""
    numbers = Numbers("kaggle provider 'k'")
    assert seconds("108000s", "t", numbers) == 108000 and seconds("1.5s", "t", numbers) == 1.5
    assert seconds(None, "t", numbers) == 0 and seconds(7, "t", numbers) == 7
    for bad in ("x", "nans", "infs", "-1s", "1_0s", True):
        with pytest.raises(ProviderUnavailable, match="not a duration"):
            seconds(bad, "t", numbers)


def test_logs_come_from_the_kernels_output_and_are_read_once_when_finished(fake: FakeKaggle, tmp_path: Path) -> None:
    kaggle = adapter(fake)
    ref = kaggle.launch(probe(tmp_path, lines="20"))
    wait_state(kaggle, ref, ended)
    reads = fake.calls.count("ListKernelSessionOutput")
    tail = kaggle.logs(ref, 3).splitlines()
    assert tail[-1].startswith("reconciler-bootstrap: exit") and tail[0] == "line 18"
    kaggle.observe()
    assert fake.calls.count("ListKernelSessionOutput") == reads


def test_a_log_of_a_kernel_whose_output_spans_pages_is_read_whole_from_the_first_page(
        fake: FakeKaggle, tmp_path: Path) -> None:
    """Kaggle pages a version's output files, not its log: the adapter reads the log field of the
    first page (no page token), however many files follow, and the exit record at its end."""
    kaggle = adapter(fake)
    write = "for i in range(45): open(f'f{i:02}.txt', 'w').write('x')\nfor i in range(400): print('line', i)"
    ref = kaggle.launch(LaunchSpec(job="paged", run_id="r-1", epoch=1, command=[sys.executable, "-c", write]))
    state = wait_state(kaggle, ref, ended)
    kernel = fake.kernels[slug(ref.id)]
    assert len(fake.output_files(kernel)) == 45 and state.exit_code == 0
    text = kaggle.logs(ref, 1000)
    assert "line 0\n" in text and "line 399\n" in text
    assert text.splitlines()[-1].startswith("reconciler-bootstrap: exit")
    asked = [r for _, m, r, _ in fake.exchanges if m == "ListKernelSessionOutput"]
    assert asked and not any("pageToken" in r for r in asked)


# ---- secrets and storage ----------------------------------------------------------------------


def test_the_bootstrap_reads_secrets_attached_to_the_jobs_kernel(fake: FakeKaggle, tmp_path: Path) -> None:
    kaggle = adapter(fake)
    spec = probe(tmp_path, secrets={"PROBE_SECRET": "never-sent"})  # the daemon's value never travels
    fake.secrets["PROBE_SECRET"] = "held-by-kaggle"
    fake.attach(job_kernel("p"), "PROBE_SECRET")
    ref = kaggle.launch(spec)
    assert wait_state(kaggle, ref, ended).exit_code == 0
    assert probe_records(spec)[0]["env"]["PROBE_SECRET"] == "held-by-kaggle"
    assert "never-sent" not in fake.kernels[slug(ref.id)].text


def test_a_secret_attached_to_another_kernel_is_not_seen(fake: FakeKaggle, tmp_path: Path) -> None:
    fake.secrets["PROBE_SECRET"] = "held-by-kaggle"
    fake.attach(job_kernel("other-job"), "PROBE_SECRET")
    kaggle = adapter(fake)
    state = wait_state(kaggle, kaggle.launch(probe(tmp_path, secrets={"PROBE_SECRET": ""})), ended)
    assert state.exit_code == SECRET_NOT_ATTACHED, state


def test_a_secret_not_attached_fails_once_naming_the_secret_and_the_kernels_url(fake: FakeKaggle,
                                                                               tmp_path: Path) -> None:
    fake.secrets["MISSING_ONE"] = "exists-at-account-level"  # created, never attached
    kaggle = adapter(fake)
    ref = kaggle.launch(probe(tmp_path, secrets={"MISSING_ONE": ""}))
    state = wait_state(kaggle, ref, ended)
    assert (state.phase, state.exit_code) == (WorkerPhase.EXITED, SECRET_NOT_ATTACHED), state
    url = f"https://www.kaggle.com/code/{fake.username}/{job_kernel('p')}"
    assert f"attach secret MISSING_ONE to kernel {url} in the Kaggle editor (Add-ons → Secrets)" in state.detail
    assert "the next attempt uses it" in state.detail and slug(ref.id) == job_kernel("p")


def test_secrets_attached_once_serve_every_later_attempt(fake: FakeKaggle, tmp_path: Path) -> None:
    fake.secrets["PROBE_SECRET"] = "attached-once"
    kaggle = adapter(fake)
    first = kaggle.launch(probe(tmp_path, secrets={"PROBE_SECRET": ""}))
    assert wait_state(kaggle, first, ended).exit_code == SECRET_NOT_ATTACHED
    fake.attach(slug(first.id), "PROBE_SECRET")  # once, to the kernel the failure named
    for epoch in (2, 3):
        spec = probe(tmp_path, epoch=epoch, secrets={"PROBE_SECRET": ""})
        ref = kaggle.launch(spec)
        assert ref.id == first.id and wait_state(kaggle, ref, ended).exit_code == 0
        assert probe_records(spec)[-1]["env"]["PROBE_SECRET"] == "attached-once"
    assert fake.versions(slug(first.id)) == 3 and len(fake.kernels) == 1


# ---- attempts as versions of the job's kernel ---------------------------------------------------


def test_a_second_attempt_is_a_new_version_of_the_same_kernel_and_the_first_is_no_longer_reported(
        fake: FakeKaggle, tmp_path: Path) -> None:
    kaggle = adapter(fake)
    first = kaggle.launch(probe(tmp_path))
    assert wait_state(kaggle, first, ended).exit_code == 0
    second = kaggle.launch(probe(tmp_path, epoch=2, sleep="30"))
    assert slug(second.id) == slug(first.id) and fake.versions(slug(first.id)) == 2 and fake.pushes == 2
    assert second != first and (second.run_id, second.epoch) == ("r-1", 2)
    seen = wait_state(kaggle, second, running)
    assert seen.phase is WorkerPhase.RUNNING
    for view in (kaggle, adapter(fake)):  # this process, and a fresh one after a restart
        workers = view.observe()
        assert list(workers) == [second] and workers[second].phase is WorkerPhase.RUNNING
    assert kaggle.logs(first, 5).splitlines()[-1].startswith("reconciler-bootstrap: exit")  # kept once final


def test_a_new_attempt_is_not_pushed_over_a_version_still_running(fake: FakeKaggle, tmp_path: Path) -> None:
    kaggle = adapter(fake)
    first = kaggle.launch(probe(tmp_path, sleep="30"))
    wait_state(kaggle, first, running)
    with pytest.raises(ProviderUnavailable) as err:
        adapter(fake).launch(probe(tmp_path, epoch=2))
    assert str(err.value) == (f"kaggle provider 'kaggle': kernel {slug(first.id)} is still running attempt 1; "
                              "waiting for it to end")
    assert fake.pushes == 1 and kaggle.observe()[first].phase is WorkerPhase.RUNNING


def test_a_second_attempts_push_that_timed_out_after_acting_is_adopted(fake: FakeKaggle, tmp_path: Path) -> None:
    kaggle = adapter(fake)
    assert wait_state(kaggle, kaggle.launch(probe(tmp_path)), ended).exit_code == 0
    spec = probe(tmp_path, epoch=2, sleep="30")
    fake.push_timeout(3)
    with pytest.raises(ProviderUnavailable, match="may have acted"):
        adapter(fake, request_timeout_seconds=1).launch(spec)
    ref = kaggle.launch(spec)  # the same process's next tick: the kernel's source says it is attempt 2
    assert fake.pushes == 2 and fake.versions(slug(ref.id)) == 2
    wait_state(kaggle, ref, running)
    assert kaggle.launch(spec) == ref and fake.pushes == 2


def test_the_previous_versions_end_reported_late_is_read_as_pending(fake: FakeKaggle, tmp_path: Path) -> None:
    kaggle = adapter(fake)
    first = kaggle.launch(probe(tmp_path))
    assert wait_state(kaggle, first, ended).exit_code == 0
    fake.queue_delay = 60
    fake.lag_versions(3)  # Kaggle still answers status and log from version 1
    second = kaggle.launch(probe(tmp_path, epoch=2))
    states = [kaggle.observe()[second] for _ in range(3)]
    assert [s.phase for s in states] == [WorkerPhase.PENDING] * 3, states
    assert "previous version (COMPLETE)" in states[0].detail
    assert kaggle.observe()[second].provider_state == "QUEUED"
    assert log_attempt('x\nreconciler-bootstrap: kaggle attempt ["r-1", 2]\n') == ("r-1", 2)
    assert log_attempt("nothing here") is None


def test_the_log_of_a_new_attempt_is_never_the_previous_versions_output(fake: FakeKaggle, tmp_path: Path) -> None:
    kaggle = adapter(fake)
    first = kaggle.launch(probe(tmp_path, lines="3"))
    assert wait_state(kaggle, first, ended).exit_code == 0
    fake.queue_delay = 60
    fake.lag_versions(3)  # Kaggle still answers status and output from version 1
    second = kaggle.launch(probe(tmp_path, epoch=2))
    kaggle.observe()
    assert "line 2" in fake.rpc_ListKernelSessionOutput({"userName": fake.username,
                                                         "kernelSlug": slug(second.id)})["log"]
    assert kaggle.logs(second) == ""


def test_a_worker_that_cannot_reach_storage_ends_with_the_bootstraps_reason(fake: FakeKaggle, tmp_path: Path) -> None:
    fake.secrets.update({"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"})
    fake.attach(job_kernel("p"), "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    spec = probe(tmp_path, secrets={"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""})
    env = {**spec.env, "RECONCILER_RUN_URI": "s3://no-such-bucket/runs/p/r-1", "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9"}
    kaggle = adapter(fake)
    ref = kaggle.launch(LaunchSpec(**{**spec.__dict__, "env": env}))
    state = wait_state(kaggle, ref, ended, timeout=120)
    assert (state.phase, state.exit_code) == (WorkerPhase.EXITED, STORAGE_UNREACHABLE), state
    assert "cannot reach run storage s3://no-such-bucket/runs/p/r-1" in state.detail


# ---- quota ------------------------------------------------------------------------------------


def test_the_weekly_quota_is_read_as_an_allowance_and_exhaustion_and_refresh_show(fake: FakeKaggle) -> None:
    fake.set_quota(30, 10)
    allowance = adapter(fake, min_quota_hours=2).allowance()
    assert (allowance.unit, allowance.total, allowance.used, allowance.minimum) == ("gpu-hours", 30, 10, 2)
    assert allowance.remaining == pytest.approx(20, abs=0.01) and allowance.applies_to_cpu is False
    assert allowance.resets_at is not None and abs(allowance.resets_at - fake.quota_refresh_at) < 1
    fake.exhaust_quota()
    assert adapter(fake).allowance().remaining == 0
    fake.refresh_quota()
    assert adapter(fake).allowance().remaining == pytest.approx(30, abs=0.01)


def test_running_gpu_kernels_use_the_quota(fake: FakeKaggle, tmp_path: Path) -> None:
    kaggle = adapter(fake)
    ref = kaggle.launch(probe(tmp_path, gpus=1, sleep="3"))
    wait_state(kaggle, ref, ended)
    assert kaggle.allowance().used * 3600 >= 2  # type: ignore[operator]


def test_another_owners_kernels_are_counted_never_returned(fake: FakeKaggle, tmp_path: Path) -> None:
    theirs = adapter(fake, owner="repo-b")
    their_ref = theirs.launch(probe(tmp_path, sleep="30"))
    wait_state(theirs, their_ref, running)
    ours = adapter(fake)
    assert ours.observe() == {} and ours.foreign_workers == 1
    assert ours.logs(their_ref, 10) == ""
    assert adapter(fake, owner="*").observe()[their_ref].phase is WorkerPhase.RUNNING
    assert ours.capacity() is not None and ours.free_slots() is None


def test_kernels_last_run_more_than_a_week_ago_are_not_read(fake: FakeKaggle, tmp_path: Path) -> None:
    kaggle = adapter(fake)
    ref = kaggle.launch(probe(tmp_path))
    wait_state(kaggle, ref, ended)
    machine = fake.kernels[slug(ref.id)].machine
    assert machine is not None and machine.started_at is not None
    machine.started_at -= 8 * 86400
    fresh = adapter(fake)
    assert fresh.observe() == {} and "GetKernel" not in fake.calls[-3:]


def test_the_fake_runs_standalone_and_prints_its_url(tmp_path: Path) -> None:
    import subprocess

    proc = subprocess.Popen([sys.executable, "-m", "tests.fakes.kaggle", "--token", "kt-standalone",
                             "--workdir", str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = line.split(" at ", 1)[1].split()[0]
        answer = httpx.post(f"{url}/v1/kernels.KernelsApiService/GetAcceleratorQuotaStatistics", json={},
                            headers={"Authorization": "Bearer kt-standalone"})
        assert answer.status_code == 200 and answer.json()["gpuQuota"]["totalTimeAllowed"] == "108000s"
    finally:
        proc.kill()
        proc.wait()


def test_kaggles_session_cut_wins_over_the_kill_it_caused() -> None:
    killed = 'reconciler-bootstrap: exit {"code": -9, "signal": "SIGKILL"}\n'
    state = kernel_state("ERROR", "Your notebook hit the maximum session time of 43200 seconds", killed, 600)
    assert (state.phase, state.exit_code) == (WorkerPhase.SESSION_LIMIT, -9)


def test_kaggles_own_words_for_the_session_cut_and_for_memory_are_read_as_such() -> None:
    """The failure messages a user's script compares Kaggle's answers with (xhluca/bm25-benchmarks)."""
    killed = 'reconciler-bootstrap: exit {"code": -9, "signal": "SIGKILL"}\n'
    cut = kernel_state("ERROR", "Your notebook was stopped because it exceeded the max allowed execution duration.",
                       killed, 600)
    assert (cut.phase, cut.exit_code) == (WorkerPhase.SESSION_LIMIT, -9)
    memory = kernel_state("ERROR", "Your notebook tried to allocate more memory than is available.", killed, 600)
    assert (memory.phase, memory.oom, memory.signal) == (WorkerPhase.EXITED, True, "SIGKILL")
    assert kernel_state("ERROR", "Your notebook tried to allocate more memory than is available.", "", 600).oom


def test_kaggles_editor_names_for_accelerators_are_its_api_names_and_t4_x2_is_two_gpus(fake: FakeKaggle) -> None:
    assert KaggleSettings(machine_shape="GPU T4 x2").machine_shape == "NvidiaTeslaT4"
    assert KaggleSettings(machine_shape="GPU  P100").machine_shape == "NvidiaTeslaP100"
    assert KaggleSettings(machine_shape="NvidiaL4").machine_shape == "NvidiaL4"
    capacity = adapter(fake, machine_shape="GPU T4 x2").capacity()
    assert capacity is not None and (capacity.gpus, capacity.gpu_models) == (2, ["T4"])
