"""Run storage for the simulation: an fsspec filesystem held in memory that fails on purpose.

Why not fsspec's own `memory://`: its store is one dict shared by every user in the process and
its `ls` walks every key, which makes a 10,000-job tick quadratic. This one keeps a directory
index (O(children) listing) and one isolated store per simulated world, chosen by the
`world` storage option, so many simulations can run side by side.

Faults are injected per call: an OSError (what a flaky object store gives), a slow write that
moves simulated time forward, and a hook the driver uses to crash the reconciler at a chosen
call. Invariant checks read through `peek`/`raw_*`, which never fail.
"""

from __future__ import annotations

import io
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import fsspec
from fsspec.spec import AbstractFileSystem

PROTOCOL = "simfs"


class InjectedStorageError(OSError):
    """A storage call that failed because the simulation said so."""


@dataclass
class StorageFaults:
    """Switchable storage faults. `context` is 'tick' while the reconciler runs and 'worker'
    while simulated workers write, so each side can be made to fail on its own."""

    tick_error_rate: float = 0.0
    worker_error_rate: float = 0.0
    slow_write_seconds: float = 0.0  # simulated seconds one write takes (moves the clock)
    context: str = "worker"
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    hook: Callable[[str], None] | None = None  # the driver's crash point counter
    advance: Callable[[float], None] | None = None  # moves simulated time for slow writes
    calls: int = 0
    errors: int = 0

    def check(self, op: str, path: str) -> None:
        self.calls += 1
        if self.context == "tick" and self.hook is not None:
            self.hook(f"storage.{op}")
        rate = self.tick_error_rate if self.context == "tick" else self.worker_error_rate
        if rate and self.rng.random() < rate:
            self.errors += 1
            raise InjectedStorageError(f"injected storage error on {op} {path}")
        if op in ("write", "rm") and self.slow_write_seconds and self.advance is not None:
            self.advance(self.slow_write_seconds)


class WorldStore:
    """One world's files: path -> bytes, plus a directory index so listing is cheap."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.children: dict[str, set[str]] = {"": set()}
        self.faults = StorageFaults()
        self.writes: dict[str, int] = {}  # path -> how many times it was written (for invariants)

    def _parent(self, path: str) -> str:
        return path.rsplit("/", 1)[0] if "/" in path else ""

    def put(self, path: str, data: bytes) -> None:
        if path not in self.files:
            parent = self._parent(path)
            self.mkdir(parent)
            self.children[parent].add(path)
        self.files[path] = data
        self.writes[path] = self.writes.get(path, 0) + 1

    def mkdir(self, path: str) -> None:
        if path in self.children:
            return
        self.children[path] = set()
        if path:
            parent = self._parent(path)
            self.mkdir(parent)
            self.children[parent].add(path)

    def is_dir(self, path: str) -> bool:
        return path in self.children

    def remove(self, path: str) -> None:
        if path in self.files:
            del self.files[path]
        elif path in self.children:
            for child in list(self.children[path]):
                self.remove(child)
            del self.children[path]
        else:
            return
        kids = self.children.get(self._parent(path))
        if kids is not None:
            kids.discard(path)


_WORLDS: dict[str, WorldStore] = {}


def world_store(world: str) -> WorldStore:
    """The store of one simulated world, created on first use."""
    if world not in _WORLDS:
        _WORLDS[world] = WorldStore()
    return _WORLDS[world]


def drop_world(world: str) -> None:
    _WORLDS.pop(world, None)


class _Writer(io.BytesIO):
    def __init__(self, store: WorldStore, path: str) -> None:
        super().__init__()
        self._store = store
        self._path = path

    def close(self) -> None:
        if not self.closed:
            self._store.put(self._path, self.getvalue())
        super().close()


class SimFileSystem(AbstractFileSystem):
    """`simfs://<root>/...` with storage option `world=<name>` selecting the store."""

    protocol = PROTOCOL
    root_marker = ""

    def __init__(self, world: str = "default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.store = world_store(world)

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        path = str(path)
        if path.startswith(PROTOCOL + "://"):
            path = path[len(PROTOCOL) + 3 :]
        return path.strip("/")

    # ---- fsspec surface -------------------------------------------------------------------
    def _open(self, path: str, mode: str = "rb", block_size: Any = None, autocommit: bool = True,
              cache_options: Any = None, **kwargs: Any) -> Any:
        path = self._strip_protocol(path)
        if "r" in mode:
            self.store.faults.check("read", path)
            if path not in self.store.files:
                raise FileNotFoundError(path)
            return io.BytesIO(self.store.files[path])
        self.store.faults.check("write", path)
        if "x" in mode and path in self.store.files:
            raise FileExistsError(path)
        return _Writer(self.store, path)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)
        self.store.faults.check("ls", path)
        if path in self.store.files:
            names = [path]
        elif path in self.store.children:
            names = sorted(self.store.children[path])
        else:
            raise FileNotFoundError(path)
        if not detail:
            return names
        return [self._info(n) for n in names]

    def _info(self, path: str) -> dict[str, Any]:
        if path in self.store.files:
            return {"name": path, "size": len(self.store.files[path]), "type": "file"}
        if path in self.store.children:
            return {"name": path, "size": 0, "type": "directory"}
        raise FileNotFoundError(path)

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        self.store.faults.check("info", path)
        return self._info(path)

    def exists(self, path: str, **kwargs: Any) -> bool:
        path = self._strip_protocol(path)
        self.store.faults.check("exists", path)  # an error propagates: unknown is not "absent"
        return path in self.store.files or path in self.store.children

    def find(self, path: str, maxdepth: Any = None, withdirs: bool = False, detail: bool = False,
             **kwargs: Any) -> Any:
        path = self._strip_protocol(path)
        self.store.faults.check("ls", path)
        out: dict[str, dict[str, Any]] = {}
        if path in self.store.files:
            out[path] = self._info(path)
        stack = [path] if path in self.store.children else []
        while stack:
            for child in self.store.children.get(stack.pop(), ()):
                if child in self.store.files:
                    out[child] = self._info(child)
                else:
                    if withdirs:
                        out[child] = self._info(child)
                    stack.append(child)
        if detail:
            return dict(sorted(out.items()))
        return sorted(out)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        path = self._strip_protocol(path)
        self.store.mkdir(path)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        self.makedirs(path, exist_ok=True)

    def rm_file(self, path: str) -> None:
        path = self._strip_protocol(path)
        self.store.faults.check("rm", path)
        self.store.remove(path)

    def rm(self, path: Any, recursive: bool = False, maxdepth: Any = None) -> None:
        paths = path if isinstance(path, list) else [path]
        for p in paths:
            p = self._strip_protocol(p)
            self.store.faults.check("rm", p)
            self.store.remove(p)

    def cat_file(self, path: str, start: Any = None, end: Any = None, **kwargs: Any) -> bytes:
        path = self._strip_protocol(path)
        self.store.faults.check("read", path)
        if path not in self.store.files:
            raise FileNotFoundError(path)
        return self.store.files[path][start:end]

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        self.store.faults.check("write", path)
        if mode == "create" and path in self.store.files:
            raise FileExistsError(path)
        self.store.put(path, bytes(value))


fsspec.register_implementation(PROTOCOL, SimFileSystem, clobber=True)
