"""The status page as a user meets it: `reconciler serve` in its own process on 127.0.0.1, over a
real git repository (tests/web/scenario.py), opened in Debian's headless Chromium by Playwright.
Under CI=true a missing browser or Playwright fails the tests instead of skipping them."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import zygote
from tests.web.scenario import CANARY, CANARY_ENV, Scenario, build

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("RECONCILER_TEST_CHROMIUM", "/usr/bin/chromium")


def _missing(what: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what} (CI=true: the browser tests must run)")
    pytest.skip(what)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[str]


def start_server(repo: Path, *args: str, env: dict[str, str] | None = None) -> Server:
    """`reconciler serve` for `repo`, ready when /healthz answers (or failing with its output)."""
    port = free_port()
    environ = {**os.environ, "PYTHONPATH": str(ROOT), CANARY_ENV: CANARY, **(env or {})}
    proc = zygote.popen([sys.executable, "-m", "reconciler", "serve", "--repo", str(repo),
                         "--listen", f"127.0.0.1:{port}", *args], env=environ, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"reconciler serve exited: {proc.stdout.read() if proc.stdout else ''}")
        try:
            httpx.get(f"{url}/healthz", timeout=1)
            return Server(url, proc)
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("reconciler serve did not answer within 30 s")


def stop_server(server: Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(10)
    except subprocess.TimeoutExpired:
        server.proc.kill()


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    return build(tmp_path_factory.mktemp("page"))


@pytest.fixture(scope="module")
def server(scenario: Scenario) -> Iterator[Server]:
    srv = start_server(scenario.path, "--refresh", "300")  # no reload while a test reads the page
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install -e '.[dev]')")
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        _missing(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    yield pg
    context.close()
