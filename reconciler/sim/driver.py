"""The simulation driver: the real `Reconciler.tick()` in simulated time against a world that
fails on purpose.

One step = physical time moves by one tick interval (workers compute, checkpoint, die), then
the real tick runs — real parse, real plan, real execute, real status rendering — against the
`SimAdapter`s, the fault-injecting `simfs://` storage and the in-memory `SimRepo`. A crash is a
`SimCrash` (a BaseException, so no `except Exception` in the loop can swallow it, as a real
SIGKILL could not be caught) raised at the N-th injected call of a tick; the driver then throws
the Reconciler away and builds a fresh one from the same git and storage, as a restarted
daemon would. The invariant checker runs after every step.

Two clocks: the world's physical time, and the reconciler's clock (a ManualClock) which is the
physical time plus a skew that a clock-jump fault changes.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from adapters.compute import ComputeAdapter
from adapters.sim import JobModel, ProviderModel, SimAdapter, SimCloud, SimWorker
from adapters.storage import RunFolder
from desired.models import Provider
from reconciler.checkpoint_policy import IntervalPolicy
from reconciler.clock import ManualClock
from reconciler.daemon.asking import ProviderCalls
from reconciler.daemon.loop import Reconciler, TickReport
from reconciler.planner.outlook.deadline import PlacementPolicy
from reconciler.planner.plan import CONFIRM_CANCEL_TRAILER
from reconciler.sim.invariants import InvariantChecker
from reconciler.sim.repo import RepoFaults, SimRepo
from reconciler.sim.storage import PROTOCOL, drop_world, world_store
from status.models import JobStatus, Phase, iso, parse_status

START = 1_800_000_000.0
_ids = itertools.count(1)


class SimCrash(BaseException):
    """The reconciler process dies here (not an Exception: nothing in the loop may catch it)."""


@dataclass
class ProviderPlan:
    """A provider as the manifest declares it, plus the world's model of it."""

    model: ProviderModel
    concurrency: int = 100
    interruptible: bool = False  # spot-like: the placement policy treats it as unreliable


@dataclass
class JobPlan:
    name: str
    target_steps: int = 3600
    providers: list[str] = field(default_factory=list)
    model: JobModel = field(default_factory=JobModel)
    max_retries: int = 3
    budget_usd: float | None = None
    checkpoint_every: int | None = None
    step_seconds: float | None = None  # the manifest's estimate (JobSpec.step_seconds)
    stall_timeout_seconds: float = 300.0
    suspend: bool = False
    deadline_seconds: float | None = None  # after the simulation's start


@dataclass
class Faults:
    """Every switchable fault of the simulation (provider API faults live on ProviderModel)."""

    crash_rate: float = 0.0  # chance that a tick is killed at a random call
    tick_storage_error_rate: float = 0.0
    worker_storage_error_rate: float = 0.0
    slow_write_seconds: float = 0.0
    push_reject_rate: float = 0.0
    pull_error_rate: float = 0.0
    clock_jump_rate: float = 0.0  # chance per step that the reconciler's clock jumps
    clock_jump_seconds: float = 120.0  # largest jump, either way


@dataclass
class SimConfig:
    providers: list[ProviderPlan]
    jobs: list[JobPlan]
    seed: int = 0
    tick_seconds: float = 30.0
    faults: Faults = field(default_factory=Faults)
    # "hint": the job's checkpoint_every; "young-daly": the SDK's IntervalPolicy with the planner's
    # RECONCILER_MTBF_SECONDS; "true-rate": the same policy told the provider's true MTBF; "fixed-30m"
    policy: str = "hint"
    check: bool = True  # run the invariant checker after every step (off only to time the tick alone)
    placement_policy: PlacementPolicy | None = None  # None: the product's (reconciler.planner.outlook.deadline.choose)


