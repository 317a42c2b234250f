"""Sweeps (jobs with a matrix, desired.matrix) in the planner. Pure.

Each member is planned as a job of its own; what is the sweep's is counted here: which members
hold a live attempt (for `max_parallel`, kept up to date on the plan as members are planned one by
one), and what a desired state does to each sweep's members (which start, stop, go on), for `plan`.
"""

from __future__ import annotations

from collections.abc import Mapping

from adapters.compute import WorkerRef, WorkerState
from desired.parse import DesiredState
from reconciler.planner.tick import SweepChange, live
from status.models import JobStatus, Phase


def sweep_of(name: str, desired: DesiredState, recorded: Mapping[str, JobStatus]) -> str | None:
    """The sweep `name` is a member of now, or was when it was last recorded."""
    st = recorded.get(name)
    return desired.sweep_of.get(name) or (st.sweep if st is not None else None)


def live_members(desired: DesiredState, recorded: Mapping[str, JobStatus],
                 workers: Mapping[WorkerRef, WorkerState]) -> dict[str, set[str]]:
    """Members of each sweep with an open attempt or a live worker, as the tick starts: a member
    whose worker is still going (stopping, or done but not yet exited) takes its place too."""
    out: dict[str, set[str]] = {}
    for name, st in recorded.items():
        sweep = sweep_of(name, desired, recorded)
        if sweep and st.current is not None:
            out.setdefault(sweep, set()).add(name)
    for ref, state in workers.items():
        sweep = sweep_of(ref.job, desired, recorded)
        if sweep and live(state):
            out.setdefault(sweep, set()).add(ref.job)
    return out


def settle_live(sweep_live: dict[str, set[str]], st: JobStatus, workers: Mapping[WorkerRef, WorkerState]) -> None:
    """After a member is planned: it holds a place while it has an attempt, is launching, or has a
    live worker; otherwise its place is free for the members planned after it in this tick."""
    if not st.sweep:
        return
    members = sweep_live.setdefault(st.sweep, set())
    if st.current is not None or st.phase == Phase.LAUNCHING or any(live(s) for s in workers.values()):
        members.add(st.job)
    else:
        members.discard(st.job)


def sweep_changes(desired: DesiredState, recorded: Mapping[str, JobStatus],
                  planned: Mapping[str, JobStatus]) -> list[SweepChange]:
    """Each sweep's members by what the plan does to them, from the planned statuses' run ids (no
    digest is computed again)."""
    out: dict[str, SweepChange] = {name: SweepChange(name) for name in desired.sweeps}
    for name, sweep in desired.sweeps.items():
        for member in sweep.members:
            rec, st = recorded.get(member), planned.get(member)
            change = out[name]
            if rec is None or st is None or rec.run_id != st.run_id or \
                    (rec.phase == Phase.CANCELLED and st.phase != Phase.CANCELLED):
                change.start.append(member)
            elif rec.phase.terminal:
                change.done.append(member)
            else:
                change.keep.append(member)
    for name, rec in sorted(recorded.items()):
        if rec.sweep and name not in desired.jobs and not rec.phase.terminal:
            out.setdefault(rec.sweep, SweepChange(rec.sweep)).stop.append(name)
    return [out[name] for name in sorted(out)]
