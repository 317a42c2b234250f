"""Fixtures for the worker tests: a real S3 server (moto) on loopback, and stores on each backend.

The server is started here, by the tests; with CI=true a server that cannot start fails the run
instead of skipping the S3 half.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.worker.harness import S3_CREDENTIALS, References, Store

_S3_WRITE_LOCK = threading.Lock()


def _make_conditional_writes_atomic() -> None:
    """moto checks If-Match / If-None-Match and then stores the object without a lock, so two
    concurrent conditional PUTs can both pass: a check-then-act race in the test server that real
    S3 does not have (its conditional writes are atomic). It showed up as a duplicate lease epoch
    in test_concurrent_lease_bumps_each_get_their_own_epoch[s3] under load. Serialising moto's
    PUT and DELETE handlers (the server runs in this process) makes the fencing tests test our
    code, not moto's race."""
    from moto.s3.responses import S3Response

    for name in ("put_object", "delete_object"):
        original = getattr(S3Response, name)
        if getattr(original, "_serialised", False):
            continue

        def serialised(self: S3Response, _original=original):  # type: ignore[no-untyped-def]
            with _S3_WRITE_LOCK:
                return _original(self)

        serialised._serialised = True  # type: ignore[attr-defined]
        setattr(S3Response, name, serialised)


def _serve_s3() -> Any:
    """moto's S3 application alone, served by werkzeug on a free loopback port, in a thread.

    moto's ThreadedMotoServer puts every AWS service behind a dispatcher that, for each request,
    lists moto's package folder and tries every service's URL patterns before it finds S3; with
    werkzeug's log record of each request, that was nearly a third of the CPU an S3 call cost here
    (client and server in one process: 6.5 ms a call through the dispatcher, 4.5 ms without)."""
    import logging

    from moto.moto_server.werkzeug_app import create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no record of every request
    server = make_server("127.0.0.1", 0, create_backend_app("s3"), threaded=True)
    threading.Thread(target=server.serve_forever, name="s3-server", daemon=True).start()
    return server


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    try:
        _make_conditional_writes_atomic()
        server = _serve_s3()
    except Exception as exc:  # noqa: BLE001 - any failure to start is reported the same way
        if os.environ.get("CI") == "true":
            pytest.fail(f"cannot start the S3 test server (moto) on 127.0.0.1: {exc}")
        pytest.skip(f"cannot start the S3 test server (moto): {exc}")
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def make_bucket(endpoint: str) -> str:
    import boto3

    name = f"runs-{uuid.uuid4().hex[:12]}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=S3_CREDENTIALS["AWS_DEFAULT_REGION"],
    )
    client.create_bucket(Bucket=name)
    return name


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Store:
    """A place for run folders that worker processes can reach too."""
    return _store(request, tmp_path_factory)


@pytest.fixture(params=["file", "s3", "memory"])
def in_process_store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Store:
    """Also memory://, which only this process sees: for tests that start no worker process."""
    return _store(request, tmp_path_factory)


def _store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Store:
    if request.param == "file":
        return Store("file", str(tmp_path_factory.mktemp("runs")))
    if request.param == "memory":
        return Store("memory", f"memory://runs-{uuid.uuid4().hex[:12]}")
    return s3_store(request.getfixturevalue("s3_endpoint"))


def s3_store(endpoint: str) -> Store:
    """Run folders in a fresh bucket of the loopback S3 server."""
    options = {
        "endpoint_url": endpoint,
        "key": S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "secret": S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    }
    return Store("s3", f"s3://{make_bucket(endpoint)}/runs", endpoint, options)


@pytest.fixture(scope="session")
def references(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> References:
    # Under xdist each worker's base folder is a child of the run's own folder, which they share.
    base = tmp_path_factory.getbasetemp()
    root = (base if worker_id == "master" else base.parent) / "references"
    root.mkdir(exist_ok=True)
    return References(root)
