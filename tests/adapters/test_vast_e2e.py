"""End to end on the fake Vast: the real `reconciler run --until-done`, run storage in S3 (moto), a
counter job outbid once on Vast that continues at its exact durable step on a new instance and
finishes, with the attempt's cost taken from the instance's real `dph_total` and running time."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.vast import VastAdapter, parse_label
from desired.models import LocalSettings, VastSettings
from tests.adapters import e2e
from tests.conftest import StateRepoFixture
from tests.fakes.vast import DEFAULT_OFFERS, FakeVast, served
from tests.worker.conftest import s3_endpoint  # noqa: F401 - a fixture

DPH = 36.0  # $/h: one cent a second, so a short attempt costs something visible


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeVast]:
    offers = [{**DEFAULT_OFFERS[0], "dph_total": DPH, "min_bid": DPH}]
    yield from served(tmp_path / "vast", monkeypatch, offers=offers)



def repository_owner(fake: FakeVast) -> str:
    """The owner part of the labels the daemon gave its instances."""
    labels = [parse_label(c["label"]) for c in fake.creates]
    return next(label[0] for label in labels if label)


@pytest.mark.slow
@pytest.mark.parametrize("then", ["vast", "local"])
def test_end_to_end_outbid_on_vast_continues_at_its_durable_step_and_finishes(
        then: str, fake: FakeVast, state_repo: StateRepoFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        s3_endpoint: str) -> None:  # noqa: F811 - a fixture
    """Outbid once, then continued on Vast again (a new instance) or on another provider, `local`
    (Vast is cooling down after its interruption, so the placement prefers the other)."""
    e2e.daemon_env(monkeypatch)  # the daemon's own environment holds the job's secrets
    bucket = e2e.s3_storage(state_repo, s3_endpoint, tick_seconds=0.5)
    settings = VastSettings(api_url=fake.url, request_timeout_seconds=5, max_price_per_hour=40)
    state_repo.write("desired/vast.yaml", e2e.priced("vast", settings, 0.4))
    job = e2e.s3_job("count", "vast", 0.2, 60)
    if then == "local":  # dearer: Vast is chosen first
        state_repo.write("desired/local.yaml", e2e.priced("local", LocalSettings(workdir=str(tmp_path / "local")), 1.0))
        job["spec"]["placement"]["providers"] = ["vast", "local"]
    st = e2e.interrupted_count(state_repo, tmp_path / "daemon.log", s3_endpoint, bucket, job,
                               "count on vast, runs in s3", e2e.outbid_only_instance(fake), timeout=180)
    attempts = st["attempts"]
    assert [a["outcome"] for a in attempts] == ["interruption", "succeeded"], attempts
    assert [a["provider"] for a in attempts] == ["vast", then] and "outbid" in attempts[0]["detail"]
    assert attempts[1]["step_start"] >= 10 and attempts[1]["step_start"] == attempts[0].get("step_end"), attempts
    assert st["progress"]["step"] == 60 and st["interruptions"] == 1 and st["failures"] == 0
    assert attempts[0]["cost_usd"] > 0.02 and st["cost_usd"] >= attempts[0]["cost_usd"]
    # The last instance exits by itself; the next observations report it, then destroy it (its disk bills).
    deadline = time.monotonic() + 30
    while not all(i.actual == "exited" for i in fake.live()) and time.monotonic() < deadline:
        time.sleep(0.1)
    vast = VastAdapter("vast", settings, owner=repository_owner(fake))
    vast.observe()
    vast.observe()
    assert fake.live() == []
