"""Push webhooks as GitHub, GitLab and Gitea send them, over real HTTP on 127.0.0.1: a genuine push
to the reconciled branch starts a tick at once; anything else is refused with its status code and
starts nothing."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reconciler.daemon.webhook import (
    MAX_BODY,
    SECRET_ENV,
    SKEW,
    WINDOW,
    Seen,
    WebhookError,
    is_loopback,
    judge,
    parse_listen,
    pushed_at,
)
from reconciler.daemon.webhook_server import WebhookServer
from tests import zygote
from tests.conftest import StateRepoFixture
from tests.daemon.test_daemon import commit, daemon, phase_of, wait_for
from tests.daemon.test_loop_local import counter, job

SECRET = "wh-test-secret-4f1c9a"


def push(ref: str = "refs/heads/main", pushed_at: float | None = None) -> bytes:
    """A push as the forges send it: its own `after` commit, and GitHub's push time (now by default)."""
    return json.dumps({"ref": ref, "before": "0" * 40, "after": uuid.uuid4().hex.ljust(40, "0"), "commits": [],
                       "repository": {"pushed_at": int(time.time() if pushed_at is None else pushed_at)}}).encode()


def github(body: bytes, secret: str = SECRET, event: str = "push", delivery: str | None = None) -> dict[str, str]:
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"Content-Type": "application/json", "X-GitHub-Event": event,
            "X-GitHub-Delivery": delivery or str(uuid.uuid4()), "X-Hub-Signature-256": f"sha256={digest}"}


def gitlab(_body: bytes, secret: str = SECRET, delivery: str | None = None) -> dict[str, str]:
    delivery = delivery or str(uuid.uuid4())
    return {"Content-Type": "application/json", "X-Gitlab-Event": "Push Hook", "X-Gitlab-Token": secret,
            "X-Gitlab-Event-UUID": delivery, "Idempotency-Key": delivery}


def gitea(body: bytes, secret: str = SECRET, delivery: str | None = None) -> dict[str, str]:
    """Gitea sends GitHub's headers too (with its own signature in X-Hub-Signature-256 as well)."""
    delivery = delivery or str(uuid.uuid4())
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"Content-Type": "application/json", "X-Gitea-Event": "push", "X-Gitea-Delivery": delivery,
            "X-Gitea-Signature": digest, "X-GitHub-Event": "push", "X-GitHub-Delivery": delivery}


SENDERS = {"github": github, "gitlab": gitlab, "gitea": gitea}


class Hook:
    """A webhook server in this process; `woken` counts the ticks it asked for."""

    def __init__(self, branch: str | None = "main") -> None:
        self.woken = 0
        self.wake_event = threading.Event()
        self.server = WebhookServer("127.0.0.1", 0, secret=SECRET, wake=self._wake, branch=lambda: branch)
        host, port = self.server.start()
        self.url = f"http://{host}:{port}/"
        self.address = (host, port)

    def _wake(self) -> None:
        self.woken += 1
        self.wake_event.set()

    def post(self, body: bytes, headers: dict[str, str], path: str = "") -> httpx.Response:
        return httpx.post(self.url + path, content=body, headers=headers, timeout=10)


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.server.stop()


@pytest.mark.parametrize("sender", sorted(SENDERS))
def test_a_genuine_push_to_our_branch_wakes_the_daemon(hook: Hook, sender: str) -> None:
    body = push()
    r = hook.post(body, SENDERS[sender](body))
    assert r.status_code == 202, r.text
    assert r.json()["result"] == "accepted: ticking now"
    assert hook.wake_event.wait(1) and hook.woken == 1


@pytest.mark.parametrize("sender", sorted(SENDERS))
def test_a_wrong_or_missing_signature_is_401_and_wakes_nothing(hook: Hook, sender: str) -> None:
    body = push()
    wrong = SENDERS[sender](body, secret="not-the-secret")
    assert hook.post(body, wrong).status_code == 401
    unsigned = {k: v for k, v in SENDERS[sender](body).items()
                if k not in ("X-Hub-Signature-256", "X-Gitlab-Token", "X-Gitea-Signature")}
    r = hook.post(body, unsigned)
    assert r.status_code == 401 and r.json()["result"].startswith("unsigned")
    if sender != "gitlab":  # GitLab's token is the secret itself: it signs no body
        tampered = SENDERS[sender](body)  # signed for one body, sent with another
        assert hook.post(body.replace(b"refs/heads/main", b"refs/heads/maim"), tampered).status_code == 401
    assert hook.woken == 0


