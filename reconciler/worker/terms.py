"""The worker's terms with the reconciler: its exit code for a clean stop, the errors that end a run,
how far ahead of a known deadline it stops, and how it reads the numbers in its environment.
Imported by every worker module (run, dist), so it imports none of them.
"""

from __future__ import annotations

from typing import Any

EXIT_INTERRUPTED = 75
MAX_DEADLINE_MARGIN = 1800.0


def deadline_margin(save_seconds: float | None, floor: float, cap: float = MAX_DEADLINE_MARGIN) -> float:
    """Seconds before the deadline at which to stop: twice the last save's duration (saves vary),
    at least `floor`. The measured part is capped so that one pathological save cannot end every
    later session early; the provider's kill then costs that one checkpoint, not the run.
    """
    measured = 0.0 if save_seconds is None else min(cap, 2.0 * save_seconds)
    return max(floor, measured)


class Superseded(SystemExit):
    """This attempt's epoch is no longer the lease's: a newer attempt owns the run. Exits 75."""

    def __init__(self, message: str) -> None:
        super().__init__(EXIT_INTERRUPTED)
        self.message = message

    def __str__(self) -> str:
        return self.message


class RunConfigError(ValueError):
    """The worker's environment does not describe a run."""


def env_int(name: str, value: Any) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise RunConfigError(f"{name}={value!r} is not an integer: fix the worker's environment") from None


def env_float(name: str, value: Any) -> float | None:
    if value is None or value == "":
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise RunConfigError(f"{name}={value!r} is not a number: fix the worker's environment") from None
