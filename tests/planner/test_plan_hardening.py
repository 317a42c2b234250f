"""Planner rules added by the hardening work (issue 8), as tables: crash loops and the evidence
for a free interruption, exit-code rules, config errors at launch, delete and restore, deadlines,
billing to the observed end, placement by resources, and workers that never heartbeat."""

from __future__ import annotations

import pytest

from adapters.compute import WorkerPhase, WorkerRef, WorkerState
from desired.models import Capacity
from desired.parse import parse_desired
from reconciler.planner import plan as planner
from reconciler.planner.plan import Launch, LaunchResult, Observed, RunObservation, Terminate, apply_results, plan
from status.models import Outcome, Phase
from tests.planner.test_plan import NOW, PROVIDERS, desired, job_yaml, running, with_attempt


def test_steps_run_in_a_fixed_named_order() -> None:
    assert [s.__name__ for s in planner.STEPS] == [
        "fence", "read_storage", "adopt", "foresee", "stop_on_policy", "judge", "note_trouble", "drill",
        "wait_for_store",
        "reconsider",
        "finish", "hold_finished", "decide_launch"]


def ended(d, state: WorkerState, durable: int = 0, step_start: int = 0, **st_kw: int):  # type: ignore[no-untyped-def]
    run_id = d.jobs["train"].run_id()
    ref, _ = running("train", run_id, 1)
    st = with_attempt(d, step_start=step_start)
    for k, v in st_kw.items():
        setattr(st, k, v)
    obs = Observed(workers={ref: state}, runs={("train", run_id): RunObservation(lease_epoch=1, durable_step=durable)})
    return plan(d, obs, {"train": st}, NOW)


@pytest.mark.parametrize(
    ("state", "durable", "outcome"),
    [
        (WorkerState(WorkerPhase.EXITED, -11, "killed by SIGSEGV", signal="SIGSEGV"), 50, Outcome.JOB_ERROR),
        (WorkerState(WorkerPhase.EXITED, -6, "killed by SIGABRT", signal="SIGABRT"), 50, Outcome.JOB_ERROR),
        (WorkerState(WorkerPhase.EXITED, 137, "OUT_OF_MEMORY", oom=True), 50, Outcome.JOB_ERROR),
        (WorkerState(WorkerPhase.EXITED, -9, "killed by SIGKILL", signal="SIGKILL"), 0, Outcome.JOB_ERROR),
        (WorkerState(WorkerPhase.EXITED, -9, "killed by SIGKILL", signal="SIGKILL"), 50, Outcome.INTERRUPTION),
        (WorkerState(WorkerPhase.PREEMPTED, None, "PREEMPTED"), 0, Outcome.INTERRUPTION),
    ],
)
def test_a_free_interruption_needs_the_providers_word_or_new_progress(
        state: WorkerState, durable: int, outcome: Outcome) -> None:
    p = ended(desired(job_yaml()), state, durable=durable)
    assert p.statuses["train"].attempts[0].outcome == outcome


def test_a_segfaulting_job_with_no_retries_fails_instead_of_looping() -> None:
    d = desired(job_yaml(extra="  retry: {max_retries: 0}"))
    p = ended(d, WorkerState(WorkerPhase.EXITED, -11, "killed by SIGSEGV", signal="SIGSEGV"))
    st = p.statuses["train"]
    assert st.phase == Phase.FAILED and st.failures == 1
    assert "SIGSEGV" in st.message and not p.actions


def test_attempts_without_progress_back_off_and_then_fail_as_a_crash_loop() -> None:
    """Exit 75 ("interrupted") at once, every time: free, but a loop the guard catches."""
    d = desired(job_yaml(extra="  retry: {max_unproductive_attempts: 3, backoff_seconds: 10}"))
    exit75 = WorkerState(WorkerPhase.EXITED, 75, "exited 75")
    first = ended(d, exit75)
    assert first.statuses["train"].unproductive == 1
    # no provider's notice behind the exit 75: even the first such end backs off
    assert first.statuses["train"].phase == Phase.BACKOFF and not first.actions
    second = ended(d, exit75, unproductive=1)
    assert second.statuses["train"].phase == Phase.BACKOFF and not second.actions
    third = ended(d, exit75, unproductive=2)
    st = third.statuses["train"]
    assert st.phase == Phase.FAILED and "crash loop: 3 attempts in a row" in st.message
    assert st.failures == 0  # never charged: the guard, not the retry budget, stopped it


