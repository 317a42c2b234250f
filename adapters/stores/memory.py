"""memory:// stores: files in one dict per process, guarded by one lock.

For fast tests of what is built on stores (and a reference for the contract: every operation is
atomic here, so `cas_across_hosts` holds within the process, the only "host" it has). Version
tags are a counter that never repeats, so a file deleted and created again gets a new tag.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from adapters.stores.base import Store

_files: dict[str, tuple[bytes, str]] = {}  # full path -> (content, tag)
_lock = threading.Lock()
_versions = itertools.count(1)


class MemoryStore(Store):
    cas_across_hosts = True
    probe_conditional_writes = False  # the conditions are ours, checked under the lock

    def __init__(self, uri: str, storage_options: dict[str, Any] | None = None) -> None:
        super().__init__(uri, storage_options)
        self.root = self.uri[len("memory://") :].strip("/")

    def _path(self, name: str) -> str:
        return "/".join(p for p in (self.root, name) if p)

    def read_tagged(self, name: str) -> tuple[bytes | None, str | None]:
        with _lock:
            found = _files.get(self._path(name))
        return found if found is not None else (None, None)

    def _put(self, name: str, data: bytes) -> str:
        tag = f"v{next(_versions)}"
        _files[self._path(name)] = (bytes(data), tag)
        return tag

    def _write(self, name: str, data: bytes) -> None:
        with _lock:
            self._put(name, data)

    def _create(self, name: str, data: bytes) -> bool:
        with _lock:
            if self._path(name) in _files:
                return False
            self._put(name, data)
            return True

    def _swap(self, name: str, data: bytes, tag: str | None) -> str | None:
        with _lock:
            found = _files.get(self._path(name))
            if (found[1] if found else None) != tag:
                return None
            return self._put(name, data)

    def _delete(self, name: str) -> None:
        with _lock:
            _files.pop(self._path(name), None)

    def _delete_tree(self, name: str) -> None:
        top = self._path(name) + "/"
        with _lock:
            for path in [p for p in _files if p.startswith(top)]:
                del _files[path]

    def _list(self, prefix: str) -> dict[str, int]:
        top = self._path(prefix)
        top = top + "/" if top else ""
        with _lock:
            return {p[len(top) :]: len(blob) for p, (blob, _) in _files.items() if p.startswith(top)}
