"""Sweeps (jobs with a matrix) as `plan` and `status` show them: what a plan does to each sweep's
members, and each sweep's members rolled up (counts by phase, cost). The members are also listed
one by one, as the jobs they are."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rich.table import Table

from reconciler.cli.status import compact
from reconciler.trust.shown import escape
from status.models import JobStatus, money

if TYPE_CHECKING:
    from reconciler.planner.tick import SweepChange

NAMES_SHOWN = 5  # members named on a line of `plan`; the rest are counted


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:NAMES_SHOWN])
    more = len(names) - NAMES_SHOWN
    return f"{shown} and {more} more" if more > 0 else shown


def plan_lines(changes: list[SweepChange], statuses: Mapping[str, JobStatus]) -> list[str]:
    """One line a sweep: how many members start, stop, go on and are finished (the first few
    named), and the sweep's projected cost where its members' forecasts give one."""
    lines = []
    for c in changes:
        parts = [f"{len(c.start)} start ({_names(c.start)})" if c.start else "",
                 f"{len(c.stop)} stop ({_names(c.stop)})" if c.stop else "",
                 f"{len(c.keep)} keep going" if c.keep else "", f"{len(c.done)} finished" if c.done else ""]
        members = len(c.start) + len(c.keep) + len(c.done)
        said = "; ".join(p for p in parts if p)
        lines.append(f"sweep {c.sweep}: {members} member{'' if members == 1 else 's'}; {said}"
                     + _projected([statuses.get(m) for m in (*c.start, *c.keep, *c.done)]))
    return lines


def _projected(members: list[JobStatus | None]) -> str:
    """`; projected $12.00` (what finished members cost, and the live ones' projections), or what is
    not known yet (a member without a status, as a pull-request plan sees a new one, is not)."""
    if not members:
        return ""
    total, unknown = 0.0, 0
    for st in members:
        f = st.forecast if st is not None else None
        if st is None:
            unknown += 1
        elif st.phase.terminal:
            total += st.cost_usd
        elif f is not None and f.projected_cost_usd is not None:
            total += f.projected_cost_usd
        else:
            unknown += 1
    if unknown == len(members):
        return "; projected cost unknown (no member measured yet)"
    rest = f" ({unknown} member{'' if unknown == 1 else 's'} not measured yet)" if unknown else ""
    return f"; projected {money(total)}{rest}"


def rollup_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`status` rows (with `sweep`, `phase`, `spent_usd`) rolled up a sweep a row, in name order."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("sweep"):
            by.setdefault(str(r["sweep"]), []).append(r)
    out = []
    for sweep, members in sorted(by.items()):
        phases = Counter(str(r["phase"]) for r in members)
        out.append({"sweep": sweep, "members": len(members), "phases": dict(sorted(phases.items())),
                    "spent_usd": round(sum(float(r["spent_usd"] or 0.0) for r in members), 4)})
    return out


def rollup_table(rollups: list[dict[str, Any]]) -> Table:
    table = compact("sweep", "members", "phases", "spent", title="sweeps")
    for x in rollups:
        phases = ", ".join(f"{n} {phase}" for phase, n in x["phases"].items())
        table.add_row(escape(x["sweep"]), str(x["members"]), escape(phases), money(x["spent_usd"]))
    return table
