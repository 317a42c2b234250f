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

from adapters.compute import WorkerPhase
from adapters.vast import VastAdapter, instance_label
from desired.models import VastSettings
from tests.fakes import official_client
from tests.fakes.vast import FakeVast, served

vastai = official_client("vastai", "vastai==1.9.1 (pip install --no-deps)")


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