@pytest.mark.parametrize("phase", [WorkerPhase.PREEMPTED, WorkerPhase.LOST, WorkerPhase.SESSION_LIMIT])
def test_the_providers_own_ends_never_make_a_crash_loop(phase: WorkerPhase) -> None:
    """A spot market preempting faster than the job checkpoints is not the job crashing: the
    provider's word leaves the count as it was, so the job relaunches at once instead of failing."""
    d = desired(job_yaml(extra="  retry: {max_unproductive_attempts: 2, backoff_seconds: 10}"))
    p = ended(d, WorkerState(phase, None, phase.value.upper()), unproductive=1)
    st = p.statuses["train"]
    assert st.unproductive == 1 and st.phase != Phase.FAILED and st.interruptions == 1
    assert [type(a) for a in p.actions] == [Launch]


def test_a_kill_without_the_providers_word_still_counts_towards_a_crash_loop() -> None:
    d = desired(job_yaml(extra="  retry: {max_unproductive_attempts: 2, max_retries: 9, backoff_seconds: 0}"))
    kill = WorkerState(WorkerPhase.EXITED, -9, "killed by SIGKILL", signal="SIGKILL")
    st = ended(d, kill, unproductive=1).statuses["train"]
    assert st.phase == Phase.FAILED and "crash loop: 2 attempts in a row" in st.message


def test_progress_resets_the_crash_loop_count() -> None:
    p = ended(desired(job_yaml()), WorkerState(WorkerPhase.PREEMPTED, None, "PREEMPTED"), durable=30,
              unproductive=4)
    assert p.statuses["train"].unproductive == 0


@pytest.mark.parametrize(
    ("action", "phase", "failures"),
    [("fail", Phase.FAILED, 1), ("count", Phase.BACKOFF, 1), ("ignore", Phase.LAUNCHING, 0)],
)
def test_the_job_states_its_own_exit_code_rules(action: str, phase: Phase, failures: int) -> None:
    d = desired(job_yaml(extra=f"  retry: {{exit_codes: [{{codes: [3, 4], action: {action}}}]}}"))
    p = ended(d, WorkerState(WorkerPhase.EXITED, 4, "exited 4"), durable=10)
    st = p.statuses["train"]
    assert st.phase == phase and st.failures == failures


def test_a_launch_the_job_itself_makes_impossible_fails_at_once() -> None:
    d = desired(job_yaml())
    p = plan(d, Observed(), {}, NOW)
    launch = p.actions[0]
    assert isinstance(launch, Launch)
    apply_results(p, [LaunchResult(launch, error="code.path /nope does not exist", unavailable=False,
                                   job_config_error=True)], NOW, {})
    st = p.statuses["train"]
    assert st.phase == Phase.FAILED and "config error: code.path /nope" in st.message


def test_workers_of_deleted_jobs_stop_through_the_last_known_provider_and_are_billed_until_gone() -> None:
    d = desired(job_yaml())
    rec = with_attempt(d, provider="paid")
    ref, state = running("train", rec.run_id, 1, provider="paid")
    empty = parse_desired({})
    obs = Observed(workers={ref: state}, retired={"paid": d.providers["paid"]})
    p = plan(empty, obs, {"train": rec}, NOW)
    assert p.actions == [Terminate(ref, "manifest deleted")]
    later = plan(empty, Observed(retired={"paid": d.providers["paid"]}), {"train": p.statuses["train"]},
                 NOW + 3500)
    st = later.statuses["train"]
    assert st.phase == Phase.CANCELLED
    assert st.cost_usd == pytest.approx(0.5 * 3600 / 3600, rel=1e-3)  # started NOW-100, gone at NOW+3500


def test_a_commit_that_cancels_most_jobs_is_held_until_confirmed() -> None:
    d = desired(job_yaml("a"), job_yaml("b"), job_yaml("c"))
    recorded = {}
    for name in "abc":
        st = with_attempt(d, job=name)
        recorded[name] = st
    only_c = desired(job_yaml("c"))
    held = plan(only_c, Observed(), recorded, NOW)
    assert all(held.statuses[n].phase == Phase.RUNNING for n in "ab")
    assert "would cancel 2 of 3 active jobs (a, b)" in (held.statuses["a"].held or "") and held.notes
    assert "held" in held.statuses["a"].message and held.statuses["c"].held is None
    confirmed = plan(only_c, Observed(), recorded, NOW, confirm_cancel=True)
    assert all(confirmed.statuses[n].phase == Phase.CANCELLED for n in "ab")
    assert all(confirmed.statuses[n].held is None for n in "abc")


