"""Step marks on a store whose marks cost a request: posting never waits on the store, writes are
coalesced to about one a second, and closing writes the last value."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from adapters.stores import open_store
from adapters.stores.marks import Marks
from adapters.stores.memory import MemoryStore


class SlowMarks(MemoryStore):
    """A memory store whose every mark takes 0.2 s, as a request to a far store may."""

    def __init__(self) -> None:
        super().__init__(f"memory://marks-{uuid.uuid4().hex[:8]}")
        self.written: list[bytes] = []

    def mark(self, name: str, data: bytes) -> None:
        time.sleep(0.2)
        self.written.append(data)
        super().mark(name, data)


def test_posting_never_waits_and_writes_are_coalesced() -> None:
    store = SlowMarks()
    marks = Marks(store, interval=0.5)
    started = time.monotonic()
    for step in range(1, 1001):
        marks.post("reached", str(step).encode())
        time.sleep(0.0005)
    posting = time.monotonic() - started
    marks.close()
    assert posting < 10, f"1000 posts took {posting:.1f}s: they waited on the store (0.2 s a write)"
    assert len(store.written) <= 2 + posting / 0.5, f"{len(store.written)} writes in {posting:.1f}s"
    assert store.read("reached") == b"1000", "closing writes the last value"


def test_on_local_disk_every_mark_is_written_at_once(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    marks = Marks(store)
    marks.post("reached", b"7\n")
    assert store.read("reached") == b"7\n"
    marks.close()
