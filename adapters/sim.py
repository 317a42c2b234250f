"""The `sim` compute adapter: providers and workers that exist only in simulated time.

Why it exists: "it will finish" is proved by running the real planner, executor and tick
against providers that fail on purpose. `SimCloud` is a seedable world of providers (launch
delay, capacity, quota, price, preemptions drawn from an exponential distribution or replayed
from a trace of live instances) and of workers that advance steps, checkpoint with cost C,
restart with cost R and write heartbeat, checkpoints and completion through the same
`RunFolder` methods as the worker SDK, so fencing is exercised for real. `SimAdapter` is the
ComputeAdapter view of one provider of that world; it keeps no state of its own, like a real
adapter asking a real API, so a restarted reconciler finds every worker again.

Faults, each switchable per provider: API errors, timeouts that happen after the provider
acted, slow answers (simulated latency), lost observations (a live worker missing from one
listing), zombies (a preempted machine that keeps running cut off from storage and comes back
later), and a whole-API outage. Time comes from the caller: the world moves only when
`advance(t)` is called, and reads `clock.now()` only to know the time of an API call.

State table (what happened to the simulated machine -> WorkerPhase):

| machine                                        | phase          |
|------------------------------------------------|----------------|
| launched, not started yet (launch delay)       | pending        |
| restoring, computing or checkpointing          | running        |
| process ended by itself (code 0, 1, 75)        | exited(code)   |
| reclaimed, or terminated by request            | preempted      |
| killed at the provider's session limit         | session-limit  |
| a zombie while cut off, after its preemption   | preempted      |
| a zombie after it came back                    | running        |
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from adapters.compute import (
    ANY_OWNER,
    Allowance,
    LaunchRefused,
    LaunchSpec,
    ProviderUnavailable,
    WorkerPhase,
    WorkerRef,
    WorkerState,
    worker_deadline,
)
from adapters.storage import CheckpointName, Fenced, RunFolder, StorageError
from desired.models import Capacity, SimSettings

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_INTERRUPTED = 75
RETRY_SECONDS = 5.0  # a worker retries a failed storage call this much later
DEADLINE_MARGIN_SECONDS = 30.0  # a worker that knows its deadline saves this long before it


class _Clock(Protocol):
    def now(self) -> float: ...


# ---- models -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PreemptionTrace:
    """Live instances per time step, replayed in a loop: `{"gap_seconds": S, "data": [n0, ...]}`.
    When the count falls below the workers a provider runs, the excess are preempted."""

    gap_seconds: float
    data: tuple[int, ...]

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> PreemptionTrace:
        gap = float(obj["gap_seconds"])
        data = tuple(int(x) for x in obj["data"])
        if gap <= 0 or not data or min(data) < 0:
            raise ValueError("a trace needs gap_seconds > 0 and a non-empty list of counts >= 0")
        return cls(gap, data)

    @classmethod
    def load(cls, path: str) -> PreemptionTrace:
        with open(path) as fh:
            return cls.from_json(json.load(fh))

    def live_at(self, t_rel: float) -> int:
        return self.data[int(max(0.0, t_rel) // self.gap_seconds) % len(self.data)]


@dataclass
class ProviderModel:
    """One simulated provider: its economics, its reliability, and the faults of its API."""

    name: str
    launch_delay_seconds: float = 60.0
    capacity: int | None = None  # most live workers at once; None = unlimited
    quota_seconds: float | None = None  # worker-seconds it gives in all: a session ends when it runs out
    price_per_hour: float = 0.0
    credits_usd: float | None = None  # prepaid credits (Lightning-like): reported as an allowance, then refused
    mtbf_seconds: float | None = None  # mean time between preemptions of one worker (exponential)
    trace: PreemptionTrace | None = None
    session_limit_seconds: float | None = None  # hard limit of one session (notebooks)
    tell_deadline: bool = True  # pass RECONCILER_DEADLINE to workers when there is a limit
    notice_seconds: float = 0.0  # warning before a preemption (spot notices)
    # API faults
    api_error_rate: float = 0.0
    api_timeout_rate: float = 0.0  # the call acts, then raises as if it had timed out
    api_slow_seconds: float = 0.0  # simulated latency of every call
    lost_observation_rate: float = 0.0
    zombie_rate: float = 0.0  # a preempted machine keeps running, cut off
    zombie_return_seconds: float = 600.0
    down: bool = False
    fail_ops: frozenset[str] = frozenset()  # calls that always fail, e.g. {"terminate"}
    retention_seconds: float = 3600.0  # how long ended workers stay listed

    @classmethod
    def from_settings(cls, name: str, settings: SimSettings | None) -> ProviderModel:
        s = settings or SimSettings()
        return cls(name=name, launch_delay_seconds=s.launch_delay_seconds,
                   mtbf_seconds=s.mean_time_between_preemptions_seconds, api_error_rate=s.api_error_rate)


@dataclass
class JobModel:
    """How a job computes: C, R, speed, and how often it fails by its own fault."""

    step_seconds: float = 1.0
    checkpoint_cost_seconds: float = 30.0
    restart_cost_seconds: float = 60.0
    checkpoint_interval_seconds: float | None = None  # compute between checkpoints; None: env hint or 30 min
    error_rate_per_hour: float = 0.0  # exits 1 (a bug, OOM): charged
    hang_rate_per_hour: float = 0.0  # stops heartbeating while the provider says running: charged
    always_fails: bool = False  # every attempt exits 1 soon after it starts
    honour_deadline: bool = True  # saves and exits 75 before RECONCILER_DEADLINE
    fencing: bool = True  # False = a broken worker that ignores the lease (to test the checker)


# ---- workers ------------------------------------------------------------------------------------


@dataclass
class WorkerLedger:
    """Ground truth about one worker, for invariants and figures (never read by the loop)."""

    steps_computed: float = 0.0
    lost_steps: int | None = None  # heartbeat-free truth: computed minus durable at death
    ended: float | None = None
    end_reason: str = ""  # preempted, session-limit, terminated, error, hang, done, fenced, interrupted
    charged_fault: bool = False  # the job's own fault (error or hang)
    billed_seconds: float = 0.0
    running_seconds: float = 0.0
    useful_compute_seconds: float = 0.0


class SimWorker:
    """One simulated machine running one attempt. Advances by events up to a given time."""

    def __init__(self, cloud: SimCloud, provider: ProviderModel, ref: WorkerRef, spec: LaunchSpec,
                 model: JobModel, folder: RunFolder, now: float, interval: float) -> None:
        self.cloud = cloud
        self.provider = provider
        self.ref = ref
        self.spec = spec
        self.model = model
        self.folder = folder
        self.launched = now
        self.t = now
        self.start_at = now + provider.launch_delay_seconds
        self.phase = "pending"  # pending restoring computing checkpointing hung ended
        self.phase_end = self.start_at
        # The checkpoint in progress is the last before leaving; its exit code; why (in the SDK's beats).
        self.final_save, self.final_exit, self.stopping = False, EXIT_INTERRUPTED, ""
        self.save_started = 0.0  # when the save under way began
        self.save_seconds: float | None = None  # what the last save took, until durable
        self.step = 0.0
        self.durable = 0
        self.target = int(spec.env.get("RECONCILER_TARGET_STEPS", "0") or 0) or None
        self.interval = interval
        self.since_ckpt = 0.0
        self.compute_total = 0.0
        self.last_hb = -math.inf
        self.state: WorkerState = WorkerState(WorkerPhase.PENDING, None, "PROVISIONING")
        self.alive = True  # the process exists (a zombie is alive while reported preempted)
        self.hidden_until: float | None = None  # zombie: cut off from us and storage until then
        self.zombie = False  # it survived a preemption it was reported dead from
        self.reported: WorkerState | None = None  # what the provider says while the zombie is hidden
        self.log: list[str] = []
        self.ledger = WorkerLedger()
        rng = cloud.rng
        self.preempt_at = math.inf
        if provider.mtbf_seconds:
            self.preempt_at = now + rng.expovariate(1.0 / provider.mtbf_seconds)
        self.session_end_at = math.inf
        self.deadline: float | None = None
        if provider.session_limit_seconds:
            self.session_end_at = self.start_at + provider.session_limit_seconds
            if provider.tell_deadline and model.honour_deadline:
                self.deadline = self.session_end_at
        self.error_after = math.inf  # compute seconds until the job's own error
        if model.always_fails:
            self.error_after = 5.0
        elif model.error_rate_per_hour:
            self.error_after = rng.expovariate(model.error_rate_per_hour / 3600.0)
        self.notice_seen = False
        self.hang_after = math.inf
        if model.hang_rate_per_hour:
            self.hang_after = rng.expovariate(model.hang_rate_per_hour / 3600.0)

    # ---- storage, the way the SDK does it -------------------------------------------------
    def _fenced(self, exc: Fenced) -> None:
        self.log.append(f"fenced: {exc}")
        self._end(EXIT_INTERRUPTED, "fenced", WorkerState(WorkerPhase.EXITED, EXIT_INTERRUPTED, "exited 75"))

    def _can_reach_storage(self) -> bool:
        return self.hidden_until is None or self.t >= self.hidden_until

    def _heartbeat(self) -> None:
        if not self._can_reach_storage():
            return
        record: dict[str, Any] = {"epoch": self.ref.epoch, "step": int(self.step), "target": self.target,
                                  "time": self.t, "metrics": {}, "stopping": self.stopping}
        if self.save_seconds is not None:  # as the SDK says it: the last save, from its start until durable
            record["save_seconds"] = self.save_seconds
        if self.model.checkpoint_interval_seconds or not self.spec.env.get("RECONCILER_CHECKPOINT_EVERY"):
            # As the SDK says it where no step count pins it: from one save's start to the next.
            record["save_every_seconds"] = self.interval + self.model.checkpoint_cost_seconds
        try:
            if self.model.fencing:
                self.folder.write_progress(self.ref.epoch, record)
            else:
                self.folder.write_json("progress.json", record)
            self.last_hb = self.t
        except Fenced as exc:
            self._fenced(exc)
        except StorageError:
            pass  # the next heartbeat tries again

    def _restore(self) -> bool:
        if not self._can_reach_storage():
            return False
        try:
            ckpts = self.folder.accepted_checkpoints()
        except StorageError:
            return False
        self.durable = ckpts[0].step if ckpts else 0
        self.step = float(self.durable)
        return True

    def _commit(self) -> bool:
        """Writes one checkpoint of the current step; False = try again later (storage failed)."""
        if not self._can_reach_storage():
            return False
        step = int(self.step)
        if step <= self.durable and not self.final_save:
            return True
        ckpt = CheckpointName(step, self.ref.epoch)
        payload = f"{self.spec.run_id}:{step}".encode()
        record = {"files": {"state": {"size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}},
                  "step": step, "epoch": self.ref.epoch, "parent": self.durable}
        try:
            if step > self.durable:
                self.folder.store.write_payload(f"checkpoints/{ckpt.dirname}/state", memoryview(payload))
                if self.model.fencing:
                    self.folder.commit_checkpoint(self.ref.epoch, ckpt, record)
                else:
                    self.folder.write_json(f"checkpoints/{ckpt.dirname}/COMMIT.json", record)
            self.durable = step
        except Fenced as exc:
            self._fenced(exc)
            return True
        except StorageError as exc:
            if "already exists" in str(exc):  # a retry after a lost answer: it is there
                self.durable = step
            else:
                return False
        try:
            if self.model.fencing:
                self.folder.collect(self.ref.epoch, keep=2)
        except Fenced as exc:
            self._fenced(exc)
        except StorageError:
            pass
        return True

    def _complete(self) -> bool:
        if not self._can_reach_storage():
            return False
        try:
            if self.model.fencing:
                self.folder.mark_done(self.ref.epoch, {"step": int(self.step), "time": self.t})
            else:
                self.folder.write_json("done.json", {"step": int(self.step), "epoch": self.ref.epoch})
        except Fenced as exc:
            self._fenced(exc)
            return True
        except StorageError as exc:
            if "completed by another attempt" in str(exc):
                self._fenced(Fenced(str(exc)))
                return True
            return False
        self.cloud.completions.append((self.spec.job, self.spec.run_id, self.ref.epoch, self.t))
        self._end(EXIT_OK, "done", WorkerState(WorkerPhase.EXITED, EXIT_OK, "exited 0"))
        return True

    # ---- life -----------------------------------------------------------------------------
    def _end(self, code: int | None, reason: str, state: WorkerState) -> None:
        if not self.alive:
            return
        self.alive = False
        self.phase = "ended"
        led = self.ledger
        led.ended = self.t
        led.end_reason = reason
        led.lost_steps = max(0, int(self.step) - self.durable)
        led.charged_fault = led.charged_fault or reason == "error"
        if self.hidden_until is not None and self.reported is not None:
            # A zombie that ends while cut off: the provider keeps reporting what it said.
            self.state = self.reported
        else:
            self.state = state
        if code is not None:
            self.log.append(f"exit {code} ({reason})")
        self.cloud.on_end(self)

    def kill(self, reason: str, phase: WorkerPhase, word: str) -> None:
        """From outside: preemption, session limit, termination. A zombie may survive it."""
        if not self.alive:
            return
        if reason == "preempted" and self.provider.zombie_rate and self.hidden_until is None \
                and self.cloud.rng.random() < self.provider.zombie_rate:
            self.hidden_until = self.t + self.provider.zombie_return_seconds
            self.zombie = True
            self.reported = WorkerState(phase, None, word, "zombie: cut off, still running")
            self.cloud.zombies += 1
            self.cloud.on_interruption(self)
            return
        self.cloud.on_interruption(self)
        self._end(None, reason, WorkerState(phase, None, word))

    def visible_state(self) -> WorkerState:
        if self.alive and self.hidden_until is not None and self.t < self.hidden_until:
            assert self.reported is not None
            return self.reported
        if self.alive:
            if self.phase == "pending":
                return WorkerState(WorkerPhase.PENDING, None, "PROVISIONING")
            return WorkerState(WorkerPhase.RUNNING, None, "RUNNING")
        return self.state

    def advance(self, until: float) -> None:
        """Runs this machine's events up to `until` (it never goes back)."""
        guard = 0
        while self.alive and self.t < until:
            guard += 1
            if guard > 100_000:
                raise RuntimeError(f"worker {self.ref.id} does not make progress at t={self.t}")
            kill_at = min(self.preempt_at, self.session_end_at)
            nxt, event = self._next_event()
            e = min(nxt, kill_at, until)
            dt = e - self.t
            if dt > 0:
                self._spend(dt)
            self.t = e
            if e >= kill_at and kill_at <= until:
                if self.session_end_at <= self.preempt_at:
                    self.kill("session-limit", WorkerPhase.SESSION_LIMIT, "SESSION_LIMIT")
                else:
                    self.preempt_at = math.inf
                    self.kill("preempted", WorkerPhase.PREEMPTED, "PREEMPTED")
                continue
            if e < nxt:
                break
            self._on(event)
        if self.alive and self.phase in ("restoring", "computing", "checkpointing") \
                and self.t - self.last_hb >= self.cloud.heartbeat_seconds:
            self._heartbeat()

    def _spend(self, dt: float) -> None:
        led = self.ledger
        led.billed_seconds += dt
        if self.phase != "pending":
            led.running_seconds += dt
        if self.phase == "computing":
            self.step += dt / self.model.step_seconds
            if self.target:
                self.step = min(self.step, float(self.target))
            self.since_ckpt += dt
            self.compute_total += dt
            led.steps_computed += dt / self.model.step_seconds

    def _next_event(self) -> tuple[float, str]:
        if self.phase in ("pending", "restoring", "checkpointing"):
            return self.phase_end, self.phase
        if self.phase == "hung":
            return math.inf, "hung"
        # computing
        candidates = [
            (self.t + max(0.0, self.interval - self.since_ckpt), "interval"),
            (self.t + max(0.0, self.error_after - self.compute_total), "error"),
            (self.t + max(0.0, self.hang_after - self.compute_total), "hang"),
        ]
        if self.target:
            left = max(0.0, (self.target - self.step) * self.model.step_seconds)
            candidates.append((self.t + left, "target"))
        if self.deadline is not None:
            save_at = self.deadline - self.model.checkpoint_cost_seconds - DEADLINE_MARGIN_SECONDS
            candidates.append((max(self.t, save_at), "deadline"))
        if self.provider.notice_seconds and self.preempt_at < math.inf and not self.notice_seen:
            candidates.append((max(self.t, self.preempt_at - self.provider.notice_seconds), "notice"))
        return min(candidates)

    def _start_checkpoint(self, final: bool, exit_code: int = EXIT_INTERRUPTED) -> None:
        self.phase = "checkpointing"
        self.phase_end = self.t + self.model.checkpoint_cost_seconds
        self.save_started = self.t
        self.final_save = final
        self.final_exit = exit_code

    def _on(self, event: str) -> None:
        if event == "pending":
            self.phase = "restoring"
            self.phase_end = self.t + self.model.restart_cost_seconds
            self.log.append(f"started at {self.t:.0f}")
            self._heartbeat()
        elif event == "restoring":
            if not self._restore():
                self.phase_end = self.t + RETRY_SECONDS
                return
            self.phase = "computing"
            self.since_ckpt = 0.0
            self.log.append(f"restored step {self.durable}")
            self._heartbeat()
        elif event == "checkpointing":
            if not self._commit():
                self.phase_end = self.t + RETRY_SECONDS
                return
            if not self.alive:
                return
            self.since_ckpt = 0.0
            self.save_seconds = self.t - self.save_started
            if self.final_save:
                if self.target and int(self.step) >= self.target:
                    if not self._complete():
                        self.phase_end = self.t + RETRY_SECONDS
                    return
                self.cloud.on_interruption(self)
                self._heartbeat()  # the SDK's stopping beat, written once the final checkpoint is durable
                self._end(self.final_exit, "interrupted",
                          WorkerState(WorkerPhase.EXITED, self.final_exit, f"exited {self.final_exit}"))
                return
            self.phase = "computing"
            self._heartbeat()
        elif event == "interval":
            self._start_checkpoint(final=False)
        elif event == "target":
            self._start_checkpoint(final=True, exit_code=EXIT_OK)
        elif event == "deadline":
            self.deadline, self.stopping = None, "deadline"
            self._start_checkpoint(final=True)
        elif event == "notice":
            self.notice_seen, self.stopping = True, "request"  # relayed as the planner does; reclaimed at preempt_at
            if self.preempt_at - self.t >= self.model.checkpoint_cost_seconds:
                self._start_checkpoint(final=True)
        elif event == "error":
            self.log.append("Traceback (most recent call last):\nRuntimeError: simulated job error")
            self._end(EXIT_ERROR, "error", WorkerState(WorkerPhase.EXITED, EXIT_ERROR, "exited 1"))
        elif event == "hang":
            self.phase = "hung"
            self.ledger.charged_fault = True
            self.log.append("hung: no more heartbeats")