def test_a_run_that_completed_while_its_cancel_was_held_is_recorded_as_succeeded() -> None:
    d = desired(job_yaml("a"), job_yaml("b"))
    recorded = {n: with_attempt(d, job=n) for n in "ab"}
    gone = WorkerState(WorkerPhase.EXITED, 0, "exited 0")
    workers = {WorkerRef("free", recorded[n].current.worker, n, recorded[n].run_id, 1): gone  # type: ignore[union-attr]
               for n in "ab"}
    runs = {("a", recorded["a"].run_id): RunObservation(lease_epoch=1, durable_step=90, done=True, done_step=100),
            ("b", recorded["b"].run_id): RunObservation(lease_epoch=1, durable_step=40)}
    confirmed = plan(desired(), Observed(workers=workers, runs=runs), recorded, NOW, confirm_cancel=True)
    a, b = confirmed.statuses["a"], confirmed.statuses["b"]
    assert (a.phase, a.attempts[-1].outcome, a.progress.step) == (Phase.SUCCEEDED, Outcome.SUCCEEDED, 100)
    assert (b.phase, b.attempts[-1].outcome) == (Phase.CANCELLED, Outcome.CANCELLED)


def test_deleting_one_job_of_many_needs_no_confirmation() -> None:
    d = desired(job_yaml("a"), job_yaml("b"), job_yaml("c"))
    recorded = {n: with_attempt(d, job=n) for n in "abc"}
    p = plan(desired(job_yaml("b"), job_yaml("c")), Observed(), recorded, NOW)
    assert p.statuses["a"].phase == Phase.CANCELLED and not p.notes


def test_a_restored_manifest_revives_its_run_from_durable_progress() -> None:
    d = desired(job_yaml())
    rec = with_attempt(d, ended=NOW - 50, outcome=Outcome.CANCELLED)
    rec.phase = Phase.CANCELLED
    run_id = rec.run_id
    p = plan(d, Observed(runs={("train", run_id): RunObservation(lease_epoch=1, durable_step=40)}),
             {"train": rec}, NOW)
    assert [a.run_id for a in p.actions if isinstance(a, Launch)] == [run_id]
    assert p.statuses["train"].progress.step == 40


def test_at_the_deadline_the_live_attempt_is_stopped_and_the_job_fails() -> None:
    d = desired(job_yaml(extra="  deadline: 2020-01-01T00:00:00Z"))
    run_id = d.jobs["train"].run_id()
    ref, state = running("train", run_id, 1)
    p = plan(d, Observed(workers={ref: state}, runs={("train", run_id): RunObservation(lease_epoch=1)}),
             {"train": with_attempt(d)}, NOW)
    assert p.actions == [Terminate(ref, "policy: deadline reached")]
    assert p.statuses["train"].phase == Phase.FAILED and "deadline" in p.statuses["train"].message


def test_an_attempt_is_billed_to_the_workers_observed_end_not_to_the_tick() -> None:
    d = desired(job_yaml())
    run_id = d.jobs["train"].run_id()
    ref, _ = running("train", run_id, 1, provider="paid")
    st = with_attempt(d, provider="paid")  # started NOW - 100
    gone = WorkerState(WorkerPhase.EXITED, 1, "exited 1", ended_at=NOW - 100 + 36)
    p = plan(d, Observed(workers={ref: gone}, runs={("train", run_id): RunObservation(lease_epoch=1)}),
             {"train": st}, NOW + 660)  # noticed 11 minutes later
    assert p.statuses["train"].attempts[0].cost_usd == pytest.approx(0.5 * 36 / 3600, abs=1e-4)


def test_cost_stops_at_completion_and_a_worker_that_never_exits_is_stopped_after_a_grace() -> None:
    d = desired(job_yaml())
    run_id = d.jobs["train"].run_id()
    ref, state = running("train", run_id, 1, provider="paid")
    done_at = NOW - 100 + 72
    run = RunObservation(lease_epoch=1, durable_step=100, done=True, done_time=done_at)
    first = plan(d, Observed(workers={ref: state}, runs={("train", run_id): run}),
                 {"train": with_attempt(d, provider="paid")}, done_at + 5)
    st = first.statuses["train"]
    assert st.phase == Phase.SUCCEEDED and not first.actions
    assert st.attempts[0].cost_usd == pytest.approx(0.5 * 72 / 3600, abs=1e-4)
    later = plan(d, Observed(workers={ref: state}, runs={("train", run_id): run}), {"train": st},
                 done_at + planner.FINISHED_GRACE_SECONDS + 1)
    assert [a.ref for a in later.actions if isinstance(a, Terminate)] == [ref]
    assert later.statuses["train"].cost_usd == st.cost_usd


GPU_PROVIDERS = PROVIDERS + """
---
apiVersion: reconciler.dev/v1
kind: Provider
metadata: {name: gamer}
spec:
  settings: {type: local}
  resources: {gpus: 1, gpu_models: [rtx4090]}
"""


