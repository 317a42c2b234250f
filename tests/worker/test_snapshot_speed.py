"""The fast paths of saving and restoring keep every guarantee of the slow ones.

Digests computed beside the I/O (xxh3_128, or sha256 for older checkpoints and where xxhash is
missing), restore reading shards straight into the tensors' own buffers, and CUDA state staged through
pinned buffers on a side stream. There is no GPU here: the staging test drives the real `Stager`
through a recording stand-in for `torch.cuda` and checks the order of the calls the GPU would
see; the copies themselves run on CPU tensors.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import xxhash

from adapters import digest
from adapters.storage import CheckpointName, CorruptCheckpoint, RunFolder, StorageError
from reconciler.worker import open_run, snapshot, staging
from tests.worker.harness import Store, assert_same

SHARD_BYTES = 1 << 20


def big_state(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Tensors of several sizes: on restore the small ones share a buffer, the large (from
    snapshot.LARGE_BYTES, 1 MiB, up) have their own. 4.3 MB of parameters: with SHARD_BYTES that is
    five shards of the model and nine of the optimizer, as with 14 MB and 3 MiB shards before."""
    torch.manual_seed(seed)
    model = torch.nn.ParameterList(
        [torch.nn.Parameter(torch.randn(n)) for n in (3, 300_000, 17, 500_000, 1, 280_000)]
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    return model, opt  # type: ignore[return-value]


def save_twice(store: Store, monkeypatch: pytest.MonkeyPatch, algorithm: str) -> tuple[RunFolder, dict[str, Any]]:
    """Checkpoints at steps 1 and 2 written with `algorithm`; returns the folder and step 1's model state."""
    monkeypatch.setenv(digest.DIGEST_ENV, algorithm)
    monkeypatch.setenv("RECONCILER_SHARD_BYTES", str(SHARD_BYTES))  # several shards per object
    folder = store.folder()
    model, opt = big_state()
    with open_run(uri=folder.uri, storage_options=store.options, epoch=folder.bump_lease(),
                  install_signal_handlers=False) as run:
        run.save(1, model=model, optimizer=opt)
        run.wait()
        at_1 = {k: v.clone() for k, v in model.state_dict().items()}
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        run.save(2, model=model, optimizer=opt)
        run.wait()
    return folder, at_1


def newest(folder: RunFolder) -> CheckpointName:
    return folder.committed_checkpoints()[0]


def restore_into(store: Store, folder: RunFolder) -> tuple[int, torch.nn.Module]:
    model, opt = big_state(seed=1)
    with open_run(uri=folder.uri, storage_options=store.options, epoch=folder.bump_lease(),
                  install_signal_handlers=False) as run:
        return run.restore(model=model, optimizer=opt), model


@pytest.mark.parametrize("algorithm", ["xxh3_128", "sha256"])
def test_commit_records_name_their_digest_and_restore_checks_it(
    store: Store, monkeypatch: pytest.MonkeyPatch, algorithm: str
) -> None:
    folder, _ = save_twice(store, monkeypatch, algorithm)
    ckpt = newest(folder)
    record = folder.read_commit(ckpt)
    assert len([f for f in record["files"] if f.startswith("model.")]) >= 2
    for fname, info in record["files"].items():
        blob = folder.store.read(f"checkpoints/{ckpt.dirname}/{fname}") or b""
        want = xxhash.xxh3_128(blob).hexdigest() if algorithm == "xxh3_128" else hashlib.sha256(blob).hexdigest()
        assert info == {"size": len(blob), algorithm: want}
    monkeypatch.delenv(digest.DIGEST_ENV)  # the reader follows the record, whatever it would write
    step, model = restore_into(store, folder)
    assert step == 2


def test_by_default_both_digests_are_written_so_a_worker_without_xxhash_restores(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run moves between providers: one written where xxhash is installed must restore where it
    is not (a hosted provider's image), checked by sha256 there."""
    folder, _ = save_twice(store, monkeypatch, "")  # RECONCILER_CHECKPOINT_DIGEST unset: the default
    ckpt = newest(folder)
    for fname, info in folder.read_commit(ckpt)["files"].items():
        blob = folder.store.read(f"checkpoints/{ckpt.dirname}/{fname}") or b""
        assert info == {"size": len(blob), "xxh3_128": xxhash.xxh3_128(blob).hexdigest(),
                        "sha256": hashlib.sha256(blob).hexdigest()}
    monkeypatch.setattr(digest, "_xxhash", lambda: None)
    assert digest.expected(folder.read_commit(ckpt)["files"]["meta.pkl"])[0] == "sha256"
    step, _model = restore_into(store, folder)
    assert step == 2
    name = f"checkpoints/{ckpt.dirname}/model.0001.bin"  # and sha256 still catches damage there
    data = bytearray(folder.store.read(name) or b"")
    data[7] ^= 0x01
    folder.store.write(name, bytes(data))
    assert restore_into(store, folder)[0] == 1


@pytest.mark.parametrize("algorithm", ["xxh3_128", "sha256"])
@pytest.mark.parametrize("damage", ["flip", "truncate", "extend"])
def test_a_damaged_shard_is_caught_while_reading_and_the_previous_checkpoint_restored(
    store: Store, monkeypatch: pytest.MonkeyPatch, algorithm: str, damage: str
) -> None:
    folder, at_1 = save_twice(store, monkeypatch, algorithm)
    name = f"checkpoints/{newest(folder).dirname}/model.0001.bin"
    data = bytearray(folder.store.read(name) or b"")
    if damage == "flip":
        data[len(data) - 5] ^= 0x01
    elif damage == "truncate":
        del data[-100:]
    else:
        data += b"\0"
    folder.store.write(name, bytes(data))
    step, model = restore_into(store, folder)
    assert step == 1
    assert_same(at_1, model.state_dict())


def test_restored_large_tensors_get_buffers_of_their_own_and_small_ones_share_one(tmp_path: Any) -> None:
    model, opt = big_state()
    folder = RunFolder(str(tmp_path / "run"))
    epoch = folder.bump_lease()
    snap = snapshot.capture(5, {"model": model, "optimizer": opt}, {})
    with ThreadPoolExecutor(4) as pool:
        ckpt = snapshot.write(folder, epoch, snap, None, pool)
        loaded = snapshot.read(folder, ckpt, pool)
    restored = loaded["objects"]["model"]
    for key, value in model.state_dict().items():
        assert torch.equal(restored[key], value)
    storages = {key: t.untyped_storage().data_ptr() for key, t in restored.items()}
    large = [k for k, t in restored.items() if t.numel() * t.element_size() >= snapshot.LARGE_BYTES]
    small = [k for k in restored if k not in large]
    assert len({storages[k] for k in large}) == len(large) == 3, "one buffer per large tensor"
    assert len({storages[k] for k in small}) == 1 and storages[small[0]] not in {storages[k] for k in large}
    # the layout covers every byte of the section once, and no tensor straddles two spans
    total = int(snap.sections["optimizer"].numel())
    spans, sizes = snapshot._layout(snap.meta["objects"]["optimizer"], total)
    assert spans[0].start == 0 and spans[-1].end == total
    assert all(x.end == y.start for x, y in zip(spans, spans[1:], strict=False))
    assert sum(sizes) == total and sum(x.end - x.start for x in spans) == total
    refs: list[snapshot.TensorRef] = []
    snapshot._collect_refs(snap.meta["objects"]["optimizer"], refs)
    for ref in refs:
        assert any(x.start <= ref.offset and ref.offset + ref.nbytes <= x.end for x in spans), ref


def test_overlapped_digest_equals_the_one_shot_digest_and_passes_on_errors() -> None:
    data = os.urandom(5 << 20)
    for algorithm in digest.ALGORITHMS:
        hasher = digest.Overlapped(digest.new(algorithm))
        view = memoryview(data)
        for i in range(0, len(data), 123_457):  # chunks of an odd size, handed over faster than hashed
            hasher.update(view[i : i + 123_457])
        one_shot = digest.new(algorithm)
        one_shot.update(data)
        assert hasher.hexdigest() == one_shot.hexdigest()

    class Broken:
        def update(self, chunk: Any) -> None:
            raise MemoryError("no room")

        def hexdigest(self) -> str:
            return ""

    broken = digest.Overlapped(Broken())
    broken.update(b"x" * 10)
    with pytest.raises(MemoryError):
        broken.hexdigest()


def test_digest_settings_and_records_that_cannot_be_checked_fail_clearly(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(digest.DIGEST_ENV, "md5")
    with pytest.raises(digest.DigestError, match="RECONCILER_CHECKPOINT_DIGEST='md5' is not one of"):
        digest.preferred()
    folder, _ = save_twice(store, monkeypatch, "xxh3_128")
    ckpt = newest(folder)
    # a reader without the xxhash package says what to install rather than calling the checkpoint corrupt
    monkeypatch.setattr(digest, "_xxhash", lambda: None)
    out = bytearray(1 << 20)
    with pytest.raises(StorageError, match="pip install xxhash") as err:
        folder.read_verified(ckpt, "meta.pkl", folder.read_commit(ckpt)["files"]["meta.pkl"], memoryview(out))
    assert not isinstance(err.value, CorruptCheckpoint)
    # a record without any digest is not a valid commit record
    name = f"checkpoints/{ckpt.dirname}/COMMIT.json"
    record = json.loads(folder.store.read(name) or b"")
    record["files"]["meta.pkl"].pop("xxh3_128")
    folder.store.write(name, json.dumps(record).encode())
    with pytest.raises(CorruptCheckpoint, match="has no digest"):
        folder.read_commit(ckpt)


class Recorder:
    """Stands in for `torch.cuda`: streams, events and contexts that log what is done with them."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.current_side: str | None = None
        self.training = FakeStream(self, "training")
        self.counts = {"stream": 0, "event": 0}
        self.on_host_wait: Any = None

    def Stream(self) -> FakeStream:  # noqa: N802 - the names torch.cuda uses
        self.counts["stream"] += 1
        return FakeStream(self, f"side{self.counts['stream']}")

    def Event(self) -> FakeEvent:  # noqa: N802
        self.counts["event"] += 1
        return FakeEvent(self, f"event{self.counts['event']}")

    def current_stream(self) -> FakeStream:
        return self.training

    @contextmanager
    def device(self, device: torch.device) -> Iterator[None]:
        yield

    @contextmanager
    def stream(self, stream: FakeStream) -> Iterator[None]:
        self.current_side = stream.name
        try:
            yield
        finally:
            self.current_side = None


class FakeStream:
    def __init__(self, rec: Recorder, name: str) -> None:
        self.rec, self.name = rec, name

    def wait_stream(self, other: FakeStream) -> None:
        self.rec.log.append(f"{self.name} waits for {other.name}")

    def wait_event(self, event: FakeEvent) -> None:
        self.rec.log.append(f"{self.name} waits for {event.name}")


class FakeEvent:
    def __init__(self, rec: Recorder, name: str) -> None:
        self.rec, self.name = rec, name

    def record(self, stream: FakeStream) -> None:
        self.rec.log.append(f"{self.name} recorded on {stream.name}")

    def synchronize(self) -> None:
        self.rec.log.append(f"host waits for {self.name}")
        if self.rec.on_host_wait is not None:
            self.rec.on_host_wait()


class RecordingStager(staging.Stager):
    """The real Stager; only the pinned allocation (torch's own job, impossible without CUDA) is
    replaced by a plain one that is counted."""

    allocations = 0

    def alloc(self, nbytes: int) -> torch.Tensor:
        RecordingStager.allocations += 1
        return torch.empty(nbytes, dtype=torch.uint8)

    def usable(self, buf: torch.Tensor) -> bool:
        return True


class RecordingStagers(staging.Stagers):
    """Large tensors play the device's; small ones stay on the host, to mix both paths in one save."""

    def __init__(self, cuda: Recorder) -> None:
        super().__init__(cuda)
        self.stager = RecordingStager(torch.device("cpu"), cuda)

    def for_tensor(self, t: torch.Tensor) -> staging.Stager | None:
        return self.stager if t.numel() >= 1000 else None


def test_device_tensors_are_staged_on_a_side_stream_into_reused_buffers_without_a_host_wait(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec = Recorder()
    real_copy = torch.Tensor.copy_

    def logged_copy(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        if non_blocking:  # the asynchronous (device) copies
            rec.log.append(f"copy issued on {rec.current_side or 'the training stream'}")
        return real_copy(self, src, non_blocking=non_blocking)

    monkeypatch.setattr(torch.Tensor, "copy_", logged_copy)
    stagers = RecordingStagers(rec)
    model, opt = big_state()
    folder = RunFolder(str(tmp_path / "run"))
    epoch = folder.bump_lease()
    RecordingStager.allocations = 0
    buffers: dict[str, torch.Tensor] = {}
    with ThreadPoolExecutor(4) as pool:
        for step in (1, 2):
            rec.log.clear()
            snap = snapshot.capture(step, {"model": model, "optimizer": opt}, buffers, stagers)
            event = f"event{step}"
            assert rec.log[0] == "side1 waits for training", "the copies wait for the values being computed"
            copies = rec.log[1:-2]
            assert copies and set(copies) == {"copy issued on side1"}, "every device copy goes on the side stream"
            assert rec.log[-2:] == [f"{event} recorded on side1", f"training waits for {event}"], (
                "the training stream waits for the copy (on the device) before it changes the tensors"
            )
            if step == 2:
                assert all(snap.sections[k] is buffers[k] for k in buffers), "host buffers are reused"
            buffers = snap.sections
            target = tmp_path / "run" / "checkpoints" / CheckpointName(step, epoch).dirname
            seen: list[bool] = []
            rec.on_host_wait = lambda t=target, s=seen: s.append(t.exists())  # type: ignore[misc]
            ckpt = snapshot.write(folder, epoch, snap, None, pool)
            assert rec.log[-1] == f"host waits for {event}" and seen == [False], (
                "the writer waits for the copy before it reads a byte"
            )
    assert RecordingStager.allocations == 2, "one pinned buffer per object, allocated by the first save only"
    with ThreadPoolExecutor(2) as pool:
        loaded = snapshot.read(folder, ckpt, pool)
    for key, value in model.state_dict().items():
        assert torch.equal(loaded["objects"]["model"][key], value)


def test_background_uploads_reuse_one_thread_and_can_be_joined_with_a_timeout() -> None:
    gate = threading.Event()
    names: list[str] = []

    def upload(tag: str) -> None:
        names.append(f"{tag}:{threading.current_thread().name}")
        gate.wait(10)

    first = snapshot.Background(upload, "a")
    first.join(timeout=0.05)
    assert first.is_alive(), "join with a timeout returns while the upload still runs"
    gate.set()
    first.join()
    assert not first.is_alive()
    second = snapshot.Background(upload, "b")
    second.join()
    assert len(names) == 2 and names[0].split(":")[1] == names[1].split(":")[1], "the same thread serves both"
    assert names[0].split(":")[1].startswith("reconciler-upload")
