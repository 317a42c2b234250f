"""The invariants of the completion guarantee, checked against ground truth after every step.

Ground truth is what the loop cannot see: every simulated machine (zombies included), its
ledger (why it ended, whether the job itself was at fault, what it was billed), and storage
read without faults. What the loop recorded is the status at the reconciler's git HEAD.

After every step:
- single writer: per run, at most one live machine believes it may write (its epoch is the
  lease's, or it ignores the lease), and no two machines ever share an epoch;
- durable progress (the newest accepted checkpoint) never goes backwards, nor does the
  progress recorded in status for the same run;
- a completion is recorded once: one `mark_done` per run, one transition to Succeeded per run,
  and Succeeded only when storage holds the completion;
- interruptions are never charged: status `failures` never exceeds the number of machines
  of that run that failed by the job's own fault (exit 1, hang);
- no cost over the budget: what the providers billed for a job stays within its budget plus
  the two tick intervals the loop needs to notice.
At the end (`check_final`, after faults are healed): every job whose manifest exists is
Succeeded, or Failed for a reason of its own (its retry budget, its cost budget, its deadline,
its config), a deleted one is Cancelled, and no machine of a finished job is still running.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from adapters.storage import StorageError
from status.models import JobStatus, Phase, parse_status

if TYPE_CHECKING:
    from reconciler.sim.driver import Simulation

OWN_REASONS = ("failed ", "policy: ", "config error")


class InvariantChecker:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.violations: list[str] = []
        self.durable: dict[tuple[str, str], int] = {}
        self.status_step: dict[tuple[str, str], int] = {}
        self.succeeded: Counter[tuple[str, str]] = Counter()
        self.last_phase: dict[str, Phase] = {}
        self.duplicate_completions = 0
        self._parsed: dict[str, tuple[bytes, JobStatus | None]] = {}
        self._head: str | None = None
        self._statuses: dict[str, JobStatus] = {}
        self.checks = 0
        self._reported: set[tuple[str, str]] = set()
        self._seen_exc: list[str] = []

    def fail(self, what: str) -> None:
        msg = f"step {self.sim.steps} t+{self.sim.phys - self.sim.cloud.t0:.0f}s: {what}"
        self.violations.append(msg)

    # ---- status at the reconciler's HEAD, parsed once per blob ------------------------------
    def statuses(self) -> dict[str, JobStatus]:
        head = self.sim.repo.head()
        if head == self._head:
            return self._statuses
        out: dict[str, JobStatus] = {}
        for path, blob in self.sim.repo.read_files(head, "status").items():
            if not path.endswith(".yaml"):
                continue
            cached = self._parsed.get(path)
            if cached is None or cached[0] is not blob:
                cached = (blob, parse_status(blob))
                self._parsed[path] = cached
            if cached[1] is not None:
                out[cached[1].job] = cached[1]
        self._head, self._statuses = head, out
        return out

    # ---- after every step ------------------------------------------------------------------
    def after_step(self) -> None:
        self.checks += 1
        sim = self.sim
        for msg in sim.tick_exceptions[len(self._seen_exc):]:
            self.fail(f"the tick raised instead of surviving the fault: {msg}")
        self._seen_exc = list(sim.tick_exceptions)
        with sim.quiet():
            self._check_workers()
            self._check_status()
            self._check_cost()

    def _check_workers(self) -> None:
        sim = self.sim
        by_run: dict[tuple[str, str], list] = {}
        for w in sim.cloud.live.values():
            by_run.setdefault((w.spec.job, w.spec.run_id), []).append(w)
        runs = set(by_run) | set(self.durable)
        for key in runs:
            folder = sim.folder(*key)
            try:
                lease = folder.lease()
                epoch = int(lease.get("epoch", 0))
                durable = folder.durable_step()
            except StorageError as exc:
                self.fail(f"ground-truth read of {key} failed: {exc}")
                continue
            writers = [w for w in by_run.get(key, []) if w.ref.epoch == epoch or not w.model.fencing]
            if len(writers) > 1:
                self.fail(f"run {key}: {len(writers)} live workers may write: {[w.ref.id for w in writers]}")
            prev = self.durable.get(key, 0)
            if durable < prev:
                self.fail(f"run {key}: durable progress went back from {prev} to {durable}")
            self.durable[key] = max(prev, durable)
        epochs = Counter((w.spec.job, w.spec.run_id, w.ref.epoch) for w in sim.cloud.workers.values())
        for key3, n in epochs.items():
            if n > 1:
                self.fail(f"run {key3[:2]}: {n} workers were launched with epoch {key3[2]}")
        per_run = Counter((j, r) for j, r, _e, _t in sim.cloud.completions)
        dups = sum(n - 1 for n in per_run.values() if n > 1)
        if dups > self.duplicate_completions:
            self.fail(f"{dups - self.duplicate_completions} run(s) completed twice: {per_run}")
            self.duplicate_completions = dups

    def charged_truth(self, job: str, run_id: str) -> int:
        return sum(1 for w in self.sim.cloud.workers.values()
                   if w.spec.job == job and w.spec.run_id == run_id and w.ledger.charged_fault)

    def _check_status(self) -> None:
        sim = self.sim
        for name, st in self.statuses().items():
            key = (name, st.run_id)
            prev = self.status_step.get(key, 0)
            if st.progress.step < prev:
                self.fail(f"{name}: recorded progress went back from {prev} to {st.progress.step}")
            self.status_step[key] = max(prev, st.progress.step)
            truth = self.charged_truth(name, st.run_id)
            if st.failures > truth:
                self.fail(f"{name}: {st.failures} failures charged, but only {truth} were the job's own "
                          f"fault; last attempts: {[(a.outcome, a.detail) for a in st.attempts[-3:]]}")
            last = self.last_phase.get(name)
            if st.phase == Phase.SUCCEEDED and last != Phase.SUCCEEDED:
                self.succeeded[key] += 1
                if self.succeeded[key] > 1:
                    self.fail(f"{name}: run {st.run_id} recorded as Succeeded a second time")
                if sim.folder(*key).done() is None:
                    self.fail(f"{name}: Succeeded without a completion record in storage")
            self.last_phase[name] = st.phase

    def _check_cost(self) -> None:
        sim = self.sim
        budgets = {j.name: j for j in sim.config.jobs if j.budget_usd is not None}
        if not budgets:
            return
        billed: dict[str, float] = {}
        slack: dict[str, float] = {}
        for w in sim.cloud.workers.values():
            if w.spec.job in budgets:
                cost = w.ledger.billed_seconds * w.provider.price_per_hour / 3600.0
                billed[w.spec.job] = billed.get(w.spec.job, 0.0) + cost
                slack[w.spec.job] = max(slack.get(w.spec.job, 0.0),
                                        2 * sim.config.tick_seconds * w.provider.price_per_hour / 3600.0)
        for name, cost in billed.items():
            budget = budgets[name].budget_usd
            assert budget is not None
            if cost > budget + slack[name] + 1e-9 and (name, "cost") not in self._reported:
                self._reported.add((name, "cost"))
                self.fail(f"{name}: providers billed ${cost:.4f}, over its budget of ${budget:g}")

    # ---- at the end --------------------------------------------------------------------------
    def check_final(self) -> None:
        sim = self.sim
        sts = self.statuses()
        desired = sim.desired_jobs()
        self._reported = set()
        with sim.quiet():
            for name in sorted(desired | sim.deleted_jobs):
                st = sts.get(name)
                if st is None:
                    if name in desired:
                        self.fail(f"{name}: no status was ever recorded")
                    continue
                if name not in desired:
                    if st.phase not in (Phase.CANCELLED, Phase.SUCCEEDED, Phase.FAILED):
                        self.fail(f"{name}: manifest deleted but the job is {st.phase.value}")
                    continue
                if not st.phase.terminal:
                    self.fail(f"{name}: never finished: {st.phase.value} ({st.message})")
                elif st.phase == Phase.SUCCEEDED:
                    if sim.folder(name, st.run_id).done() is None:
                        self.fail(f"{name}: Succeeded without a completion record")
                elif st.phase == Phase.FAILED:
                    if not st.message.startswith(OWN_REASONS):
                        self.fail(f"{name}: Failed for a reason that is not its own: {st.message}")
                elif st.phase == Phase.CANCELLED:
                    self.fail(f"{name}: Cancelled although its manifest exists")
            for w in sim.cloud.live.values():
                st = sts.get(w.spec.job)
                if w.hidden_until is not None:
                    continue
                if st is None or st.phase.terminal or w.spec.job not in desired:
                    phase = st.phase.value if st else None
                    self.fail(f"{w.ref.id}: still running after its job finished ({phase})")
