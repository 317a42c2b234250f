"""The "What counts against a job" table (docs/concepts/what-counts.md), row by row, against the planner
(issue 30).

Each row of the table has one case here, in the same order, with scenarios that build the smallest real
input (a desired/observed/recorded triple for `plan`) and report what the code decided. A row
added, removed, reordered or reclassed in either place fails `test_readme_rows_are_the_cases`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from adapters.compute import WorkerPhase, WorkerState
from adapters.hosted import SECRET_NOT_ATTACHED, STORAGE_UNREACHABLE
from adapters.stores.faults import StoreFault
from desired.models import Capacity
from desired.parse import parse_desired
from reconciler.planner.health import clock
from reconciler.planner.judge import RAPID_END_LIMIT
from reconciler.planner.plan import Launch, LaunchResult, Observed, Plan, RunObservation, Terminate, apply_results, plan
from status.models import STORAGE_FAULT_DETAIL, Attempt, JobStatus, Outcome, Phase
from tests.planner.test_plan import NOW, desired, job_yaml, running, with_attempt

TABLE_DOC = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "what-counts.md"
HEADING = "# What counts against a job"
LOOSE = "  retry: {max_retries: 50, max_unproductive_attempts: 50, backoff_seconds: 10}"


def readme_rows() -> list[tuple[str, str, str]]:
    """(what happened, class, next) of each row, from the header to the first blank line after it."""
    lines = TABLE_DOC.read_text().split(HEADING, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| what happened |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.strip():
            break
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 3, f"table row not of 3 cells: {line}"
        rows.append((cells[0], cells[1], cells[2]))
    return rows


@dataclass(frozen=True)
class Decision:
    """What the planner made of one scenario: the ended attempt (if any) and the job after it."""

    outcome: Outcome | None
    detail: str
    unconfirmed: bool
    phase: Phase
    message: str
    failures: int
    launched: tuple[str, ...]  # providers launched on in the same tick
    stopped: bool  # a live worker was asked to stop


def decided(p: Plan, job: str = "train") -> Decision:
    st = p.statuses[job]
    last = st.attempts[-1] if st.attempts else None
    return Decision(last.outcome if last else None, last.detail if last else "", bool(last and last.unconfirmed),
                    st.phase, st.message, st.failures,
                    tuple(a.provider for a in p.actions if isinstance(a, Launch) and a.job == job),
                    any(isinstance(a, Terminate) for a in p.actions))


def end(state: WorkerState, run: RunObservation | None = None, extra: str = "", previous: Attempt | None = None,
        store_fault: StoreFault | None = None, step_start: int = 0, started: float = NOW - 100,
        later: float = 0.0, **status: int) -> Decision:
    """The live attempt (epoch 2 on `free`, launched at `started`) ends as `state` says, seen by one tick."""
    d = desired(job_yaml(extra=extra))
    run_id = d.jobs["train"].run_id()
    ref, _ = running("train", run_id, 2)
    st = with_attempt(d, epoch=2, step_start=step_start)
    st.attempts[-1] = st.attempts[-1].model_copy(update={"started": started})
    if previous is not None:
        st.attempts.insert(0, previous)
    for k, v in status.items():
        setattr(st, k, v)
    obs = Observed(workers={ref: state}, store_fault=store_fault,
                   runs={("train", run_id): run or RunObservation(lease_epoch=2, durable_step=step_start)})
    p = plan(d, obs, {"train": st}, NOW)
    if later:  # and a tick `later` seconds on, with no worker left
        p = plan(d, Observed(), dict(p.statuses), NOW + later)
    return decided(p)


def deadline_in(seconds: float) -> str:
    return f"  deadline: '{datetime.fromtimestamp(NOW + seconds, UTC).isoformat()}'"


def beat(stopping: str | None, at: float = NOW - 5, step: int = 7) -> RunObservation:
    """The SDK's last beat of attempt 2, written after its final checkpoint (step 7, from 5)."""
    return RunObservation(lease_epoch=2, durable_step=step, heartbeat_epoch=2, heartbeat_step=step,
                          heartbeat_time=at, heartbeat_stopping=stopping)


UNCONFIRMED_BEFORE = Attempt(epoch=1, provider="free", worker="w1", started=NOW - 900, ended=NOW - 800,
                             outcome=Outcome.INTERRUPTION, unconfirmed=True, step_start=0, step_end=5)

# Scenarios, in the table's order---------------------------------------------------------------


def preempted() -> Decision:
    return end(WorkerState(WorkerPhase.PREEMPTED, -9, "PREEMPTED"))


