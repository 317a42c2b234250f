"""Large payloads on S3 go up in concurrent parts through botocore alone (no boto3); the stores'
retry pauses never draw from the `random` module's global generator."""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.worker.conftest import s3_endpoint, s3_store, store  # noqa: F401 - fixtures
from tests.worker.harness import Store


def test_a_payload_of_several_parts_reads_back_identical(store: Store) -> None:  # noqa: F811
    folder = store.folder()
    data = os.urandom(40 << 20)  # three parts of 16 MiB
    folder.store.write_payload("checkpoints/big.bin", memoryview(data))
    out = bytearray(len(data))
    digest = hashlib.sha256()
    assert folder.store.read_payload_into("checkpoints/big.bin", memoryview(out), digest) == len(data)
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest()


@contextlib.contextmanager
def global_draws() -> Iterator[list[str]]:
    """The calls this thread makes on the `random` module's global generator while inside (other
    threads of the test process are left out: only what the code under test does here counts)."""
    calls: list[str] = []

    def seen(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call" and getattr(arg, "__self__", None) is random._inst:  # type: ignore[attr-defined]
            calls.append(arg.__name__)

    sys.setprofile(seen)
    try:
        yield calls
    finally:
        sys.setprofile(None)


class _Body:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self) -> Any:
        yield self.data


def test_a_retried_request_leaves_the_global_random_stream_alone(s3_endpoint: str) -> None:  # noqa: F811
    """A worker uploads on a background thread: a retry pause drawn from `random`'s global generator
    would move the training script's draws, and the resumed run would differ from an uninterrupted one."""
    from botocore.awsrequest import AWSResponse

    s3 = s3_store(s3_endpoint)
    client = s3.folder().store.client
    sends = []

    def first_send_fails(request: Any, **_: Any) -> AWSResponse | None:
        sends.append(request.url)
        error = b"<Error><Code>InternalError</Code><Message>try again</Message></Error>"
        return AWSResponse(request.url, 500, {}, _Body(error)) if len(sends) == 1 else None

    client.meta.events.register_first("before-send.s3", first_send_fails, unique_id="test-first-send-fails")
    try:
        with global_draws() as draws:
            s3.folder().store.write("retried.json", b"{}")
        assert draws == []
    finally:
        client.meta.events.unregister("before-send.s3", unique_id="test-first-send-fails")
    assert len(sends) == 2, "the 500 was retried once"


def test_a_lease_swap_that_loses_a_race_leaves_the_global_random_stream_alone(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    folder = store.folder()
    epoch = folder.bump_lease()
    swap, lost = folder._lease_cas, []

    def loses_once(token: Any, record: dict[str, Any]) -> bool:
        if not lost:
            lost.append(True)
            return False
        return swap(token, record)

    monkeypatch.setattr(folder, "_lease_cas", loses_once)
    with global_draws() as draws:
        folder.release_unstarted(epoch)
    assert lost and draws == []
