"""The RunPod adapter against the fake RunPod GraphQL server: one test per fault the issue names,
hostile values through GraphQL variables, the key's places, money (costPerHr, balance), and the
log and exit code that travel through the run folder (RunPod has no log API)."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.compute import LaunchSpec, ProviderConfigError, ProviderUnavailable, WorkerPhase
from adapters.runpod import M_ON_DEMAND, RunpodAdapter, pod_name, start_command
from adapters.storage import RunFolder
from desired.models import RunpodSettings
from tests.adapters.test_contract import ended, probe_records, running, wait_state
from tests.fakes import runpod as runpod_fake
from tests.fakes.runpod import API_KEY, NO_INSTANCES, FakeRunpod

PROBE = str(Path(__file__).with_name("probe.py"))
GPU = "NVIDIA GeForce RTX 4090"


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRunpod]:
    # RunPod's own 5 s grace (its docs' FAQ "OnDemand vs Spot Pod"): after a worker exits 75 on
    # SIGTERM, its bootstrap copies the log tail, which carries the exit record the adapter reads, to
    # run storage (a Python process); on a loaded CI machine that took over 1 s, and a 1 s grace cut it off
    server = FakeRunpod(tmp_path / "machines", kill_grace=5.0, retention=2.0)
    monkeypatch.setenv("RUNPOD_API_KEY", API_KEY)
    yield server
    server.close()


def adapter_on(fake: FakeRunpod, owner: str = "repo-a", **settings: object) -> RunpodAdapter:
    values: dict[str, object] = {"api_url": fake.url, "request_timeout_seconds": 2, **settings}
    return RunpodAdapter("runpod", RunpodSettings.model_validate(values), owner=owner)


class Specs:
    def __init__(self, tmp: Path, fake: FakeRunpod) -> None:
        self.tmp, self.fake, self.count = tmp, fake, 0

    def __call__(self, *args: str, epoch: int = 1, secret: str | None = None, **probe: str) -> LaunchSpec:
        self.count += 1
        job = f"job{self.count}"
        out = self.tmp / f"probe-{self.count}.jsonl"
        env = {"PROBE_OUT": str(out), **{f"PROBE_{k.upper()}": v for k, v in probe.items()},
               "RECONCILER_RUN_ID": "r1", "RECONCILER_EPOCH": str(epoch),
               "RECONCILER_RUN_URI": (self.tmp / "runs" / job / "r1").as_uri()}
        secrets = {"PROBE_SECRET": secret} if secret is not None else {}
        for name, value in secrets.items():
            self.fake.set_secret(name, value)
        return LaunchSpec(job=job, run_id="r1", epoch=epoch, command=[sys.executable, "-u", PROBE, *args],
                          env=env, secret_env=secrets)


@pytest.fixture
def specs(tmp_path: Path, fake: FakeRunpod) -> Specs:
    return Specs(tmp_path, fake)


records = probe_records
wait = wait_state


# ---- the key ----------------------------------------------------------------------------------


def test_a_missing_key_is_one_sentence_naming_runpod_and_where_the_key_is_read(
        fake: FakeRunpod, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNPOD_API_KEY")
    with pytest.raises(ProviderConfigError) as err:
        RunpodAdapter("gpu-spot", RunpodSettings(api_url=fake.url), owner="o", home=tmp_path)
    message = str(err.value)
    assert "runpod provider 'gpu-spot'" in message and "RUNPOD_API_KEY" in message
    assert "~/.runpod/config.toml" in message and "\n" not in message


def test_a_refused_key_is_one_sentence_and_the_key_is_never_in_it(fake: FakeRunpod,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNPOD_API_KEY", "rp-wrong-key-123456")
    adapter = adapter_on(fake)
    with pytest.raises(ProviderConfigError) as err:
        adapter.observe()
    message = str(err.value)
    assert "runpod provider 'runpod'" in message and "RUNPOD_API_KEY" in message and "config.toml" in message
    assert "rp-wrong-key-123456" not in message and API_KEY not in message


def test_the_key_is_read_from_the_sdk_config_file_when_the_variable_is_unset(
        fake: FakeRunpod, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNPOD_API_KEY")
    (tmp_path / ".runpod").mkdir()
    (tmp_path / ".runpod" / "config.toml").write_text(f'[default]\napi_key = "{API_KEY}"\n')
    adapter = RunpodAdapter("runpod", RunpodSettings(api_url=fake.url), owner="o", home=tmp_path)
    assert adapter.observe() == {}


# ---- launch -----------------------------------------------------------------------------------

HOSTILE = ['it\'s "quoted"', "back\\slash", "new\nline", '"} ) { myself { id } } #', "{{ RUNPOD_SECRET_X }}",
           "$(id) `id` ${HOME}", "'; podTerminate(input:{podId:\"x\"}) #"]


def test_hostile_values_reach_the_worker_verbatim_and_travel_only_as_graphql_variables(
        fake: FakeRunpod, specs: Specs) -> None:
    adapter = adapter_on(fake)
    plain = "".join(HOSTILE)
    spec = specs(*HOSTILE, plain=plain, secret='s"ec}\\ret\n')
    fake.set_secret("X", "another secret")
    ref = adapter.launch(spec)
    wait(adapter, ref, ended)
    record = records(spec)[0]
    assert record["argv"] == HOSTILE
    assert record["env"]["PROBE_PLAIN"] == plain  # RunPod's {{ }} substitution never saw it
    assert record["env"]["PROBE_SECRET"] == 's"ec}\\ret\n'
    create = next(r for r in fake.requests if "podRentInterruptable" in r["query"])
    assert '"}' not in create["query"] and "RUNPOD_SECRET" not in create["query"]  # values only in variables
    env = {e["key"]: e["value"] for e in create["variables"]["input"]["env"]}
    assert env["PROBE_SECRET"] == "{{ RUNPOD_SECRET_PROBE_SECRET }}"  # a reference, never the value
    assert "PROBE_PLAIN" not in env and env["RECONCILER_RUN_URI"] == spec.env["RECONCILER_RUN_URI"]
    assert all("s\"ec}" not in json.dumps(r) for r in fake.requests)


def test_the_start_command_is_one_shell_word_with_no_single_quote_inside() -> None:
    command = start_command("print('hello')\n" * 100)
    assert command.startswith("sh -c '") and command.endswith("'") and command[7:-1].count("'") == 0


def test_spot_launch_bids_the_minimum_when_no_bid_is_set_and_cost_is_cost_per_hour_times_uptime(
        fake: FakeRunpod, specs: Specs) -> None:
    adapter = adapter_on(fake)
    spec = specs(sleep="2.5")
    ref = adapter.launch(spec)
    state = wait(adapter, ref, ended)
    pod = fake.pods[ref.id]
    assert pod.spot and pod.input["bidPerGpu"] == 0.35 and pod.input["gpuTypeId"] == GPU
    assert pod.input["name"] == pod_name("repo-a", spec.job, "r1", 1) == f"rc-repo-a-{spec.job}-r1-e1"
    assert state.phase is WorkerPhase.EXITED and state.exit_code == 0
    uptime = pod.uptime(time.time())
    assert uptime >= 2 and state.cost_usd == pytest.approx(0.35 * uptime / 3600, abs=1e-6)


def test_on_demand_launch_uses_podFindAndDeployOnDemand(fake: FakeRunpod, specs: Specs) -> None:  # noqa: N802
    adapter = adapter_on(fake, interruptible=False)
    ref = adapter.launch(specs(exit="3"))
    state = wait(adapter, ref, ended)
    assert not fake.pods[ref.id].spot and "bidPerGpu" not in fake.pods[ref.id].input
    assert (state.phase, state.exit_code) == (WorkerPhase.EXITED, 3)


def test_a_long_name_is_cut_with_a_hash_and_stays_unique() -> None:
    one, two = pod_name("o" * 40, "j" * 40, "r1", 1), pod_name("o" * 40, "j" * 39 + "k", "r1", 1)
    assert len(one) <= 60 and one.endswith("-e1") and one != two


def test_an_operator_view_launches_nothing(fake: FakeRunpod, specs: Specs) -> None:
    with pytest.raises(ProviderConfigError):
        adapter_on(fake, owner="*").launch(specs())


# ---- faults -----------------------------------------------------------------------------------


def test_no_capacity_for_the_gpu_type_is_unavailable_and_creates_nothing(fake: FakeRunpod, specs: Specs) -> None:
    fake.set_capacity(GPU, 0)
    with pytest.raises(ProviderUnavailable, match="no capacity"):
        adapter_on(fake).launch(specs())
    assert fake.pods == {}


def test_a_graphql_error_with_http_200_is_a_config_error_with_runpods_message(fake: FakeRunpod) -> None:
    fake.fail_next(operation="myself", message="Field 'pods' is not allowed for this key")
    with pytest.raises(ProviderConfigError, match="Field 'pods' is not allowed"):
        adapter_on(fake).observe()


def test_a_capacity_error_with_http_200_is_unavailable(fake: FakeRunpod, specs: Specs) -> None:
    fake.fail_next(operation="podRentInterruptable", message=NO_INSTANCES)
    with pytest.raises(ProviderUnavailable):
        adapter_on(fake).launch(specs())


def test_500_and_garbage_json_are_unavailable(fake: FakeRunpod) -> None:
    adapter = adapter_on(fake)
    fake.fail_next(status=500, count=5)
    with pytest.raises(ProviderUnavailable):
        adapter.observe()
    fake.faults.clear()
    fake.fail_next(body=b"<html>not json</html>")
    with pytest.raises(ProviderUnavailable, match="not JSON"):
        adapter.observe()
    assert adapter.observe() == {}


def test_429_is_retried_after_retry_after(fake: FakeRunpod) -> None:
    fake.fail_next(status=429, retry_after="1")
    began = time.monotonic()
    assert adapter_on(fake).observe() == {}
    assert time.monotonic() - began >= 0.9


def test_a_create_that_acts_then_times_out_is_adopted_next_tick_not_repeated(fake: FakeRunpod, specs: Specs) -> None:
    adapter = adapter_on(fake)
    spec = specs(sleep="30")
    fake.act_then_stall(4.0, operation="podRentInterruptable")
    with pytest.raises(ProviderUnavailable, match="may have acted"):
        adapter.launch(spec)
    ref = adapter.launch(spec)
    assert len(fake.pods) == 1 and ref.id in fake.pods
    assert len(records(spec)) == 1


def test_a_bid_below_the_market_minimum_is_unavailable(fake: FakeRunpod, specs: Specs) -> None:
    with pytest.raises(ProviderUnavailable, match="bid"):
        adapter_on(fake, bid_per_gpu=0.05).launch(specs())
    assert fake.pods == {}


def test_a_bid_above_the_job_s_cap_is_unavailable_and_creates_nothing(fake: FakeRunpod, specs: Specs) -> None:
    capped = LaunchSpec(**{**specs().__dict__, "max_price_per_hour": 0.1})
    with pytest.raises(ProviderUnavailable, match="above the job's cap of \\$0.1/h"):
        adapter_on(fake, bid_per_gpu=0.5).launch(capped)
    with pytest.raises(ProviderUnavailable, match="on-demand .* above the job's cap"):
        adapter_on(fake, interruptible=False).launch(capped)
    assert fake.pods == {}
    adapter_on(fake, interruptible=False).launch(LaunchSpec(**{**capped.__dict__, "max_price_per_hour": 50.0}))
    assert len(fake.pods) == 1


@pytest.mark.parametrize("price", [-0.5, "NaN", 1e12], ids=["negative", "nan-text", "absurd"])
def test_an_on_demand_price_that_is_not_a_sound_number_is_refused_under_a_cap(
        fake: FakeRunpod, specs: Specs, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        price: object) -> None:
    """A negative price passed the cap check (-0.5 x GPUs is below any cap): an unknown price
    cannot be shown to be under the job's cap, so nothing is created."""
    monkeypatch.setattr(runpod_fake, "GPU_TYPES", {k: (d, m, price, b) for k, (d, m, _p, b)
                                                   in runpod_fake.GPU_TYPES.items()})
    capped = LaunchSpec(**{**specs().__dict__, "max_price_per_hour": 50.0})
    with caplog.at_level("WARNING", logger="reconciler"), pytest.raises(
            ProviderUnavailable, match="did not say what on-demand .* costs, so the job's cap of \\$50/h"):
        adapter_on(fake, interruptible=False).launch(capped)
    assert fake.pods == {}
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "runpod provider 'runpod' answered a bad uninterruptablePrice"]


