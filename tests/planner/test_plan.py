"""The planner's rules as tables of inputs and expected actions: no processes, no sleeps."""

from __future__ import annotations

import pytest

from adapters.compute import WorkerPhase, WorkerRef, WorkerState
from desired.parse import DesiredState, parse_desired
from reconciler.planner.plan import (
    LOST_AFTER_SECONDS,
    Launch,
    LaunchResult,
    Observed,
    RunObservation,
    Terminate,
    apply_results,
    plan,
)
from status.models import Attempt, JobStatus, Outcome, Phase

NOW = 1_800_000_000.0


def job_yaml(name: str = "train", command: str = '["python", "train.py"]', extra: str = "") -> str:
    retry = "" if "retry:" in extra else "  retry: {max_retries: 2, backoff_seconds: 10, backoff_max_seconds: 60}"
    return f"""
apiVersion: reconciler.dev/v1
kind: Job
metadata: {{name: {name}}}
spec:
  command: {command}
  target_steps: 100
{retry}
{extra}
"""


PROVIDERS = """
apiVersion: reconciler.dev/v1
kind: Provider
metadata: {name: free}
spec: {settings: {type: local}, concurrency: 1}
---
apiVersion: reconciler.dev/v1
kind: Provider
metadata: {name: paid}
spec: {settings: {type: local}, concurrency: 4, price_per_hour: 0.5}
"""


def desired(*jobs: str, providers: str = PROVIDERS) -> DesiredState:
    files = {f"desired/job{i}.yaml": text for i, text in enumerate(jobs)}
    files["desired/providers.yaml"] = providers
    state = parse_desired(files)
    assert not state.errors, state.errors
    return state


def running(job: str, run_id: str, epoch: int, provider: str = "free") -> tuple[WorkerRef, WorkerState]:
    ref = WorkerRef(provider, f"{job}.{run_id}.e{epoch}", job, run_id, epoch)
    return ref, WorkerState(WorkerPhase.RUNNING, provider_state="running")


def with_attempt(d: DesiredState, job: str = "train", epoch: int = 1, provider: str = "free",
                 **kw: object) -> JobStatus:
    run_id = d.jobs[job].run_id()
    st = JobStatus(job=job, run_id=run_id, phase=Phase.RUNNING, manifest="desired/job0.yaml", total_attempts=1)
    st.attempts.append(Attempt(epoch=epoch, provider=provider, worker=f"{job}.{run_id}.e{epoch}",
                               started=NOW - 100, **kw))  # type: ignore[arg-type]
    return st


def test_new_job_is_launched_on_free_provider_first() -> None:
    d = desired(job_yaml())
    p = plan(d, Observed(), {}, NOW)
    assert p.actions == [Launch("train", d.jobs["train"].run_id(), "free", "first launch")]
    assert p.statuses["train"].phase == Phase.LAUNCHING


def test_concurrency_limit_sends_second_job_to_next_provider() -> None:
    d = desired(job_yaml("a"), job_yaml("b"))
    p = plan(d, Observed(), {}, NOW)
    assert [(a.job, a.provider) for a in p.actions if isinstance(a, Launch)] == [("a", "free"), ("b", "paid")]


def test_price_cap_excludes_expensive_provider() -> None:
    d = desired(job_yaml("a"), job_yaml("b", extra="  placement: {max_price_per_hour: 0.1}"))
    p = plan(d, Observed(), {}, NOW)
    assert [a.job for a in p.actions] == ["a"]
    assert p.statuses["b"].phase == Phase.PENDING
    assert p.statuses["b"].message == "waiting: free already runs 1 worker, its concurrency limit"


@pytest.mark.parametrize(
    ("state", "outcome", "charged", "backs_off"),
    [
        (WorkerState(WorkerPhase.PREEMPTED, -9, "killed by SIGKILL"), Outcome.INTERRUPTION, False, False),
        (WorkerState(WorkerPhase.SESSION_LIMIT, None, "TIMEOUT"), Outcome.SESSION_END, False, False),
        (WorkerState(WorkerPhase.LOST, None, "NODE_FAIL"), Outcome.INTERRUPTION, False, False),
        # exit 75 with no notice from the provider behind it: free once, but it backs off
        (WorkerState(WorkerPhase.EXITED, 75, "exited 75"), Outcome.INTERRUPTION, False, True),
        (WorkerState(WorkerPhase.EXITED, 1, "exited 1"), Outcome.JOB_ERROR, True, True),
        (WorkerState(WorkerPhase.EXITED, 0, "exited 0"), Outcome.JOB_ERROR, True, True),  # no done.json
    ],
)
def test_end_of_attempt_is_classified_and_only_job_errors_are_charged(
    state: WorkerState, outcome: Outcome, charged: bool, backs_off: bool
) -> None:
    d = desired(job_yaml())
    run_id = d.jobs["train"].run_id()
    ref, _ = running("train", run_id, 1)
    obs = Observed(workers={ref: state}, runs={("train", run_id): RunObservation(lease_epoch=1, durable_step=40,
                                                                                  heartbeat_step=47,
                                                                                  heartbeat_epoch=1)})
    p = plan(d, obs, {"train": with_attempt(d)}, NOW)
    st = p.statuses["train"]
    assert st.attempts[0].outcome == outcome
    assert st.failures == (1 if charged else 0)
    assert st.interruptions == (0 if charged else 1)
    assert st.attempts[0].steps_lost == 7
    if backs_off:
        assert st.phase == Phase.BACKOFF and not p.actions
    else:  # the provider's interruptions relaunch at once, elsewhere first
        assert [a.provider for a in p.actions if isinstance(a, Launch)] == ["paid"]