# ---- the world ----------------------------------------------------------------------------------


class SimCloud:
    """Every simulated provider and worker of one simulation, in one seedable place."""

    def __init__(self, clock: _Clock, *, seed: int = 0, storage_options: dict[str, Any] | None = None,
                 heartbeat_seconds: float = 30.0) -> None:
        self.clock = clock
        self.rng = random.Random(seed)
        self.t = clock.now()
        self.t0 = self.t
        self.storage_options = dict(storage_options or {})
        self.heartbeat_seconds = heartbeat_seconds
        self.providers: dict[str, ProviderModel] = {}
        self.jobs: dict[str, JobModel] = {}
        self.workers: dict[str, SimWorker] = {}
        self.by_provider: dict[str, dict[str, SimWorker]] = {}
        self.live: dict[str, SimWorker] = {}
        self.completions: list[tuple[str, str, int, float]] = []
        # figures: (job, run, epoch, time, steps lost, seconds of compute lost) per interruption
        self.interruptions: list[tuple[str, str, int, float, int, float]] = []
        self.deaths: dict[tuple[str, str], float] = {}  # run -> when its last worker was lost
        self.relaunch_delays: list[float] = []  # seconds from a death to the next launch of the run
        self.ended: list[SimWorker] = []
        self.zombies = 0
        self.quota_used: dict[str, float] = {}
        self.api_calls = 0
        # Hooks for the driver: called at the start and end of every API call (crash points),
        # asked for the checkpoint interval of a new worker, and told when simulated time passes.
        self.call_hook: Callable[[str], None] | None = None
        self.interval_fn: Callable[[SimWorker], float] | None = None
        self.slow_fn: Callable[[float], None] | None = None

    def add_provider(self, model: ProviderModel) -> ProviderModel:
        self.providers[model.name] = model
        self.by_provider.setdefault(model.name, {})
        return model

    def job_model(self, job: str) -> JobModel:
        return self.jobs.get(job) or JobModel()

    # ---- time -----------------------------------------------------------------------------
    def advance(self, until: float) -> None:
        """Moves every live worker to `until`, applying trace capacity drops on the way."""
        if until <= self.t:
            return
        cuts: list[float] = []
        for p in self.providers.values():
            if p.trace is not None:
                gap = p.trace.gap_seconds
                k = math.floor((self.t - self.t0) / gap) + 1
                while self.t0 + k * gap <= until:
                    cuts.append(self.t0 + k * gap)
                    k += 1
        for cut in sorted(set(cuts)):
            self._advance_workers(cut)
            self.t = cut
            self._apply_traces()
        self._advance_workers(until)
        self.t = until
        self._forget_old()

    def _advance_workers(self, until: float) -> None:
        for w in list(self.live.values()):
            w.advance(until)

    def _apply_traces(self) -> None:
        for p in self.providers.values():
            if p.trace is None:
                continue
            allowed = p.trace.live_at(self.t - self.t0)
            running = [w for w in self.by_provider[p.name].values() if w.alive and w.hidden_until is None]
            excess = len(running) - allowed
            if excess > 0:
                for w in self.rng.sample(running, excess):
                    w.kill("preempted", WorkerPhase.PREEMPTED, "RECLAIMED")

    def _forget_old(self) -> None:
        for name, workers in self.by_provider.items():
            keep = self.providers[name].retention_seconds
            for wid in [wid for wid, w in workers.items()
                        if not w.alive and w.ledger.ended is not None and self.t - w.ledger.ended > keep]:
                del workers[wid]

    def on_interruption(self, w: SimWorker) -> None:
        lost = max(0, int(w.step) - w.durable)
        lost_s = lost * w.model.step_seconds
        self.interruptions.append((w.spec.job, w.spec.run_id, w.ref.epoch, w.t, lost, lost_s))
        self.deaths[(w.spec.job, w.spec.run_id)] = w.t

    def on_end(self, worker: SimWorker) -> None:
        self.live.pop(worker.ref.id, None)
        self.ended.append(worker)
        p = worker.provider.name
        self.quota_used[p] = self.quota_used.get(p, 0.0) + worker.ledger.billed_seconds

    # ---- the provider API -----------------------------------------------------------------
    def api(self, provider: str, op: str) -> ProviderModel:
        """Entry of every API call: crash point, latency, outage, random errors."""
        self.api_calls += 1
        if self.call_hook is not None:
            self.call_hook(f"{provider}.{op}")
        p = self.providers[provider]
        if p.api_slow_seconds and self.slow_fn is not None:
            self.slow_fn(p.api_slow_seconds)
        if p.down:
            raise ProviderUnavailable(f"sim provider {provider}: API unreachable (outage)")
        if op in p.fail_ops:
            raise ProviderUnavailable(f"sim provider {provider}: {op} refused (injected)")
        if p.api_error_rate and self.rng.random() < p.api_error_rate:
            raise ProviderUnavailable(f"sim provider {provider}: API error 503 on {op}")
        return p

    def api_done(self, provider: str, op: str) -> None:
        """End of an API call: crash point, and a timeout that hides the provider's answer."""
        if self.call_hook is not None:
            self.call_hook(f"{provider}.{op}.done")
        p = self.providers[provider]
        if p.api_timeout_rate and self.rng.random() < p.api_timeout_rate:
            raise ProviderUnavailable(f"sim provider {provider}: {op} timed out (it may have happened)")

    def launch(self, provider: str, spec: LaunchSpec) -> WorkerRef:
        p = self.api(provider, "launch")
        wid = f"{provider}-{spec.job}-{spec.run_id}-e{spec.epoch}"
        ref = WorkerRef(provider, wid, spec.job, spec.run_id, spec.epoch)
        if wid in self.workers:  # labels already there: adopt
            self.api_done(provider, "launch")
            return ref
        live = sum(1 for w in self.by_provider[provider].values() if w.alive)
        cap = p.capacity
        if p.trace is not None:
            traced = p.trace.live_at(self.t - self.t0)
            cap = traced if cap is None else min(cap, traced)
        if cap is not None and live >= cap:
            raise LaunchRefused(f"sim provider {provider}: no capacity ({live}/{cap} in use)")
        if p.quota_seconds is not None and self.quota_used.get(provider, 0.0) >= p.quota_seconds:
            raise LaunchRefused(f"sim provider {provider}: free quota spent")
        if p.credits_usd is not None and self.credits_left(provider) <= 0:
            raise LaunchRefused(f"sim provider {provider}: credits spent")
        model = self.job_model(spec.job)
        env = dict(spec.env)
        session_end = self.t + p.launch_delay_seconds + p.session_limit_seconds if p.session_limit_seconds else None
        if p.quota_seconds is not None:  # the session also ends when the quota runs out (billed from launch)
            used = self.quota_used.get(provider, 0.0) + sum(
                w.ledger.billed_seconds for w in self.live.values() if w.provider.name == provider)
            quota_end = self.t + max(0.0, p.quota_seconds - used)
            session_end = quota_end if session_end is None else min(session_end, quota_end)
        deadline = worker_deadline(spec, session_end if p.tell_deadline else None)
        if deadline is not None:
            env["RECONCILER_DEADLINE"] = str(deadline)
        spec = LaunchSpec(job=spec.job, run_id=spec.run_id, epoch=spec.epoch, command=spec.command, env=env,
                          secret_env={}, workdir=spec.workdir, cpus=spec.cpus, memory_gb=spec.memory_gb,
                          gpus=spec.gpus)
        folder = RunFolder(env["RECONCILER_RUN_URI"], self.storage_options)
        died = self.deaths.pop((spec.job, spec.run_id), None)
        if died is not None:
            self.relaunch_delays.append(self.t - died)
        interval = self._interval(model, spec)
        w = SimWorker(self, p, ref, spec, model, folder, self.t, interval)
        if p.credits_usd is not None and p.price_per_hour > 0:
            # Credits that run out mid-job take the machine away unannounced, as Lightning's do.
            w.preempt_at = min(w.preempt_at, self.t + self.credits_left(provider) / p.price_per_hour * 3600.0)
        if session_end is not None and session_end < w.session_end_at:
            w.session_end_at = session_end
            if p.tell_deadline and model.honour_deadline:
                w.deadline = session_end
        if self.interval_fn is not None:
            w.interval = self.interval_fn(w)
        self.workers[wid] = w
        self.by_provider[provider][wid] = w
        self.live[wid] = w
        self.api_done(provider, "launch")
        return ref

    def _interval(self, model: JobModel, spec: LaunchSpec) -> float:
        if model.checkpoint_interval_seconds:
            return model.checkpoint_interval_seconds
        hint = spec.env.get("RECONCILER_CHECKPOINT_EVERY")
        if hint:
            return int(hint) * model.step_seconds
        return 1800.0

    def observe(self, provider: str) -> dict[WorkerRef, WorkerState]:
        p = self.api(provider, "observe")
        out: dict[WorkerRef, WorkerState] = {}
        for w in self.by_provider[provider].values():
            if w.alive and p.lost_observation_rate and self.rng.random() < p.lost_observation_rate:
                continue
            out[w.ref] = w.visible_state()
        self.api_done(provider, "observe")
        return out

    def terminate(self, ref: WorkerRef) -> None:
        self.api(ref.provider, "terminate")
        w = self.workers.get(ref.id)
        if w is not None and w.alive:
            if w.hidden_until is not None and self.t < w.hidden_until:
                pass  # cut off: the order does not reach it
            else:
                w.hidden_until = None
                w._end(None, "terminated", WorkerState(WorkerPhase.PREEMPTED, None, "TERMINATED",
                                                        "terminated by request"))
        self.api_done(ref.provider, "terminate")

    def logs(self, ref: WorkerRef, tail: int = 50) -> str:
        self.api(ref.provider, "logs")
        w = self.workers.get(ref.id)
        text = "\n".join(w.log[-tail:]) if w else ""
        self.api_done(ref.provider, "logs")
        return text

    def free_slots(self, provider: str) -> int | None:
        p = self.providers[provider]
        if p.capacity is None and p.trace is None:
            return None
        cap = p.capacity if p.capacity is not None else 10**9
        if p.trace is not None:
            cap = min(cap, p.trace.live_at(self.t - self.t0))
        return max(0, cap - sum(1 for w in self.by_provider[provider].values() if w.alive))

    def spent_usd(self, provider: str) -> float:
        """What the provider has billed so far, ended and live workers together."""
        p = self.providers[provider]
        seconds = sum(w.ledger.billed_seconds for w in self.workers.values() if w.provider.name == provider)
        return seconds / 3600.0 * p.price_per_hour

    def credits_left(self, provider: str) -> float:
        p = self.providers[provider]
        return (p.credits_usd or 0.0) - self.spent_usd(provider)

    def allowance(self, provider: str) -> Allowance | None:
        """Quota or credits as a hosted provider's API reports them (Kaggle-like hours, Lightning-like credits)."""
        p = self.providers[provider]
        if p.credits_usd is not None:
            return Allowance("credits", remaining=self.credits_left(provider), total=p.credits_usd,
                             used=self.spent_usd(provider))
        if p.quota_seconds is not None:
            used = self.quota_used.get(provider, 0.0) + sum(
                w.ledger.billed_seconds for w in self.live.values() if w.provider.name == provider)
            return Allowance("gpu-hours", remaining=(p.quota_seconds - used) / 3600.0, total=p.quota_seconds / 3600.0,
                             used=used / 3600.0)
        return None

    def revive_zombies(self) -> None:
        """Zombies whose time cut off has passed are seen again (their next write meets the fence)."""
        for w in self.live.values():
            if w.hidden_until is not None and self.t >= w.hidden_until:
                w.hidden_until = None


