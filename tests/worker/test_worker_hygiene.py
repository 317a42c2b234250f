"""What a checkpoint and a killed attempt leave in the run folder: the same state gives the same
bytes (no uninitialised alignment slack written out), a kill in the middle of a heartbeat leaves no
temporary file behind once the next attempt starts, and the steps a killed attempt did after its
last heartbeat are counted as lost: exactly the steps the next attempt computes again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from adapters.storage import RunFolder
from reconciler.daemon.loop import read_run
from reconciler.planner.judge import close
from reconciler.worker import open_run
from status.models import Attempt, Outcome
from tests.worker.conftest import s3_store
from tests.worker.harness import Store, attempt


def _payload(folder: RunFolder) -> dict[str, bytes]:
    (ckpt,) = folder.accepted_checkpoints()
    base = Path(folder.store.os_path(f"checkpoints/{ckpt.dirname}"))
    return {p.name: p.read_bytes() for p in sorted(base.iterdir()) if p.name != "COMMIT.json"}


def _save_once(uri: str, state: dict[str, torch.Tensor]) -> RunFolder:
    with open_run(uri=uri, install_signal_handlers=False) as run:
        run.save(7, state=state)
        run.wait()
        return run.folder


def test_the_same_state_saved_twice_gives_identical_files(tmp_path: Path) -> None:
    # Odd sizes: every tensor is followed by alignment slack in the packed buffer.
    state = {"a": torch.arange(3, dtype=torch.float32), "b": torch.ones(5, 7, dtype=torch.float16)}
    first = _payload(_save_once(str(tmp_path / "one"), state))
    # Leave garbage where the allocator will find it for the second run's fresh buffer.
    junk = torch.full((4096,), 0xA5, dtype=torch.uint8)
    del junk
    second = _payload(_save_once(str(tmp_path / "two"), state))
    assert first.keys() == second.keys() and any(n.endswith(".bin") for n in first)
    for name in first:
        assert first[name] == second[name], f"{name} differs between two saves of the same state"
    shard = first["state.0000.bin"]
    assert shard[12:64] == bytes(52), "the slack after a 12-byte tensor must be zeros"
    assert shard[-(64 - 70 % 64):] == bytes(64 - 70 % 64), "the file must not end in uninitialised bytes"


# Write points of a first heartbeat, in order: the metrics series' temporary file, its rename, then
# progress.json's temporary file and its rename. A kill after either temporary file is complete
# leaves it behind.
@pytest.mark.parametrize("kill_at, left_behind", [(2, "metrics/e1.json.tmp-"), (4, "progress.json.tmp-")])
def test_a_kill_inside_a_heartbeat_leaves_no_temp_file_after_the_next_start(
        tmp_path: Path, kill_at: int, left_behind: str) -> None:
    store = Store("file", str(tmp_path))
    folder = store.folder()
    env = store.env(folder, folder.bump_lease(), RECONCILER_FAULT_KILL_AT=kill_at, RECONCILER_CHECKPOINT_EVERY=5)
    assert attempt(env, {"steps": 10, "seed": 1}) == -9
    root = Path(folder.store.os_path())
    left = [p.relative_to(root).as_posix() for p in root.rglob("*") if ".tmp-" in p.name]
    assert len(left) == 1 and left[0].startswith(left_behind), f"the kill should land mid-write: {left}"
    env = store.env(folder, folder.bump_lease(), RECONCILER_CHECKPOINT_EVERY=5)
    assert attempt(env, {"steps": 10, "seed": 1}) == 0
    assert not [p.name for p in root.rglob("*") if ".tmp-" in p.name]


def _notes(log: Path, word: str) -> list[int]:
    return [int(line.split()[1]) for line in log.read_text().splitlines() if line.startswith(word + " ")]


def test_steps_lost_are_the_steps_the_next_attempt_recomputes(tmp_path: Path) -> None:
    store = Store("file", str(tmp_path))
    folder = store.folder()
    run_id = folder.uri.rsplit("/", 1)[-1]
    log = tmp_path / "train.log"
    slow_beats = {"RECONCILER_CHECKPOINT_EVERY": 5, "RECONCILER_HEARTBEAT_INTERVAL": 1000}
    epoch = folder.bump_lease()
    started = time.time()
    # Killed after finishing step 13: its only heartbeat was step 1, its last checkpoint step 10 (or 5).
    cfg = {"steps": 20, "seed": 1, "log": str(log)}
    assert attempt(store.env(folder, epoch, **slow_beats), {**cfg, "die_at": 13}) == -9
    seen = read_run(str(tmp_path), "job", run_id, {})
    assert seen.heartbeat_step == 1, "the heartbeat alone never saw the steps after step 1"
    first = Attempt(epoch=epoch, provider="local", worker="w", started=started)
    closed = close(first, Outcome.INTERRUPTION, time.time(), seen)
    # The next attempt: what it restores from and what it then computes again.
    assert attempt(store.env(folder, folder.bump_lease(), **slow_beats), cfg) == 0
    restored = _notes(log, "restored")[-1]
    assert restored == seen.durable_step and restored in (5, 10)  # save(10) may still be uploading
    assert closed.steps_lost == 13 - restored


def test_on_s3_the_steps_after_the_last_heartbeat_are_reported_within_about_a_second(s3_endpoint: str) -> None:
    store = s3_store(s3_endpoint)
    folder = store.folder()
    run_id = folder.uri.rsplit("/", 1)[-1]
    slow_beats = {"RECONCILER_CHECKPOINT_EVERY": 1000, "RECONCILER_HEARTBEAT_INTERVAL": 1000}
    # About 0.1 s a step: killed after step 25, 2.4 s after its only heartbeat (step 1).
    cfg = {"steps": 40, "seed": 1, "sleep": 0.1, "die_at": 25}
    assert attempt(store.env(folder, folder.bump_lease(), **slow_beats), cfg) == -9
    seen = read_run(store.base, "job", run_id, store.options)
    assert seen.heartbeat_step == 1, "the heartbeat alone never saw the steps after step 1"
    assert seen.reached_step is not None and 25 - 12 <= seen.reached_step <= 25, (
        f"the mark says step {seen.reached_step}: it should trail the kill at step 25 by about a second at most")


def test_only_temp_files_of_dead_or_long_gone_writers_are_removed(tmp_path: Path) -> None:
    from adapters.stores.local import HOST, STALE_TEMP_SECONDS

    folder = RunFolder(str(tmp_path))
    gone_pid = _reaped_pid()
    files = {
        f"progress.json.tmp-{HOST}-{os.getpid()}-aaaa": True,  # this process: being written
        f"progress.json.tmp-{HOST}-{gone_pid}-bbbb": False,  # this host, writer gone
        "stop.json.tmp-otherhost-12-cccc": True,  # another host, recent: may be in flight
        "lease.json.tmp-otherhost-13-dddd": False,  # another host, long ago
    }
    for name in files:
        (tmp_path / name).write_bytes(b"x")
    old = time.time() - STALE_TEMP_SECONDS - 60
    os.utime(tmp_path / "lease.json.tmp-otherhost-13-dddd", (old, old))
    removed = folder.store.remove_stale_temp_files()
    assert sorted(removed) == sorted(n for n, kept in files.items() if not kept)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for n, kept in files.items() if kept)


def _reaped_pid() -> int:
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
