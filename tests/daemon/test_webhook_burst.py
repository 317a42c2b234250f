"""The webhook server under load and abuse, over real sockets: a burst of hundreds of connections is
answered in full (bench/webhook_burst.py), and a client that sends nothing, half a request, or
garbage, or stalls, costs one line in the log and no traceback."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.daemon import serving
from tests.daemon.test_webhook import Hook

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"connections=(\d+) answered=(\d+) accepted=(\d+) reset=(\d+) refused=(\d+) timed_out=(\d+) "
                  r"half_open_logged=(\d+) tracebacks=(\d+) seconds=(\S+)")


def test_a_burst_of_300_connections_is_answered_in_full() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "webhook_burst.py"), "--connections", "300",
                          "--half-open", "10"], capture_output=True, text=True, env=env, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    match = LINE.fullmatch(res.stdout.strip().splitlines()[-1])
    assert match, res.stdout
    connections, answered, accepted, reset, refused, timed_out, logged, tracebacks = map(int, match.groups()[:8])
    assert connections == answered == accepted == 300, res.stdout
    assert reset == refused == timed_out == tracebacks == 0
    assert logged == 10  # one line per half-open client
    assert "Traceback" not in res.stderr


@pytest.fixture
def quick_hook(monkeypatch: pytest.MonkeyPatch) -> Iterator[Hook]:
    """A server whose connections get half a second to deliver their request."""
    monkeypatch.setattr(serving, "READ_TIMEOUT", 0.5)
    h = Hook()
    yield h
    h.server.stop()


def _lines(caplog: pytest.LogCaptureFixture, count: int) -> list[str]:
    """The server's lines about connections, once `count` have come (it writes them as it notices)."""
    deadline = time.monotonic() + 10
    while True:
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("http: connection from")]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.02)


@pytest.mark.parametrize("sent", [b"", b"POST /webhook HTTP/1.1\r\nHost: hook\r\nX-GitHub-Ev",
                                  b"POST /webhook HTTP/1.1\r\nHost: hook\r\nContent-Length: 100\r\n\r\n{\"ref\""])
def test_a_client_that_goes_away_early_costs_one_line(quick_hook: Hook, caplog: pytest.LogCaptureFixture,
                                                       capfd: pytest.CaptureFixture[str], sent: bytes) -> None:
    """Nothing sent, half the headers, or the headers and part of the body: then the client closes."""
    with caplog.at_level(logging.INFO, logger="reconciler"):
        with socket.create_connection(quick_hook.address, timeout=5) as s:
            s.sendall(sent)
        lines = _lines(caplog, 1)
        time.sleep(0.7)  # past the deadline: a connection already gone must not be reported again
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("http: connection from")]
    assert len(lines) == 1 and lines[0].startswith("http: connection from 127.0.0.1: closed by the client"), lines
    says = f"after {len(sent)} bytes, before its request was complete" if sent else "without sending a request"
    assert lines[0].endswith(says), lines
    assert "Traceback" not in caplog.text + capfd.readouterr().err
    assert quick_hook.woken == 0


@pytest.mark.parametrize("sent", [b"", b"POST /webhook HTTP/1.1\r\nHost: hook\r\n",
                                  b"POST /webhook HTTP/1.1\r\nHost: hook\r\nContent-Length: 100\r\n\r\n{"])
def test_a_client_that_stalls_is_cut_off_at_the_deadline_with_one_line(quick_hook: Hook,
                                                                       caplog: pytest.LogCaptureFixture,
                                                                       capfd: pytest.CaptureFixture[str],
                                                                       sent: bytes) -> None:
    with caplog.at_level(logging.INFO, logger="reconciler"), \
            socket.create_connection(quick_hook.address, timeout=5) as s:
        s.sendall(sent)
        assert s.recv(4096) == b""  # the server closed it
        lines = _lines(caplog, 1)
    assert lines == [f"http: connection from 127.0.0.1: no complete request within 0.5s ({len(sent)} bytes "
                     "received): closed"], lines
    assert "Traceback" not in caplog.text + capfd.readouterr().err


def test_garbage_is_answered_400_with_one_line(quick_hook: Hook, caplog: pytest.LogCaptureFixture,
                                               capfd: pytest.CaptureFixture[str]) -> None:
    with caplog.at_level(logging.INFO, logger="reconciler"), \
            socket.create_connection(quick_hook.address, timeout=5) as s:
        s.sendall(b"\x16\x03\x01 not http at all\r\n\r\n")  # e.g. a TLS hello sent to plain HTTP
        assert s.recv(4096).startswith(b"HTTP/1.1 400")
        while s.recv(4096):  # the rest of the answer, then the server's close
            pass
        quick_hook.server.stop()  # its loop has handled every event of that connection, the close too
        lines = _lines(caplog, 1)
    assert lines == ["http: connection from 127.0.0.1: Invalid HTTP request received"], lines
    assert "Traceback" not in caplog.text + capfd.readouterr().err


async def _scrape_all(address: tuple[str, int], count: int) -> list[bytes]:
    """`count` connections opened together, then each asks for /metrics: the status lines answered."""
    opened = asyncio.Barrier(count)

    async def one() -> bytes:
        reader, writer = await asyncio.open_connection(*address)
        await opened.wait()
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n")
        try:
            return await asyncio.wait_for(reader.readline(), 20)
        except (TimeoutError, OSError):
            return b""
        finally:
            writer.close()

    return await asyncio.gather(*(one() for _ in range(count)))


def test_a_burst_of_300_scrapes_of_the_metrics_endpoint_is_answered_in_full() -> None:
    """`run --metrics` on a port of its own is served like the webhook (prometheus_client's own
    server queued 5 connections)."""
    from reconciler.daemon.metrics import Metrics
    from reconciler.daemon.telemetry import serve_metrics

    stop, port = serve_metrics(Metrics(), "127.0.0.1", 0)
    try:
        lines = asyncio.run(_scrape_all(("127.0.0.1", port), 300))
    finally:
        stop()
    assert [line.split(b" ")[1] for line in lines if line] == [b"200"] * 300