def test_outbid_sends_sigterm_and_a_worker_that_saves_in_time_exits_75(fake: FakeRunpod, specs: Specs) -> None:
    adapter = adapter_on(fake)
    spec = specs(sleep="60", on_term="75")
    ref = adapter.launch(spec)
    records(spec)
    wait(adapter, ref, running)
    fake.outbid(ref.id)
    state = wait(adapter, ref, ended)
    assert (state.phase, state.exit_code, state.provider_state) == (WorkerPhase.PREEMPTED, 75, "EXITED")
    assert "stopped by RunPod (Outbid)" in state.detail, state
    assert Path(spec.env["PROBE_OUT"] + ".term").exists()
    assert records(spec)[0]["env"]["RECONCILER_EPOCH"] == "1"


def test_outbid_past_the_grace_is_sigkill_and_reported_as_a_preemption(fake: FakeRunpod, specs: Specs) -> None:
    adapter = adapter_on(fake)
    spec = specs(sleep="60", on_term="ignore")
    ref = adapter.launch(spec)
    records(spec)
    wait(adapter, ref, running)
    began = time.monotonic()
    fake.outbid(ref.id)
    state = wait(adapter, ref, ended)
    assert time.monotonic() - began >= fake.kill_grace - 0.1  # SIGKILL came only after the grace
    assert state.phase is WorkerPhase.PREEMPTED and "outbid" in state.detail, state
    assert adapter_on(fake).observe()[ref] == state  # a restarted daemon agrees


