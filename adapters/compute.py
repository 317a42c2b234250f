"""The contract every compute adapter implements, and the one vocabulary of worker states.

Adapters talk to a provider; they decide nothing. Each adapter maps its provider's own states
onto `WorkerPhase` in one table and keeps the provider's word beside it for humans.

Shared rules every adapter applies the same way: worker labels pass `check_label` (a full match);
every worker carries its state repository's identity (`owner`) in its labels and folder name
(`worker_folder_name`); a worker command gets only `worker_base_env` of the environment it is
started from, plus its `env` and secrets; RECONCILER_DEADLINE is `worker_deadline`;
RECONCILER_MTBF_SECONDS (the planner's figure) is in `env` already (`with_mtbf`).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from desired.models import Capacity
from status.redact import Redactor


class WorkerPhase(StrEnum):
    PENDING = "pending"  # accepted by the provider, not started yet
    RUNNING = "running"
    EXITED = "exited"  # the process ended by itself; see exit_code
    PREEMPTED = "preempted"  # taken away: spot reclaim, node failure, killed from outside
    SESSION_LIMIT = "session-limit"  # the provider's time limit ended it
    LOST = "lost"  # unreachable or unknown to the provider


@dataclass(frozen=True)
class WorkerRef:
    """Names one worker; `id` is the provider's handle, the rest are our labels on it."""

    provider: str
    id: str
    job: str
    run_id: str
    epoch: int


@dataclass(frozen=True)
class WorkerState:
    phase: WorkerPhase
    exit_code: int | None = None
    provider_state: str = ""  # the provider's own word, e.g. "PREEMPTED" or "killed by SIGKILL"
    detail: str = ""  # who or what, when the provider says (e.g. "cancelled by uid 1001")
    # Evidence for the planner (an adapter reports facts, the planner classifies them). A command
    # that died of a signal is EXITED with `signal` set (exit_code -signum where the process was
    # watched directly, 128+signum where the provider reports a shell's code, as Slurm does);
    # PREEMPTED is kept for the provider's own word (spot reclaim, node failure) and for a stop the
    # reconciler asked for (then `signal` may be set too, and `detail` says so).
    signal: str | None = None  # the signal that ended the command, e.g. "SIGSEGV" (phase EXITED)
    oom: bool = False  # the provider says the kernel or the scheduler killed it for memory
    ended_at: float | None = None  # when the command ended, if the provider can tell (for billing)
    cost_usd: float | None = None  # what the provider billed for this worker so far, if it says (Lightning)
    host: str = ""  # the machine it runs on, where the provider names one (a Vast.ai machine id)
    notice: str = ""  # the provider announced it will take the worker away (Lightning's interruption
    # notice): the worker is still running; the planner asks it to save and leave through the run folder


@dataclass(frozen=True)
class LaunchSpec:
    """Everything an adapter needs to start one attempt. `env` already holds RECONCILER_* variables;
    `secret_env` is kept apart so adapters never write it to logs or files others can read."""

    job: str
    run_id: str
    epoch: int
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    secret_env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    cpus: int = 1
    memory_gb: float | None = None
    gpus: int = 0
    gpu_model: str | None = None
    gpu_memory_gb: float | None = None
    cuda: float | None = None
    deadline: float | None = None  # the job's deadline (epoch seconds); adapters pass the earlier of
    # it and their own session limit to the worker as RECONCILER_DEADLINE
    code_git: str | None = None  # hosted providers fetch the job's code themselves: git URL and ref,
    code_ref: str | None = None  # or run it in the job's container image
    image: str | None = None
    max_price_per_hour: float | None = None  # the job's own cap: a market adapter never bids or rents above it
    avoid_hosts: tuple[str, ...] = ()  # machines (provider's ids) that recently lost a worker: not these


@dataclass(frozen=True)
class Allowance:
    """A provider's own limit on what may still be spent, read from its API: Kaggle's weekly GPU
    hours, Lightning AI's credits. Hosted adapters offer it as an optional `allowance()` method
    (read once per tick); the planner starts nothing the allowance cannot carry and the status keeps
    it in the provider ledger. `unit` is "gpu-hours" or "credits" (1 credit = 1 USD)."""

    unit: str
    remaining: float  # left now, after what the provider has reserved for running sessions
    minimum: float = 0.0  # what must remain to start one more worker (the adapter's settings say)
    total: float | None = None  # allowed per period, if the provider says
    used: float | None = None  # used this period, if the provider says
    resets_at: float | None = None  # epoch seconds of the next refill, if any
    applies_to_cpu: bool = True  # False: only workers with GPUs draw on it (Kaggle's GPU quota)


# A hosted adapter whose provider keeps the job's secrets itself (Kaggle's user secrets, Lightning's
# teamspace secrets) sets `secrets_at_provider = True`: a launch then carries only the secret names,
# and the daemon need not hold their values (it masks those it does hold).
SECRETS_AT_PROVIDER = "secrets_at_provider"


class ProviderUnavailable(Exception):
    """The provider cannot serve now: API down, no capacity, quota spent. Not the job's fault."""


class LaunchRefused(ProviderUnavailable):
    """The provider refused a launch before starting anything (no capacity, quota spent, its working
    directory cannot be made): no worker exists, so the attempt's epoch may be taken again. A launch
    that failed in any other way (a timeout, an answer cut off) may have started one: its epoch stays
    used, so that two workers never write under the same epoch."""


class ProviderConfigError(Exception):
    """The provider's settings or credentials are wrong; a person must fix them."""


class JobConfigError(Exception):
    """The job cannot run as written (its code path does not exist, its resources cannot be met):
    the job fails at once with this reason instead of waiting for a provider that cannot help."""


