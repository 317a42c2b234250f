"""The Vast.ai adapter against the fake Vast server: one test per fault the marketplace has, each
asserting what the planner is told (see the state table in adapters/vast.py)."""

from __future__ import annotations

import json
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.compute import LaunchSpec, ProviderConfigError, ProviderUnavailable, WorkerPhase, WorkerState
from adapters.vast import VastAdapter, onstart_script
from desired.models import VastSettings
from tests.adapters.test_contract import records_at, wait_state
from tests.fakes.vast import DEFAULT_OFFERS, FakeVast, served

PROBE = str(Path(__file__).with_name("probe.py"))


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeVast]:
    yield from served(tmp_path / "vast", monkeypatch)


def adapter(fake: FakeVast, **settings: Any) -> VastAdapter:
    values: dict[str, Any] = {"api_url": fake.url, "request_timeout_seconds": 5, "max_price_per_hour": 1.0}
    values.update(settings)
    return VastAdapter("vast", VastSettings(**values), owner="repo-a")


def spec(tmp_path: Path, *args: str, job: str = "train", secret: str | None = None, **probe: str) -> LaunchSpec:
    env = {"PROBE_OUT": str(tmp_path / f"{job}.jsonl"), **{f"PROBE_{k.upper()}": v for k, v in probe.items()}}
    return LaunchSpec(job=job, run_id="r1", epoch=1, command=[sys.executable, "-u", PROBE, *args], env=env,
                      secret_env={"PROBE_SECRET": secret} if secret is not None else {})


wait = wait_state


def phase(*phases: WorkerPhase) -> Callable[[WorkerState], bool]:
    return lambda state: state.phase in phases


records = records_at


def offer(oid: int, dph: float, reliability: float = 0.99, min_bid: float | None = None) -> dict[str, Any]:
    return {**DEFAULT_OFFERS[0], "id": oid, "machine_id": oid, "dph_total": dph, "reliability": reliability,
            "min_bid": dph / 2 if min_bid is None else min_bid}


def test_outbid_is_a_preemption_and_the_stopped_instance_is_destroyed(fake: FakeVast, tmp_path: Path) -> None:
    vast = adapter(fake)
    ref = vast.launch(spec(tmp_path, sleep="60"))
    wait(vast, ref, phase(WorkerPhase.RUNNING))
    fake.outbid(int(ref.id))
    state = wait(vast, ref, phase(WorkerPhase.PREEMPTED))
    assert "outbid" in state.detail and state.provider_state.startswith("stopped")
    vast.observe()  # reported once: now destroyed, so its disk stops billing
    assert fake.live() == []
    assert vast.observe()[ref] == state


def test_host_offline_is_an_interruption_after_a_grace_and_lost_once_gone(fake: FakeVast, tmp_path: Path) -> None:
    vast = adapter(fake)
    vast.offline_grace_seconds = 1.0
    ref = vast.launch(spec(tmp_path, sleep="60"))
    wait(vast, ref, phase(WorkerPhase.RUNNING))
    fake.host_offline(int(ref.id), gone_after=30)
    assert vast.observe()[ref].phase is WorkerPhase.RUNNING  # a blip, for now
    state = wait(vast, ref, phase(WorkerPhase.PREEMPTED))
    assert "host offline" in state.detail

    other = adapter(fake)  # gone from the list without our destroy: lost
    ref2 = other.launch(spec(tmp_path, sleep="60", job="second"))
    wait(other, ref2, phase(WorkerPhase.RUNNING))
    fake.host_offline(int(ref2.id), gone_after=0.2)
    state2 = wait(other, ref2, phase(WorkerPhase.LOST))
    assert "gone" in state2.detail