def session_limit() -> Decision:
    return end(WorkerState(WorkerPhase.SESSION_LIMIT, None, "TIMEOUT"))


def completed() -> Decision:
    return end(WorkerState(WorkerPhase.EXITED, 0), RunObservation(lease_epoch=2, durable_step=100, done=True))


def store_full() -> Decision:
    return end(WorkerState(WorkerPhase.EXITED, 1, "exited 1"),
               store_fault=StoreFault("full", "No space left on device", "file:///runs"))


def storage_unreachable() -> Decision:
    return end(WorkerState(WorkerPhase.EXITED, STORAGE_UNREACHABLE, "exited",
                           detail="the worker cannot reach run storage s3://runs: timed out"))


def storage_unreachable_after_backoff(later: float = 3599) -> Decision:
    return end(WorkerState(WorkerPhase.EXITED, STORAGE_UNREACHABLE, "exited",
                           detail="the worker cannot reach run storage s3://runs: timed out"), later=later)


def storage_unreachable_an_hour_on() -> Decision:
    return storage_unreachable_after_backoff(3601)


def secret_missing() -> Decision:
    return end(WorkerState(WorkerPhase.EXITED, SECRET_NOT_ATTACHED, "exited",
                           detail="secret HF_TOKEN is not attached to kernel me/train"))


def rule(action: str) -> Callable[[], Decision]:
    def scenario() -> Decision:
        return end(WorkerState(WorkerPhase.EXITED, 3, "exited 3"),
                   extra="  retry: {max_retries: 2, backoff_seconds: 10, "
                         f"exit_codes: [{{codes: [3], action: {action}}}]}}")
    return scenario


def oom() -> Decision:
    return end(WorkerState(WorkerPhase.EXITED, 137, "OUT_OF_MEMORY", oom=True))


def crash_signal() -> Decision:
    return end(WorkerState(WorkerPhase.EXITED, -11, "killed by SIGSEGV", signal="SIGSEGV"))


def killed_after_checkpoint() -> Decision:
    return end(WorkerState(WorkerPhase.EXITED, -9, "killed by SIGKILL", signal="SIGKILL"),
               RunObservation(lease_epoch=2, durable_step=7), step_start=5)


def killed_without_checkpoint() -> Decision:
    return end(WorkerState(WorkerPhase.EXITED, -9, "killed by SIGKILL", signal="SIGKILL"),
               RunObservation(lease_epoch=2, durable_step=5), step_start=5)


def killed_twice() -> Decision:
    return end(WorkerState(WorkerPhase.EXITED, -9, "killed by SIGKILL", signal="SIGKILL"),
               RunObservation(lease_epoch=2, durable_step=7), step_start=5, previous=UNCONFIRMED_BEFORE)


def stop_for_job_deadline() -> Decision:
    return end(WorkerState(WorkerPhase.EXITED, 75), beat("deadline"), extra=deadline_in(25 * 60), step_start=5)


def stop_for_session_deadline() -> Decision:
    return end(WorkerState(WorkerPhase.EXITED, 75), beat("deadline"), step_start=5)


def stop_on_notice() -> Decision:
    return end(WorkerState(WorkerPhase.EXITED, 75), beat("request"), step_start=5)


def stop_without_notice() -> Decision:
    return end(WorkerState(WorkerPhase.EXITED, 75), beat(None), step_start=5)


def stop_without_notice_twice() -> Decision:
    return end(WorkerState(WorkerPhase.EXITED, 75), beat(None), step_start=5, previous=UNCONFIRMED_BEFORE)


def exit_0_without_record() -> Decision:
    return end(WorkerState(WorkerPhase.EXITED, 0, "exited 0"))


def exit_1() -> Decision:
    return end(WorkerState(WorkerPhase.EXITED, 1, "exited 1"))


def stalled() -> Decision:
    run = RunObservation(lease_epoch=2, heartbeat_epoch=2, heartbeat_step=10, heartbeat_time=NOW - 5000,
                         heartbeat_unchanged_since=NOW - 301, heartbeat_unchanged_ticks=3)
    return end(WorkerState(WorkerPhase.RUNNING, provider_state="running"), run, started=NOW - 3600)


def stop_before_a_far_deadline() -> Decision:
    return end(WorkerState(WorkerPhase.EXITED, 75), beat("deadline"), extra=deadline_in(10 * 3600), step_start=5)


def over_retry_budget() -> Decision:
    return end(WorkerState(WorkerPhase.EXITED, 1, "exited 1"), failures=2)


def crash_loop() -> Decision:
    # The fifth end in a row without a new checkpoint; each lived longer than a minute.
    return end(WorkerState(WorkerPhase.EXITED, 1, "exited 1"),
               extra="  retry: {max_retries: 50, backoff_seconds: 10}", unproductive=4)


