"""The official `vastai` client (PyPI `vastai` 1.9.1, `VastAI(api_key=..., server_url=...)`) pointed at
the fake Vast server, for every call the adapter makes: search offers, create an instance, show
instances (the paged v1 list) and one instance, logs (request_logs, then the `result_url` fetched
without auth), destroy, show user. Its answers must parse as that client expects, so the fake
speaks the wire format Vast's own client speaks, and the adapter, tested against the fake, does too.

The client is installed with `pip install --no-deps vastai==1.9.1` (its pinned dependencies, e.g.
cryptography==49.0.0 and pillow==12.2.0, serve its other commands, not these calls); the test is
skipped where it is not installed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from adapters.compute import LaunchSpec, WorkerPhase
from adapters.vast import VastAdapter, instance_label
from desired.models import VastSettings
from tests.fakes import official_client
from tests.fakes.vast import FakeVast, served

vastai = official_client("vastai", "vastai==1.9.1 (pip install --no-deps)")
display = official_client("vastai.cli.display", "vastai==1.9.1 (pip install --no-deps)")
query = official_client("vastai.api.query", "vastai==1.9.1 (pip install --no-deps)")


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeVast]:
    yield from served(tmp_path / "vast", monkeypatch)


def client(fake: FakeVast) -> Any:
    return vastai.VastAI(api_key=fake.key, server_url=fake.url, retry=2)


def test_search_create_show_logs_destroy_and_user_through_the_official_client(fake: FakeVast) -> None:
    vast = client(fake)
    offers = vast.search_offers("num_gpus=1 gpu_name=RTX_4090 reliability>0.98", type="bid", order="dph_total")
    assert [o["id"] for o in offers] == [1001] and offers[0]["min_bid"] == 0.20

    label = instance_label("repo-a", "train", "r1", 1)
    made = vast.create_instance(1001, image="pytorch/pytorch:latest", disk=20, env={"TOKEN": "it's $(x)"},
                                price=0.25, label=label, onstart_cmd='echo "hello $TOKEN"; sleep 30',
                                cancel_unavail=True)
    assert made["success"] is True
    iid = made["new_contract"]

    deadline = time.monotonic() + 10
    while vast.show_instance(iid)["actual_status"] != "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    [row] = vast.show_instances()
    assert (row["id"], row["label"], row["dph_total"]) == (iid, label, 0.25)
    assert row["extra_env"] == {"TOKEN": "it's $(x)"} and row["duration"] >= 0
    assert vast.show_instance(iid)["intended_status"] == "running"

    # the adapter sees the instance the official client made as its own worker
    adapter = VastAdapter("vast", VastSettings(api_url=fake.url), owner="repo-a")
    [(ref, state)] = adapter.observe().items()
    assert (ref.id, ref.job, ref.run_id, ref.epoch, state.phase) == (str(iid), "train", "r1", 1, WorkerPhase.RUNNING)

    deadline = time.monotonic() + 10
    while "hello" not in (text := vast.logs(iid, tail="10")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "hello it's $(x)" in text

    assert vast.destroy_instance(iid)["success"] is True
    assert vast.show_instance(iid) is None
    assert vast.show_user()["credit"] > 0


def test_the_client_pages_the_instance_list(fake: FakeVast) -> None:
    vast = client(fake)
    for n in range(30):
        vast.create_instance(1002, image="x", label=f"other-{n}", onstart_cmd="sleep 30", price=0.2)
    rows = vast.show_instances()
    assert len(rows) == 30 and len({r["id"] for r in rows}) == 30
    assert fake.count("list") == 2  # 25 + 5
    adapter = VastAdapter("vast", VastSettings(api_url=fake.url), owner="repo-a")
    assert adapter.observe() == {} and adapter.foreign_workers == 30


def test_the_client_does_not_retry_the_search_quota_either(fake: FakeVast) -> None:
    fake.fail("search", status=429, body={"error": "search_quota_exceeded"}, retry_after="0", times=5)
    with pytest.raises(requests.HTTPError):
        client(fake).search_offers("num_gpus=1")
    assert fake.count("search") == 1


# ---- conformance: what the adapter sends and what the fake answers, against the official client ----
#
# vastai has no response models: its definitions are the requests it builds (every option on, recorded
# on the fake), the field tables it searches and shows by (`offers_fields`, `displayable_fields`,
# `instance_fields`, `user_fields`) and the fields its code reads with `[...]` (a missing one raises).
# Fields Vast documents beyond those are in DOCUMENTED, each from Vast's API reference
# (docs.vast.ai/api-reference, its OpenAPI file api-reference/openapi.yaml in github.com/vast-ai/docs).

INSTANCE_DOCUMENTED = {  # docs.vast.ai/api-reference/instances/show-instance (schema Instance)
    "intended_status", "cur_state", "next_state", "status_msg", "end_date", "host_id", "image_runtype",
    "image_args", "public_ipaddr", "ports"}
LIST_DOCUMENTED = {"success", "instances_found", "total_instances", "label_counts"}  # GET /api/v1/instances
ACTUAL_STATUSES = {None, "loading", "running", "stopped", "frozen", "exited", "rebooting", "unknown", "offline"}
CREATE_ANSWER = {"success", "new_contract"}  # PUT /api/v0/asks/{id}: 200
LOGS_ANSWER = {"success", "result_url", "msg"}  # PUT /api/v0/instances/request_logs/{id}: 200
DESTROY_ANSWER = {"success", "msg"}  # DELETE /api/v0/instances/{id}: 200
ERROR_ANSWER = {"success", "error", "msg"}  # any refusal (docs.vast.ai/api-reference: schema Error)


def client_requests(fake: FakeVast) -> dict[str, set[str]]:
    """Route -> the body and query keys vastai 1.9.1 sends on it, each call with every option it has."""
    vast = client(fake)
    vast.search_offers("num_gpus>=1 gpu_name=RTX_4090 reliability>0.9 machine_id notin [1,2]", type="bid",
                       order="dph_total", limit=5, storage=7)
    made = vast.create_instance(1001, image="img", disk=20, env={"A": "b"}, price=0.25, label="l", extra="x",
                                onstart_cmd="true", login="-u u -p p r", python_utf8=True, lang_utf8=True,
                                force=True, cancel_unavail=True, user="root", runtype="args", args=["-c", "true"])
    iid = made["new_contract"]
    vast.show_instances()
    vast.show_instance(iid)
    vast.logs(iid, tail="10", filter="x", daemon_logs=True)
    vast.destroy_instance(iid)
    vast.show_user()
    sent: dict[str, set[str]] = {}
    for route, _, params, body, _, _ in fake.exchanges:
        sent.setdefault(route, set()).update(params, body if isinstance(body, dict) else {})
    fake.exchanges.clear()
    return sent


def operators() -> set[str]:
    """The comparison words vastai's own query parser writes (`>=` -> gte, `notin` ...)."""
    parsed = query.parse_query("a>=1 b<=1 c>1 d<1 e=1 f!=1 g in [1] h notin [1]", {}, {*"abcdefgh"}, {}, {})
    return {op for ops in parsed.values() for op in ops}