def test_exit_zero_with_done_record_is_success() -> None:
    d = desired(job_yaml())
    run_id = d.jobs["train"].run_id()
    ref, _ = running("train", run_id, 1)
    obs = Observed(workers={ref: WorkerState(WorkerPhase.EXITED, 0)},
                   runs={("train", run_id): RunObservation(lease_epoch=1, durable_step=100, done=True)})
    p = plan(d, obs, {"train": with_attempt(d)}, NOW)
    assert p.statuses["train"].phase == Phase.SUCCEEDED
    assert p.statuses["train"].attempts[0].outcome == Outcome.SUCCEEDED
    assert p.statuses["train"].progress.step == 100
    assert not p.actions


def test_job_error_beyond_retry_budget_fails_with_log_tail() -> None:
    d = desired(job_yaml())
    run_id = d.jobs["train"].run_id()
    ref, _ = running("train", run_id, 3)
    st = with_attempt(d, epoch=3)
    st.failures = 2
    obs = Observed(workers={ref: WorkerState(WorkerPhase.EXITED, 1)},
                   runs={("train", run_id): RunObservation(lease_epoch=3)},
                   logs={ref: "Traceback...\nValueError: bad learning rate\n"})
    p = plan(d, obs, {"train": st}, NOW)
    assert p.statuses["train"].phase == Phase.FAILED
    assert "retry budget" in p.statuses["train"].message
    assert "ValueError: bad learning rate" in (p.statuses["train"].log_tail or "")
    assert not p.actions


def test_backoff_grows_and_then_relaunches() -> None:
    d = desired(job_yaml())
    st = with_attempt(d, ended=NOW - 5, outcome=Outcome.JOB_ERROR)
    st.failures = 2
    p = plan(d, Observed(), {"train": st}, NOW)
    assert p.statuses["train"].phase == Phase.BACKOFF
    assert p.statuses["train"].backoff_until == NOW - 5 + 20  # 10 s * 2**(2-1)
    later = plan(d, Observed(), {"train": p.statuses["train"]}, NOW + 16)
    assert [type(a) for a in later.actions] == [Launch]


def test_worker_missing_once_is_not_lost_but_sustained_silence_is() -> None:
    d = desired(job_yaml())
    run_id = d.jobs["train"].run_id()
    obs = Observed(runs={("train", run_id): RunObservation(lease_epoch=1)})
    first = plan(d, obs, {"train": with_attempt(d)}, NOW)
    assert first.statuses["train"].current is not None and not first.actions
    again = plan(d, obs, {"train": first.statuses["train"]}, NOW + LOST_AFTER_SECONDS / 2)
    assert again.statuses["train"].current is not None and not again.actions
    lost = plan(d, obs, {"train": again.statuses["train"]}, NOW + LOST_AFTER_SECONDS + 1)
    assert lost.statuses["train"].attempts[0].outcome == Outcome.INTERRUPTION
    assert lost.statuses["train"].failures == 0
    assert any(isinstance(a, Launch) for a in lost.actions)


def test_unreachable_provider_keeps_the_worker() -> None:
    d = desired(job_yaml())
    run_id = d.jobs["train"].run_id()
    obs = Observed(unreachable={"free": "timeout"}, runs={("train", run_id): RunObservation(lease_epoch=1)})
    p = plan(d, obs, {"train": with_attempt(d)}, NOW)
    assert p.statuses["train"].current is not None
    assert not p.actions