class SimAdapter:
    """ComputeAdapter for one provider of a SimCloud. Built by the registry as
    `SimAdapter(name, settings)` (then it makes a private world on the wall clock), or by the
    simulation with `world=` to share one world between ticks and reconciler restarts."""

    def __init__(self, name: str, settings: SimSettings | None = None, world: SimCloud | None = None, *,
                 owner: str = ANY_OWNER) -> None:
        self.name = name
        self.owner = owner  # one simulated repository per world: every worker is ours
        self.foreign_workers = 0
        if world is None:
            import time

            class _Wall:
                def now(self) -> float:
                    return time.time()

            world = SimCloud(_Wall())
        self.world = world
        if name not in world.providers:
            world.add_provider(ProviderModel.from_settings(name, settings))

    def _sync(self) -> None:
        self.world.advance(self.world.clock.now())
        self.world.revive_zombies()

    def launch(self, spec: LaunchSpec) -> WorkerRef:
        self._sync()
        return self.world.launch(self.name, spec)

    def observe(self) -> dict[WorkerRef, WorkerState]:
        self._sync()
        return self.world.observe(self.name)

    def terminate(self, ref: WorkerRef) -> None:
        self._sync()
        self.world.terminate(ref)

    def logs(self, ref: WorkerRef, tail: int = 50) -> str:
        return self.world.logs(ref, tail)

    def free_slots(self) -> int | None:
        return self.world.free_slots(self.name)

    def capacity(self) -> Capacity | None:
        return None

    def allowance(self) -> Allowance | None:
        return self.world.allowance(self.name)


__all__ = [
    "EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "JobModel", "PreemptionTrace", "ProviderModel", "SimAdapter",
    "SimCloud", "SimWorker", "WorkerLedger",
]
