"""Relaunch storms of issue 30, with real local processes: a worker killed by a signal after each
checkpoint, and a worker that stops itself for the job's deadline."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from adapters.compute import WorkerPhase, WorkerState
from desired.models import Job
from desired.parse import parse_desired
from reconciler.daemon.loop import Reconciler
from reconciler.planner.judge import RAPID_END_LIMIT, classify
from reconciler.planner.plan import Observed, plan
from reconciler.planner.tick import RunObservation
from status.models import Attempt, JobStatus, Outcome, Phase
from tests.conftest import StateRepoFixture
from tests.daemon.test_loop_local import counter, job, phase, tick_until
from tests.planner.test_plan import NOW, desired, job_yaml

BACKOFF = 2.5
SLOW_RETRY = f"{{max_retries: 2, backoff_seconds: {BACKOFF}, backoff_max_seconds: {BACKOFF}}}"


def assert_backed_off(attempts: list[Attempt]) -> None:
    """Each relaunch waited out the backoff from the end before it. Read from the attempts, not
    from the phases seen between ticks: on a loaded machine the loop may see an end only after its
    backoff has passed, and then rightly relaunches at once, never showing Backoff. The status keeps
    whole seconds, so a gap of 2.5 s may read as 2 (and a relaunch at once as 1 at most)."""
    for before, after in zip(attempts, attempts[1:], strict=False):
        assert before.ended is not None and after.started - before.ended >= BACKOFF - 1, (before, after)


def test_signal_kills_after_each_checkpoint_back_off_and_count_against_max_retries(
        state_repo: StateRepoFixture, local_workdir: Path) -> None:
    # Every attempt restores, saves one new step and is SIGKILLed: each gains progress, and no
    # provider says it was preempted. Before, each was a free interruption relaunched at once.
    extra = f"{{checkpoint_every: 1, retry: {SLOW_RETRY}}}"
    state_repo.write("desired/oom.yaml", job("oom", [*counter(0.01), "--killed-after-save"], extra))
    state_repo.commit("add oom")
    final = tick_until(Reconciler(state_repo.path), phase("oom"))
    st = final.statuses["oom"]
    assert st.phase == Phase.FAILED, st.message
    assert "more than the retry budget of 2" in st.message
    # The first unconfirmed interruption is free; each one after it in a row is charged.
    assert st.total_attempts == 4 and st.interruptions == 1 and st.failures == 3
    assert [a.outcome for a in st.attempts] == [Outcome.INTERRUPTION] + [Outcome.JOB_ERROR] * 3
    assert all(a.unconfirmed for a in st.attempts)
    assert all((a.step_end or 0) > a.step_start for a in st.attempts)  # progress did not buy a free pass
    assert_backed_off(st.attempts)  # even after the free one


def test_exit_75_with_no_notice_backs_off_and_its_repeats_count_against_max_retries(
        state_repo: StateRepoFixture, local_workdir: Path) -> None:
    # Exit 75 at once, every attempt, and no provider ever said it would stop the worker.
    looping = [*counter(0.0), "--interrupt-until-epoch", "1000"]
    state_repo.write("desired/oom.yaml", job("oom", looping, f"retry: {SLOW_RETRY}"))
    state_repo.commit("add oom")
    final = tick_until(Reconciler(state_repo.path), phase("oom"))
    st = final.statuses["oom"]
    assert st.phase == Phase.FAILED and "more than the retry budget of 2" in st.message, st.message
    assert st.total_attempts == 4 and st.interruptions == 1 and st.failures == 3
    assert st.attempts[0].detail == "worker checkpointed and stopped (exit 75) with no stop notice from the provider"
    assert_backed_off(st.attempts)


def test_attempts_ending_at_once_are_held_whatever_their_progress(state_repo: StateRepoFixture,
                                                                  local_workdir: Path) -> None:
    # A generous retry budget does not make the loop unbounded: attempts that each end within
    # moments of starting are held after RAPID_END_LIMIT in a row.
    extra = "{checkpoint_every: 1, retry: {max_retries: 50, backoff_seconds: 0.05, backoff_max_seconds: 0.1}}"
    state_repo.write("desired/oom.yaml", job("oom", [*counter(0.01), "--killed-after-save"], extra))
    state_repo.commit("add oom")
    final = tick_until(Reconciler(state_repo.path), phase("oom"))
    st = final.statuses["oom"]
    assert st.phase == Phase.FAILED, st.message
    assert st.total_attempts == RAPID_END_LIMIT
    assert st.message.startswith(f"rapid-end loop: {RAPID_END_LIMIT} attempts in a row ended within")
    assert "killed by SIGKILL" in st.message


def test_no_relaunch_after_the_worker_stopped_for_the_jobs_deadline(state_repo: StateRepoFixture,
                                                                     local_workdir: Path) -> None:
    # The SDK stops RECONCILER_GRACE seconds before the deadline (exit 75). Before, the daemon
    # relaunched it again and again until the deadline, each attempt restoring, running a step and
    # leaving; and called it a session's end on a provider that has no sessions.
    # 8 s for the worker to start and take its first steps: on a loaded machine (six test
    # processes on two cores) importing the SDK alone can take several. Its 60 steps take 30 s, so
    # that a worker started quickly cannot complete the run before it stops (3 s of steps did, on
    # a machine with nothing else running).
    deadline = datetime.fromtimestamp(int(time.time()) + 24, UTC)
    extra = f"{{deadline: '{deadline.isoformat()}', env: {{RECONCILER_GRACE: '16'}}}}"
    state_repo.write("desired/late.yaml", job("late", counter(0.5), extra))
    state_repo.commit("add late")
    messages: list[str] = []
    final = tick_until(Reconciler(state_repo.path), phase("late"), timeout=60,
                       each=lambda r: messages.append(r.statuses["late"].message) if "late" in r.statuses else None)
    st = final.statuses["late"]
    assert st.phase == Phase.FAILED and "deadline" in st.message, st.message
    assert st.total_attempts == 1
    first = st.attempts[0]
    assert first.outcome == Outcome.CANCELLED and first.exit_code == 75
    assert first.detail == "worker checkpointed and stopped before the job's deadline (exit 75)"
    assert any(m.startswith("not relaunching: the last attempt stopped for the job's deadline") for m in messages)


def _job(deadline: float | None) -> Job:
    extra = "" if deadline is None else f", deadline: '{datetime.fromtimestamp(deadline, UTC).isoformat()}'"
    state = parse_desired({"desired/job.yaml": "apiVersion: reconciler.dev/v1\nkind: Job\nmetadata: {name: job}\n"
                           f"spec: {{command: [python, train.py]{extra}}}\n"})
    assert not state.errors, state.errors
    return state.jobs["job"]


STOPPED_AT = 1_800_000_000.0


@pytest.mark.parametrize(
    ("deadline", "code", "outcome", "detail"),
    [
        (None, 75, Outcome.SESSION_END, "worker checkpointed and stopped before its session's end (exit 75)"),
        (STOPPED_AT + 10 * 3600, 75, Outcome.SESSION_END,
         "worker checkpointed and stopped before its session's end (exit 75)"),
        (STOPPED_AT + 25, 75, Outcome.CANCELLED, "worker checkpointed and stopped before the job's deadline (exit 75)"),
        (STOPPED_AT + 25, 1, Outcome.CANCELLED,
         "every rank checkpointed and stopped before the job's deadline; the launcher exited with code 1"),
    ],
)
def test_a_stop_for_a_deadline_names_the_deadline_it_was(deadline: float | None, code: int, outcome: Outcome,
                                                         detail: str) -> None:
    run = RunObservation(lease_epoch=1, durable_step=5, heartbeat_epoch=1, heartbeat_step=5,
                         heartbeat_time=STOPPED_AT, heartbeat_stopping="deadline")
    verdict = classify(_job(deadline), Attempt(epoch=1, provider="local", worker="w", started=0.0),
                       WorkerState(WorkerPhase.EXITED, code), run)
    assert verdict is not None and (verdict.outcome, verdict.detail) == (outcome, detail)


@pytest.mark.parametrize(
    ("stopping", "previous", "outcome", "unconfirmed"),
    [
        ("request", None, Outcome.INTERRUPTION, False),  # the provider's notice, relayed by the planner
        ("request", True, Outcome.INTERRUPTION, False),
        ("signal", None, Outcome.INTERRUPTION, True),  # a SIGTERM from outside: nobody confirmed it
        ("signal", True, Outcome.JOB_ERROR, True),  # ... and again: charged
        (None, None, Outcome.INTERRUPTION, True),
        (None, True, Outcome.JOB_ERROR, True),
    ],
)
def test_exit_75_is_confirmed_only_by_a_notice(stopping: str | None, previous: bool | None, outcome: Outcome,
                                               unconfirmed: bool) -> None:
    run = RunObservation(lease_epoch=2, durable_step=5, heartbeat_epoch=2, heartbeat_step=5,
                         heartbeat_time=STOPPED_AT, heartbeat_stopping=stopping)
    before = Attempt(epoch=1, provider="local", worker="w1", started=0.0, ended=1.0,
                     outcome=Outcome.INTERRUPTION, unconfirmed=previous)
    verdict = classify(_job(None), Attempt(epoch=2, provider="local", worker="w2", started=2.0, step_start=2),
                       WorkerState(WorkerPhase.EXITED, 75), run, before)
    assert verdict is not None and (verdict.outcome, verdict.unconfirmed) == (outcome, unconfirmed)


@pytest.mark.parametrize(
    ("unconfirmed", "lasted", "held"),
    [(True, 10.0, True), (None, 10.0, False), (True, 600.0, False)],
)
def test_the_rapid_end_guard_counts_short_unconfirmed_ends_only(unconfirmed: bool | None, lasted: float,
                                                                held: bool) -> None:
    # Five ends in a row, each with progress. The provider's own word (unconfirmed None) never
    # counts: preemptions are recovered without limit; nor do attempts that lived a while.
    d = desired(job_yaml(extra="  retry: {max_retries: 50, max_unproductive_attempts: 50, backoff_seconds: 0}"))
    st = JobStatus(job="train", run_id=d.jobs["train"].run_id(), manifest="desired/job0.yaml",
                   total_attempts=RAPID_END_LIMIT)
    for i in range(RAPID_END_LIMIT):
        start = NOW - 10_000 + 1000 * i
        st.attempts.append(Attempt(epoch=i + 1, provider="free", worker=f"w{i}", started=start, ended=start + lasted,
                                   outcome=Outcome.INTERRUPTION, unconfirmed=unconfirmed, step_start=i,
                                   step_end=i + 1, detail="interrupted: killed by SIGKILL"))
    got = plan(d, Observed(), {"train": st}, NOW).statuses["train"]
    assert (got.phase == Phase.FAILED and got.message.startswith("rapid-end loop: 5 attempts in a row ended "
                                                                 "within 60 s of starting")) == held, got.message