@pytest.mark.parametrize("state", ["rebooting", "frozen", "maintenance"])
def test_a_passing_state_is_waited_for_and_lost_only_past_its_bound(
        fake: FakeVast, tmp_path: Path, state: str) -> None:
    vast = adapter(fake)
    vast.transition_timeout_seconds = 30
    ref = vast.launch(spec(tmp_path, sleep="60"))
    wait(vast, ref, phase(WorkerPhase.RUNNING))
    fake.transition(int(ref.id), state, seconds=1.0)
    during = vast.observe()[ref]
    assert during.phase is WorkerPhase.RUNNING and during.provider_state.startswith(state)
    wait(vast, ref, lambda s: s.provider_state.startswith("running"))
    assert [i.id for i in fake.live()] == [int(ref.id)]  # the healthy instance was kept, not replaced

    vast.transition_timeout_seconds = 0.5
    fake.transition(int(ref.id), state, seconds=60)
    lost = wait(vast, ref, phase(WorkerPhase.LOST))
    assert state in lost.detail and "destroyed" in lost.detail
    assert fake.live() == []


def test_an_offer_gone_at_rent_is_skipped_for_the_next(fake: FakeVast, tmp_path: Path) -> None:
    fake.offers = [offer(1, 0.2), offer(2, 0.3)]
    fake.vanish(1)
    vast = adapter(fake)
    ref = vast.launch(spec(tmp_path, sleep="5"))
    assert [i.offer["id"] for i in fake.live()] == [2]
    assert [i.id for i in fake.live()] == [int(ref.id)]
    assert fake.count("create") == 2


def test_no_offer_at_all_is_unavailable(fake: FakeVast, tmp_path: Path) -> None:
    fake.offers = [offer(1, 0.2)]
    fake.vanish(1)
    with pytest.raises(ProviderUnavailable, match="vast provider 'vast' has no offer"):
        adapter(fake).launch(spec(tmp_path))
    assert fake.live() == []


def test_slow_image_pull_past_the_limit_is_destroyed_and_counted_unavailable(fake: FakeVast, tmp_path: Path) -> None:
    fake.loading_seconds = 60
    vast = adapter(fake, loading_timeout_seconds=1)
    ref = vast.launch(spec(tmp_path))
    assert vast.observe()[ref].phase is WorkerPhase.PENDING
    state = wait(vast, ref, phase(WorkerPhase.LOST), timeout=10)
    assert "capacity unavailable" in state.detail and state.provider_state.startswith("loading")
    assert fake.live() == []


def test_429_is_retried_after_its_retry_after(fake: FakeVast) -> None:
    fake.fail("list", status=429, body={"error": "rate_limited"}, retry_after="1")
    started = time.monotonic()
    assert adapter(fake).observe() == {}
    assert time.monotonic() - started >= 1.0
    assert fake.count("list") == 2


def test_the_search_quota_429_is_not_retried(fake: FakeVast, tmp_path: Path) -> None:
    fake.fail("search", status=429, body={"error": "search_quota_exceeded"}, retry_after="1")
    with pytest.raises(ProviderUnavailable, match="search quota is spent until UTC midnight"):
        adapter(fake).launch(spec(tmp_path))
    assert fake.count("search") == 1 and fake.count("create") == 0


@pytest.mark.parametrize("kind", ["status", "garbage"])
def test_500_and_garbage_json_are_unavailable(fake: FakeVast, kind: str) -> None:
    fake.fail("list", kind=kind, status=500, times=10)
    vast = adapter(fake)
    vast.api.sleep = lambda _s: None
    with pytest.raises(ProviderUnavailable, match="vast provider 'vast'"):
        vast.observe()


@pytest.mark.parametrize("body", [{}, {"instances": [], "next_token": None}], ids=["empty", "json-body"])
def test_a_redirect_is_unavailable_never_an_empty_list(fake: FakeVast, tmp_path: Path, body: dict[str, Any]) -> None:
    """A 3xx (a proxy or login wall before the API) once read as an empty instance list: the
    running instance was 'gone from Vast's list' and relaunched within seconds."""
    vast = adapter(fake)
    ref = vast.launch(spec(tmp_path, sleep="60"))
    wait(vast, ref, phase(WorkerPhase.RUNNING))
    fake.fail("list", kind="redirect", status=301, body=body)
    with pytest.raises(ProviderUnavailable, match="answered HTTP 301 to https://cloud.vast.ai/.*redirects are not"):
        vast.observe()
    assert vast.observe()[ref].phase is WorkerPhase.RUNNING