def test_a_drained_balance_stops_pods_refuses_creates_and_shows_in_the_allowance(
        fake: FakeRunpod, specs: Specs) -> None:
    adapter = adapter_on(fake)
    first = specs(sleep="60")
    ref = adapter.launch(first)
    records(first)
    wait(adapter, ref, running)
    assert adapter.allowance().remaining == pytest.approx(100.0, abs=0.01)
    fake.drain_balance()
    state = wait(adapter, ref, ended)
    assert state.phase is WorkerPhase.PREEMPTED
    with pytest.raises(ProviderUnavailable, match="balance"):
        adapter.launch(specs())
    allowance = adapter.allowance()
    assert (allowance.unit, allowance.remaining, allowance.minimum) == ("credits", 0.0, 0.0)


def test_balance_is_the_allowance_in_credits(fake: FakeRunpod) -> None:
    fake.balance = 12.5
    allowance = adapter_on(fake).allowance()
    assert (allowance.unit, allowance.remaining) == ("credits", 12.5)


# ---- states, logs -----------------------------------------------------------------------------


def test_a_failed_attempt_s_log_tail_and_exit_code_come_from_the_run_folder(fake: FakeRunpod, specs: Specs) -> None:
    adapter = adapter_on(fake)
    spec = specs(lines="500", exit="4")
    ref = adapter.launch(spec)
    state = wait(adapter, ref, ended)
    assert (state.phase, state.exit_code) == (WorkerPhase.EXITED, 4)
    stored = RunFolder(spec.env["RECONCILER_RUN_URI"]).attempt_log(1)
    assert "line 499" in stored and "line 50\n" not in stored  # the tail (last 400 lines), not all of it
    assert adapter.logs(ref, 3).splitlines()[-2] == "line 499"
    assert adapter_on(fake).logs(ref, 3) == adapter.logs(ref, 3)  # a fresh adapter reads it too


