"""Local servers that speak hosted providers' documented APIs (one module per provider).

Each runs launched workers as real local processes (`machine.Machine`), so the real bootstrap,
SDK, storage and fencing are exercised, and injects its provider's characteristic failures on
demand. Each also runs standalone: `python -m tests.fakes.<provider> --port N` prints its base URL.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from adapters.compute import ComputeAdapter, LaunchSpec, WorkerRef


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
