"""A drill's records in the run folder (docs/guides/drills.md), written by the reconciler and the
worker SDK and read by both:

- `drill/request.json`: the reconciler asks the attempt of `epoch` to drill (its id, the lookahead,
  notice or kill); the worker reads it at heartbeat cadence, as it reads stop.json;
- `drill/<id>-taken.json`: the drilled attempt read the request and will drill (an older SDK, or
  one under torchrun, never writes it: the reconciler gives up on such a drill after TAKE_SECONDS);
- `drill/<id>-before.json`: the drilled attempt: the durable checkpoint N it drilled after, and the
  exact metrics it reported for each step N+1..N+K (not thinned, unlike metrics/: adapters/series.py);
  written once the lookahead is done (a notice drill: the step of its final checkpoint and the grace
  it used);
- `drill/<id>-after.json`: the next attempt: the step it restored, and the metrics of the same steps.

Values are kept as JSON numbers, which read back as the same floats, so "exact" means bit-identical.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from adapters.storage import RunFolder, StorageError

REQUEST = "drill/request.json"
LOOKAHEAD_SECONDS = 600.0  # the lookahead ends after this long even with fewer steps (a slow step)
TAKE_SECONDS = 600.0  # a request no worker took up this long after it was asked is not carried out

Points = dict[int, dict[str, float]]


def taken_name(drill_id: str) -> str:
    return f"drill/{drill_id}-taken.json"


def before_name(drill_id: str) -> str:
    return f"drill/{drill_id}-before.json"


def after_name(drill_id: str) -> str:
    return f"drill/{drill_id}-after.json"


@dataclass(frozen=True)
class Request:
    id: str
    epoch: int  # the attempt asked to drill
    lookahead: int = 5
    notice: bool = False

    def record(self) -> dict[str, Any]:
        return {"id": self.id, "epoch": self.epoch, "lookahead": self.lookahead, "notice": self.notice}


@dataclass(frozen=True)
class Side:
    """What one attempt wrote: before (`step` = N, the checkpoint) or after (`step` = what it restored)."""

    epoch: int
    step: int
    points: Points = field(default_factory=dict)
    grace_used: float | None = None  # notice drills: seconds from the notice to the final checkpoint


def write_request(folder: RunFolder, request: Request) -> None:
    folder.write_json(REQUEST, request.record())


def read_request(folder: RunFolder) -> Request | None:
    data = folder.read_json(REQUEST)
    if not data:
        return None
    try:
        return Request(str(data["id"]), int(data["epoch"]), int(data.get("lookahead", 5)), bool(data.get("notice")))
    except (KeyError, TypeError, ValueError):
        return None


def write_side(folder: RunFolder, name: str, side: Side) -> None:
    record: dict[str, Any] = {"epoch": side.epoch, "step": side.step,
                              "points": [[s, v] for s, v in sorted(side.points.items())]}
    if side.grace_used is not None:
        record["grace_used"] = side.grace_used
    folder.write_json(name, record)


def read_side(folder: RunFolder, name: str) -> Side | None:
    """One side's record; None when it is not written yet (or is damaged: it is written again never,
    so a damaged record reads as a drill not carried out)."""
    try:
        data = folder.read_json(name)
    except StorageError:
        return None
    if not data:
        return None
    try:
        points = {int(s): {str(k): float(v) for k, v in values.items()} for s, values in data.get("points", [])}
        grace = data.get("grace_used")
        return Side(int(data["epoch"]), int(data["step"]), points, float(grace) if grace is not None else None)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


@dataclass(frozen=True)
class Seen:
    """A drill's records as the reconciler read them this tick."""

    id: str
    before: Side | None = None
    after: Side | None = None
    taken: bool = False  # the drilled attempt took the request up


def read(folder: RunFolder, drill_id: str) -> Seen:
    try:
        taken = folder.read_json(taken_name(drill_id)) is not None
    except StorageError:
        taken = False
    return Seen(drill_id, read_side(folder, before_name(drill_id)), read_side(folder, after_name(drill_id)), taken)


__all__ = ["LOOKAHEAD_SECONDS", "REQUEST", "TAKE_SECONDS", "Request", "Seen", "Side", "after_name", "before_name",
           "read", "read_request", "read_side", "taken_name", "write_request", "write_side"]
