"""A storage fault is the store's, never a job's: a real tmpfs that fills up and a read-only bind
mount under a live local job. While the fault holds nothing is charged, nothing is launched and
the worker keeps training; once the store is back the same attempt completes from its durable
step with nothing lost (the workload asserts its sum, which a lost or repeated step would break).
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from adapters.leader import MIN_SECONDS_ENV, Election
from reconciler.clock import ManualClock
from reconciler.loop import Reconciler, TickReport
from status.models import Phase
from tests.conftest import StateRepoFixture
from tests.loop.test_loop_local import job, phase, tick_until

WORKLOAD = Path(__file__).parent / "workloads" / "counter.py"
ROOT = Path(__file__).resolve().parents[2]  # the worker imports this tree's SDK, not an installed one
TARGET = 60

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs or a bind mount needs root")


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode != 0:
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
                      end: Callable[[], None], kind: str) -> None:
    """Runs a counter job; once it has a checkpoint, `start`s the fault, ticks until the worker has
    trained to its last step under it, `end`s it and ticks until the job is done. Checks on every
    tick of the fault that nothing is charged or launched, and at the end that one attempt did it all."""
    state_repo.write("desired/count.yaml", job("count", [sys.executable, str(WORKLOAD), "0.1"], f"env: {{PYTHONPATH: {ROOT}}}"))
    state_repo.commit("add count")
    rec = Reconciler(state_repo.path)
    first = tick_until(rec, lambda r: r.statuses["count"].phase == Phase.RUNNING and reached(
        storage, r.statuses["count"].run_id) >= 15, timeout=90)
    run_id = first.statuses["count"].run_id
    start()

    def faulted(report: TickReport) -> None:
        st = report.statuses["count"]
        assert st.failures == 0 and st.phase != Phase.FAILED, st.message
        assert st.total_attempts == 1, st.attempts
        assert not any(a.startswith("launch") for a in report.actions), report.actions

    during = tick_until(rec, lambda r: reached(storage, run_id) >= TARGET, each=faulted, timeout=90)
    st = during.statuses["count"]
    assert st.phase == Phase.RUNNING and kind in st.message, st.message
    readme = (state_repo.path / "status" / "README.md").read_text()
    assert f"is {kind}" in readme
    end()
    final = tick_until(rec, phase("count"), timeout=90)
    st = final.statuses["count"]
    assert st.phase == Phase.SUCCEEDED, st.message
    assert st.failures == 0 and st.interruptions == 0 and st.total_attempts == 1, st.attempts
    assert st.progress.step == TARGET
    assert "Run storage fault" not in (state_repo.path / "status" / "README.md").read_text()


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