SAFE_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
ANY_OWNER = "*"  # an operator's view (tools, tests): sees every owner's workers and launches nothing

# The only variables of the daemon's own environment a worker command gets (plus its `env` and
# named secrets): never the daemon's whole environment, which may hold other jobs' credentials.
BASE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR")
BASE_ENV_PREFIXES = ("LC_",)


def check_label(value: str, what: str) -> str:
    """Labels become folder names and job comments on a host; refuse anything that could escape
    or confuse them (one rule for every adapter). A full match: `"x\n"` is refused."""
    if not SAFE_LABEL.fullmatch(value) or ".." in value:
        raise ProviderConfigError(f"{what} {value!r} cannot be used as a worker label")
    return value


def check_owner(owner: str, what: str = "owner") -> str:
    """The state repository's identity; ANY_OWNER is the operator's view (observe and stop only)."""
    return owner if owner == ANY_OWNER else check_label(owner, what)


def worker_folder_name(owner: str, job: str, run_id: str, epoch: int) -> str:
    """`<owner>.<job>.<run_id>.e<epoch>`: one name per worker, never shared by two repositories."""
    return f"{owner}.{check_label(job, 'job name')}.{check_label(run_id, 'run id')}.e{epoch}"


def worker_base_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What a worker command inherits from the environment it is started from: PATH, HOME,
    USER/LOGNAME, LANG/LC_*, TZ, TMPDIR (those that are set), nothing else."""
    return {k: v for k, v in environ.items() if k in BASE_ENV or k.startswith(BASE_ENV_PREFIXES)}


def output_mask(spec: LaunchSpec) -> dict[str, object] | None:
    """What the process that captures a worker's output needs to mask the job's secrets in it
    before it is stored (adapters.bootstrap.OutputMasker): travels with the secrets themselves, on
    stdin or in the 0600 payload, never in an argv. None when the job has no secret to mask."""
    redactor = Redactor(spec.secret_env.values())
    return {"pattern": redactor.pattern, "longest": redactor.longest} if redactor else None


def worker_deadline(spec: LaunchSpec, session_end: float | None = None) -> float | None:
    """RECONCILER_DEADLINE: the earliest of the job's deadline and the provider's session end."""
    known = [t for t in (spec.deadline, session_end) if t is not None]
    return min(known) if known else None


def with_deadline(env: Mapping[str, str], deadline: float | None) -> dict[str, str]:
    """`env` with RECONCILER_DEADLINE (whole epoch seconds) set, when a deadline is known."""
    out = dict(env)
    if deadline is not None:
        out["RECONCILER_DEADLINE"] = str(int(deadline))
    return out


def with_mtbf(env: Mapping[str, str], mtbf_seconds: float | None) -> dict[str, str]:
    """`env` with RECONCILER_MTBF_SECONDS (whole seconds) set, when the planner measured one: the
    worker SDK chooses its checkpoint interval from it (reconciler.checkpoint_policy)."""
    out = dict(env)
    if mtbf_seconds is not None:
        out["RECONCILER_MTBF_SECONDS"] = str(int(mtbf_seconds))
    return out


@runtime_checkable
class ComputeAdapter(Protocol):
    """Built as `cls(name, settings, owner=identity)`. `owner` is the state repository's identity:
    it goes into every worker's labels, folder name and job comment, and observe/terminate/adopt
    touch only workers that carry it. `foreign_workers` is set by observe(): how many workers of
    other owners it saw (reported, never touched)."""

    name: str
    owner: str
    foreign_workers: int

    def launch(self, spec: LaunchSpec) -> WorkerRef:
        """Start a worker labelled (job, run_id, epoch); adopt one that already carries the labels."""
        ...

    def observe(self) -> dict[WorkerRef, WorkerState]:
        """Every worker carrying our labels, launched by this process or not. Raises
        ProviderUnavailable when the provider cannot be asked (the caller must not conclude
        anything about the workers from that)."""
        ...

    def terminate(self, ref: WorkerRef) -> None:
        """Stop the worker; a worker already gone is not an error."""
        ...

    def logs(self, ref: WorkerRef, tail: int = 50) -> str:
        """The last `tail` lines of the worker's output, or '' if there are none."""
        ...

    def free_slots(self) -> int | None:
        """How many more workers the provider can take now, if it can tell; None = unknown."""
        ...

    def capacity(self) -> Capacity | None:
        """What one worker may use here (CPUs, memory, GPUs and models), if the adapter can tell;
        None = unknown. A Provider's declared `spec.resources` takes precedence."""
        ...


@runtime_checkable
class Kills(Protocol):
    """Optional: end a worker with no notice at all, as a machine that vanishes (a drill,
    docs/guides/drills.md): SIGKILL at once, no grace, no stop request. The end is ours, so it is
    reported as terminate's is (stopped by the reconciler). An adapter without it is stopped with
    `terminate` instead."""

    def kill(self, ref: WorkerRef) -> None:
        ...


@runtime_checkable
class WatchesEndings(Protocol):
    """Optional, for adapters that can see one of their workers end soon after it happens (an exit
    record written on an SSH host, a Slurm job leaving the running states). The daemon runs it on a
    thread of its own and only ticks when told: what the ending means is still decided by the
    planner from `observe()`. It must be cheap, never raise, and must not touch the adapter's state
    that ticks use (it runs beside them)."""

    def watch_endings(self, stop: threading.Event, notify: Callable[[], None]) -> None:
        """Blocks until `stop` is set, calling `notify()` soon after any of our workers ends."""
        ...