def keys_within(data: Any, allowed: set[Any], where: str) -> None:
    assert isinstance(data, dict), f"{where}: {data!r} is not an object"
    unknown = set(data) - allowed
    assert not unknown, f"{where}: {sorted(unknown)} are not fields vastai or Vast's reference know"


def check_request(route: str, params: dict[str, str], body: Any, sent: dict[str, set[str]]) -> None:
    if route == "search":
        controls = sent["search"] - query.offers_fields
        keys_within(body, query.offers_fields | controls, "search request")
        for name, ops in body.items():
            if name not in controls:
                keys_within(ops, operators(), f"search request {name}")
        assert body["type"] in ("on-demand", "bid", "reserved"), body["type"]  # vastai's words
        return
    keys_within({**params, **(body if isinstance(body, dict) else {})}, sent.get(route, set()), f"{route} request")


def check_row(row: Any, where: str) -> None:
    keys_within(row, {f[0] for f in display.instance_fields} | {"start_date", "extra_env"} | INSTANCE_DOCUMENTED,
                where)
    assert isinstance(row["start_date"], (int, float)), f"{where}: start_date"  # vastai subtracts it from now
    assert all(isinstance(p, list) and len(p) == 2 for p in row["extra_env"]), f"{where}: extra_env"  # pairs
    assert row["actual_status"] in ACTUAL_STATUSES, f"{where}: actual_status {row['actual_status']!r}"


