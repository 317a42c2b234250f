"""The planner's vocabulary: what it is given (observations), what it returns (actions, a plan,
the executor's results), and the working state one job carries from step to step (`JobTick`).
Pure, like the planner; split from reconciler/planner/plan.py so that the steps can live in more than
one module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from adapters.artifacts import Input
from adapters.compute import Allowance, WorkerPhase, WorkerRef, WorkerState
from adapters.stores.faults import StoreFault
from desired.models import Capacity, Job, Provider
from desired.parse import DesiredState
from reconciler.planner.health import ProviderHealth, Trouble
from reconciler.planner.judge import PROVIDER_ENDED, close, record_close
from reconciler.planner.outlook.deadline import PlacementPolicy, choose
from reconciler.planner.outlook.forecast import Reliability
from reconciler.planner.outlook.reliability import RoomShape
from reconciler.planner.run_observation import RunObservation
from status.models import Attempt, JobStatus, Outcome, Phase

# ---- inputs -----------------------------------------------------------------------------------

__all__ = ["RunObservation"]  # what storage says about a run: its own module, since judge reads it too


@dataclass
class Observed:
    workers: dict[WorkerRef, WorkerState] = field(default_factory=dict)
    unreachable: dict[str, str] = field(default_factory=dict)  # provider -> why it could not be asked
    runs: dict[tuple[str, str], RunObservation] = field(default_factory=dict)  # (job, run_id)
    logs: dict[WorkerRef, str] = field(default_factory=dict)  # tails of exited workers
    capacity: dict[str, Capacity] = field(default_factory=dict)  # provider -> what its adapter reports
    allowances: dict[str, Allowance] = field(default_factory=dict)  # provider -> its quota or credits now
    bad_hosts: frozenset[tuple[str, str]] = frozenset()  # (provider, host): lost a worker of ours lately
    run_storage: dict[tuple[str, str], str] = field(default_factory=dict)  # (job, run_id) -> store it was read from
    # Providers no longer in desired/ that the status says ran workers: asked so those workers can
    # be stopped and billed, never launched on.
    retired: dict[str, Provider] = field(default_factory=dict)
    free_slots: dict[str, int] = field(default_factory=dict)  # provider -> workers it can take now, where it says
    room_waits: dict[str, float] = field(default_factory=dict)  # provider -> mean seconds without room (RoomWatch)
    room_shapes: dict[str, RoomShape] = field(default_factory=dict)  # provider -> its room periods (RoomWatch)
    # What this tick's probe of run storage found wrong with it (full, read-only, ...), or None:
    # while it holds, nothing is charged and nothing that needs the store is launched.
    store_fault: StoreFault | None = None


@dataclass(frozen=True)
class Launch:
    job: str
    run_id: str
    provider: str
    reason: str
    avoid_hosts: tuple[str, ...] = ()  # machines of this provider that recently lost a worker of ours
    # The provider's measured mean time between failures, passed as RECONCILER_MTBF_SECONDS (the
    # worker's checkpoint interval follows it). A figure of the moment: no part of equality.
    mtbf_seconds: float | None = field(default=None, compare=False)
    # The completed runs of the jobs it runs `after`, whose outputs the worker downloads first.
    inputs: tuple[Input, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Terminate:
    ref: WorkerRef
    reason: str
    # Where the run's folder is, for the stop request the executor writes there first (None: the
    # settings' storage). A locator, not part of what is stopped, so it takes no part in equality.
    store: str | None = field(default=None, compare=False)
    # No notice, as a machine that vanishes (a drill): no stop request, the provider's harshest stop
    # (SIGKILL where it has one, else its terminate).
    hard: bool = False


@dataclass(frozen=True)
class MoveRunData:
    """Copy a run's folder to the store `storage:` now names (verified), before its next attempt."""

    job: str
    run_id: str
    source: str
    target: str


@dataclass(frozen=True)
class RequestStop:
    """Ask a live worker, through its run folder, to save and exit 75 at its next heartbeat, without
    asking the provider to stop it (the provider has announced it will: an interruption notice)."""

    ref: WorkerRef
    reason: str
    store: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ArmDrill:
    """Ask the live worker of `epoch`, through its run folder, to drill (adapters/drills.py)."""

    ref: WorkerRef
    drill_id: str
    epoch: int
    lookahead: int
    notice: bool
    store: str | None = field(default=None, compare=False)


Action = Launch | Terminate | MoveRunData | RequestStop | ArmDrill