def test_without_a_run_folder_an_on_demand_exit_code_is_unknown_and_says_so(fake: FakeRunpod, specs: Specs) -> None:
    adapter = adapter_on(fake, interruptible=False)
    spec = specs(exit="2")
    spec.env.pop("RECONCILER_RUN_URI")
    ref = adapter.launch(spec)
    state = wait(adapter, ref, ended)
    assert state.phase is WorkerPhase.EXITED and state.exit_code is None and "exit code unknown" in state.detail
    assert adapter.logs(ref) == ""


def test_a_dead_pod_is_lost_and_a_vanished_pod_is_lost_unless_we_terminated_it(fake: FakeRunpod, specs: Specs) -> None:
    adapter = adapter_on(fake)
    a, b = specs(sleep="60"), specs(sleep="60")
    ref_a, ref_b = adapter.launch(a), adapter.launch(b)
    wait(adapter, ref_a, running)
    wait(adapter, ref_b, running)
    fake.pods[ref_a.id].status = fake.pods[ref_a.id].stopping = "DEAD"
    assert adapter.observe()[ref_a].phase is WorkerPhase.LOST
    adapter.terminate(ref_b)
    wait(adapter, ref_b, ended)
    with fake.lock:
        del fake.pods[ref_a.id]
    time.sleep(2.5)  # past the fake's retention: the terminated pod leaves the list
    seen = adapter.observe()
    assert seen[ref_a].phase is WorkerPhase.LOST and "no longer listed" in seen[ref_a].detail
    assert seen[ref_b].phase is WorkerPhase.PREEMPTED and "by the reconciler" in seen[ref_b].detail
    adapter.terminate(ref_b)  # gone: quiet