@pytest.mark.parametrize("sender", sorted(SENDERS))
def test_a_replayed_delivery_is_409_and_ticks_once(hook: Hook, sender: str) -> None:
    body = push()
    headers = SENDERS[sender](body)
    assert hook.post(body, headers).status_code == 202
    r = hook.post(body, headers)
    assert r.status_code == 409 and r.json()["result"] == "replayed delivery"
    assert hook.woken == 1


def test_a_push_to_another_branch_is_ignored_with_202(hook: Hook) -> None:
    for ref in ("refs/heads/feature", "refs/tags/v1", "refs/heads/mainline"):
        body = push(ref)
        r = hook.post(body, github(body))
        assert r.status_code == 202 and r.json()["result"].startswith("ignored"), r.text
    assert hook.woken == 0


def test_a_push_when_our_branch_cannot_be_told_still_ticks() -> None:
    """On a detached HEAD the tick itself says what is wrong; the webhook must not hide it."""
    h = Hook(branch=None)
    try:
        body = push("refs/heads/anything")
        assert h.post(body, github(body)).status_code == 202 and h.woken == 1
    finally:
        h.server.stop()


def test_a_10_mb_body_is_refused_413_before_it_is_read(hook: Hook) -> None:
    """Only the headers and 64 KB of the body are sent: the answer comes without the rest."""
    size = 10 * 1024 * 1024
    body = push().ljust(size)
    head = "".join(f"{k}: {v}\r\n" for k, v in github(body).items())
    with socket.create_connection(hook.address, timeout=10) as s:
        s.sendall(f"POST / HTTP/1.1\r\nHost: hook\r\n{head}Content-Length: {size}\r\n\r\n".encode() + body[:65536])
        answer = s.recv(4096).decode()
    assert answer.startswith("HTTP/1.1 413"), answer
    assert "connection: close" in answer.lower()  # header names are case-insensitive
    assert size > MAX_BODY and hook.woken == 0


def test_a_client_that_asks_before_sending_10_mb_gets_413_instead_of_100_continue(hook: Hook) -> None:
    with socket.create_connection(hook.address, timeout=10) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: hook\r\nX-GitHub-Event: push\r\nExpect: 100-continue\r\n"
                  b"Content-Length: 10485760\r\n\r\n")
        assert s.recv(4096).decode().startswith("HTTP/1.1 413")
    assert hook.woken == 0


def test_a_body_without_content_length_is_411(hook: Hook) -> None:
    body = push()
    head = "".join(f"{k}: {v}\r\n" for k, v in github(body).items())
    with socket.create_connection(hook.address, timeout=10) as s:
        s.sendall(f"POST / HTTP/1.1\r\nHost: hook\r\n{head}Transfer-Encoding: chunked\r\n\r\n".encode())
        assert s.recv(4096).decode().startswith("HTTP/1.1 411")
    assert hook.woken == 0


def raw_post(hook: Hook, body: bytes, lengths: list[bytes]) -> str:
    """One signed push sent with the Content-Length header(s) as written; the status line answered."""
    head = "".join(f"{k}: {v}\r\n" for k, v in github(body).items()).encode()
    head += b"".join(b"Content-Length: " + n + b"\r\n" for n in lengths)
    with socket.create_connection(hook.address, timeout=10) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: hook\r\n" + head + b"\r\n" + body)
        return s.recv(4096).decode().split("\r\n", 1)[0]


@pytest.mark.parametrize("form", ["underscore", "plus", "decimal", "arabic-indic", "hex"])
def test_a_content_length_that_is_not_plain_digits_is_400(hook: Hook, form: str) -> None:
    """int() reads "12_3" as 123, "+123" as 123 and Arabic-Indic digits as digits: each made the
    server read a body of a length the sender never wrote."""
    body = push()
    n = str(len(body))
    written = {"underscore": f"{n[:-1]}_{n[-1]}".encode(), "plus": f"+{n}".encode(), "decimal": f"{n}.0".encode(),
               "arabic-indic": n.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")).encode(),
               "hex": hex(len(body)).encode()}[form]
    answer = raw_post(hook, body, [written])
    assert answer.startswith("HTTP/1.1 400"), (written, answer)
    assert hook.woken == 0


def test_a_content_length_with_spaces_around_it_is_read(hook: Hook) -> None:
    """Spaces around a header's value are not part of it (RFC 9110 §5.5)."""
    body = push()
    assert raw_post(hook, body, [f"  {len(body)}\t".encode()]).startswith("HTTP/1.1 202")


