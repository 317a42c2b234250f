"""Sharded checkpoints beyond local disk and beyond a blocking save: real ranks (gloo on CPU)
writing through torch.distributed.checkpoint to a real S3 server (moto on 127.0.0.1), with one
rank SIGKILLed mid-save and the run resumed on another number of ranks; and saves that return
once the state is copied while a slowed writer is still writing, a kill before the commit
leaving the checkpoint before as the accepted one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fsspec
import pytest

from adapters import digest
from adapters.storage import COMMIT_FILE, RunFolder
from tests.worker.conftest import make_bucket
from tests.worker.harness import S3_CREDENTIALS, References, Store, assert_same, load, run_ranks
from tests.worker.test_worker_distributed import EVERY, QUIET, STEPS, checkpoint_dirs, notes, shared_reference


@pytest.fixture(scope="module")
def local_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return Store("file", str(tmp_path_factory.mktemp("runs")))


@pytest.fixture(scope="module")
def sharded_reference(references: References) -> Any:
    """The sharded job run start to end on 2 ranks, on local disk: what every resume must equal (the
    same run tests/worker/test_worker_distributed.py compares against, made once per session)."""
    return shared_reference(references, "sharded", 2)


@pytest.fixture
def s3_store(s3_endpoint: str) -> Store:
    options = {"endpoint_url": s3_endpoint, "key": S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
               "secret": S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"]}
    return Store("s3", f"s3://{make_bucket(s3_endpoint)}/runs", s3_endpoint, options)


def bucket(store: Store) -> Any:
    """The test's own view of the bucket (s3fs), independent of the SDK's."""
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **store.options)
    fs.invalidate_cache()
    return fs


def ckpt_path(folder: RunFolder, step: int, epoch: int, name: str = "") -> str:
    return f"{folder.uri}/checkpoints/{step:012d}-e{epoch}" + (f"/{name}" if name else "")


def commit_record(store: Store, folder: RunFolder, step: int, epoch: int) -> dict[str, Any] | None:
    fs, path = bucket(store), ckpt_path(folder, step, epoch, COMMIT_FILE)
    return dict(json.loads(fs.cat_file(path))) if fs.exists(path) else None


def s3_listing(store: Store, folder: RunFolder, step: int, epoch: int) -> set[str]:
    fs, path = bucket(store), ckpt_path(folder, step, epoch)
    return {p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)} if fs.exists(path) else set()


def test_sharded_saves_to_s3_survive_a_rank_killed_mid_save_and_resume_on_three_ranks(
        s3_store: Store, sharded_reference: Any, tmp_path: Path) -> None:
    folder = s3_store.folder()
    log = tmp_path / "s3.log"
    cfg = {"mode": "sharded", "steps": STEPS, "seed": 3, "log": str(log)}
    # With 2 ranks rank 1 hashes one of the three files per save: it dies in the second save,
    # after both ranks wrote their part to the bucket and before rank 0 could commit.
    codes = run_ranks(s3_store.env(folder, folder.bump_lease(), **QUIET), cfg, 2,
                      rank_env={1: {"RECONCILER_FAULT_KILL_AT": 2}})
    assert codes[1] == -9, codes
    assert folder.durable_step() == EVERY
    first = commit_record(s3_store, folder, EVERY, 1)
    assert first is not None and first["world_size"] == 2
    assert set(first["files"]) == {".metadata", "__0_0.distcp", "__1_0.distcp"}, first["files"]
    for info in first["files"].values():  # both digests, as the replicated path records them
        assert set(digest.written()) <= set(info), info
    cut = s3_listing(s3_store, folder, 2 * EVERY, 1)
    assert "__1_0.distcp" in cut and COMMIT_FILE not in cut, cut
    out = tmp_path / "resumed.pt"
    codes = run_ranks(s3_store.env(folder, folder.bump_lease(), **QUIET), {**cfg, "out": str(out)}, 3)
    assert codes == [0, 0, 0]
    assert [notes(log, r, "restored")[-1] for r in range(3)] == [EVERY] * 3
    assert_same(sharded_reference, load(str(out)), "sharded state saved to S3 by 2 ranks, resumed on 3")
    assert folder.done()["step"] == STEPS
    last = commit_record(s3_store, folder, STEPS, 2)
    assert last is not None and last["world_size"] == 3


def test_a_damaged_shard_on_s3_is_refused_and_the_checkpoint_before_is_used(
        s3_store: Store, sharded_reference: Any, tmp_path: Path) -> None:
    folder = s3_store.folder()
    cfg = {"mode": "sharded", "steps": STEPS, "seed": 3, "log": str(tmp_path / "bad.log")}
    assert run_ranks(s3_store.env(folder, folder.bump_lease(), **QUIET), {**cfg, "steps": 2 * EVERY}, 2) == [0, 0]
    fs, shard = bucket(s3_store), ckpt_path(folder, 2 * EVERY, 1, "__1_0.distcp")
    data = bytearray(fs.cat_file(shard))
    data[len(data) // 2] ^= 0xFF
    fs.pipe_file(shard, bytes(data))
    out = tmp_path / "resumed.pt"
    codes = run_ranks(s3_store.env(folder, folder.bump_lease(), **QUIET), {**cfg, "out": str(out)}, 2)
    assert codes == [0, 0]
    assert notes(tmp_path / "bad.log", 0, "restored")[-1] == EVERY
    assert_same(sharded_reference, load(str(out)), "resumed from the checkpoint before the damaged one")


def test_a_sharded_save_returns_before_its_commit_and_a_kill_before_the_commit_keeps_the_one_before(
        local_store: Store, sharded_reference: Any, tmp_path: Path) -> None:
    folder = local_store.folder()
    log = tmp_path / "slow.log"
    slow = 2.0  # each write sleeps this long; the 4 steps between saves take 3 s, so no save waits for one before
    cfg = {"mode": "sharded", "steps": STEPS, "seed": 3, "log": str(log), "slow_write": slow, "sleep": 0.75}
    # The ranks SIGKILL themselves right after save(8) returned, while its write is still sleeping.
    codes = run_ranks(local_store.env(folder, folder.bump_lease(), **QUIET), {**cfg, "die_at": 2 * EVERY}, 2)
    assert codes == [-9, -9], codes
    for rank in (0, 1):
        returned = [line.split() for line in Path(f"{log}.{rank}").read_text().splitlines()
                    if line.startswith("returned ")]
        assert [int(r[1]) for r in returned] == [EVERY, 2 * EVERY], returned
        for _, step, seconds, committed in returned:
            assert float(seconds) < slow and committed == "0", f"rank {rank}: save({step}) waited for its write"
    assert folder.durable_step() == EVERY, "the checkpoint whose write was cut short must not be accepted"
    assert COMMIT_FILE not in checkpoint_dirs(folder).get(f"{2 * EVERY:012d}-e1", set())
    out = tmp_path / "resumed.pt"
    resume = {**cfg, "slow_write": 0.5, "sleep": 0, "out": str(out)}
    codes = run_ranks(local_store.env(folder, folder.bump_lease(), **QUIET), resume, 2)
    assert codes == [0, 0]
    assert [notes(log, r, "restored")[-1] for r in (0, 1)] == [EVERY, EVERY]
    assert_same(sharded_reference, load(str(out)), "resumed after a kill before the commit")
    assert folder.done()["step"] == STEPS


def test_a_run_folder_that_ranks_cannot_share_or_reach_is_refused_in_one_sentence(
        s3_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from reconciler.worker import sharded

    with pytest.raises(ValueError, match="lives in one process's memory: use a file:// or s3:// run folder"):
        sharded.check_folder(RunFolder("memory://sharded-refused/run"))
    folder = s3_store.folder()
    sharded.check_folder(folder)  # torch 2.13 has DCP's fsspec writer
    monkeypatch.setitem(sys.modules, "torch.distributed.checkpoint._fsspec_filesystem", None)
    with pytest.raises(ValueError, match="lacks: use a file:// run folder"):
        sharded.check_folder(folder)