def check_answer(route: str, status: int, answer: Any) -> None:
    if status != 200:
        keys_within(answer, ERROR_ANSWER, f"{route} refusal")
        return
    offers = query.offers_fields | {f[0] for f in display.displayable_fields}
    if route == "search":
        keys_within(answer, {"offers"}, "search answer")
        for i, offer in enumerate(answer["offers"]):
            keys_within(offer, offers, f"offer {i}")
    elif route == "list":
        keys_within(answer, {"instances", "next_token"} | LIST_DOCUMENTED, "instance list")
        for i, row in enumerate(answer["instances"]):
            check_row(row, f"instance list [{i}]")
    elif route == "show":
        keys_within(answer, {"instances"}, "instance")
        if answer["instances"] is not None:
            check_row(answer["instances"], "instance")
    elif route == "user":
        keys_within(answer, {f[0] for f in display.user_fields} | {"api_key"}, "user")
    else:
        known = {"create": CREATE_ANSWER, "logs": LOGS_ANSWER, "destroy": DESTROY_ANSWER}[route]
        keys_within(answer, known, f"{route} answer")
        assert set(answer) >= ({"success", "new_contract"} if route == "create" else {"success"}), answer


def test_the_check_is_strict(fake: FakeVast) -> None:
    sent = client_requests(fake)
    with pytest.raises(AssertionError, match="not fields"):
        check_request("search", {}, {"num_gpus": {"eq": 1}, "gpu_count": {"eq": 1}, "type": "bid"}, sent)
    with pytest.raises(AssertionError, match="not fields"):
        check_request("search", {}, {"num_gpus": {"atleast": 1}, "type": "bid"}, sent)
    with pytest.raises(AssertionError, match="not fields"):
        check_request("create", {}, {"image": "x", "bid": 0.2}, sent)
    with pytest.raises(KeyError):
        check_row({"id": 1, "actual_status": "running", "extra_env": []}, "row")  # no start_date
    with pytest.raises(AssertionError, match="actual_status"):
        check_row({"id": 1, "actual_status": "created", "start_date": 1.0, "extra_env": []}, "row")


@pytest.mark.parametrize("interruptible", [True, False])
def test_every_request_of_the_adapter_and_every_answer_of_the_fake_keep_to_the_official_client(
        fake: FakeVast, interruptible: bool) -> None:
    """A worker's life through the adapter (search, rent, list, show, logs, destroy, credit, doctor's
    checks) against the official client's own requests, field tables and reads."""
    sent = client_requests(fake)
    adapter = VastAdapter("vast", VastSettings(api_url=fake.url, interruptible=interruptible), owner="repo-a")
    ref = adapter.launch(LaunchSpec(job="j", run_id="r1", epoch=1, command=["sh", "-c", "echo hi; sleep 30"], gpus=1))
    deadline = time.monotonic() + 10
    while (state := adapter.observe().get(ref)) is None or state.phase is not WorkerPhase.RUNNING:
        assert time.monotonic() < deadline, state
        time.sleep(0.1)
    adapter.logs(ref)
    adapter.terminate(ref)
    adapter.observe()
    adapter.allowance()
    adapter.preflight([LaunchSpec(job="j", run_id="r1", epoch=2, command=["true"], gpus=1)])
    routes = set()
    for route, _, params, body, status, answer in fake.exchanges:
        check_request(route, params, body, sent)
        check_answer(route, status, answer)
        routes.add(route)
    assert routes >= {"search", "create", "list", "show", "logs", "destroy", "user"}, routes