def test_two_different_content_lengths_are_400(hook: Hook) -> None:
    body = push()
    assert raw_post(hook, body, [str(len(body)).encode(), str(len(body) + 5).encode()]).startswith("HTTP/1.1 400")
    assert hook.woken == 0


@pytest.mark.parametrize("payload", [b"[" * 100_000 + b"]" * 100_000,
                                     b'{"ref": "refs/heads/main", "x": ' + b"[" * 65 + b"]" * 65 + b"}",
                                     b'{"ref": "refs/heads/other", "ref": "refs/heads/main"}',
                                     b'{"ref": "refs/heads/main", "n": NaN}'],
                         ids=["nested-100000", "nested-65", "duplicate-key", "nan"])
def test_a_signed_body_that_is_not_strict_json_is_400_and_the_server_keeps_serving(hook: Hook,
                                                                                   payload: bytes) -> None:
    """Deep nesting raised RecursionError in the handler's thread; duplicate keys and NaN are not
    JSON as RFC 8259 writes it. All are refused in one sentence, and the next push is served."""
    r = hook.post(payload, github(payload))
    assert r.status_code == 400 and r.json()["result"].startswith("body is not JSON ("), r.text
    body = push()
    assert hook.post(body, github(body)).status_code == 202
    assert hook.woken == 1


def test_ping_other_events_and_malformed_requests(hook: Hook) -> None:
    body = push()
    assert hook.post(body, github(body, event="ping")).status_code == 200
    issue = json.dumps({"action": "opened"}).encode()
    r = hook.post(issue, github(issue, event="issues"))
    assert r.status_code == 202 and r.json()["result"].startswith("ignored")
    form = b"payload=%7B%7D"
    assert hook.post(form, github(form)).status_code == 400  # content type left at form-urlencoded
    assert hook.post(body, {"Content-Type": "application/json"}).status_code == 400  # no sender we know
    no_id = {k: v for k, v in github(body).items() if k != "X-GitHub-Delivery"}
    assert hook.post(body, no_id).status_code == 400
    assert hook.post(body, github(body), path="webhook").status_code == 202
    assert hook.post(body, github(body), path="other").status_code == 404
    assert httpx.get(hook.url).status_code == 405
    assert hook.woken == 1


def test_the_log_has_one_line_per_request_and_never_the_secret_or_body(hook: Hook,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    body = json.dumps({"ref": "refs/heads/main", "marker": "body-marker-7e2"}).encode()
    with caplog.at_level(logging.INFO, logger="reconciler"):
        hook.post(body, github(body, delivery="d-1"))
        hook.post(body, gitlab(body, secret="wrong-token-9"))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("webhook: ")]
    assert lines == ["webhook: github push delivery d-1 from 127.0.0.1: 202 accepted: ticking now",
                     f"webhook: gitlab Push Hook delivery {lines[1].split()[5]} from 127.0.0.1: 401 bad signature"]
    assert not any(s in caplog.text for s in (SECRET, "wrong-token-9", "body-marker-7e2"))


def test_seen_delivery_ids_are_bounded_in_number_and_age() -> None:
    now = [0.0]
    seen = Seen(keep=3, ttl=100, clock=lambda: now[0])
    assert all(seen.first_time(k) for k in "abc")
    assert not seen.first_time("a")
    assert seen.first_time("d")  # pushes "a" out
    assert seen.first_time("a")
    now[0] = 1000.0
    assert seen.first_time("d")  # expired


def test_listen_addresses() -> None:
    assert parse_listen(":8080") == ("127.0.0.1", 8080)
    assert parse_listen("127.0.0.1:9000") == ("127.0.0.1", 9000)
    assert parse_listen("[::1]:9000") == ("::1", 9000)
    assert parse_listen("0.0.0.0:80") == ("0.0.0.0", 80)
    for bad in ("8080", "host:", "host:port", ":70000"):
        with pytest.raises(ValueError):
            parse_listen(bad)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.com")


def test_a_port_in_use_or_an_empty_secret_is_one_sentence(hook: Hook) -> None:
    with pytest.raises(WebhookError, match=f"cannot listen on 127.0.0.1:{hook.address[1]}"):
        WebhookServer("127.0.0.1", hook.address[1], secret=SECRET, wake=lambda: None, branch=lambda: "main").start()
    with pytest.raises(WebhookError, match=SECRET_ENV):
        WebhookServer("127.0.0.1", 0, secret="", wake=lambda: None, branch=lambda: "main")