def test_capacity_names_the_gpu_type_and_free_slots_are_unknown(fake: FakeRunpod) -> None:
    adapter = adapter_on(fake, gpu_type_id="NVIDIA A100 80GB PCIe")
    capacity = adapter.capacity()
    assert capacity is not None and capacity.gpu_models == ["NVIDIA A100 80GB PCIe"]
    assert adapter.free_slots() is None


def test_the_fake_runs_standalone(tmp_path: Path) -> None:
    import subprocess

    import httpx

    proc = subprocess.Popen([sys.executable, "-m", "tests.fakes.runpod", "--port", "0", "--root", str(tmp_path)],
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        answer = httpx.post(f"{url}/graphql", json={"query": "{ myself { clientBalance } }"},
                            headers={"Authorization": f"Bearer {API_KEY}"}).json()
        assert answer == {"data": {"myself": {"clientBalance": 100.0}}}
    finally:
        proc.terminate()
        proc.wait(10)


def test_an_ended_pod_is_released_and_still_reported_as_it_ended_also_after_a_restart(
        fake: FakeRunpod, specs: Specs) -> None:
    adapter = adapter_on(fake)
    adapter.release_after = 0.0
    ref = adapter.launch(specs(exit="3"))
    state = wait(adapter, ref, ended)
    assert (state.phase, state.exit_code) == (WorkerPhase.EXITED, 3)
    deadline = time.monotonic() + 10
    while fake.pods[ref.id].status != "TERMINATED" and time.monotonic() < deadline:
        adapter.observe()
        time.sleep(0.2)
    assert fake.pods[ref.id].status == "TERMINATED"  # released: a stopped pod would hold its disk
    assert adapter.observe()[ref] == state
    fresh = adapter_on(fake).observe()[ref]
    assert (fresh.phase, fresh.exit_code, fresh.provider_state) == (WorkerPhase.EXITED, 3, "EXITED")


@pytest.mark.parametrize(("message", "kind"), [
    ("Forbidden: this key cannot rent pods", ProviderConfigError),
    ("Insufficient funds: add credit to your account", ProviderUnavailable),
    ("Your bid price is too low", ProviderUnavailable),
    ("Something went wrong", ProviderConfigError),
])
def test_graphql_error_messages_are_mapped_by_what_they_say(fake: FakeRunpod, message: str, kind: type) -> None:
    fake.fail_next(operation="myself", message=message)
    with pytest.raises(kind) as err:
        adapter_on(fake).observe()
    assert "runpod provider 'runpod'" in str(err.value)


def test_the_default_image_is_a_versioned_tag_runpod_publishes() -> None:
    """RunPod publishes runpod/pytorch under versioned tags only; `latest` does not pull."""
    repo, _, tag = RunpodSettings().image.partition(":")
    assert repo == "runpod/pytorch" and tag != "latest"
    assert re.fullmatch(r"\d+\.\d+\.\d+-py3\.\d+-cuda\d+\.\d+\.\d+-devel-ubuntu\d\d\.\d\d", tag)


# ---- a pod whose command ends: RunPod restarts it; the bootstrap stops its own pod ---------------


def test_the_fake_restarts_a_container_whose_command_ends_as_runpod_does(fake: FakeRunpod) -> None:
    adapter = adapter_on(fake, interruptible=False)
    created = adapter.graphql(M_ON_DEMAND, {"input": {
        "name": "plain", "imageName": "img", "gpuTypeId": GPU, "dockerArgs": "true"}})["podFindAndDeployOnDemand"]
    deadline = time.monotonic() + 15
    while fake.pods[created["id"]].restarts < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    pod = fake.pods[created["id"]]
    assert pod.restarts >= 2 and pod.status in ("RUNNING", "RESTARTING") and pod.ended_at is None


def test_a_finished_worker_stops_its_own_pod_with_the_pods_key_so_it_is_not_restarted(
        fake: FakeRunpod, specs: Specs) -> None:
    adapter = adapter_on(fake, interruptible=False)
    ref = adapter.launch(specs(exit="4"))
    state = wait(adapter, ref, ended)
    pod = fake.pods[ref.id]
    assert (state.phase, state.exit_code) == (WorkerPhase.EXITED, 4)
    assert pod.restarts == 0 and pod.last_change == "Stopped by user"
    stops = [r for r in fake.requests if "podStop" in r["query"]]
    assert stops and stops[0]["pod_key"] == ref.id and stops[0]["variables"] == {"podId": ref.id}


def test_a_refused_self_stop_is_said_in_the_pods_log_and_the_daemon_releases_the_restarting_pod(
        fake: FakeRunpod, specs: Specs) -> None:
    fake.fail_next(operation="podStop", message="Forbidden: key lacks permission")
    adapter = adapter_on(fake, interruptible=False)
    adapter.release_after = 0.0
    spec = specs(exit="0")
    ref = adapter.launch(spec)
    records(spec)
    fake.start_delay = 60.0  # the restart RunPod does stays visible as RESTARTING
    state = wait(adapter, ref, ended)
    pod = fake.pods[ref.id]
    assert (state.phase, state.exit_code, state.provider_state) == (WorkerPhase.EXITED, 0, "RESTARTING")
    assert pod.restarts == 1 and pod.stopping == "TERMINATED"  # released by the daemon, not run again
    assert pod.machine is not None and "could not stop this pod (the reconciler will)" in pod.machine.log_text()
