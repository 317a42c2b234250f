"""One contract every store backend passes (as every fsspec backend passes one abstract suite):
local disk, S3 (the loopback moto server), memory://, and the generic fsspec backend (over
fsspec's own in-memory filesystem)."""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid
from collections.abc import Callable

import fsspec
import pytest

from adapters.stores import CorruptCheckpoint, Store, UnsafeStoreError, open_store
from adapters.stores.fsspec import FsspecStore
from tests.worker.conftest import make_bucket
from tests.worker.harness import S3_CREDENTIALS, IgnoringStore

PART = 5 << 20  # S3's smallest part


@pytest.fixture(params=["local", "s3", "memory", "fsspec"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Store:
    if request.param == "local":
        made = open_store(str(tmp_path_factory.mktemp("store")))
    elif request.param == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        made = open_store(f"s3://{make_bucket(endpoint)}/folder", {
            "endpoint_url": endpoint,
            "key": S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "secret": S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        })
    elif request.param == "memory":
        made = open_store(f"memory://contract-{uuid.uuid4().hex[:8]}/folder")
    else:
        made = FsspecStore(f"memory://fsspec-{uuid.uuid4().hex[:8]}/folder", fs=fsspec.filesystem("memory"))
    made.part_bytes = PART
    return made


def _threads(n: int, target: Callable[[int], None]) -> None:
    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_missing_files_read_as_none_and_delete_quietly(store: Store) -> None:
    assert store.read("nope.json") is None
    assert store.read_tagged("nope.json") == (None, None)
    assert store.list("nope") == {}
    store.delete("nope.json")
    store.delete_tree("nope")
    with pytest.raises(CorruptCheckpoint, match="missing"):
        store.read_payload_into("nope.bin", memoryview(bytearray(4)))


def test_a_reader_never_sees_a_mix_of_two_writes(store: Store) -> None:
    versions = [bytes([c]) * (256 << 10) for c in b"ab"]
    store.write("f.bin", versions[0])
    stop = time.monotonic() + 1.0
    seen: list[bytes | None] = []

    def writer(_: int) -> None:
        i = 0
        while time.monotonic() < stop:
            i += 1
            store.write("f.bin", versions[i % 2])

    def reader(_: int) -> None:
        while time.monotonic() < stop:
            seen.append(store.read("f.bin"))

    _threads(2, lambda i: (writer if i == 0 else reader)(i))
    assert seen and all(blob in versions for blob in seen)


def test_exactly_one_of_many_concurrent_creators_wins(store: Store) -> None:
    wins: list[int] = []

    def create(i: int) -> None:
        if store.create("once.json", f"writer {i}".encode()):
            wins.append(i)

    _threads(8, create)
    assert len(wins) == 1
    assert store.read("once.json") == f"writer {wins[0]}".encode()
    assert not store.create("once.json", b"late")


def test_swap_writes_only_over_the_tag_it_was_given(store: Store) -> None:
    assert store.swap("s.json", b"1", "no-such-tag") is None
    assert store.read("s.json") is None
    first = store.swap("s.json", b"1", None)  # None: only if absent
    assert first is not None and store.read_tagged("s.json") == (b"1", first)
    assert store.swap("s.json", b"x", None) is None
    second = store.swap("s.json", b"2", first)
    assert second is not None and second != first
    assert store.swap("s.json", b"x", first) is None  # stale tag
    assert store.read_tagged("s.json") == (b"2", second)


# The generic store's swap compares and then writes: run folders use a lease log there. Local disk's
# swap holds an flock: atomic on one host.
@pytest.mark.parametrize("store", ["local", "s3", "memory"], indirect=True)
def test_concurrent_incrementers_lose_no_update(store: Store) -> None:
    store.write("n", b"0")

    def increment(_: int) -> None:
        for _ in range(10):
            while True:
                blob, tag = store.read_tagged("n")
                if store.swap("n", str(int(blob or b"0") + 1).encode(), tag) is not None:
                    break

    _threads(4, increment)
    assert store.read("n") == b"40"


def test_list_delete_and_delete_tree(store: Store) -> None:
    store.write("a", b"1")
    store.write("d/b", b"22")
    store.write_payload("d/e/c", memoryview(b"333"))
    assert store.list("") == {"a": 1, "d/b": 2, "d/e/c": 3}
    assert store.list("d") == {"b": 2, "e/c": 3}
    store.delete_tree("d")
    assert store.list("") == {"a": 1}
    store.delete("a")
    assert store.list("") == {}


def test_a_payload_of_several_parts_reads_back_identical(store: Store) -> None:
    data = os.urandom(2 * PART + 123)
    store.write_payload("big.bin", memoryview(data))
    out = bytearray(len(data))
    hasher = hashlib.sha256()
    assert store.read_payload_into("big.bin", memoryview(out), hasher) == len(data)
    assert out == data and hasher.hexdigest() == hashlib.sha256(data).hexdigest()


def test_short_and_long_payloads_are_told_apart(store: Store) -> None:
    store.write_payload("p.bin", memoryview(b"0123456789"))
    assert store.read_payload_into("p.bin", memoryview(bytearray(12))) == 10  # shorter than expected
    assert store.read_payload_into("p.bin", memoryview(bytearray(8))) > 8  # longer than expected


def test_a_scatter_read_fills_the_parts_in_order(store: Store) -> None:
    data = os.urandom(3000)
    store.write_payload("p.bin", memoryview(data))
    parts = [memoryview(bytearray(n)) for n in (3, 1000, 1997)]
    hasher = hashlib.sha256()
    assert store.read_parts_into("p.bin", parts, hasher) == 3000
    assert b"".join(bytes(p) for p in parts) == data and hasher.hexdigest() == hashlib.sha256(data).hexdigest()
    assert store.read_parts_into("p.bin", parts[:2], None) > 1003


def test_a_mark_reads_back_as_its_last_value(store: Store) -> None:
    store.write("keep", b"")  # the folder exists, as a run folder does before its first mark
    for step in (5, 17):
        store.mark("reached", f"{step:019d}\n".encode())
    store.close()
    assert int(store.read("reached") or b"") == 17


def test_the_store_passes_the_conditional_write_probe(store: Store) -> None:
    assert store._probe(), "creating twice or swapping with a wrong tag was accepted"
    store.check_conditional_writes()
    left = [n for n in store.list("") if not n.endswith(".lock")]  # local disk's swap keeps its flock file
    assert left == [], "the probe left its file behind"


def test_a_store_that_ignores_conditional_writes_is_refused_unless_allowed(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("adapters.stores.base._probed", {})
    ignoring = IgnoringStore(store)
    with pytest.raises(UnsafeStoreError, match="ignores conditional writes"):
        ignoring.create("x.json", b"1")
    assert store.read("x.json") is None
    monkeypatch.setenv("RECONCILER_ALLOW_UNFENCED_STORE", "1")
    assert ignoring.create("x.json", b"1")
    assert not ignoring.create("x.json", b"2")  # read-then-write: no longer safe against a race
    assert ignoring.swap("x.json", b"3", "stale") is None