def test_a_seen_worker_resets_the_silence() -> None:
    d = desired(job_yaml())
    run_id = d.jobs["train"].run_id()
    ref, state = running("train", run_id, 1)
    st = with_attempt(d, unseen_since=NOW - LOST_AFTER_SECONDS / 2)
    p = plan(d, Observed(workers={ref: state}, runs={("train", run_id): RunObservation(lease_epoch=1)}),
             {"train": st}, NOW)
    assert p.statuses["train"].current is not None
    assert p.statuses["train"].current.unseen_since is None


def test_unchanged_heartbeat_over_several_observations_is_stalled_and_charged() -> None:
    d = desired(job_yaml(extra="  stall_timeout_seconds: 60"))
    run_id = d.jobs["train"].run_id()
    ref, state = running("train", run_id, 1)
    obs = Observed(workers={ref: state}, runs={("train", run_id): RunObservation(
        lease_epoch=1, heartbeat_epoch=1, heartbeat_step=10, heartbeat_time=NOW - 5000,
        heartbeat_unchanged_since=NOW - 61, heartbeat_unchanged_ticks=3)})
    p = plan(d, obs, {"train": with_attempt(d)}, NOW)
    assert Terminate(ref, "stalled: no heartbeat") in p.actions
    assert p.statuses["train"].attempts[0].outcome == Outcome.STALLED
    assert p.statuses["train"].failures == 1


@pytest.mark.parametrize(("since", "ticks"), [(NOW - 400, 2), (None, 0), (NOW - 30, 10)])
def test_clock_jump_or_missing_memory_never_makes_a_worker_stalled(since: float | None, ticks: int) -> None:
    """A worker's clock far behind ours, a jump of our clock within two observations, or a fresh
    reconciler with no memory of the heartbeat: none is evidence of a stall."""
    d = desired(job_yaml(extra="  stall_timeout_seconds: 60"))
    run_id = d.jobs["train"].run_id()
    ref, state = running("train", run_id, 1)
    obs = Observed(workers={ref: state}, runs={("train", run_id): RunObservation(
        lease_epoch=1, heartbeat_epoch=1, heartbeat_step=10, heartbeat_time=NOW - 5000,
        heartbeat_unchanged_since=since, heartbeat_unchanged_ticks=ticks)})
    p = plan(d, obs, {"train": with_attempt(d)}, NOW)
    assert not p.actions and p.statuses["train"].current is not None


def test_fresh_reconciler_judges_a_stall_by_the_worker_clock_with_a_wide_margin() -> None:
    """`run --once` from cron never accumulates observations: a heartbeat three timeouts old by the
    worker's clock is a stall; one timeout old is not."""
    d = desired(job_yaml(extra="  stall_timeout_seconds: 60"))
    run_id = d.jobs["train"].run_id()
    ref, state = running("train", run_id, 1)

    def verdict(beat_age: float) -> list[object]:
        obs = Observed(workers={ref: state}, runs={("train", run_id): RunObservation(
            lease_epoch=1, heartbeat_epoch=1, heartbeat_step=10, heartbeat_time=NOW - beat_age,
            heartbeat_unchanged_since=NOW, heartbeat_unchanged_ticks=1, heartbeat_first_observation=True)})
        return plan(d, obs, {"train": with_attempt(d)}, NOW).actions

    assert verdict(70) == []
    assert verdict(181) == [Terminate(ref, "stalled: no heartbeat")]


def test_suspending_a_running_job_stops_its_worker_for_free() -> None:
    d = desired(job_yaml(extra="  suspend: true"))
    run_id = d.jobs["train"].run_id()
    ref, state = running("train", run_id, 1)
    p = plan(d, Observed(workers={ref: state}, runs={("train", run_id): RunObservation(lease_epoch=1)}),
             {"train": with_attempt(d)}, NOW)
    assert p.actions == [Terminate(ref, "suspended by the manifest")]
    st = p.statuses["train"]
    assert st.phase == Phase.SUSPENDED and st.failures == 0
    assert st.attempts[0].outcome == Outcome.CANCELLED


def test_unrecorded_worker_holding_the_lease_is_adopted_not_duplicated() -> None:
    d = desired(job_yaml())
    run_id = d.jobs["train"].run_id()
    ref, state = running("train", run_id, 4)
    obs = Observed(workers={ref: state}, runs={("train", run_id): RunObservation(lease_epoch=4)})
    st = with_attempt(d, epoch=3, ended=NOW - 1, outcome=Outcome.INTERRUPTION)
    p = plan(d, obs, {"train": st}, NOW)
    assert not p.actions
    assert p.statuses["train"].current is not None and p.statuses["train"].current.epoch == 4