@pytest.mark.parametrize("interruptible", [True, False], ids=["bid", "on-demand"])
def test_an_offer_priced_below_zero_or_not_a_number_is_refused_with_one_warning(
        fake: FakeVast, tmp_path: Path, caplog: pytest.LogCaptureFixture, interruptible: bool) -> None:
    """NaN compares false with the cap (so it passed it) and a negative price sorts first: such
    offers are dropped, each bad field said once, and the next sound offer is rented."""
    bad_field = "min_bid" if interruptible else "dph_total"
    fake.offers = [{**offer(1, 0.2), bad_field: -0.1}, {**offer(2, 0.25), bad_field: "nan"}, offer(3, 0.3),
                   {**offer(4, 0.28), "reliability": 1.5}]
    vast = adapter(fake, interruptible=interruptible)
    with caplog.at_level("WARNING", logger="reconciler"):
        vast.launch(spec(tmp_path, sleep="5"))
        vast.launch(spec(tmp_path, sleep="5", job="two"))  # the same bad offers, searched again
    assert [i.offer["id"] for i in fake.live()] == [3, 3]
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert said == [f"vast provider 'vast' answered a bad offer {field}: {value} is not a number from 0 to {high}; "
                    "what carried it is refused"
                    for field, value, high in [(bad_field, "-0.1", "10000"), ("reliability", "1.5", "1")]]


def test_a_nan_on_the_wire_refuses_the_whole_answer_and_rents_nothing(fake: FakeVast, tmp_path: Path) -> None:
    """`NaN` and `Infinity` are not JSON (RFC 8259 §6); Python's json.loads takes them."""
    fake.offers = [{**offer(1, 0.2), "min_bid": float("nan")}, {**offer(2, 0.3), "min_bid": float("inf")}]
    with pytest.raises(ProviderUnavailable, match="not JSON as its API documents"):
        adapter(fake).launch(spec(tmp_path))
    assert fake.count("create") == 0


def test_the_fake_reads_content_length_as_a_real_server_does(fake: FakeVast) -> None:
    """Held to RFC 9112 §6.3 like the real service: "1_0" is not 10."""
    body = b'{"limit": 1}'
    for length, status in ((b"1_2", b"400"), (b"+12", b"400"), (b"12", b"401")):
        with socket.create_connection(("127.0.0.1", int(fake.url.rsplit(":", 1)[1])), timeout=10) as s:
            s.sendall(b"POST /api/v0/bundles/ HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n" + body)
            assert s.recv(4096).split(b" ")[1] == status, length  # 401: read, then refused for its missing key


def test_a_create_that_acted_then_timed_out_is_adopted_not_doubled(fake: FakeVast, tmp_path: Path) -> None:
    fake.fail("create", kind="late", seconds=3)
    vast = adapter(fake, request_timeout_seconds=1)
    job = spec(tmp_path, sleep="30")
    with pytest.raises(ProviderUnavailable, match="may have acted"):
        vast.launch(job)
    ref = adapter(fake).launch(job)  # the next tick, maybe after a restart
    assert [i.id for i in fake.live()] == [int(ref.id)]
    assert fake.count("create") == 1


