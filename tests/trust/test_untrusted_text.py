"""Untrusted text (a file name, a job's message, a worker's log) with control characters never reaches
a terminal, a log line, a status file or commit, or the status page raw: an escape sequence there
could rewrite the screen, a CR overwrite the line, a newline forge a line or a commit trailer."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import yaml
from starlette.testclient import TestClient

from reconciler.daemon.loop import Reconciler
from reconciler.trust.shown import VisibleFilter
from reconciler.web.app import create_app
from status.text import lines, one_line
from tests.cli.test_cli import cli
from tests.conftest import StateRepoFixture
from tests.daemon.test_loop_local import job, tick_until

HOSTILE = "\x1b]0;owned\x07\x1b[2J\rforged\u202e"  # a title change, clear screen, CR, a bidi override
RAW = ("\x1b", "\x07", "\r", "\u202e")
NAME = f"desired/bad{HOSTILE}\n.yaml"


def raw_in(text: str) -> list[str]:
    return [c for c in RAW if c in text]


def test_control_characters_become_visible_escapes() -> None:
    assert one_line("a\x1b[31mb\r\nc\td\u202e\x85") == "a\\x1b[31mb\\r\\nc\\td\\u202e\\x85"
    assert lines("line 1\r\nline\x1b 2\n\tend\x7f") == "line 1\\r\nline\\x1b 2\n\tend\\x7f"
    assert one_line("plain — ünïcode ✓") == "plain — ünïcode ✓"


@pytest.fixture
def hostile_repo(state_repo: StateRepoFixture, local_workdir: Path) -> StateRepoFixture:
    """A file whose name holds escape sequences (and a bad manifest), a job whose message will quote
    a code.path with them, and a job whose worker prints them to its log."""
    state_repo.write(NAME, "kind: Job\nnot: a manifest\n")
    state_repo.write("desired/a.yaml", job("a", ["true"], yaml.safe_dump({"code": {"path": "/nowhere/" + HOSTILE}})))
    printer = "import sys; sys.stdout.write('before\\x1b[2J\\rafter\\n'); sys.exit(3)"
    state_repo.write("desired/p.yaml", job("p", [sys.executable, "-c", printer],
                                           "retry: {max_retries: 0}"))
    state_repo.commit("hostile text")
    return state_repo


def test_status_files_commit_and_readme_show_no_control_character(hostile_repo: StateRepoFixture) -> None:
    rec = Reconciler(hostile_repo.path)
    report = tick_until(rec, lambda r: "a" in r.statuses and r.statuses["a"].phase.terminal)
    assert "\x1b[2J" in report.statuses["a"].message  # the message carries the hostile text itself
    message = hostile_repo.git("log", "--format=%B", "-n", "20")
    readme = (hostile_repo.path / "status" / "README.md").read_text()
    status_a = hostile_repo.status_text("a")
    for shown in (message, readme, status_a, *report.changed):
        assert not raw_in(shown), shown
    assert "\\x1b[2J" in readme and "bad\\x1b]0;owned" in readme  # the message's and the file name's
    assert "\\x1b[2J" in message


def test_cli_output_shows_no_control_character(hostile_repo: StateRepoFixture) -> None:
    rec = Reconciler(hostile_repo.path)
    tick_until(rec, lambda r: all(n in r.statuses and r.statuses[n].phase.terminal for n in ("a", "p")))
    repo = ["--repo", str(hostile_repo.path)]
    validate = cli("validate", *repo, check=False)
    assert validate.returncode == 1 and "bad\\x1b]0;owned\\x07\\x1b[2J\\rforged\\u202e\\n.yaml" in validate.stderr
    runs = [validate, cli("status", *repo, check=False), cli("describe", "a", *repo), cli("describe", "p", *repo),
            cli("logs", "p", *repo), cli("plan", *repo, check=False)]
    for done in runs:
        assert not raw_in(done.stdout + done.stderr), done.args
    assert "before\\x1b[2J" in runs[4].stdout
    raw = cli("logs", "p", "--raw", *repo).stdout  # asked for: as the worker wrote it (click drops ANSI off a tty)
    assert "before" in raw and "\\x1b" not in raw


def test_log_lines_and_the_status_page_show_no_control_character(hostile_repo: StateRepoFixture) -> None:
    rec = Reconciler(hostile_repo.path)
    tick_until(rec, lambda r: "a" in r.statuses and r.statuses["a"].phase.terminal)
    record = logging.LogRecord("reconciler", logging.WARNING, __file__, 1, "job %s: %s", ("a", HOSTILE), None)
    assert VisibleFilter().filter(record) and not raw_in(record.getMessage())
    client = TestClient(create_app(hostile_repo.path))
    for url in ("/", "/job/a", "/job/p"):
        page = client.get(url)
        assert page.status_code == 200 and not raw_in(page.text), url
    assert "\\x1b[2J" in client.get("/job/a").text