def test_a_job_is_placed_only_where_its_resources_can_be_met() -> None:
    d = desired(job_yaml(extra="  resources: {gpus: 1, gpu_model: A100}"), providers=GPU_PROVIDERS)
    no_gpu = Capacity(cpus=2, gpus=0)
    p = plan(d, Observed(capacity={"free": no_gpu, "paid": no_gpu}), {}, NOW)
    st = p.statuses["train"]
    assert not p.actions and st.phase == Phase.PENDING
    assert "gamer: needs GPU model A100, offers rtx4090" in st.message
    assert "free: needs 1 GPUs, offers 0" in st.message
    fits = plan(desired(job_yaml(extra="  resources: {gpus: 1, gpu_model: RTX4090}"), providers=GPU_PROVIDERS),
                Observed(capacity={"free": no_gpu, "paid": no_gpu}), {}, NOW)
    assert [a.provider for a in fits.actions if isinstance(a, Launch)] == ["gamer"]


@pytest.mark.parametrize(("timeout", "stalled"), [("", False), ("  stall_timeout_seconds: 60", True)])
def test_a_worker_that_never_heartbeats_is_judged_by_its_provider_unless_the_job_sets_a_timeout(
        timeout: str, stalled: bool) -> None:
    d = desired(job_yaml(extra=timeout))
    run_id = d.jobs["train"].run_id()
    ref, state = running("train", run_id, 1)
    run = RunObservation(lease_epoch=1, heartbeat_unchanged_since=NOW - 4000, heartbeat_unchanged_ticks=50)
    st = with_attempt(d)
    st.attempts[0] = st.attempts[0].model_copy(update={"started": NOW - 5000, "running_since": NOW - 4900})
    p = plan(d, Observed(workers={ref: state}, runs={("train", run_id): run}), {"train": st}, NOW)
    assert (Terminate(ref, "stalled: no heartbeat") in p.actions) == stalled
    if not stalled:
        assert "not instrumented" in p.statuses["train"].message


def test_a_worker_is_called_not_instrumented_only_after_the_grace_without_a_heartbeat() -> None:
    """The first Running transition of an SDK job comes before its first beat: no false alarm then;
    the words come once the worker has run for the grace without one, and go with the first beat."""
    d = desired(job_yaml())
    run_id = d.jobs["train"].run_id()
    ref, state = running("train", run_id, 1)
    silent = RunObservation(lease_epoch=1, heartbeat_unchanged_since=NOW, heartbeat_unchanged_ticks=1)
    st = with_attempt(d)
    st.attempts[0] = st.attempts[0].model_copy(update={"started": NOW - 600})  # queued a while, then started
    first = plan(d, Observed(workers={ref: state}, runs={("train", run_id): silent}), {"train": st}, NOW)
    seen = first.statuses["train"]
    assert seen.phase == Phase.RUNNING and "not instrumented" not in seen.message
    assert seen.attempts[-1].running_since == NOW
    later = NOW + planner.FIRST_HEARTBEAT_GRACE_SECONDS
    p = plan(d, Observed(workers={ref: state}, runs={("train", run_id): silent}), {"train": seen}, later)
    assert "not instrumented" in p.statuses["train"].message
    beating = RunObservation(lease_epoch=1, heartbeat_epoch=1, heartbeat_step=5, heartbeat_time=later,
                             heartbeat_unchanged_since=later, heartbeat_unchanged_ticks=1)
    p = plan(d, Observed(workers={ref: state}, runs={("train", run_id): beating}), {"train": seen}, later)
    assert "not instrumented" not in p.statuses["train"].message




def test_a_changed_store_moves_a_run_between_attempts_never_under_a_live_worker() -> None:
    d = desired(job_yaml())
    run_id = d.jobs["train"].run_id()
    key = ("train", run_id)
    old_store = "file:///old-store"
    idle = with_attempt(d, ended=NOW - 10, outcome=Outcome.INTERRUPTION, step_start=0)
    idle.storage = old_store
    runs = {key: RunObservation(lease_epoch=1, durable_step=30)}
    p = plan(d, Observed(runs=runs, run_storage={key: old_store}), {"train": idle}, NOW)
    assert p.actions == [planner.MoveRunData("train", run_id, old_store, d.settings.storage)]
    assert p.statuses["train"].phase == Phase.PENDING
    apply_results(p, [], NOW, {}, [planner.MoveResult(p.actions[0])])  # type: ignore[arg-type]
    assert p.statuses["train"].storage == d.settings.storage

    live = with_attempt(d)
    live.storage = old_store
    ref, state = running("train", run_id, 1)
    held = plan(d, Observed(workers={ref: state}, runs=runs, run_storage={key: old_store}), {"train": live}, NOW)
    assert not held.actions and any("held while attempt 1 is live" in n for n in held.notes)
