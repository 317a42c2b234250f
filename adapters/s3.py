"""Our botocore helpers for the S3 store (adapters/stores/s3.py): one client per configuration,
how S3 errors read, and uploads from memory without a copy.
"""

from __future__ import annotations

import io
import logging
import os
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

log = logging.getLogger(__name__)


def s3_error_code(exc: Exception) -> tuple[str, int]:
    resp = getattr(exc, "response", None) or {}
    code = str(resp.get("Error", {}).get("Code", ""))
    status = int(resp.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code, status


def is_precondition_failed(exc: Exception) -> bool:
    code, status = s3_error_code(exc)
    return code == "PreconditionFailed" or status == 412


def is_conflict(exc: Exception) -> bool:
    code, status = s3_error_code(exc)
    return code == "ConditionalRequestConflict" or status == 409


def is_missing(exc: Exception) -> bool:
    code, status = s3_error_code(exc)
    return code in ("NoSuchKey", "404", "NotFound") or status == 404


_clients: dict[tuple[Any, ...], Any] = {}
_clients_lock = threading.Lock()
_jitter = random.Random()  # retry pauses, apart from the global generator: see _own_retry_jitter


def s3_client(endpoint: str | None, region: str, key: str | None, secret: str | None, token: str | None) -> Any:
    """One S3 client per configuration and process (they are thread-safe and slow to make).

    A plain botocore client (what boto3 wraps): botocore comes with s3fs in the version aiobotocore
    pins, while boto3 would have to match it and cannot be named in the `s3` extra (see pyproject).
    """
    cache_key = (endpoint, region, key, secret, token, os.getpid())
    with _clients_lock:
        if cache_key not in _clients:
            import botocore.session
            from botocore.config import Config

            session = botocore.session.get_session()
            retries: dict[str, Any] = {"mode": "standard"}
            if session.get_config_variable("max_attempts") is None:
                # Unless AWS_MAX_ATTEMPTS or `max_attempts` in ~/.aws/config says otherwise, as for any
                # AWS tool (botocore's args.py reads them only when the client's config names none),
                # a call is retried 5 times.
                retries["max_attempts"] = 5
            _clients[cache_key] = session.create_client(
                "s3",
                endpoint_url=endpoint,
                region_name=region,
                aws_access_key_id=key,
                aws_secret_access_key=secret,
                aws_session_token=token,
                config=Config(max_pool_connections=32, retries=retries),
            )
            _own_retry_jitter(_clients[cache_key])
        return _clients[cache_key]


def _own_retry_jitter(client: Any) -> None:
    """Give the client's retry pauses a generator of their own.

    botocore's standard retry mode draws each pause from the `random` module's global generator
    (`ExponentialBackoff(random=random.random)` in botocore/retries/standard.py, registered under
    the unique id `retry-config-s3`). A worker uploads on a background thread, so one retried
    request there would move the training script's Python random stream by a draw, and the run
    would no longer resume bit-identically (seen in CI: a resumed run's noise was one draw ahead).
    """
    entry = getattr(getattr(client.meta.events, "_emitter", None), "_unique_id_handlers", {}).get("retry-config-s3")
    handler = getattr((entry or {}).get("handler"), "__self__", None)
    backoff = getattr(getattr(handler, "_retry_policy", None), "_retry_backoff", None)
    if backoff is None or not hasattr(backoff, "_random"):
        log.warning("botocore's S3 retry handler is not where this version of reconciler looks for it; a retried "
                    "request may draw from Python's global random generator and change a training run's draws")
        return
    backoff._random = _jitter.random


class _MemReader(io.RawIOBase):
    """A seekable read-only file over a memoryview, so uploads need no extra copy of the state."""

    def __init__(self, buf: memoryview) -> None:
        self._buf = buf.cast("B") if buf.format != "B" or buf.ndim != 1 else buf
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: len(self._buf)}[whence]
        self._pos = max(0, min(len(self._buf), base + offset))
        return self._pos

    def readinto(self, b: Any) -> int:
        out = memoryview(b).cast("B")
        n = min(len(out), len(self._buf) - self._pos)
        out[:n] = self._buf[self._pos : self._pos + n]
        self._pos += n
        return n



def multipart_upload(client: Any, bucket: str, key: str, buf: memoryview, part_bytes: int) -> None:
    """Parts of `part_bytes` uploaded 8 at a time straight from `buf`; aborted on any failure,
    so a failed upload leaves no object (and no parts billed)."""
    flat = buf.cast("B") if buf.format != "B" or buf.ndim != 1 else buf
    upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]

    def put(number: int) -> dict[str, Any]:
        part = _MemReader(flat[(number - 1) * part_bytes : number * part_bytes])
        resp = client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, Body=part)
        return {"PartNumber": number, "ETag": resp["ETag"]}

    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            parts = list(pool.map(put, range(1, -(-len(flat) // part_bytes) + 1)))
        client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts})
    except BaseException:
        try:
            client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload)
        except Exception as exc:
            log.debug("abort of multipart upload %s failed: %s", upload, exc)
        raise
