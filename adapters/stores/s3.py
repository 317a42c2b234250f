"""s3:// stores, through our own botocore client (adapters/s3.py).

Exclusive creation is `If-None-Match: *`, compare-and-swap is `If-Match` on the ETag (atomic on
S3 and on the compatible stores that enforce it: `cas_across_hosts`); a 409 "conditional request
conflict" on creation is retried. Payloads above `part_bytes` go up as concurrent multipart
uploads straight from memory.
"""

from __future__ import annotations

import os
import time
from typing import Any

from adapters.s3 import is_conflict, is_missing, is_precondition_failed, multipart_upload, s3_client
from adapters.stores.base import CorruptCheckpoint, StorageError, Store

CREATE_ATTEMPTS = 8


class S3Store(Store):
    cas_across_hosts = True

    def __init__(self, uri: str, storage_options: dict[str, Any] | None = None) -> None:
        options = dict(storage_options or {})
        options.setdefault("skip_instance_cache", True)
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint and "endpoint_url" not in options and "endpoint_url" not in options.get("client_kwargs", {}):
            options["endpoint_url"] = endpoint
        super().__init__(uri, options)
        self.bucket, _, self.prefix = self.uri[len("s3://") :].partition("/")
        self._client_obj: Any = None

    @property
    def endpoint(self) -> str | None:
        o = self.storage_options
        return o.get("endpoint_url") or (o.get("client_kwargs") or {}).get("endpoint_url")

    @property
    def client(self) -> Any:
        """A botocore S3 client (shared per configuration and process); made on first use."""
        if self._client_obj is None:
            o = self.storage_options
            ck = dict(o.get("client_kwargs") or {})
            region = ck.get("region_name") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
            self._client_obj = s3_client(self.endpoint, region, o.get("key"), o.get("secret"), o.get("token"))
        return self._client_obj

    def probe_key(self) -> str:
        return f"{self.endpoint or ''}:{self.bucket}"

    def worker_env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL_S3": str(self.endpoint)} if self.endpoint else {}

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def read_tagged(self, name: str) -> tuple[bytes | None, str | None]:
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self.key(name))
            return resp["Body"].read(), str(resp["ETag"])
        except Exception as exc:
            if is_missing(exc):
                return None, None
            raise StorageError(f"cannot read {self.url(name)}: {exc}") from exc

    def _write(self, name: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.key(name), Body=data)

    def _create(self, name: str, data: bytes) -> bool:
        for attempt in range(CREATE_ATTEMPTS):
            try:
                self.client.put_object(Bucket=self.bucket, Key=self.key(name), Body=data, IfNoneMatch="*")
                return True
            except Exception as exc:
                if is_precondition_failed(exc):
                    return False
                if is_conflict(exc) and attempt < CREATE_ATTEMPTS - 1:
                    time.sleep(0.05 * (attempt + 1))  # a concurrent conditional write is in flight
                    continue
                raise
        return False

    def _swap(self, name: str, data: bytes, tag: str | None) -> str | None:
        cond = {"IfMatch": tag} if tag else {"IfNoneMatch": "*"}
        try:
            return str(self.client.put_object(Bucket=self.bucket, Key=self.key(name), Body=data, **cond)["ETag"])
        except Exception as exc:
            if is_precondition_failed(exc) or is_conflict(exc) or (tag and is_missing(exc)):
                return None
            raise

    def _delete(self, name: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.key(name))

    def _delete_tree(self, name: str) -> None:
        keys = list(self._keys(self.key(name) + "/"))
        for i in range(0, len(keys), 1000):
            batch = {"Objects": [{"Key": k} for k in keys[i : i + 1000]]}
            self.client.delete_objects(Bucket=self.bucket, Delete=batch)

    def _keys(self, prefix: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            out.update((o["Key"], int(o["Size"])) for o in page.get("Contents", []))
        return out

    def _list(self, prefix: str) -> dict[str, int]:
        key = self.key(prefix) if prefix else self.prefix
        key = key + "/" if key else ""
        return {k[len(key) :]: size for k, size in self._keys(key).items()}

    def _write_payload(self, name: str, buf: memoryview) -> None:
        if len(buf) <= self.part_bytes:
            self.client.put_object(Bucket=self.bucket, Key=self.key(name), Body=bytes(buf))
        else:
            multipart_upload(self.client, self.bucket, self.key(name), buf, self.part_bytes)

    def read_payload_into(self, name: str, out: memoryview, hasher: Any = None) -> int:
        out = out.cast("B") if out.format != "B" else out
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self.key(name))["Body"]
            n = 0
            while True:
                chunk = body.read(min(self.part_bytes, max(1, len(out) - n + 1)))
                if not chunk:
                    return n
                if n + len(chunk) > len(out):
                    return len(out) + 1
                out[n : n + len(chunk)] = chunk
                if hasher is not None:
                    hasher.update(chunk)
                n += len(chunk)
        except Exception as exc:
            if is_missing(exc):
                raise CorruptCheckpoint(f"{self.url(name)} is missing") from exc
            raise StorageError(f"cannot read {self.url(name)}: {exc}") from exc