def test_a_refused_key_is_one_sentence_naming_vast_and_where_the_key_is_read(
        fake: FakeVast, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VAST_API_KEY", "wrong-key-0x5eed")
    with pytest.raises(ProviderConfigError) as refused:
        adapter(fake).observe()
    message = str(refused.value)
    assert "vast provider 'vast'" in message and "VAST_API_KEY" in message and "vast_api_key" in message
    assert "wrong-key-0x5eed" not in message and "\n" not in message


def test_a_missing_key_is_one_sentence_and_the_config_file_is_read(
        fake: FakeVast, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VAST_API_KEY")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    with pytest.raises(ProviderConfigError, match=r"has no API key; it is read from the VAST_API_KEY"):
        adapter(fake).observe()
    (tmp_path / "config" / "vastai").mkdir(parents=True)
    (tmp_path / "config" / "vastai" / "vast_api_key").write_text(fake.key + "\n")
    assert adapter(fake).observe() == {}


def test_never_bids_above_the_cap_nor_below_the_market_minimum(fake: FakeVast, tmp_path: Path) -> None:
    fake.offers = [offer(1, 0.9, min_bid=0.5)]
    with pytest.raises(ProviderUnavailable):
        adapter(fake, max_price_per_hour=0.4).launch(spec(tmp_path))
    assert fake.count("create") == 0
    fake.offers = [offer(2, 0.9, min_bid=0.39)]
    adapter(fake, max_price_per_hour=0.4).launch(spec(tmp_path, job="two"))
    [created] = fake.creates
    assert 0.39 <= created["price"] <= 0.4 and created["cancel_unavail"] is True


def test_a_multi_gpu_offer_is_bid_for_per_machine_as_the_official_client_documents(
        fake: FakeVast, tmp_path: Path) -> None:
    """vastai's `create instance --bid_price` is "per machine bid price in $/hour", and an offer's
    `min_bid` is its whole price like `dph_total`: a 4-GPU offer's bid is not divided nor multiplied."""
    fake.offers = [{**offer(1, 2.0, min_bid=0.8), "num_gpus": 4}]
    ref = adapter(fake, max_price_per_hour=1.0).launch(spec(tmp_path, sleep="5"))
    [created] = fake.creates
    assert created["price"] == pytest.approx(0.8 * 1.05 + 0.001, abs=1e-4)
    assert fake.instances[int(ref.id)].dph_total == created["price"]  # billed at the bid, for the machine
    fake.offers = [{**offer(2, 2.0, min_bid=0.8), "num_gpus": 4}]
    with pytest.raises(ProviderUnavailable):  # the cap binds the machine's price, not one GPU's share
        adapter(fake, max_price_per_hour=0.5).launch(spec(tmp_path, job="capped"))


def test_the_job_s_own_cap_binds_below_the_provider_s(fake: FakeVast, tmp_path: Path) -> None:
    fake.offers = [offer(1, 0.9, min_bid=0.3), offer(2, 0.9, min_bid=0.2)]
    capped = LaunchSpec(**{**spec(tmp_path).__dict__, "max_price_per_hour": 0.25})
    adapter(fake, max_price_per_hour=0.4).launch(capped)
    [created] = fake.creates
    assert created["price"] <= 0.25 and [i.offer["id"] for i in fake.live()] == [2]


def test_on_demand_rents_at_the_offer_price_without_a_bid(fake: FakeVast, tmp_path: Path) -> None:
    fake.offers = [offer(1, 0.9), offer(2, 0.3)]
    vast = adapter(fake, interruptible=False, max_price_per_hour=0.5)
    vast.launch(spec(tmp_path))
    assert "price" not in fake.creates[0]
    assert [(i.offer["id"], i.dph_total) for i in fake.live()] == [(2, 0.3)]


def test_chooses_by_price_then_reliability(fake: FakeVast, tmp_path: Path) -> None:
    fake.offers = [offer(1, 0.5, 0.999), offer(2, 0.3, 0.985), offer(3, 0.3, 0.995), offer(4, 0.3, 0.90)]
    adapter(fake, interruptible=False).launch(spec(tmp_path))
    assert [i.offer["id"] for i in fake.live()] == [3]  # 4 is below min_reliability 0.98


def test_machines_the_planner_avoids_are_left_out_and_a_worker_names_its_machine(
        fake: FakeVast, tmp_path: Path) -> None:
    fake.offers = [offer(1, 0.3), offer(2, 0.5)]
    vast = adapter(fake, interruptible=False)
    ref = vast.launch(LaunchSpec(**{**spec(tmp_path, sleep="30").__dict__, "avoid_hosts": ("1",)}))
    assert [i.offer["id"] for i in fake.live()] == [2]  # the cheaper machine 1 lost a worker lately
    assert vast.observe()[ref].host == "2"
    fake.offers = [offer(1, 0.3)]  # the avoided machine is the only one left: better than waiting hours
    vast.launch(LaunchSpec(**{**spec(tmp_path, sleep="30", job="again").__dict__, "avoid_hosts": ("1",)}))
    assert sorted(i.offer["id"] for i in fake.live()) == [1, 2]


def test_resources_reach_the_search(fake: FakeVast, tmp_path: Path) -> None:
    vast = adapter(fake)
    job = LaunchSpec(**{**spec(tmp_path).__dict__, "gpus": 2, "gpu_model": "RTX_4090", "memory_gb": 48,
                        "gpu_memory_gb": 24, "cuda": 12.1})
    query = vast.query(job)
    assert query["gpu_ram"] == {"gte": 24000} and query["cuda_max_good"] == {"gte": 12.1}
    assert query["num_gpus"] == {"eq": 2} and query["gpu_name"] == {"eq": "RTX 4090"}
    assert query["cpu_ram"] == {"gte": 48000} and query["reliability"] == {"gte": 0.98}
    assert query["verified"] == {"eq": True} and query["type"] == "bid"
    with pytest.raises(ProviderUnavailable):  # the fake has no 2-GPU machine
        vast.launch(job)


def test_cost_is_dph_total_times_the_running_time(fake: FakeVast, tmp_path: Path) -> None:
    fake.offers = [offer(1, 36.0, min_bid=36.0)]  # $0.01 a second
    vast = adapter(fake, max_price_per_hour=40)
    ref = vast.launch(spec(tmp_path, sleep="2"))
    state = wait(vast, ref, phase(WorkerPhase.EXITED))
    [inst] = fake.live()
    assert state.exit_code == 0 and state.ended_at == inst.end_date
    expected = inst.dph_total * (inst.end_date - inst.start_date) / 3600  # type: ignore[operator]
    assert state.cost_usd == pytest.approx(expected, rel=1e-3) and state.cost_usd > 0.02


def test_credit_is_the_allowance_and_running_out_stops_the_instances(fake: FakeVast, tmp_path: Path) -> None:
    fake.credit = 42.5
    vast = adapter(fake)
    allowance = vast.allowance()
    assert (allowance.unit, allowance.remaining, allowance.minimum) == ("credits", 42.5, 0.0)
    ref = vast.launch(spec(tmp_path, sleep="60"))
    wait(vast, ref, phase(WorkerPhase.RUNNING))
    fake.credit = 0.0
    state = wait(vast, ref, phase(WorkerPhase.PREEMPTED))
    assert "insufficient credit" in state.detail
    assert vast.allowance().remaining == 0


HOSTILE = ["it's", '"q"', "$(touch PWNED)", "`touch PWNED`", "a\nb", "EOF", "'EOF'", "\\", "; touch PWNED #",
           "$HOME", "*", ""]


def test_hostile_argv_env_and_secrets_reach_the_worker_verbatim(fake: FakeVast, tmp_path: Path) -> None:
    hostile = "\n".join(HOSTILE)
    vast = adapter(fake)
    job = spec(tmp_path, *HOSTILE, secret=hostile, plain=hostile)
    ref = vast.launch(job)
    wait(vast, ref, phase(WorkerPhase.EXITED))
    record = records(tmp_path / "train.jsonl")[0]
    assert record["argv"] == HOSTILE
    assert record["env"]["PROBE_PLAIN"] == hostile and record["env"]["PROBE_SECRET"] == hostile
    assert not list(tmp_path.rglob("PWNED"))
    created = fake.creates[0]
    assert (created["runtype"], created["onstart"], created["args"][0]) == ("args", "sh", "-c")
    onstart = created["args"][1]
    assert re.fullmatch(r'cd "\$\(mktemp -d\)" && printf %s [A-Za-z0-9+/=]+ \| python3 -c "[^"]+" > bootstrap\.py '
                        r"&& exec python3 -u bootstrap\.py\n", onstart)
    assert onstart == onstart_script(onstart and _decoded(onstart))


def _decoded(onstart: str) -> str:
    import base64
    import zlib

    return zlib.decompress(base64.b64decode(onstart.split("printf %s ", 1)[1].split(" ", 1)[0])).decode()


def test_secrets_never_reach_a_message_a_label_or_the_logs(fake: FakeVast, tmp_path: Path) -> None:
    secret = "vast-secret-3e9d"
    vast = adapter(fake)
    ref = vast.launch(spec(tmp_path, secret=secret, lines="3"))
    wait(vast, ref, phase(WorkerPhase.EXITED))
    assert secret not in vast.logs(ref, 1000)
    assert all(secret not in json.dumps(body) for body in fake.creates)  # label, onstart: names only
    assert all(secret not in i.label for i in fake.live())


def test_terminate_destroys_bills_until_then_and_a_failed_destroy_raises(fake: FakeVast, tmp_path: Path) -> None:
    fake.offers = [offer(1, 36.0, min_bid=36.0)]
    vast = adapter(fake, max_price_per_hour=40)
    vast.api.sleep = lambda _s: None
    ref = vast.launch(spec(tmp_path, sleep="60"))
    wait(vast, ref, phase(WorkerPhase.RUNNING))
    time.sleep(1)
    fake.fail("destroy", status=500, times=10)
    with pytest.raises(ProviderUnavailable):
        vast.terminate(ref)  # the planner orders it again on the next tick
    assert len(fake.live()) == 1
    fake.faults.clear()
    vast.terminate(ref)
    assert fake.live() == []
    state = vast.observe()[ref]
    assert state.phase is WorkerPhase.PREEMPTED and state.detail == "destroyed by the reconciler"
    assert state.cost_usd is not None and state.cost_usd >= 0.01


def test_a_finished_instance_is_destroyed_once_its_end_was_reported(fake: FakeVast, tmp_path: Path) -> None:
    vast = adapter(fake)
    ref = vast.launch(spec(tmp_path, exit="3"))
    state = wait(vast, ref, phase(WorkerPhase.EXITED))
    assert state.exit_code == 3 and len(fake.live()) == 1  # still listed: a restarted daemon sees it too
    assert vast.observe()[ref] == state
    assert fake.live() == [] and vast.observe()[ref] == state


def test_the_fake_runs_standalone(tmp_path: Path) -> None:
    import subprocess

    import httpx

    proc = subprocess.Popen([sys.executable, "-m", "tests.fakes.vast", "--port", "0", "--key", "k-1",
                             "--workdir", str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        user = httpx.get(f"{url}/api/v0/users/current", headers={"Authorization": "Bearer k-1"}).json()
        assert user["credit"] > 0
        assert httpx.get(f"{url}/api/v0/users/current").status_code == 401
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_bid_below_a_risen_market_minimum_moves_on_to_the_next_offer(fake: FakeVast, tmp_path: Path) -> None:
    fake.offers = [offer(1, 0.4, min_bid=0.2), offer(2, 0.5, min_bid=0.25)]
    fake.raise_min_bid_at_rent(1, 0.3)  # our bid of 0.211 was enough at search time
    adapter(fake).launch(spec(tmp_path, sleep="5"))
    assert [i.offer["id"] for i in fake.live()] == [2] and fake.count("create") == 2
    assert all(c["price"] <= 1.0 for c in fake.creates)
