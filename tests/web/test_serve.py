"""`reconciler serve` over HTTP: the token when one is set, the refusal to serve beyond this machine
without one, and the page's own pieces (links to commits, timeline layout) as plain data."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

from reconciler.web.app import TOKEN_ENV, check_bind, local_path
from reconciler.web.views import commit_url_template, merge_attempts, timeline
from status.models import Attempt, JobStatus, Outcome
from tests import zygote
from tests.web.conftest import ROOT, start_server, stop_server
from tests.web.scenario import Scenario

TOKEN = "page-token-3f9a1c77e2"


@pytest.fixture(scope="module")
def gated(scenario: Scenario):
    server = start_server(scenario.path, env={TOKEN_ENV: TOKEN})
    yield server
    stop_server(server)


def test_with_a_token_set_a_request_without_it_is_refused(gated) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong-token"}, {"Authorization": f"Bearer {TOKEN}x"}):
        res = httpx.get(gated.url + "/", headers=headers)
        assert res.status_code == 401, headers
        assert "train" not in res.text
    assert httpx.get(gated.url + "/job/train").status_code == 401
    assert httpx.get(gated.url + "/", cookies={"reconciler_token": "nope"}).status_code == 401


def test_the_right_bearer_token_opens_the_page(gated) -> None:
    res = httpx.get(gated.url + "/job/train", headers={"Authorization": f"Bearer {TOKEN}"})
    assert res.status_code == 200
    assert 'id="timeline"' in res.text


def test_a_token_in_the_address_becomes_a_cookie_and_leaves_the_address(gated) -> None:
    with httpx.Client(base_url=gated.url) as client:
        res = client.get("/job/train", params={"token": TOKEN})
        assert res.status_code == 303
        assert res.headers["location"] == "/job/train"
        assert "httponly" in res.headers["set-cookie"].lower()
        assert client.get("/job/train").status_code == 200  # the cookie now carries it
        assert TOKEN not in client.get("/").text


def _serve(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return zygote.run([sys.executable, "-m", "reconciler", "serve", *args], capture_output=True, text=True,
                      timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT), **env})


def test_serving_beyond_loopback_without_a_token_refuses_to_start(scenario: Scenario) -> None:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    res = _serve("--repo", str(scenario.path), "--listen", "0.0.0.0:0", env={**env, TOKEN_ENV: ""})
    assert res.returncode == 1
    assert TOKEN_ENV in res.stderr and "reachable from other machines" in res.stderr
    assert "Traceback" not in res.stderr
    with pytest.raises(ValueError):
        check_bind("192.0.2.10", None)
    check_bind("192.0.2.10", "a-token")
    check_bind("127.0.0.1", None)
    check_bind("::1", None)


def test_a_folder_that_is_no_repository_is_one_sentence(tmp_path: Path) -> None:
    res = _serve("--repo", str(tmp_path), "--listen", "127.0.0.1:0", env={})
    assert res.returncode == 1
    assert "is not a git repository" in res.stderr and "Traceback" not in res.stderr


def test_bad_listen_and_commit_url_are_usage_errors(scenario: Scenario) -> None:
    assert _serve("--listen", "nowhere", env={}).returncode == 2
    res = _serve("--repo", str(scenario.path), "--commit-url", "https://x/commit/", env={})
    assert res.returncode == 2 and "{sha}" in res.stderr


@pytest.mark.parametrize(("remote", "url"), [
    ("git@github.com:o/r.git", "https://github.com/o/r/commit/{sha}"),
    ("https://github.com/o/r", "https://github.com/o/r/commit/{sha}"),
    ("https://user:pw@gitlab.com/g/sub/r.git", "https://gitlab.com/g/sub/r/-/commit/{sha}"),
    ("ssh://git@codeberg.org/o/r.git", "https://codeberg.org/o/r/commit/{sha}"),
    ("/srv/git/state.git", None),
    ("https://git.internal.example/o/r.git", None),
    (None, None),
])
def test_commit_links_come_from_remotes_on_known_forges(remote: str | None, url: str | None) -> None:
    assert commit_url_template(remote) == url


def _attempt(epoch: int, provider: str, started: float, outcome: Outcome | None) -> Attempt:
    return Attempt(epoch=epoch, provider=provider, worker=f"w{epoch}", started=started,
                   ended=None if outcome is None else started + 50, outcome=outcome)


def test_the_timeline_keeps_every_attempt_of_the_history_with_its_latest_record() -> None:
    old = JobStatus(job="j", run_id="r",
                    attempts=[_attempt(1, "a", 0, Outcome.INTERRUPTION), _attempt(2, "b", 100, None)])
    new = JobStatus(job="j", run_id="r",
                    attempts=[_attempt(2, "b", 100, Outcome.JOB_ERROR), _attempt(3, "a", 200, None)])
    attempts = merge_attempts([old, new])
    assert [(a.epoch, a.outcome) for a in attempts] == [(1, Outcome.INTERRUPTION), (2, Outcome.JOB_ERROR), (3, None)]
    tl = timeline(attempts, now=300)
    assert [p for p, _ in tl.lanes] == ["a", "b"]
    assert [b.cls for b in tl.bars] == ["interrupted", "failed", "running"]
    assert tl.bars[0].y == tl.bars[2].y != tl.bars[1].y
    assert tl.bars[0].x < tl.bars[1].x < tl.bars[2].x


def test_the_page_s_layout_module_does_no_io() -> None:
    from tests.test_architecture import IO_MODULES, imported_modules

    views = ROOT / "reconciler" / "web" / "views.py"
    bad = {m for m in imported_modules(views) if m in IO_MODULES or m.split(".")[0] in IO_MODULES}
    assert not bad, f"reconciler/web/views.py imports {sorted(bad)}"


def test_a_job_not_reconciled_yet_has_a_page_and_an_unknown_one_is_404(server) -> None:
    res = httpx.get(server.url + "/job/new-job")
    assert res.status_code == 200
    assert "No attempt yet." in res.text and "not reconciled yet" in res.text
    missing = httpx.get(server.url + "/job/nope")
    assert missing.status_code == 404 and missing.text == "no job named nope"
    # the name comes from the URL: a terminal escape or a newline in it comes back as a visible escape
    hostile = httpx.get(server.url + "/job/nope%1b%5b2J%0aforged")
    assert hostile.status_code == 404 and "\x1b" not in hostile.text and "\n" not in hostile.text
    assert hostile.text.startswith("no job named nope") and "forged" in hostile.text


def test_the_page_loads_nothing_from_elsewhere(server) -> None:
    res = httpx.get(server.url + "/job/train")
    assert "default-src 'self'" in res.headers["content-security-policy"]
    assert not re.search(r'(src|href)="(https?:)?//(?!github\.com/example/state/commit/)', res.text)
    css = httpx.get(server.url + "/static/style.css")
    assert css.status_code == 200 and "url(" not in css.text


def test_history_lists_a_file_s_commits_newest_first(scenario: Scenario) -> None:
    from adapters.gitrepo import StateRepo

    repo = StateRepo(scenario.path)
    entries = repo.history("status/train.yaml", limit=5)
    assert [sha for sha, _, _ in entries] == list(reversed(scenario.commits["train"]))[:5]
    assert entries[0][2] == "train: forecast"
    assert entries[0][1] >= entries[-1][1]
    assert repo.history("status/none.yaml") == []
    assert repo.remote_url() == "git@github.com:example/state.git"
    assert repo.remote_url("upstream") is None


def test_a_repository_without_commits_is_served_with_its_one_sentence(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path / "empty")], check=True)
    server = start_server(tmp_path / "empty")
    try:
        res = httpx.get(server.url + "/")
        assert res.status_code == 503
        assert "has no commits yet" in res.text and "Traceback" not in res.text
    finally:
        stop_server(server)


def test_a_finished_job_s_timeline_ends_with_its_last_attempt() -> None:
    attempts = [_attempt(1, "a", 0, Outcome.JOB_ERROR), _attempt(2, "a", 100, Outcome.SUCCEEDED)]
    tl = timeline(attempts, now=10_000)
    last = tl.bars[-1]
    assert last.x + last.width == pytest.approx(tl.width - 10, abs=1)  # the plot's right edge, not `now`


def test_the_overview_shows_each_provider_s_learned_mtbf(tmp_path: Path) -> None:
    from status.models import render_status
    from status.room import RoomEvidence, render_room
    from tests.planner.test_plan import PROVIDERS
    from tests.planner.test_plan_interval import SPOT, history

    repo = tmp_path / "state"
    (repo / "desired").mkdir(parents=True)
    (repo / "status").mkdir()
    (repo / "reconciler.yaml").write_text(f"storage: file://{tmp_path}/runs\n")
    (repo / "desired" / "providers.yaml").write_text(PROVIDERS + "---" + SPOT)
    stormy = history("old", "spot", [3 / 3600] * 5, Outcome.INTERRUPTION, end=time.time() - 1)  # 3 s each
    (repo / "status" / "old.yaml").write_text(render_status(stormy))
    (repo / "status" / "room.yaml").write_text(render_room({"spot": RoomEvidence(
        seen_at=time.time(), had_room=False, room_periods=4.0, short_room_periods=1.0,
        short_within_seconds=1200.0, mean_wait_hours=2.0)}))
    scenario = Scenario(repo, tmp_path / "runs", time.time())
    scenario.git("init", "-q")
    scenario.git("add", "-A")
    scenario.git("commit", "-q", "-m", "five interruptions on spot")
    server = start_server(repo)
    try:
        html = httpx.get(server.url + "/").text
    finally:
        stop_server(server)
    rows = dict(re.findall(r'<tr data-provider="([^"]+)">(.*?)</tr>', html))
    cells = {name: re.findall(r"<td[^>]*>(.*?)</td>", row) for name, row in rows.items()}
    head = re.findall(r"<th[^>]*>(.*?)</th>", html.split('id="providers"')[1].split("</thead>")[0])
    kind = head.index("kind")  # the failure-rate columns: kind, MTBF told, interruptions, machine time, prior
    assert cells["spot"][0] == "spot" and cells["spot"][kind] == "interruptible"
    told = int(re.fullmatch(r"(\d+) s", cells["spot"][kind + 1])[1])
    assert 3 <= told <= 30 and cells["spot"][kind + 2] == "5.0"  # within ten times the 3 s observed
    assert cells["free"][kind:kind + 5] == ["reliable", "30 d (2,592,000 s)", "0.0", "none", "30 d"]
    room = head.index("room for a worker")  # what the daemon has seen of spot's room (status/room.yaml)
    assert cells["spot"][room] == "without room for 2.0 h on average; 25 % of room periods end within 20 min"
    assert cells["free"][room] == ""  # it never said whether it had a free slot


# Request targets whose path, as the server decodes it, a browser would follow to another host.
OFF_SITE = ["//evil.example/", "/%2F/evil.example", "%2F%2Fevil.example", "/%5Cevil.example", "/%5C%5Cevil.example",
            "/\\evil.example", "/%09/evil.example", "/%0A/evil.example", "/%0D%0A/evil.example", "/%20/evil.example",
            "https:evil.example", "/https://evil.example"]


def _location(server, target: str) -> str:
    """The Location answered to a raw request line (no client library to tidy the target up)."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"GET {target}?token={TOKEN}&x=1 HTTP/1.1\r\nHost: page\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    head = answer.decode("latin-1").split("\r\n\r\n", 1)[0]
    assert head.startswith("HTTP/1.1 303"), head
    return next(line.split(":", 1)[1].strip() for line in head.split("\r\n") if line.lower().startswith("location:"))


@pytest.mark.parametrize("target", OFF_SITE)
def test_the_token_s_redirect_never_leaves_the_site(gated, target: str) -> None:
    """The redirect after ?token= goes to the path asked for; a path a browser would read as another
    host (`//host`, `/\\host`, with tabs or newlines inside, percent-encoded or not) goes to / instead."""
    location = _location(gated, target)
    assert location.startswith("/") and location[1:2] not in ("/", "\\"), location
    assert all(c.isprintable() and not c.isspace() for c in location), location
    assert urlsplit(urljoin("http://page/", location)).netloc == "page", location


def test_the_token_s_redirect_keeps_a_local_path_and_its_query(gated) -> None:
    assert _location(gated, "/job/train") == "/job/train?x=1"
    assert local_path("/job/a b") == "/job/a%20b" and local_path("/job/x\\y") == "/job/x%5Cy"