def second_end_without_progress() -> Decision:
    return end(WorkerState(WorkerPhase.EXITED, 3, "exited 3"), unproductive=1,
               extra=f"{LOOSE[:-1]}, exit_codes: [{{codes: [3], action: ignore}}]}}")


def preempted_in_a_loop() -> Decision:
    """A preemption after four ends without progress: the row of four stays (no fifth, no reset),
    and so does its backoff."""
    return end(WorkerState(WorkerPhase.PREEMPTED, -9, "PREEMPTED"), unproductive=4)


def rapid_ends(unconfirmed: bool | None = True, last: Outcome = Outcome.INTERRUPTION) -> Decision:
    d = desired(job_yaml(extra=LOOSE))
    st = JobStatus(job="train", run_id=d.jobs["train"].run_id(), manifest="desired/job0.yaml",
                   total_attempts=RAPID_END_LIMIT)
    for i in range(RAPID_END_LIMIT):
        start = NOW - 10_000 + 1000 * i
        st.attempts.append(Attempt(epoch=i + 1, provider="free", worker=f"w{i}", started=start, ended=start + 10,
                                   outcome=last if i == RAPID_END_LIMIT - 1 else Outcome.INTERRUPTION,
                                   unconfirmed=unconfirmed, step_start=i, step_end=i + 1,
                                   detail="interrupted: killed by SIGKILL"))
    return decided(plan(d, Observed(), {"train": st}, NOW))


def refused() -> Decision:
    d = desired(job_yaml(extra="  placement: {providers: [free]}"))
    p = plan(d, Observed(), {}, NOW)
    apply_results(p, [LaunchResult(p.actions[0], error="no capacity")], NOW, {})  # type: ignore[arg-type]
    return decided(plan(d, Observed(), dict(p.statuses), NOW + 1))


def unreachable() -> Decision:
    d = desired(job_yaml(extra="  placement: {providers: [free]}"))
    return decided(plan(d, Observed(unreachable={"free": "timed out"}), {}, NOW))


def code_path_missing() -> Decision:
    d = desired(job_yaml())
    p = plan(d, Observed(), {}, NOW)
    apply_results(p, [LaunchResult(p.actions[0], error="code.path /nowhere does not exist",  # type: ignore[arg-type]
                                   unavailable=False, job_config_error=True)], NOW, {})
    return decided(p)


def unplaceable() -> Decision:
    no_gpu = Capacity(cpus=2, gpus=0)
    return decided(plan(desired(job_yaml(extra="  resources: {gpus: 1}")),
                        Observed(capacity={"free": no_gpu, "paid": no_gpu}), {}, NOW))


def unknown_provider() -> Decision:
    d = parse_desired({"desired/a.yaml": job_yaml(extra="  placement: {providers: [nowhere]}")})
    return decided(plan(d, Observed(), {}, NOW))


def budget_spent() -> Decision:
    d = desired(job_yaml(extra="  budget_usd: 1"))
    st = with_attempt(d, ended=NOW - 1, outcome=Outcome.INTERRUPTION)
    st.cost_usd = 1.2
    return decided(plan(d, Observed(), {"train": st}, NOW))


def too_late() -> Decision:
    return decided(plan(desired(job_yaml(extra=deadline_in(20))), Observed(), {}, NOW))


def deadline_comes() -> Decision:
    d = desired(job_yaml(extra=deadline_in(-1)))
    run_id = d.jobs["train"].run_id()
    ref, state = running("train", run_id, 1)
    obs = Observed(workers={ref: state}, runs={("train", run_id): RunObservation(lease_epoch=1)})
    return decided(plan(d, obs, {"train": with_attempt(d)}, NOW))


# What each class word of the table means in the code---------------------------------------

def _free_end(o: Outcome) -> Callable[[Decision], bool]:
    return lambda x: x.outcome == o and not x.unconfirmed and x.failures == 0


def _charged(o: Outcome) -> Callable[[Decision], bool]:
    return lambda x: x.outcome == o and x.failures >= 1


def _failed(prefix: str) -> Callable[[Decision], bool]:
    return lambda x: x.phase == Phase.FAILED and x.message.startswith(prefix)