def job_manifest(job: JobPlan) -> str:
    lines = [
        "apiVersion: reconciler.dev/v1",
        "kind: Job",
        "metadata:",
        f"  name: {job.name}",
        "spec:",
        "  command: [sim-train]",
        f"  target_steps: {job.target_steps}",
        f"  stall_timeout_seconds: {job.stall_timeout_seconds}",
        "  retry:",
        f"    max_retries: {job.max_retries}",
        "    backoff_seconds: 10",
    ]
    if job.checkpoint_every:
        lines.append(f"  checkpoint_every: {job.checkpoint_every}")
    if job.step_seconds:
        lines.append(f"  step_seconds: {job.step_seconds!r}")
    if job.providers:
        lines.append(f"  placement: {{providers: [{', '.join(job.providers)}]}}")
    if job.budget_usd is not None:
        lines.append(f"  budget_usd: {job.budget_usd}")
    if job.suspend:
        lines.append("  suspend: true")
    if job.deadline_seconds is not None:
        lines.append(f"  deadline: {iso(START + job.deadline_seconds)}")
    return "\n".join(lines) + "\n"


def provider_manifest(p: ProviderPlan) -> str:
    m = p.model
    return "\n".join([
        "apiVersion: reconciler.dev/v1",
        "kind: Provider",
        "metadata:",
        f"  name: {m.name}",
        "spec:",
        f"  settings: {{type: sim, launch_delay_seconds: {m.launch_delay_seconds}, "
        f"interruptible: {str(p.interruptible).lower()}}}",
        f"  concurrency: {p.concurrency}",
        f"  price_per_hour: {m.price_per_hour}",
        *([f"  free_quota_hours: {m.quota_seconds / 3600.0}"] if m.quota_seconds is not None else []),
    ]) + "\n"