@dataclass
class SweepChange:
    """What a plan does to one sweep's members (names in order): reconciler.planner.sweeps."""

    sweep: str
    start: list[str] = field(default_factory=list)  # new members, new runs, or cancelled ones restored
    stop: list[str] = field(default_factory=list)  # active members no longer in the matrix: cancelled
    keep: list[str] = field(default_factory=list)  # members whose run goes on as it is
    done: list[str] = field(default_factory=list)  # finished members, left as they are


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    statuses: dict[str, JobStatus] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # things worth logging that change nothing
    health: dict[str, ProviderHealth] = field(default_factory=dict)  # each provider's, as this plan saw it
    troubles: set[Trouble] = field(default_factory=set)  # what `health` was computed from
    # Sweep -> its members holding a live attempt, kept up to date as members are planned (max_parallel).
    sweep_live: dict[str, set[str]] = field(default_factory=dict)
    sweeps: list[SweepChange] = field(default_factory=list)  # what this plan does to each sweep's members


@dataclass(frozen=True)
class LaunchResult:
    action: Launch
    ref: WorkerRef | None = None
    error: str | None = None
    unavailable: bool = True  # error was the provider's (capacity, API), not the job's config
    job_config_error: bool = False  # the job cannot run as written: fail it at once
    held: bool = False  # it waits for a person (an input gone from storage): Pending, `held:` in its message


@dataclass(frozen=True)
class MoveResult:
    action: MoveRunData
    error: str | None = None


@dataclass
class JobTick:
    """The planner's working state for one job, handed from step to step."""

    job: Job
    st: JobStatus
    run: RunObservation
    workers: dict[WorkerRef, WorkerState]
    desired: DesiredState
    observed: Observed
    now: float
    out: Plan
    busy: dict[str, int]
    current: Attempt | None = None
    policy: PlacementPolicy = choose
    reliability: dict[str, Reliability] = field(default_factory=dict)
    recorded: JobStatus | None = None  # the job's status as the tick read it (`reliability` counts it)
    recorded_jobs: Mapping[str, JobStatus] = field(default_factory=dict)  # every job's, as the tick read them

    @property
    def health(self) -> dict[str, ProviderHealth]:
        """Every provider's health, shared by all jobs (reconciler.planner.health), kept on the plan."""
        return self.out.health

    def price(self, provider: str) -> float:
        prov = self.desired.providers.get(provider) or self.observed.retired.get(provider)
        return prov.spec.price_per_hour if prov else 0.0

    def live_refs(self, epoch: int | None = None) -> list[WorkerRef]:
        return [r for r, s in self.workers.items() if live(s) and r.run_id == self.st.run_id
                and (epoch is None or r.epoch == epoch)]

    def stop(self, ref: WorkerRef, reason: str) -> None:
        if not any(isinstance(a, Terminate) and a.ref == ref for a in self.out.actions):
            self.out.actions.append(Terminate(ref, reason, self.observed.run_storage.get((ref.job, ref.run_id))))

    def close_current(self, outcome: Outcome, detail: str, exit_code: int | None = None,
                      ended: float | None = None, unconfirmed: bool = False) -> None:
        assert self.current is not None
        cur = self.current
        seen = next((s for r, s in self.workers.items()
                     if (r.provider, r.id, r.epoch) == (cur.provider, cur.worker, cur.epoch)), None)
        closed = close(cur, outcome, self.now, self.run, detail, exit_code, self.price(cur.provider), ended,
                       seen.cost_usd if seen else None)
        if unconfirmed:
            closed = closed.model_copy(update={"unconfirmed": True})
        record_close(self.st, closed.model_copy(update={"host": seen.host}) if seen and seen.host else closed,
                     provider_ended=(seen is not None and seen.phase in PROVIDER_ENDED)
                     or self.observed.store_fault is not None)  # neither says anything about the job
        self.current = None


Step = Callable[[JobTick], bool]  # True = the job's status is settled for this tick


def live(state: WorkerState) -> bool:
    return state.phase in (WorkerPhase.PENDING, WorkerPhase.RUNNING)


# ---- small verbs the steps share --------------------------------------------------------------


def stop_current(t: JobTick, reason: str) -> None:
    """Stops the live attempt (SIGTERM: it saves) and closes it as ours to end: free."""
    assert t.current is not None
    for ref in t.live_refs(t.current.epoch):
        t.stop(ref, reason)
    t.close_current(Outcome.CANCELLED, reason)


def last_detail(st: JobStatus) -> str:
    return st.attempts[-1].detail if st.attempts else ""


def fail(st: JobStatus, reason: str) -> None:
    """The job is Failed with the reason as its message, and backs off no more."""
    st.phase = Phase.FAILED
    st.message = reason
    st.backoff_until = None