# ---- the daemon --------------------------------------------------------------------------------------
def listening_port(log: Path) -> int | None:
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", log.read_text())
    return int(m.group(1)) if m else None


def test_webhooks_make_an_hourly_daemon_launch_a_new_job_within_seconds(state_repo: StateRepoFixture,
                                                                          tmp_path: Path) -> None:
    """tick_seconds 60 and no watcher: only a webhook can make the daemon see a new job soon. A
    push to another branch starts nothing; a push from each sender to main launches its job."""
    state_repo.write("desired/first.yaml", job("first", counter(1.0)))
    state_repo.commit("first")
    log = tmp_path / "daemon.log"
    proc = daemon(state_repo.path, log, "--tick-seconds", "60", "--no-watch", "--listen", "127.0.0.1:0",
                  env={SECRET_ENV: SECRET})
    try:
        wait_for("the first tick", lambda: phase_of(state_repo.path, "first") is not None)
        port = listening_port(log)
        assert port is not None, log.read_text()
        url = f"http://127.0.0.1:{port}/webhook"
        state_repo.write("desired/second.yaml", job("second", counter(1.0)))
        commit(state_repo, "second")
        body = push("refs/heads/elsewhere")
        assert httpx.post(url, content=body, headers=github(body)).status_code == 202
        time.sleep(3)
        assert phase_of(state_repo.path, "second") is None, "a push to another branch must not tick"
        for name, sender in SENDERS.items():
            if name != "github":
                state_repo.write(f"desired/{name}.yaml", job(name, counter(1.0)))
                commit(state_repo, name)
            target = "second" if name == "github" else name
            body = push()
            sent = time.time()
            assert httpx.post(url, content=body, headers=sender(body)).status_code == 202
            wait_for(f"the {name} webhook's tick", lambda t=target: phase_of(state_repo.path, t) is not None,
                     timeout=15)
            assert time.time() - sent < 15
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    out = log.read_text()
    assert SECRET not in out
    assert out.count("202 accepted: ticking now") == 3, out


def test_listen_without_a_secret_is_refused_before_anything_starts(state_repo: StateRepoFixture) -> None:
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    res = zygote.run([sys.executable, "-m", "reconciler", "run", "--repo", str(state_repo.path),
                      "--listen", ":0"], capture_output=True, text=True, env={**env, "COLUMNS": "300"},
                     timeout=60)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"set {SECRET_ENV}" in res.stderr
    assert not (state_repo.path / "status").exists()
    assert not (state_repo.path / ".git" / "reconciler.lock").exists()


# ---- replays under a fresh delivery id, and old pushes ----------------------------------------------
@pytest.mark.parametrize("sender", sorted(SENDERS))
def test_a_replayed_payload_under_a_fresh_delivery_id_is_409(hook: Hook, sender: str) -> None:
    """The delivery id is not signed: a captured body sent again under a new id is still a replay."""
    body = push()
    assert hook.post(body, SENDERS[sender](body)).status_code == 202
    r = hook.post(body, SENDERS[sender](body, delivery=str(uuid.uuid4())))
    assert r.status_code == 409 and "another delivery id" in r.json()["result"], r.text
    assert hook.woken == 1


def test_a_push_older_than_the_window_or_from_the_future_is_409(hook: Hook) -> None:
    now = time.time()
    for pushed in (now - WINDOW - 30, now + SKEW + 30):
        body = push(pushed_at=pushed)
        r = hook.post(body, github(body))
        assert r.status_code == 409 and r.json()["result"].startswith("stale delivery"), r.text
    body = push(pushed_at=now - WINDOW + 30)  # late, but inside the window
    assert hook.post(body, github(body)).status_code == 202
    assert hook.woken == 1


def test_the_window_s_edges_and_the_push_times_read() -> None:
    body = json.dumps({"ref": "refs/heads/main", "repository": {"pushed_at": 1000}}).encode()
    headers = github(body)

    def answer(now: float) -> int:
        return judge(headers, body, SECRET.encode(), lambda: "main", Seen(), now=now)[1].status

    assert answer(1000 + WINDOW) == 202 and answer(1000 + WINDOW + 1) == 409
    assert answer(1000 - SKEW) == 202 and answer(1000 - SKEW - 1) == 409
    assert pushed_at({"repository": {"pushed_at": "2026-01-01T00:00:00Z"}}) == 1767225600.0
    assert pushed_at({"repository": {"pushed_at": True}}) is None and pushed_at({}) is None
