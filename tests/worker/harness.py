"""Helpers shared by the worker tests: stores on disk and S3, training attempts in forked children."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock

from adapters.storage import RunFolder
from adapters.stores import Store as BaseStore

S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}

PRELOAD = [
    "torch",
    "torch._dynamo",
    "torch.optim",
    "numpy",
    "boto3",
    "botocore",
    "reconciler.worker",
    "tests.worker.workloads.train",
    "tests.worker.workloads.dist_train",
    "torch.distributed.checkpoint",
    "torch.distributed.tensor",
]


@dataclass
class Store:
    """A place for run folders: a temp directory, or a fresh bucket on the loopback S3 server."""

    kind: str
    base: str
    endpoint: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def folder(self, job: str = "job", run: str | None = None) -> RunFolder:
        return RunFolder.for_run(self.base, job, run or f"r-{uuid.uuid4().hex[:8]}", self.options)

    def env(self, folder: RunFolder, epoch: int, **extra: Any) -> dict[str, str]:
        env = {
            "RECONCILER_RUN_URI": folder.uri,
            "RECONCILER_RUN_ID": folder.uri.rsplit("/", 1)[-1],
            "RECONCILER_EPOCH": str(epoch),
            "RECONCILER_HEARTBEAT_INTERVAL": "0",
        }
        if self.endpoint:
            env.update(S3_CREDENTIALS, AWS_ENDPOINT_URL=self.endpoint)
        env.update({k: str(v) for k, v in extra.items()})
        return env



def child_env(store: Store, folder: RunFolder, epoch: int, every: int) -> dict[str, str]:
    """The environment of a worker run as a program of its own (`python -m`, or forked from
    tests/zygote.py): this one's, the run's variables, and the worktree on PYTHONPATH."""
    root = str(Path(__file__).resolve().parents[2])
    pythonpath = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, **store.env(folder, epoch, RECONCILER_CHECKPOINT_EVERY=every), "PYTHONPATH": pythonpath}

class IgnoringStore(BaseStore):
    """Another store with its conditions dropped: creation and swaps simply write (as some
    S3-compatible stores do with If-None-Match/If-Match). Fencing must refuse it."""

    probe_conditional_writes = True

    def __init__(self, inner: BaseStore) -> None:
        super().__init__(inner.uri, inner.storage_options)
        self.inner = inner
        self.cas_across_hosts = inner.cas_across_hosts

    def read_tagged(self, name: str) -> tuple[bytes | None, str | None]:
        return self.inner.read_tagged(name)

    def _write(self, name: str, data: bytes) -> None:
        self.inner.write(name, data)

    def _create(self, name: str, data: bytes) -> bool:
        self.inner.write(name, data)
        return True

    def _swap(self, name: str, data: bytes, tag: str | None) -> str | None:
        self.inner.write(name, data)
        return self.inner.read_tagged(name)[1]

    def _delete(self, name: str) -> None:
        self.inner.delete(name)

    def _delete_tree(self, name: str) -> None:
        self.inner.delete_tree(name)

    def _list(self, prefix: str) -> dict[str, int]:
        return self.inner.list(prefix)

    def read_payload_into(self, name: str, out: memoryview, hasher: Any = None) -> int:
        return self.inner.read_payload_into(name, out, hasher)


def _child(env: dict[str, str], cfg: dict[str, Any]) -> None:
    os.environ.update(env)
    from tests.worker.workloads.train import main

    main(cfg)


_ctx: Any = None


def context() -> Any:
    """A fork server that has imported torch once; each attempt is a fork of it, killed for real."""
    global _ctx
    if _ctx is None:
        _ctx = multiprocessing.get_context("forkserver")
        _ctx.set_forkserver_preload(PRELOAD)
    return _ctx


# A forkserver child's exit code is 8 bytes on a pipe that only one reader gets. Process.start()
# polls every live child (multiprocessing.process._cleanup), so a start() in one thread racing a
# join() in another makes one of them read EOF and record 255 (CPython gh-130895). Every start
# and every reap goes through this lock; waiting for the exit does not.
_reap_lock = threading.Lock()


def start(env: dict[str, str], cfg: dict[str, Any]) -> Any:
    return spawn(_child, env, cfg)


def spawn(target: Any, *args: Any) -> Any:
    """Start `target(*args)` in a fork of the fork server (a module-level function)."""
    proc = context().Process(target=target, args=args, daemon=True)
    with _reap_lock:
        proc.start()
    return proc


def join(proc: Any, timeout: float | None = None) -> int | None:
    """Wait up to `timeout` for `proc` to end; its exit code, or None while it runs (thread-safe)."""
    if not multiprocessing.connection.wait([proc.sentinel], timeout):
        return None
    with _reap_lock:
        proc.join()
        return int(proc.exitcode)


def attempt(env: dict[str, str], cfg: dict[str, Any], timeout: float = 120) -> int:
    """Run one training attempt to its end; returns its exit code (-9 when SIGKILLed)."""
    proc = start(env, cfg)
    code = join(proc, timeout)
    if code is None:
        proc.kill()
        join(proc)
        raise AssertionError(f"training attempt did not finish within {timeout}s")
    return code


def assert_same(a: Any, b: Any, where: str = "state") -> None:
    """Bitwise equality of nested state (tensors compared by dtype, shape and every bit)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), f"{where} differs"
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{where}: keys {set(a) ^ set(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _rank_child(env: dict[str, str], cfg: dict[str, Any]) -> None:
    os.environ.update(env)
    from tests.worker.workloads.dist_train import main

    main(cfg)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_ranks(env: dict[str, str], cfg: dict[str, Any], world: int,
                rank_env: dict[int, dict[str, Any]] | None = None) -> list[Any]:
    """Start `world` ranks of the distributed workload as torchrun would: one process per rank,
    RANK/LOCAL_RANK/WORLD_SIZE and a rendezvous on 127.0.0.1 in each one's environment."""
    common = {**env, "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
              "GLOO_SOCKET_IFNAME": "lo"}
    procs = []
    for rank in range(world):
        extra = {k: str(v) for k, v in (rank_env or {}).get(rank, {}).items()}
        procs.append(spawn(_rank_child, {**common, "RANK": str(rank), "LOCAL_RANK": str(rank), **extra}, cfg))
    return procs


def join_ranks(procs: list[Any], timeout: float = 120) -> list[int]:
    """Wait for every rank; once one dies by a signal, end the others as torchrun does. Exit codes."""
    deadline = time.monotonic() + timeout
    codes: dict[int, int] = {}
    while len(codes) < len(procs):
        if time.monotonic() > deadline:
            for p in procs:
                p.kill()
            raise AssertionError(f"ranks did not finish within {timeout}s (exit codes so far: {codes})")
        for i, p in enumerate(procs):
            if i not in codes:
                code = join(p, 0.05)
                if code is not None:
                    codes[i] = code
        if any(c < 0 for c in codes.values()):
            for i, p in enumerate(procs):
                if i not in codes:
                    p.kill()
                    code = join(p, 30)
                    codes[i] = -9 if code is None else code
    return [codes[i] for i in range(len(procs))]


def run_ranks(env: dict[str, str], cfg: dict[str, Any], world: int,
              rank_env: dict[int, dict[str, Any]] | None = None, timeout: float = 120) -> list[int]:
    return join_ranks(start_ranks(env, cfg, world, rank_env), timeout)


def load(path: str) -> Any:
    return torch.load(path, weights_only=False)


class References:
    """Uninterrupted reference runs, made once per test session and shared by the tests (and the
    xdist workers) that compare a resumed run against the same one: its outputs do not depend on
    the store the tests' own runs use, so each [file] and [s3] pair need not train it twice."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def get(self, key: str, produce: Callable[[Path], None]) -> Path:
        """The folder of the reference `key`, made by `produce(folder)` if no test has made it yet."""
        folder = self.root / key
        with FileLock(str(self.root / f"{key}.lock")):
            if not (folder / "made").exists():
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir(parents=True)
                produce(folder)
                (folder / "made").touch()
        return folder
