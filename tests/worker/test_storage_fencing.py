"""The run folder's fencing: compare-and-swap lease, sealed epochs, exclusive completion, probe."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from adapters.storage import (
    CheckpointName,
    Fenced,
    LeaseConflict,
    RunFolder,
    UnsafeStoreError,
    expand_url,
)
from tests.worker.harness import IgnoringStore, Store


@pytest.fixture
def store(in_process_store: Store) -> Store:
    """Run folders and leases in this process: memory:// as well as local disk and S3."""
    return in_process_store


def commit(folder: RunFolder, epoch: int, step: int) -> CheckpointName:
    ckpt = CheckpointName(step, epoch)
    folder.store.write_payload(f"checkpoints/{ckpt.dirname}/data.bin", memoryview(b"x"))
    folder.commit_checkpoint(epoch, ckpt, {"files": {}})
    return ckpt


def test_concurrent_lease_bumps_each_get_their_own_epoch(store: Store) -> None:
    folder = store.folder()
    got: list[int] = []
    lock = threading.Lock()

    def bump() -> None:
        epoch = folder.bump_lease(holder="t")
        with lock:
            got.append(epoch)

    threads = [threading.Thread(target=bump) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(1, 7))
    assert folder.lease_epoch() == 6


def test_bump_with_expected_epoch_refuses_a_lease_that_moved(store: Store) -> None:
    folder = store.folder()
    folder.bump_lease()
    with pytest.raises(LeaseConflict, match="not 0"):
        folder.bump_lease(expected=0)
    assert folder.bump_lease(expected=1) == 2


def test_an_epoch_released_unstarted_is_taken_again_and_older_ones_stay_fenced(store: Store) -> None:
    """A launch the provider refused started no worker: its epoch is the next launch's."""
    folder = store.folder()
    assert folder.bump_lease() == 1
    old = commit(folder, 1, 10)
    assert folder.bump_lease() == 2
    folder.release_unstarted(2)
    with pytest.raises(Fenced):
        folder.check_epoch(1)
    folder.release_unstarted(1)  # a moved-on lease is left alone
    assert folder.bump_lease() == 2 and folder.bump_lease() == 3
    assert old.dirname in folder.lease()["committed"]


def test_replaced_attempt_cannot_commit_and_its_late_commits_are_never_accepted(store: Store) -> None:
    folder = store.folder()
    old = folder.bump_lease()
    kept = commit(folder, old, 10)
    new = folder.bump_lease()
    with pytest.raises(Fenced, match="replaced"):
        commit(folder, old, 20)
    # A zombie that passed its epoch check just before the bump still writes COMMIT.json:
    late = CheckpointName(30, old)
    folder.store.create(f"checkpoints/{late.dirname}/COMMIT.json", json.dumps({"files": {}}).encode())
    assert folder.committed_checkpoints() == [kept]
    assert folder.durable_step() == 10
    mine = commit(folder, new, 15)
    assert folder.committed_checkpoints() == [mine, kept]


def test_bump_keeps_the_outgoing_epochs_unacknowledged_commits(store: Store) -> None:
    folder = store.folder()
    old = folder.bump_lease()
    c = CheckpointName(5, old)
    folder.store.create(f"checkpoints/{c.dirname}/COMMIT.json", b'{"files": {}}')
    folder.bump_lease()
    assert folder.committed_checkpoints() == [c]


def test_done_is_written_once_and_never_by_a_replaced_attempt(store: Store) -> None:
    folder = store.folder()
    old = folder.bump_lease()
    new = folder.bump_lease()
    with pytest.raises(Fenced):
        folder.mark_done(old, {"step": 5})
    assert folder.done() is None
    folder.mark_done(new, {"step": 7})
    folder.mark_done(new, {"step": 9})  # idempotent: the first record stays
    assert folder.done() == {"step": 7, "epoch": new}
    raw = folder.read_json("done.json")
    assert raw is not None and raw["step"] == 7


def test_heartbeat_of_a_replaced_attempt_is_refused(store: Store) -> None:
    folder = store.folder()
    old = folder.bump_lease()
    tag = folder.write_progress(old, {"epoch": old, "step": 1})
    new = folder.bump_lease()
    folder.write_progress(new, {"epoch": new, "step": 2})
    with pytest.raises(Fenced):
        folder.write_progress(old, {"epoch": old, "step": 3}, tag)
    progress = folder.progress()
    assert progress is not None and (progress.epoch, progress.step) == (new, 2)


def test_collection_keeps_the_two_newest_and_removes_partial_folders(store: Store) -> None:
    folder = store.folder()
    epoch = folder.bump_lease()
    for step in (1, 2, 3, 4):
        commit(folder, epoch, step)
    folder.store.write_payload("checkpoints/000000000003-e0/half.bin", memoryview(b"partial"))
    folder.collect(epoch, keep=2)
    left = {name.split("/")[0] for name in folder.store.list("checkpoints")}
    assert left == {CheckpointName(4, epoch).dirname, CheckpointName(3, epoch).dirname}


def test_collection_by_a_replaced_attempt_is_refused(store: Store) -> None:
    folder = store.folder()
    old = folder.bump_lease()
    commit(folder, old, 1)
    folder.bump_lease()
    with pytest.raises(Fenced):
        folder.collect(old)


def test_a_store_that_ignores_conditional_writes_is_refused_at_start(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = store.folder()
    folder = RunFolder(plain.uri, store=IgnoringStore(plain.store))
    monkeypatch.setattr("adapters.stores.base._probed", {})
    with pytest.raises(UnsafeStoreError, match="ignores conditional writes"):
        folder.bump_lease()
    monkeypatch.setenv("RECONCILER_ALLOW_UNFENCED_STORE", "1")
    assert folder.bump_lease() == 1


def test_exclusive_create_refuses_an_existing_file(store: Store) -> None:
    folder = store.folder()
    assert folder.store.create("x.json", b"1")
    assert not folder.store.create("x.json", b"2")
    assert folder.store.read("x.json") == b"1"


def test_expand_url_makes_local_paths_absolute(tmp_path: Any) -> None:
    assert expand_url(str(tmp_path)) == f"file://{tmp_path}"
    assert expand_url("s3://b/k") == "s3://b/k"
