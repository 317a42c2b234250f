"""`status/room.yaml`: what the daemon has seen of each provider's room for a worker (whether it
said it had a free slot), so that a restarted daemon, or the next leader, goes on from it instead
of the priors. The deadline lookahead prices a wait for spot and a move onto room just back with
it (reconciler.planner.outlook.reliability.RoomWatch); a week of watching is what makes it useful.

Each figure is RoomWatch's evidence as of the provider's last look (`seen_at`), already weighed by
age; `mean_wait_hours` and `short_share` are what it made of them, for people reading the file, and
are not read back. Written with status changes, and alone where none came for ROOM_ALONE_SECONDS.
"""

from __future__ import annotations

from typing import Annotated, Any

import yaml
from pydantic import ConfigDict, Field, ValidationError, model_validator

from desired.parse import field_problems, load_documents
from status.models import Model, _LiteralDumper, from_iso, iso

ROOM_FILE = "room.yaml"  # in the status folder
ROOM_ALONE_SECONDS = 6 * 3600.0  # the file is committed on its own when its last write is this old


Count = Annotated[float, Field(ge=0)]  # an age-weighted count or length: never below zero


class RoomEvidence(Model):
    """One provider's line in `status/room.yaml`. Every figure finite, none below zero."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    seen_at: float  # the last look
    had_room: bool | None = None  # what it said then; None: not known (a gap nobody saw)
    state_since: float | None = None  # when that state began; None: before the first look
    seconds_without_room: Count = 0.0
    room_returns: Count = 0.0  # times room came back
    room_periods: Count = 0.0  # room periods seen from start to end
    short_room_periods: Count = 0.0  # those of them that ended within `short_within_seconds`
    short_within_seconds: Count | None = None  # RoomWatch's SHORT_WITHIN_SECONDS
    room_period_seconds: Count = 0.0  # their length
    last_period_end: float | None = None
    mean_wait_hours: float | None = None  # for people: RoomWatch's mean wait for room
    short_share: float | None = None  # for people: RoomWatch's short share

    @model_validator(mode="after")
    def _shorts_within_periods(self) -> RoomEvidence:
        if self.short_room_periods > self.room_periods + 1e-9:
            raise ValueError("short_room_periods is more than room_periods")
        return self

_TIMES = ("seen_at", "state_since", "last_period_end")


def room_row(ev: RoomEvidence) -> dict[str, Any]:
    """One provider's evidence as the file writes it: times in ISO 8601, figures to four places."""
    data = ev.model_dump(mode="json", exclude_none=True)
    for key, value in data.items():
        if key in _TIMES:
            data[key] = iso(value)
        elif isinstance(value, float):
            data[key] = round(value, 4)
    return data


def render_room(lines: dict[str, RoomEvidence]) -> str:
    """Canonical YAML for `status/room.yaml`."""
    rows: dict[str, Any] = {name: room_row(lines[name]) for name in sorted(lines)}
    header = ("# Written by the reconciler; do not edit. What the daemon has seen of each provider's room\n"
              "# for a worker, which the deadline policy's lookahead learns from (RoomWatch).\n")
    return header + yaml.dump({"providers": rows}, Dumper=_LiteralDumper, sort_keys=True, width=100)


def parse_room(text: bytes | str) -> dict[str, RoomEvidence]:
    """Reads `status/room.yaml` back, with the manifests' safe loader (desired.parse: no aliases,
    bounded size and nesting). Raises ValueError with what is wrong (the daemon then starts from
    the priors and rewrites the file)."""
    documents = load_documents(text)  # YamlProblem, a ValueError, says where the YAML breaks
    data = documents[0] if len(documents) == 1 else None
    rows = data.get("providers") if isinstance(data, dict) else None
    if not isinstance(rows, dict):
        raise ValueError("it has no `providers:` mapping")
    out = {}
    for name, row in rows.items():
        try:
            if not isinstance(row, dict):
                raise ValueError("not a mapping")
            out[str(name)] = RoomEvidence.model_validate(
                {k: from_iso(v) if k in _TIMES else v for k, v in row.items()})
        except ValidationError as exc:
            where, what = field_problems(exc, RoomEvidence)[0]
            raise ValueError(f"provider {name!r}: {where + ': ' if where else ''}{what}") from None
        except ValueError as exc:  # not a mapping, a time that is not one
            raise ValueError(f"provider {name!r}: {exc}") from None
    return out


def room_words(ev: RoomEvidence) -> str:
    """One provider's room in words, for status/README.md: how long it stays without room, and how
    many of its room periods end soon after room came back (both weighed by age, as RoomWatch weighs them)."""
    words = [] if ev.mean_wait_hours is None else [f"without room for {ev.mean_wait_hours:.1f} h on average"]
    if ev.room_periods >= 1 and ev.short_within_seconds:
        share = ev.short_room_periods / ev.room_periods
        words.append(f"{100 * share:.0f} % of room periods end within {ev.short_within_seconds / 60:g} min")
    return "; ".join(words)


def room_rows_of(text: bytes | None) -> dict[str, dict[str, Any]]:
    """Each provider's evidence as the file writes it, with its `words`; none when the file is absent
    or cannot be read. For `reconciler status --providers --json`."""
    try:
        saved = parse_room(text) if text else {}
    except ValueError:
        return {}
    return {name: {**room_row(ev), "words": room_words(ev)} for name, ev in sorted(saved.items())}


def room_words_of(text: bytes | None) -> dict[str, str]:
    """Each provider's room in words, from the file's text; none when it is absent or cannot be
    read (the daemon says why in its log, and rewrites it). For `reconciler status` and the page."""
    try:
        saved = parse_room(text) if text else {}
    except ValueError:
        return {}
    return {name: words for name, ev in saved.items() if (words := room_words(ev))}
