"""What the hosted adapters share (adapters/hosted_base.py) and the fakes' server base
(tests/fakes/server.py): the same rules, in the same words, for every provider."""

from __future__ import annotations

import socket
import sys
from typing import Any

import httpx
import pytest

from adapters.compute import ANY_OWNER, LaunchSpec, ProviderConfigError
from adapters.hosted_base import HostedAdapter, worker_name
from adapters.kaggle import KaggleAdapter
from adapters.lightning import LightningAdapter
from adapters.runpod import RunpodAdapter
from adapters.vast import VastAdapter
from desired.models import KaggleSettings, LightningSettings, RunpodSettings, VastSettings
from tests.fakes.server import FakeServer, Reply, Request, json_reply

UNREACHABLE = "http://127.0.0.1:9"  # nothing listens: a test that reaches the network fails


def hosted(owner: str) -> list[HostedAdapter]:
    """One adapter of each hosted provider, with credentials in the environment and no server."""
    return [KaggleAdapter("kaggle", KaggleSettings(api_url=UNREACHABLE, request_timeout_seconds=3), owner=owner),
            LightningAdapter("lit", LightningSettings(api_url=UNREACHABLE, project_id="p", request_timeout_seconds=3),
                             owner=owner),
            VastAdapter("vast", VastSettings(api_url=UNREACHABLE, request_timeout_seconds=3), owner=owner),
            RunpodAdapter("pods", RunpodSettings(api_url=UNREACHABLE, request_timeout_seconds=3), owner=owner,
                          environ={"RUNPOD_API_KEY": "rp-key"})]


@pytest.fixture(autouse=True)
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"KAGGLE_API_TOKEN": "kt-token", "LIGHTNING_API_KEY": "lit-key",
                        "LIGHTNING_USER_ID": "lit-user", "VAST_API_KEY": "vast-key"}.items():
        monkeypatch.setenv(name, value)


def spec(job: str = "train", run_id: str = "r1") -> LaunchSpec:
    return LaunchSpec(job=job, run_id=run_id, epoch=1, command=[sys.executable, "-c", "pass"])


def test_the_operators_view_launches_nothing_on_any_hosted_provider_and_says_which_in_one_sentence() -> None:
    for adapter in hosted(ANY_OWNER):
        with pytest.raises(ProviderConfigError) as refused:
            adapter.launch(spec())
        assert str(refused.value) == f"{adapter.who}: the operator's view (owner '*') launches nothing"
        assert adapter.operator and adapter.owns("repo-a") and adapter.owns("repo-b")


def test_a_job_or_run_id_that_cannot_be_a_label_is_refused_before_any_request() -> None:
    for adapter in hosted("repo-a"):
        for bad in (spec(job="../x"), spec(run_id="r 1")):
            with pytest.raises(ProviderConfigError, match="cannot be used as a worker label"):
                adapter.launch(bad)
        assert adapter.owns("repo-a") and not adapter.owns("repo-b") and not adapter.owns(None)


def test_each_client_names_its_provider_and_takes_the_settings_timeout() -> None:
    for adapter in hosted("repo-a"):
        assert adapter.api.who == adapter.who == f"{adapter.kind} provider {adapter.name!r}"
        assert adapter.api.timeout == 3 and adapter.api.headers["Authorization"]
        assert adapter.numbers.who == adapter.who and adapter.free_slots() is None
        adapter.close()


def test_worker_names_are_cut_with_a_hash_of_the_whole_name_and_stay_unique() -> None:
    assert worker_name("repo", "train", "r1", 3, 63) == "rc-repo-train-r1-e3"
    long_a, long_b = (worker_name("repo", "j" * 80, run, 12, 60, keep_epoch=True) for run in ("r1", "r2"))
    assert len(long_a) == len(long_b) == 60 and long_a != long_b and long_a.endswith("-e12")
    assert len(worker_name("repo", "j" * 80, "r1", 12, 63)) == 63


class Echo(FakeServer):
    http_methods = ("POST",)

    def __init__(self) -> None:
        self.seen: list[Request] = []
        self.start_serving()

    def respond(self, request: Request) -> Reply:
        self.seen.append(request)
        return json_reply(201, {"path": request.path, "query": request.query, "body": request.body.decode()})


@pytest.fixture
def echo() -> Any:
    server = Echo()
    yield server
    server.stop_serving()


def test_the_fake_server_base_hands_each_request_to_its_fake_and_writes_the_reply(echo: Echo) -> None:
    answer = httpx.post(f"{echo.url}/a/b?x=1&x=2", content=b"hello", headers={"X-Test": "yes"})
    assert answer.status_code == 201 and answer.headers["Content-Type"] == "application/json"
    assert answer.json() == {"path": "/a/b", "query": {"x": "2"}, "body": "hello"}
    assert echo.seen[0].headers["x-test"] == "yes"
    assert httpx.get(f"{echo.url}/a").status_code == 501  # a method the fake does not name


def test_a_request_with_two_different_content_lengths_is_answered_400_and_not_handed_on(echo: Echo) -> None:
    host, port = echo.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab")
        answer = b""
        while chunk := conn.recv(4096):  # the server closes the connection after its answer
            answer += chunk
    assert answer.startswith(b"HTTP/1.0 400") and answer.endswith(b"bad Content-Length\n")
    assert echo.seen == []


def test_a_late_reply_is_sent_after_its_delay(echo: Echo) -> None:
    echo.respond = lambda request: Reply(200, b"{}", {}, delay=0.5)  # type: ignore[method-assign]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{echo.url}/a", timeout=httpx.Timeout(5, read=0.1))
