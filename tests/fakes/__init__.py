"""Local servers that speak hosted providers' documented APIs (one module per provider).

Each runs launched workers as real local processes (`machine.Machine`), so the real bootstrap,
SDK, storage and fencing are exercised, and injects its provider's characteristic failures on
demand. Each also runs standalone: `python -m tests.fakes.<provider> --port N` prints its base URL.
The HTTP side (body reading, replies, late answers, the clock thread) is `tests/fakes/server.py`'s
`FakeServer`; each fake keeps only its provider's routes, faults and world.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters.compute import ComputeAdapter, LaunchSpec, WorkerRef
from adapters.wire import WireError, decimal_int

if TYPE_CHECKING:
    from tests.fakes.machine import Machine


@dataclass
class HostedKit:
    """What the adapter contract suite needs from a fake: build an adapter on it (for an owner),
    interrupt a worker from outside (kill its command), and register a launch's secrets with the
    provider's own secret store before the launch (they never travel in it)."""

    make: Callable[..., ComputeAdapter]
    interrupt: Callable[[ComputeAdapter, WorkerRef], None]
    prepare: Callable[[LaunchSpec], None]
    cancels: bool = True  # False: the provider has no cancel API (Kaggle)
    own_env: tuple[str, ...] = ()  # variables the adapter sets for every worker (RunPod: RECONCILER_GRACE=5)
    run_folder: bool = False  # True: no log API (RunPod); exits and logs are read from each probe's run folder


def machine_kit(make: Callable[..., ComputeAdapter], machine_of: Callable[[str], Machine | None],
                set_secret: Callable[[str, str], None] | None = None, **options: Any) -> HostedKit:
    """The kit of a fake whose workers run on `Machine`s: an interruption kills the worker's command
    on its machine (`machine_of(worker id)`); a launch's secrets go to `set_secret` first, when the
    provider keeps them."""

    def interrupt(adapter: ComputeAdapter, ref: WorkerRef) -> None:
        machine = machine_of(ref.id)
        assert machine is not None and machine.kill_command(), f"no command to kill for {ref.id}"

    def prepare(spec: LaunchSpec) -> None:
        for name, value in spec.secret_env.items() if set_secret is not None else ():
            set_secret(name, value)

    return HostedKit(make=make, interrupt=interrupt, prepare=prepare, **options)


def standalone(doc: str, root: str, start: Callable[[Path, int], Any], says: Callable[[Any], str]) -> None:
    """`python -m tests.fakes.<provider> [--port N] [--root DIR]`: starts the fake, prints its base
    URL and what a client must set (`says`), and serves until Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--root", default=root)
    args = parser.parse_args()
    fake = start(Path(args.root), args.port)
    print(fake.url, flush=True)
    print(says(fake), flush=True)
    serve_until_interrupted(fake.close)


def official_client(module: str, requirement: str) -> Any:
    """Import a provider's official client for the test that points it at our fake: a missing one
    fails under CI=true (it is a dev dependency `scripts/install-dev.sh` installs) and skips elsewhere."""
    import importlib
    import os

    import pytest

    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but {requirement} is not installed (scripts/install-dev.sh installs it)")
        pytest.skip(f"needs {requirement}", allow_module_level=True)


def serve_until_interrupted(close: Callable[[], None]) -> None:
    """A fake run standalone (`python -m tests.fakes.<provider>`) serves until Ctrl-C, then stops."""
    import threading

    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        close()


def read_body(handler: BaseHTTPRequestHandler) -> bytes | None:
    """The request's body by its Content-Length, read as a real HTTP server does (RFC 9112 §6.3:
    digits only, one value); None after answering 400 and closing when the length is not that."""
    given = handler.headers.get_all("Content-Length") or []
    try:
        lengths = {decimal_int(value.strip(" \t")) for value in given}
    except WireError:
        lengths = set()
    if given and len(lengths) != 1:
        handler.close_connection = True
        handler.send_response(400)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Content-Length", "19")
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.wfile.write(b"bad Content-Length\n")
        return None
    length = lengths.pop() if lengths else 0
    return handler.rfile.read(length) if length else b""
