"""Large payloads on S3 go up in concurrent parts through botocore alone (no boto3)."""

from __future__ import annotations

import hashlib
import os

from tests.worker.conftest import s3_endpoint, store  # noqa: F401 - fixtures
from tests.worker.harness import Store


def test_a_payload_of_several_parts_reads_back_identical(store: Store) -> None:  # noqa: F811
    folder = store.folder()
    data = os.urandom(40 << 20)  # three parts of 16 MiB
    folder.store.write_payload("checkpoints/big.bin", memoryview(data))
    out = bytearray(len(data))
    digest = hashlib.sha256()
    assert folder.store.read_payload_into("checkpoints/big.bin", memoryview(out), digest) == len(data)
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest()