CLASSES: dict[str, Callable[[Decision], bool]] = {
    "interruption": _free_end(Outcome.INTERRUPTION),
    "session end": _free_end(Outcome.SESSION_END),
    "succeeded": lambda x: x.outcome == Outcome.SUCCEEDED and x.phase == Phase.SUCCEEDED,
    "storage-fault interruption": lambda x: _free_end(Outcome.INTERRUPTION)(x)
    and x.detail.startswith(STORAGE_FAULT_DETAIL),
    "job error": _charged(Outcome.JOB_ERROR),
    "final by the rule": lambda x: x.outcome == Outcome.JOB_ERROR and x.phase == Phase.FAILED,
    "unconfirmed interruption": lambda x: x.outcome == Outcome.INTERRUPTION and x.unconfirmed and x.failures == 0,
    "cancelled by the deadline": lambda x: x.outcome == Outcome.CANCELLED and x.failures == 0,
    "stalled": _charged(Outcome.STALLED),
    "retry budget": _failed("failed 3 times, more than the retry budget of 2"),
    "crash-loop guard": _failed("crash loop: 5 attempts in a row ended without a new checkpoint"),
    "rapid-end guard": _failed("rapid-end loop: 5 attempts in a row ended within 60 s of starting"),
    "unavailable": lambda x: x.phase == Phase.PENDING and not x.launched and x.failures == 0
    and (x.message.startswith("waiting: free is cooling down until")
         or x.message == "waiting: free cannot be reached (timed out)"),
    "config error": _failed("config error: "),
    "unplaceable": lambda x: x.phase == Phase.PENDING and not x.launched
    and x.message.startswith("no allowed provider can take this job: ") and "free: needs 1 GPUs" in x.message,
    "policy": lambda x: (x.phase == Phase.FAILED and x.message.startswith("policy: ")) or (
        x.phase == Phase.PENDING and x.message.endswith("the deadline will end the job")),
}

# "Next" facts, where cheap ---------------------------------------------------------------------


def relaunched_elsewhere(x: Decision) -> bool:
    return x.launched == ("paid",)  # the provider that lost the worker cools down: another goes first


def cooling_down_two_minutes(x: Decision) -> bool:
    return x.message.startswith(f"waiting: free is cooling down until {clock(NOW + 120)} ")


def relaunched_on_free(x: Decision) -> bool:
    return x.launched == ("free",)


def relaunched(x: Decision) -> bool:
    return bool(x.launched)


def backs_off(x: Decision) -> bool:
    return x.phase == Phase.BACKOFF and not x.launched


def not_relaunched(x: Decision) -> bool:
    return not x.launched and x.phase != Phase.BACKOFF


def charged_once(x: Decision) -> bool:
    return x.failures == 1 and backs_off(x)


def stopped_now(x: Decision) -> bool:
    return x.stopped


def anything(x: Decision) -> bool:
    return True


Scenario = tuple[str, Callable[[], Decision], Callable[[Decision], bool]]


@dataclass(frozen=True)
class Case:
    key: str  # a stable prefix of the table row's "what happened"
    readme_class: str  # its "class" cell, verbatim
    scenarios: tuple[Scenario, ...]  # (class word of CLASSES, scenario, a fact of "next")


