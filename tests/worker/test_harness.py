"""The harness reports how an attempt ended exactly, even when attempts run in parallel threads."""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor

from tests.worker.harness import join, spawn


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def test_parallel_attempts_killed_at_once_all_report_sigkill_not_255() -> None:
    def attempts(_: int) -> list[int | None]:
        return [join(spawn(_die), 60) for _ in range(20)]

    with ThreadPoolExecutor(8) as pool:
        codes = [code for batch in pool.map(attempts, range(8)) for code in batch]
    assert codes == [-9] * len(codes)