class Simulation:
    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.world = f"w{next(_ids)}-{config.seed}"
        self.storage_url = f"{PROTOCOL}://{self.world}/runs"
        self.storage_options = {"world": self.world}
        self.phys = START
        self.skew = 0.0
        self.clock = ManualClock(START)
        f = config.faults
        self.store = world_store(self.world)
        sf = self.store.faults
        sf.tick_error_rate = f.tick_storage_error_rate
        sf.worker_error_rate = f.worker_storage_error_rate
        sf.slow_write_seconds = f.slow_write_seconds
        sf.rng = random.Random(config.seed + 1)
        sf.hook = self._hook
        sf.advance = self._slow
        self.cloud = SimCloud(_PhysClock(self), seed=config.seed + 2, storage_options=self.storage_options,
                              heartbeat_seconds=30.0)
        self.cloud.call_hook = self._hook
        self.cloud.slow_fn = self._slow
        self.cloud.interval_fn = self._interval
        for p in config.providers:
            self.cloud.add_provider(p.model)
        for j in config.jobs:
            self.cloud.jobs[j.name] = j.model
        files: dict[str, bytes] = {
            "reconciler.yaml": (f"storage: {self.storage_url}\ntick_seconds: {config.tick_seconds}\n"
                                f"storage_options: {{world: {self.world}}}\nremote: origin\n").encode(),
            "desired/providers.yaml": "---\n".join(provider_manifest(p) for p in config.providers).encode(),
        }
        for j in config.jobs:
            files[f"desired/{j.name}.yaml"] = job_manifest(j).encode()
        repo_faults = RepoFaults(push_reject_rate=f.push_reject_rate, pull_error_rate=f.pull_error_rate,
                                 rng=random.Random(config.seed + 3), hook=self._hook)
        self.repo = SimRepo(files, repo_faults)
        self._parsed_phases: dict[str, tuple[bytes, tuple[str, Phase] | None]] = {}
        self.calls = 0
        self.crash_at: int | None = None
        self.in_tick = False
        self.steps = 0
        self.crashes = 0
        self.tick_exceptions: list[str] = []
        self.last_report: TickReport | None = None
        self.tick_calls = 50
        self.last_tick_cpu = 0.0  # CPU seconds of the last Reconciler.tick() alone
        self.reconciler = self._new_reconciler()
        self.checker = InvariantChecker(self)
        self.deleted_jobs: set[str] = set()

    # ---- wiring ---------------------------------------------------------------------------
    def _new_reconciler(self) -> Reconciler:
        repo: Any = self.repo  # StateRepo's methods, in memory
        # Providers one after another: the world's seeded randomness is drawn in a fixed order.
        return Reconciler(repo, clock=self.clock, adapter_factory=self._adapter, environ={},
                          placement_policy=self.config.placement_policy, provider_calls=ProviderCalls(threads=False))

    def _adapter(self, provider: Provider, owner: str) -> ComputeAdapter:
        settings = provider.spec.settings
        return SimAdapter(provider.name, settings if settings.type == "sim" else None,  # type: ignore[arg-type]
                          world=self.cloud, owner=owner)

    def _hook(self, where: str) -> None:
        if not self.in_tick:
            return
        self.calls += 1
        if self.crash_at is not None and self.calls >= self.crash_at:
            self.crash_at = None
            raise SimCrash(where)

    def _slow(self, seconds: float) -> None:
        self.phys += seconds
        self.clock.t = self.phys + self.skew

    def _interval(self, w: SimWorker) -> float:
        policy = self.config.policy
        if policy == "fixed-30m":
            return 1800.0
        if policy in ("young-daly", "true-rate"):
            # The SDK's own policy: the MTBF the planner passed in the launch environment (or the
            # world's true one, as a yardstick), and the save cost the worker measures (a
            # simulated save blocks for its whole cost).
            given = w.spec.env.get("RECONCILER_MTBF_SECONDS")
            told = w.provider.mtbf_seconds if policy == "true-rate" else float(given) if given else None
            sdk = IntervalPolicy(mtbf=told)
            sdk.saved(blocked=w.model.checkpoint_cost_seconds, durable=w.model.checkpoint_cost_seconds)
            return sdk.interval()
        return w.interval

    @contextmanager
    def quiet(self) -> Iterator[None]:
        """Reads for the checker: no faults, no crash points, no slow writes."""
        sf = self.store.faults
        saved = (sf.tick_error_rate, sf.worker_error_rate, sf.slow_write_seconds, sf.context)
        sf.tick_error_rate = sf.worker_error_rate = sf.slow_write_seconds = 0.0
        sf.context = "worker"
        was = self.in_tick
        self.in_tick = False
        try:
            yield
        finally:
            sf.tick_error_rate, sf.worker_error_rate, sf.slow_write_seconds, sf.context = saved
            self.in_tick = was

    def folder(self, job: str, run_id: str) -> RunFolder:
        return RunFolder.for_run(self.storage_url, job, run_id, self.storage_options)

    # ---- what a person does -----------------------------------------------------------------
    def delete_job(self, name: str) -> None:
        # The simulated user means it: a delete that cancels most jobs at once is held without this.
        self.repo.user_commit({f"desired/{name}.yaml": None}, f"delete {name}\n\n{CONFIRM_CANCEL_TRAILER}")
        self.deleted_jobs.add(name)

    def edit_job(self, job: JobPlan) -> None:
        self.repo.user_commit({f"desired/{job.name}.yaml": job_manifest(job).encode()}, f"edit {job.name}")

    # ---- running ----------------------------------------------------------------------------
    def step(self, *, crash_at: int | None = None, jump: float | None = None,
             fresh: bool = False) -> TickReport | None:
        """One tick interval of physical time, then one real tick (maybe killed part way).
        `fresh` starts a new Reconciler first, as `reconciler run --once` from cron would."""
        if fresh:
            self.reconciler = self._new_reconciler()
        f = self.config.faults
        self.phys += self.config.tick_seconds
        self.store.faults.context = "worker"
        self.cloud.advance(self.phys)
        if jump is None and f.clock_jump_rate and self.rng.random() < f.clock_jump_rate:
            jump = self.rng.uniform(-f.clock_jump_seconds, f.clock_jump_seconds)
        if jump is not None:
            self.skew = jump  # a step of the reconciler host's clock, corrected later
        elif self.skew and self.rng.random() < 0.5:
            self.skew = 0.0  # NTP brings it back
        self.clock.t = self.phys + self.skew
        if crash_at is None and f.crash_rate and self.rng.random() < f.crash_rate:
            crash_at = self.rng.randint(1, max(1, self.tick_calls))
        self.crash_at = crash_at
        self.calls = 0
        self.in_tick = True
        self.store.faults.context = "tick"
        report: TickReport | None = None
        cpu = time.process_time()
        try:
            report = self.reconciler.tick()
            self.last_report = report
            self.tick_calls = max(1, self.calls)
        except SimCrash:
            self.crashes += 1
            self.reconciler = self._new_reconciler()
        except Exception as exc:  # a fault the loop did not survive: a finding, then restart
            self.tick_exceptions.append(f"step {self.steps}: {type(exc).__name__}: {exc}")
            self.reconciler = self._new_reconciler()
        finally:
            self.last_tick_cpu = time.process_time() - cpu
            self.in_tick = False
            self.crash_at = None
            self.store.faults.context = "worker"
        self.steps += 1
        if self.config.check:
            self.checker.after_step()
        return report

    def statuses(self) -> dict[str, JobStatus]:
        out = {}
        head = self.repo.head()
        for path, blob in self.repo.read_files(head, "status").items():
            if path.endswith(".yaml"):
                st = parse_status(blob)
                if st is not None:
                    out[st.job] = st
        return out

    def desired_jobs(self) -> set[str]:
        return {p[len("desired/"):-len(".yaml")] for p in self.repo.read_files(self.repo.head(), "desired")
                if p != "desired/providers.yaml"}

    def all_settled(self) -> bool:
        phases = self._phases()
        return all(j in phases and phases[j].terminal for j in self.desired_jobs())

    def _phases(self) -> dict[str, Phase]:
        """Each job's phase at HEAD, as `statuses()` reads it, parsing a status file only when its
        bytes changed: `run_to_completion` asks after every step, and a commit's unchanged files are
        the same bytes objects (the checker's `statuses` caches the same way)."""
        out: dict[str, Phase] = {}
        for path, blob in self.repo.read_files(self.repo.head(), "status").items():
            if not path.endswith(".yaml"):
                continue
            cached = self._parsed_phases.get(path)
            if cached is None or cached[0] is not blob:
                st = parse_status(blob)
                cached = (blob, None if st is None else (st.job, st.phase))
                self._parsed_phases[path] = cached
            if cached[1] is not None:
                out[cached[1][0]] = cached[1][1]
        return out

    def heal(self) -> None:
        """Stops every fault, so that liveness can be judged: the world becomes merely slow."""
        f = self.config.faults
        f.crash_rate = f.tick_storage_error_rate = f.worker_storage_error_rate = f.slow_write_seconds = 0.0
        f.push_reject_rate = f.pull_error_rate = f.clock_jump_rate = 0.0
        sf = self.store.faults
        sf.tick_error_rate = sf.worker_error_rate = sf.slow_write_seconds = 0.0
        self.repo.faults.push_reject_rate = self.repo.faults.pull_error_rate = 0.0
        for p in self.cloud.providers.values():
            p.api_error_rate = p.api_timeout_rate = p.lost_observation_rate = p.api_slow_seconds = 0.0
            p.down = False
            p.fail_ops = frozenset()

    def run(self, max_steps: int, until: Callable[[Simulation], bool] | None = None) -> int:
        for _ in range(max_steps):
            self.step()
            if until is not None and until(self):
                break
        return self.steps

    def run_to_completion(self, max_steps: int) -> bool:
        """Steps until every job is terminal and no push is pending; True when settled."""
        for _ in range(max_steps):
            self.step()
            if not self.repo.unpushed and self.all_settled():
                return True
        return False

    def close(self) -> None:
        drop_world(self.world)

    def figures(self) -> dict[str, Any]:
        sts = self.statuses()
        lost = [x[4] for x in self.cloud.interruptions]
        lost_s = [x[5] for x in self.cloud.interruptions]
        delays = [d / self.config.tick_seconds for d in self.cloud.relaunch_delays]
        return {
            "jobs": len(self.config.jobs),
            "completed": sum(1 for s in sts.values() if s.phase.value == "Succeeded"),
            "failed": sum(1 for s in sts.values() if s.phase.value == "Failed"),
            "violations": len(self.checker.violations),
            "duplicate_completions": self.checker.duplicate_completions,
            "interruptions": len(lost),
            "mean_lost_steps": sum(lost) / len(lost) if lost else 0.0,
            "worst_lost_steps": max(lost) if lost else 0,
            "mean_lost_seconds": sum(lost_s) / len(lost_s) if lost_s else 0.0,
            "worst_lost_seconds": max(lost_s) if lost_s else 0.0,
            "mean_relaunch_ticks": sum(delays) / len(delays) if delays else 0.0,
            "worst_relaunch_ticks": max(delays) if delays else 0.0,
            "crashes": self.crashes,
            "tick_exceptions": len(self.tick_exceptions),
            "zombies": self.cloud.zombies,
            "rejected_pushes": self.repo.faults.rejected_pushes,
            "storage_errors": self.store.faults.errors,
            "steps": self.steps,
        }


class _PhysClock:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    def now(self) -> float:
        return self.sim.phys
