"""Any other fsspec filesystem (gcs://, az://, ssh://, a test's own): the generic store.

Exclusive creation is an open with mode "xb", as atomic as the filesystem makes it (the probe
refuses one that ignores it); `swap` compares a sha256 tag and then writes, which is not atomic,
so `cas_across_hosts` is False and run folders use their lease log of exclusive creations here.
"""

from __future__ import annotations

import hashlib
from typing import Any

from fsspec import AbstractFileSystem
from fsspec.core import url_to_fs

from adapters.stores.base import Store


class FsspecStore(Store):
    def __init__(self, uri: str, storage_options: dict[str, Any] | None = None,
                 fs: AbstractFileSystem | None = None) -> None:
        """`fs` given: use that filesystem with the URL's path (tests pass fsspec's own in-memory one)."""
        super().__init__(uri, storage_options)
        if fs is None:
            fs, self.root = url_to_fs(self.uri, **self.storage_options)
        else:
            self.root = fs._strip_protocol(self.uri)
        self.fs: AbstractFileSystem = fs

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}" if name else self.root

    def probe_key(self) -> str:
        return f"{self.fs.protocol}:{self.root.split('/', 1)[0]}"

    def read(self, name: str) -> bytes | None:
        return self._guard("read", name, self._cat, name)

    def _cat(self, name: str) -> bytes | None:
        try:
            return bytes(self.fs.cat_file(self._path(name)))
        except FileNotFoundError:
            return None

    def read_tagged(self, name: str) -> tuple[bytes | None, str | None]:
        blob = self.read(name)
        return blob, (hashlib.sha256(blob).hexdigest() if blob is not None else None)

    def _makedirs_for(self, name: str) -> None:
        self.fs.makedirs(self._path(name).rsplit("/", 1)[0], exist_ok=True)

    def _write(self, name: str, data: bytes) -> None:
        self._makedirs_for(name)
        self.fs.pipe_file(self._path(name), data)

    def _create(self, name: str, data: bytes) -> bool:
        self._makedirs_for(name)
        try:
            with self.fs.open(self._path(name), "xb") as fh:
                fh.write(data)
            return True
        except FileExistsError:
            return False

    def _swap(self, name: str, data: bytes, tag: str | None) -> str | None:
        return self._compare_then_write(name, data, tag)

    def _delete(self, name: str) -> None:
        try:
            self.fs.rm_file(self._path(name))
        except FileNotFoundError:
            pass

    def _delete_tree(self, name: str) -> None:
        try:
            self.fs.rm(self._path(name), recursive=True)
        except FileNotFoundError:
            pass

    def _list(self, prefix: str) -> dict[str, int]:
        top = self._path(prefix)
        try:
            detail = self.fs.find(top, detail=True)
        except FileNotFoundError:
            return {}
        return {p[len(top) + 1 :]: int(d.get("size") or 0) for p, d in detail.items()}