CASES: tuple[Case, ...] = (
    Case("the provider's own word", "interruption",
         (("interruption", preempted, relaunched_elsewhere), ("interruption", preempted_in_a_loop, backs_off))),
    Case("the provider's time limit", "session end", (("session end", session_limit, relaunched),)),
    Case("exit 0 with a completion record", "succeeded", (("succeeded", completed, not_relaunched),)),
    Case("any other end while run storage has a fault", "storage-fault interruption",
         (("storage-fault interruption", store_full, not_relaunched),)),
    Case("the worker cannot reach run storage from that provider", "job error",
         (("job error", storage_unreachable, charged_once), ("job error", secret_missing, charged_once),
          ("job error", storage_unreachable_after_backoff, relaunched_elsewhere),
          ("job error", storage_unreachable_an_hour_on, relaunched_on_free))),
    Case("an exit code listed in `retry.exit_codes`", "as the rule says",
         (("final by the rule", rule("fail"), not_relaunched), ("job error", rule("count"), backs_off),
          ("interruption", rule("ignore"), relaunched))),
    Case("killed for memory", "job error", (("job error", oom, backs_off), ("job error", crash_signal, backs_off))),
    Case("killed by another signal with no word from the provider",
         "unconfirmed interruption if the attempt wrote a new checkpoint, else a job error",
         (("unconfirmed interruption", killed_after_checkpoint, backs_off),
          ("job error", killed_without_checkpoint, backs_off), ("job error", killed_twice, backs_off))),
    Case("exit 75 whose stopping beat says `deadline` and was written within 30 minutes", "cancelled by the deadline",
         (("cancelled by the deadline", stop_for_job_deadline, not_relaunched),)),
    Case("exit 75 whose stopping beat says `deadline`, otherwise", "session end",
         (("session end", stop_for_session_deadline, relaunched),
          ("session end", stop_before_a_far_deadline, relaunched))),
    Case("exit 75 after the provider's stop notice", "interruption", (("interruption", stop_on_notice, relaunched),)),
    Case("exit 75 with no notice behind it", "unconfirmed interruption",
         (("unconfirmed interruption", stop_without_notice, backs_off),
          ("job error", stop_without_notice_twice, backs_off))),
    Case("exit 0 without a completion record, or any other exit code", "job error",
         (("job error", exit_0_without_record, backs_off), ("job error", exit_1, backs_off))),
    Case("heartbeat unchanged for `stall_timeout_seconds`", "stalled", (("stalled", stalled, stopped_now),)),
    Case("more charged ends than `retry.max_retries`", "retry budget",
         (("retry budget", over_retry_budget, not_relaunched),)),
    Case("any end without a new durable checkpoint", "crash-loop guard",
         (("crash-loop guard", crash_loop, anything), ("interruption", second_end_without_progress, backs_off),
          ("interruption", preempted_in_a_loop, backs_off))),
    Case("5 ends in a row, except confirmed ones", "rapid-end guard", (("rapid-end guard", rapid_ends, anything),)),
    Case("provider refused a launch or cannot be asked", "unavailable",
         (("unavailable", refused, cooling_down_two_minutes), ("unavailable", unreachable, anything))),
    Case("a launch the job itself makes impossible", "config error", (("config error", code_path_missing, anything),)),
    Case("no allowed provider offers the job's `resources`", "unplaceable", (("unplaceable", unplaceable, anything),)),
    Case("unknown provider, budget spent", "config / policy",
         (("config error", unknown_provider, anything), ("policy", budget_spent, anything))),
    Case("too little time before the `deadline`", "policy", (("policy", too_late, not_relaunched),)),
    Case("the deadline comes", "policy", (("policy", deadline_comes, stopped_now),)),
)


def test_readme_rows_are_the_cases() -> None:
    rows = readme_rows()
    got = [(what, cls) for what, cls, _ in rows]
    for i in range(max(len(got), len(CASES))):
        row = got[i] if i < len(got) else None
        case = CASES[i] if i < len(CASES) else None
        assert row is not None, f"row {i + 1}: the test has {case.key!r} but the docs' table ends"  # type: ignore[union-attr]
        assert case is not None, f"row {i + 1}: the docs' table has {row[0]!r}, which the test has no case for"
        assert row[0].startswith(case.key), (
            f"row {i + 1}: the docs' table has {row[0]!r} where the test expects {case.key!r} "
            "(a row added, removed or moved in one place and not the other)")
        assert row[1] == case.readme_class, (
            f"row {i + 1} ({case.key!r}): the docs' class is {row[1]!r}, the test's {case.readme_class!r}")


@pytest.mark.parametrize("case", CASES, ids=[c.key for c in CASES])
def test_each_row_is_what_the_code_decides(case: Case) -> None:
    for cls, scenario, nxt in case.scenarios:
        got = scenario()
        assert CLASSES[cls](got), f"{case.key!r}: {scenario.__name__} is not {cls!r}: {got}"
        assert nxt(got), f"{case.key!r}: {scenario.__name__} does not go on as the table says ({nxt.__name__}): {got}"


def test_an_exit_code_rule_comes_before_the_oom_signal() -> None:
    got = end(WorkerState(WorkerPhase.EXITED, 137, "OUT_OF_MEMORY", oom=True),
              extra="  retry: {max_retries: 2, backoff_seconds: 10, exit_codes: [{codes: [137], action: ignore}]}")
    assert CLASSES["interruption"](got) and not CLASSES["job error"](got), got


def test_the_providers_word_comes_before_an_exit_75_without_notice() -> None:
    got = end(WorkerState(WorkerPhase.PREEMPTED, 75, "PREEMPTED"), beat(None), step_start=5,
              previous=UNCONFIRMED_BEFORE)
    assert CLASSES["interruption"](got) and relaunched_elsewhere(got), got  # confirmed: not the second unconfirmed


def test_a_storage_fault_comes_before_the_jobs_exit_code_rule() -> None:
    got = end(WorkerState(WorkerPhase.EXITED, 3, "exited 3"),
              extra="  retry: {max_retries: 2, exit_codes: [{codes: [3], action: fail}]}",
              store_fault=StoreFault("read_only", "Read-only file system", "file:///runs"))
    assert CLASSES["storage-fault interruption"](got) and got.phase != Phase.FAILED, got