def test_worker_of_an_older_epoch_is_terminated() -> None:
    d = desired(job_yaml())
    run_id = d.jobs["train"].run_id()
    zombie, zstate = running("train", run_id, 1)
    live, lstate = running("train", run_id, 2, provider="paid")
    obs = Observed(workers={zombie: zstate, live: lstate}, runs={("train", run_id): RunObservation(lease_epoch=2)})
    p = plan(d, obs, {"train": with_attempt(d, epoch=2, provider="paid")}, NOW)
    assert [a.ref for a in p.actions if isinstance(a, Terminate)] == [zombie]


def test_deleted_manifest_cancels_and_terminates() -> None:
    d = desired(job_yaml())
    rec = with_attempt(d)
    ref, state = running("train", rec.run_id, 1)
    p = plan(desired(job_yaml("other")), Observed(workers={ref: state}), {"train": rec}, NOW)
    assert Terminate(ref, "manifest deleted") in p.actions
    assert "billed until it is gone" in p.statuses["train"].message
    gone = plan(desired(job_yaml("other")), Observed(), {"train": p.statuses["train"]}, NOW + 30)
    assert gone.statuses["train"].phase == Phase.CANCELLED
    assert gone.statuses["train"].attempts[0].outcome == Outcome.CANCELLED


def test_broken_manifest_file_holds_the_job_instead_of_cancelling() -> None:
    d = desired(job_yaml())
    rec = with_attempt(d)
    ref, state = running("train", rec.run_id, 1)
    broken = parse_desired({"desired/job0.yaml": "kind: Job\nmetadata: {name: train\n"})
    assert broken.errors
    p = plan(broken, Observed(workers={ref: state}), {"train": rec}, NOW)
    assert not p.actions
    assert p.statuses["train"].phase == Phase.RUNNING
    assert "has errors" in p.statuses["train"].message


def test_command_change_starts_a_new_run_and_terminates_the_old() -> None:
    old = desired(job_yaml())
    rec = with_attempt(old)
    ref, state = running("train", rec.run_id, 1)
    new = desired(job_yaml(command='["python", "train.py", "--lr", "0.1"]'))
    assert new.jobs["train"].run_id() != rec.run_id
    p = plan(new, Observed(workers={ref: state}), {"train": rec}, NOW)
    assert any(isinstance(a, Terminate) and a.ref == ref for a in p.actions)
    assert any(isinstance(a, Launch) and a.run_id == new.jobs["train"].run_id() for a in p.actions)
    assert p.statuses["train"].attempts[0].outcome == Outcome.CANCELLED


def test_placement_change_keeps_the_run() -> None:
    old = desired(job_yaml())
    rec = with_attempt(old)
    ref, state = running("train", rec.run_id, 1)
    new = desired(job_yaml(extra="  placement: {providers: [paid]}\n  retry: {max_retries: 9}"
                           .replace("\n  retry: {max_retries: 9}", "")))
    assert new.jobs["train"].run_id() == rec.run_id
    p = plan(new, Observed(workers={ref: state}, runs={("train", rec.run_id): RunObservation(lease_epoch=1)}),
             {"train": rec}, NOW)
    assert not p.actions
    assert p.statuses["train"].phase == Phase.RUNNING


def test_suspend_launches_nothing() -> None:
    d = desired(job_yaml(extra="  suspend: true"))
    p = plan(d, Observed(), {}, NOW)
    assert not p.actions and p.statuses["train"].phase == Phase.SUSPENDED


def test_refused_launch_is_recorded_and_that_provider_skipped() -> None:
    d = desired(job_yaml())
    p = plan(d, Observed(), {}, NOW)
    launch = p.actions[0]
    assert isinstance(launch, Launch)
    apply_results(p, [LaunchResult(launch, error="no capacity")], NOW, {})
    st = p.statuses["train"]
    assert [(r.provider, r.refused, r.error) for r in st.refusals] == [("free", NOW, "no capacity")]
    nxt = plan(d, Observed(), {"train": st}, NOW + 1)
    assert [a.provider for a in nxt.actions if isinstance(a, Launch)] == ["paid"]


def test_unknown_provider_in_placement_is_a_config_error() -> None:
    files = {"desired/a.yaml": job_yaml(extra="  placement: {providers: [nowhere]}")}
    d = parse_desired(files)
    assert any("nowhere" in str(e) for e in d.errors)
    p = plan(d, Observed(), {}, NOW)
    assert p.statuses["train"].phase == Phase.FAILED and not p.actions


def test_budget_spent_stops_the_job() -> None:
    d = desired(job_yaml(extra="  budget_usd: 1"))
    st = with_attempt(d, ended=NOW - 1, outcome=Outcome.INTERRUPTION)
    st.cost_usd = 1.2
    p = plan(d, Observed(), {"train": st}, NOW)
    assert p.statuses["train"].phase == Phase.FAILED and "budget" in p.statuses["train"].message
