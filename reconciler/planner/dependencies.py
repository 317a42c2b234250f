"""Dependencies (`spec.after`): whether a job's run may start, from the statuses of the jobs it names.

Pure. A dependency is done when its status says Succeeded for the run its manifest asks for now:
a changed command, code or env is a new run, which must succeed again. One that Failed or was
Cancelled holds the jobs after it (they have used nothing, so they are not failed) until a new
run of it succeeds. The planner asks with the statuses the tick read, so a dependency that
succeeds during a tick lets its dependents start at the next; `plan` shows the same words.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from adapters.artifacts import Input
from desired.matrix import Sweep
from desired.models import Job
from status.models import JobStatus, Phase

HELD = "held:"  # how the message of a job held by a dependency begins (`run --until-done` reads it)
WAITING = "waiting for:"  # and of one waiting for its dependencies to succeed
NEW = "New"  # no status yet, as `status` says
NEW_RUN = "new run"  # its manifest asks for a run its status does not have yet
BROKEN = "manifest has errors"  # left out of the desired state: `validate` says why


@dataclass(frozen=True)
class Dependency:
    job: str
    state: str  # the phase of its status, or NEW, NEW_RUN, BROKEN
    blocked: bool = False  # it will not succeed as it is: Failed, Cancelled, or a manifest with errors

    @property
    def done(self) -> bool:
        return self.state == Phase.SUCCEEDED.value

    def __str__(self) -> str:
        return f"{self.job} ({self.state})"


def dependencies(job: Job, jobs: Mapping[str, Job], statuses: Mapping[str, JobStatus],
                 sweeps: Mapping[str, Sweep] | None = None) -> list[Dependency]:
    """Each job or sweep `job` runs after, in the order its manifest names them, with where it stands."""
    sweeps = sweeps or {}
    return [_sweep_standing(sweeps[name], jobs, statuses) if name in sweeps
            else _standing(name, jobs.get(name), statuses.get(name)) for name in job.spec.after]


def _sweep_standing(sweep: Sweep, jobs: Mapping[str, Job], statuses: Mapping[str, JobStatus]) -> Dependency:
    """A sweep is done when every member is; one member that will not succeed holds what runs after it."""
    members = [_standing(m, jobs.get(m), statuses.get(m)) for m in sweep.members]
    blocked = [d for d in members if d.blocked]
    if blocked:
        return Dependency(sweep.name, f"sweep: {', '.join(map(str, blocked))}", blocked=True)
    done = sum(d.done for d in members)
    if done == len(members):
        return Dependency(sweep.name, Phase.SUCCEEDED.value)
    return Dependency(sweep.name, f"sweep: {done} of {len(members)} members Succeeded")


def _standing(name: str, job: Job | None, st: JobStatus | None) -> Dependency:
    if job is None:  # named, so defined, yet not in the desired state: its manifest has errors
        return Dependency(name, BROKEN, blocked=True)
    if st is None:
        return Dependency(name, NEW)
    if st.run_id != job.run_id():
        return Dependency(name, NEW_RUN)
    return Dependency(name, st.phase.value, blocked=st.phase in (Phase.FAILED, Phase.CANCELLED))


def waiting(deps: list[Dependency]) -> str:
    """Why the run does not start yet, in one sentence, or "" when every dependency has succeeded."""
    blocked = [d for d in deps if d.blocked]
    if blocked:
        one = len(blocked) == 1
        return (f"{HELD} {', '.join(map(str, blocked))} will not succeed as {'it is' if one else 'they are'}; "
                f"this job starts once {'it is' if one else 'they are'} fixed and "
                f"{'succeeds' if one else 'succeed'}")
    pending = [d for d in deps if not d.done]
    return f"{WAITING} {', '.join(map(str, pending))}" if pending else ""


def held_by_dependency(st: JobStatus) -> bool:
    """The job waits for a dependency that will not succeed as it is: only a new commit moves it."""
    return st.phase == Phase.PENDING and st.message.startswith(HELD)


def inputs(job: Job, statuses: Mapping[str, JobStatus], sweeps: Mapping[str, Sweep] | None = None) -> tuple[Input, ...]:
    """The succeeded runs whose outputs a launch of `job` hands over, in the order `after` names
    them: a job's under its name, a sweep's under <sweep>/<member>. Storage "" is the settings'."""
    sweeps = sweeps or {}
    found = []
    for name in job.spec.after:
        members = [(f"{name}/{m}", m) for m in sweeps[name].members] if name in sweeps else [(name, name)]
        for folder, member in members:
            st = statuses.get(member)
            if st is not None and st.phase == Phase.SUCCEEDED:
                found.append(Input(folder, member, st.run_id, st.storage))
    return tuple(found)
