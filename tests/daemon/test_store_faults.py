"""A storage fault is the store's, never a job's: a real tmpfs that fills up and a read-only bind
mount under a live local job. While the fault holds nothing is charged, nothing is launched and
the worker keeps training; once the store is back the same attempt completes from its durable
step with nothing lost (the workload asserts its sum, which a lost or repeated step would break).
"""

from __future__ import annotations

import errno
import http.client
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from adapters.leader import MIN_SECONDS_ENV, Election
from adapters.stores import open_store
from reconciler.clock import ManualClock
from reconciler.daemon.loop import Reconciler, TickReport
from reconciler.web.app import create_app
from status.models import Phase
from tests.conftest import StateRepoFixture
from tests.daemon.test_loop_local import job, phase, tick_until
from tests.worker.conftest import make_bucket, s3_endpoint  # noqa: F401 - a fixture
from tests.worker.harness import S3_CREDENTIALS

WORKLOAD = Path(__file__).parent / "workloads" / "counter.py"
ROOT = Path(__file__).resolve().parents[2]  # the worker imports this tree's SDK, not an installed one
TARGET = 60

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs or a bind mount needs root")


def _mount(*args: str) -> None:
    """`mount`, tried three times (a run under load once skipped here, its reason not kept); a
    failure is a skip on a developer's machine and, with CI=true, a failure that says why."""
    for _ in range(3):
        done = subprocess.run(["mount", *args], capture_output=True, text=True)
        if done.returncode == 0:
            return
        time.sleep(0.5)
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but `mount {' '.join(args)}` failed: {done.stderr.strip()}", pytrace=False)
    pytest.skip(f"cannot mount here: {done.stderr.strip()}")


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, unmounted afterwards."""
    where = tmp_path / "runs"
    where.mkdir()
    _mount("-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where))
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


def fill(folder: Path) -> Path:
    """Writes one file until the file system is full; returns it (delete it to free the space)."""
    big = folder / "filler"
    with open(big, "wb", buffering=0) as fh:
        chunk = b"\0" * 4096
        while True:
            try:
                fh.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
    return big


def reached(storage: Path, run_id: str, epoch: int = 1) -> int:
    mark = storage / "count" / run_id / f"reached-e{epoch}"
    text = mark.read_bytes().strip(b"\0 \n") if mark.exists() else b""
    return int(text) if text.isdigit() else 0


def run_through_fault(state_repo: StateRepoFixture, storage: Path, start: Callable[[], None],
                      end: Callable[[], None], kind: str, env: str = "",
                      reached_at: Callable[[Path, str], int] = reached,
                      held: Callable[[TickReport], bool] | None = None, secrets: str = "") -> None:
    """Runs a counter job; once it has a checkpoint, `start`s the fault, ticks until the worker has
    trained to its last step under it (or until `held` says), `end`s it and ticks until the job is
    done. Checks on every tick of the fault that nothing is charged or launched, and at the end
    that one attempt did it all."""
    state_repo.write("desired/count.yaml", job("count", [sys.executable, str(WORKLOAD), "0.1"],
                                               f"env: {{PYTHONPATH: {ROOT}, {env}}}\n{secrets}"))
    state_repo.commit("add count")
    rec = Reconciler(state_repo.path)
    first = tick_until(rec, lambda r: r.statuses["count"].phase == Phase.RUNNING and reached_at(
        storage, r.statuses["count"].run_id) >= 15, timeout=90)
    run_id = first.statuses["count"].run_id
    start()

    def faulted(report: TickReport) -> None:
        st = report.statuses["count"]
        assert st.failures == 0 and st.phase != Phase.FAILED, st.message
        assert st.total_attempts == 1, st.attempts
        assert not any(a.startswith("launch") for a in report.actions), report.actions

    during = tick_until(rec, held or (lambda r: reached_at(storage, run_id) >= TARGET), each=faulted, timeout=120)
    st = during.statuses["count"]
    assert st.phase == Phase.RUNNING and kind in st.message, st.message
    readme = (state_repo.path / "status" / "README.md").read_text()
    assert readme.count("Run storage fault") == 1 and f"is {kind}" in readme
    page = TestClient(create_app(state_repo.path)).get("/").text
    assert page.count("Run storage fault") == 1 and f"is {kind}" in page
    end()
    final = tick_until(rec, phase("count"), timeout=90)
    st = final.statuses["count"]
    assert st.phase == Phase.SUCCEEDED, st.message
    assert st.failures == 0 and st.interruptions == 0 and st.total_attempts == 1, st.attempts
    assert st.progress.step == TARGET
    assert "Run storage fault" not in (state_repo.path / "status" / "README.md").read_text()
    assert "Run storage fault" not in TestClient(create_app(state_repo.path)).get("/").text


@needs_root
def test_a_full_store_charges_no_job_and_the_job_completes_when_space_is_back(
        tmp_path: Path, tmpfs: Path, local_workdir: Path) -> None:
    state_repo = StateRepoFixture(tmp_path / "state", tmpfs)
    filler: list[Path] = []
    run_through_fault(state_repo, tmpfs, lambda: filler.append(fill(tmpfs)), lambda: filler[0].unlink(), "full")


@needs_root
def test_a_read_only_store_charges_no_job_and_the_job_completes_when_writable(
        tmp_path: Path, local_workdir: Path) -> None:
    storage = tmp_path / "runs"
    storage.mkdir()
    state_repo = StateRepoFixture(tmp_path / "state", storage)
    mounted: list[bool] = []

    def read_only() -> None:
        # A read-only bind mount of the folder stacked on itself: new opens see it read-only.
        _mount("--bind", str(storage), str(storage))
        mounted.append(True)
        _mount("-o", "remount,ro,bind", str(storage))

    def writable() -> None:
        subprocess.run(["umount", str(storage)], check=True)
        mounted.clear()

    try:
        run_through_fault(state_repo, storage, read_only, writable, "read-only")
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(storage)], check=False)



@needs_root
def test_a_lease_the_full_store_cannot_renew_leads_until_it_expires_then_the_daemon_stops_acting(
        tmp_path: Path, tmpfs: Path, local_workdir: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MIN_SECONDS_ENV, "30")
    caplog.set_level(logging.INFO, "reconciler")
    state_repo = StateRepoFixture(tmp_path / "state", tmpfs)
    clock = ManualClock()
    rec = Reconciler(state_repo.path, clock=clock)
    rec.election = Election()
    assert rec.tick().halted is None  # the lease is taken: good for 30 s
    filler = fill(tmpfs)
    clock.advance(10)
    within = rec.tick()
    assert within.halted is None and within.errors == []  # still the leader: nobody else can be
    clock.advance(25)  # past the lease this daemon last wrote
    state_repo.write("desired/later.yaml", job("later", ["true"], "suspend: true"))
    state_repo.commit("add later")
    for _ in range(3):
        report = rec.tick()
        assert report.halted is not None and "cannot renew the leader lease" in report.halted
        assert report.actions == [] and report.status_commit is None
        clock.advance(1)
    assert not (state_repo.path / "status" / "later.yaml").exists()
    said = [r.getMessage() for r in caplog.records if "not acting" in r.getMessage()]
    assert len(said) == 1 and "full" in said[0], said
    filler.unlink()
    back = rec.tick()
    assert back.halted is None and back.statuses["later"].phase == Phase.SUSPENDED
    assert (state_repo.path / "status" / "later.yaml").exists()
    assert sum("renewed again" in r.getMessage() for r in caplog.records) == 1


class Failing503:
    """A loopback proxy in front of the S3 test server that answers 503 Service Unavailable to
    every request while `failing` is set, and passes everything through otherwise."""

    BODY = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ServiceUnavailable</Code>'
            b"<Message>Please reduce your request rate.</Message></Error>")

    def __init__(self, upstream: str) -> None:
        self.failing = threading.Event()
        target = upstream.removeprefix("http://")
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if proxy.failing.is_set():
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(proxy.BODY)))
                    self.end_headers()
                    self.wfile.write(proxy.BODY)
                    return
                conn = http.client.HTTPConnection(target, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("content-length", "connection", "transfer-encoding", "date", "server"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def test_an_s3_store_answering_503_charges_no_job_and_the_job_completes_after(
        tmp_path: Path, local_workdir: Path, s3_endpoint: str,  # noqa: F811 - a fixture
        monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in S3_CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    # Each S3 call tries twice, not six times: the fault and what it costs are the same, and the two
    # ticks under it do not wait out botocore's backoff (up to 15 s a call) on every store call.
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    proxy = Failing503(s3_endpoint)
    bucket = make_bucket(s3_endpoint)
    state_repo = StateRepoFixture(tmp_path / "state", tmp_path / "unused")
    state_repo.write("reconciler.yaml", f"storage: s3://{bucket}/runs\ntick_seconds: 0.5\n"
                                        f"storage_options: {{endpoint_url: '{proxy.url}'}}\n")
    state_repo.commit("s3 storage behind the proxy")
    secrets = f"secrets: [{', '.join(S3_CREDENTIALS)}]"
    seen: list[int] = []

    def reached_s3(_storage: Path, run_id: str) -> int:
        blob = open_store(f"s3://{bucket}/runs/count/{run_id}", {"endpoint_url": s3_endpoint}).read("reached-e1")
        return int(blob) if blob else 0

    def two_ticks_of_it(report: TickReport) -> bool:
        seen.append(1)
        return len(seen) >= 2

    try:
        run_through_fault(state_repo, tmp_path, proxy.failing.set, proxy.failing.clear, "unavailable",
                          secrets=secrets, reached_at=reached_s3, held=two_ticks_of_it)
    finally:
        proxy.close()
