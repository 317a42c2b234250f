"""One row of `reconciler doctor`: a read-only check against a provider, a registry or run storage.

Compute adapters may offer `preflight(specs) -> list[Check]` (the `Preflight` protocol): the checks
only they know how to make (offers and prices on a market, a Kaggle kernel's secrets, an SSH host
answering), for the launch specs of the jobs placed on them. A preflight never creates, rents,
launches or pushes anything: it reads.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from adapters.compute import LaunchSpec


class Outcome(StrEnum):
    OK = "ok"
    WARN = "warn"  # cannot be confirmed from here, or fine now but worth a look; never fails doctor
    FAIL = "fail"  # the first paid run would go wrong: doctor exits 1


@dataclass(frozen=True)
class Check:
    """`target` is what was checked (a provider's name, `storage`, `images`), `what` the check
    ("credentials", "offers for train-a"), `detail` what was found, `fix` what to do (failures, warnings)."""

    target: str
    what: str
    outcome: Outcome
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "outcome": str(self.outcome)}


def ok(target: str, what: str, detail: str) -> Check:
    return Check(target, what, Outcome.OK, detail)


def warn(target: str, what: str, detail: str, fix: str) -> Check:
    return Check(target, what, Outcome.WARN, detail, fix)


def fail(target: str, what: str, detail: str, fix: str) -> Check:
    return Check(target, what, Outcome.FAIL, detail, fix)


@runtime_checkable
class Preflight(Protocol):
    """Optional on a compute adapter: its own read-only checks for the jobs placed on it."""

    def preflight(self, specs: list[LaunchSpec]) -> list[Check]:
        ...
