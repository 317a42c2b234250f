"""What hosted providers taught the planner (issue 9). A provider's own allowance, as its API
reports it (Kaggle's weekly GPU hours, Lightning AI's credits), decides whether one more worker may
start there; the provider's own bill is what an attempt costs; an interruption notice asks the
worker to save; a worker that stopped for its deadline ended a session; one that cannot reach
storage, or lacks a secret at its provider, is charged once."""

from __future__ import annotations

import pytest

from adapters.compute import Allowance, WorkerPhase, WorkerState
from adapters.hosted import SECRET_NOT_ATTACHED
from reconciler.planner.plan import Launch, Observed, RunObservation, plan
from status.models import Attempt, JobStatus, Outcome, Phase
from tests.planner.test_plan import NOW, PROVIDERS, desired, job_yaml, running, with_attempt

GPU = "  resources: {gpus: 1}"


def launched(p) -> list[str]:  # type: ignore[no-untyped-def]
    return [a.provider for a in p.actions if isinstance(a, Launch)]


def avoided_for_a_while(d, st: JobStatus, run_id: str):  # type: ignore[no-untyped-def]
    """After a failure charged to `free`: ten minutes later the job launches on `paid`, not on free
    again; a job placed on free alone waits. Returns that plan and the waiting status."""
    later = plan(d, Observed(runs={("train", run_id): RunObservation(lease_epoch=1)}), {"train": st}, NOW + 600)
    assert launched(later) == ["paid"]  # not free again, and not a loop of the same failure
    only_free = desired(job_yaml(extra="  placement: {providers: [free]}"))
    st.run_id = only_free.jobs["train"].run_id()
    return later, plan(only_free, Observed(), {"train": st}, NOW + 600).statuses["train"]


def test_a_gpu_session_is_not_started_when_the_weekly_quota_cannot_carry_it() -> None:
    d = desired(job_yaml(extra=GPU))
    quota = Allowance("gpu-hours", remaining=0.5, minimum=1.0, total=30, used=29.5, resets_at=NOW + 86400,
                      applies_to_cpu=False)
    p = plan(d, Observed(allowances={"free": quota}), {}, NOW)
    assert launched(p) == ["paid"]
    p = plan(desired(job_yaml(extra=GPU + "\n  placement: {providers: [free]}")),
             Observed(allowances={"free": quota}), {}, NOW)
    st = p.statuses["train"]
    assert not p.actions and st.phase == Phase.PENDING
    assert "free: quota: 0.5 gpu-hours left, a session needs 1" in st.message and "refills" in st.message


def test_a_gpu_quota_does_not_hold_cpu_jobs() -> None:
    quota = Allowance("gpu-hours", remaining=0.0, minimum=1.0, applies_to_cpu=False)
    assert launched(plan(desired(job_yaml()), Observed(allowances={"free": quota}), {}, NOW)) == ["free"]


def test_two_gpu_jobs_in_one_tick_do_not_both_spend_the_last_session_of_quota() -> None:
    d = desired(job_yaml("a", extra=GPU), job_yaml("b", extra=GPU),
                providers=PROVIDERS.replace("concurrency: 1}", "concurrency: 4}"))
    quota = Allowance("gpu-hours", remaining=1.5, minimum=1.0, applies_to_cpu=False)
    assert sorted(launched(plan(d, Observed(allowances={"free": quota}), {}, NOW))) == ["free", "paid"]


@pytest.mark.parametrize(("balance", "where"), [(0.55, ["free"]), (0.45, [])])
def test_credits_must_pay_an_hour_above_what_is_kept_aside(balance: float, where: list[str]) -> None:
    d = desired(job_yaml(extra="  placement: {providers: [paid]}"))
    credits = Allowance("credits", remaining=balance, minimum=0.05)
    p = plan(d, Observed(allowances={"paid": credits}), {}, NOW)
    assert launched(p) == (["paid"] if where else [])
    if not where:
        assert "paid: credits: $0.45 left, one hour here needs $0.55 ($0.05 kept aside)" in p.statuses["train"].message


def test_the_providers_own_bill_is_the_attempts_cost() -> None:
    d = desired(job_yaml())
    run_id = d.jobs["train"].run_id()
    ref, _ = running("train", run_id, 1, provider="paid")
    done = WorkerState(WorkerPhase.EXITED, 0, "completed", cost_usd=0.1234)
    run = RunObservation(lease_epoch=1, durable_step=100, done=True, done_time=NOW - 5)
    p = plan(d, Observed(workers={ref: done}, runs={("train", run_id): run}),
             {"train": with_attempt(d, provider="paid")}, NOW)
    st = p.statuses["train"]
    assert st.phase == Phase.SUCCEEDED and st.attempts[0].cost_usd == pytest.approx(0.1234)


def test_a_worker_that_cannot_reach_storage_is_charged_once_and_its_provider_avoided() -> None:
    d = desired(job_yaml())
    run_id = d.jobs["train"].run_id()
    ref, _ = running("train", run_id, 1, provider="free")
    bad = WorkerState(WorkerPhase.EXITED, 66, "ERROR", detail="cannot reach run storage s3://b/r: AccessDenied")
    p = plan(d, Observed(workers={ref: bad}, runs={("train", run_id): RunObservation(lease_epoch=1)}),
             {"train": with_attempt(d)}, NOW)
    st = p.statuses["train"]
    assert st.failures == 1 and "cannot reach run storage from free" in st.attempts[0].detail
    assert st.provider_backoff["free"] >= NOW + 3000
    _, waiting = avoided_for_a_while(d, st, run_id)
    assert waiting.message.startswith("waiting: free avoided until ") and "cannot reach run storage" in waiting.message


def test_a_worker_missing_a_secret_is_charged_once_with_what_to_do_and_its_provider_avoided() -> None:
    d = desired(job_yaml())
    run_id = d.jobs["train"].run_id()
    ref, _ = running("train", run_id, 1, provider="free")
    what = ("secret HF_TOKEN is not attached to this job's kernel; attach secret HF_TOKEN to kernel "
            "https://www.kaggle.com/code/u/rc-x-train-1a2b3c4d in the Kaggle editor (Add-ons → Secrets); "
            "the next attempt uses it")
    bad = WorkerState(WorkerPhase.EXITED, SECRET_NOT_ATTACHED, "ERROR", detail=what)
    p = plan(d, Observed(workers={ref: bad}, runs={("train", run_id): RunObservation(lease_epoch=1)}),
             {"train": with_attempt(d)}, NOW)
    st = p.statuses["train"]
    assert st.failures == 1 and st.attempts[0].outcome == Outcome.JOB_ERROR
    assert st.attempts[0].detail == f"a secret is missing on free: {what}"
    assert st.provider_backoff["free"] >= NOW + 3000
    later, waiting = avoided_for_a_while(d, st, run_id)
    assert waiting.message.startswith("waiting: free avoided until ")
    assert "https://www.kaggle.com/code/u/rc-x-train-1a2b3c4d" in waiting.message  # what to do, in the job's message
    reasons = [a.reason for a in later.actions if isinstance(a, Launch)]
    assert "https://www.kaggle.com/code/u/rc-x-train-1a2b3c4d" in reasons[0]  # the relaunch says why


def test_an_interruption_notice_asks_the_worker_to_save_through_its_run_folder(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from adapters.storage import RunFolder
    from desired.models import Settings
    from reconciler.daemon.execute import execute
    from reconciler.planner.plan import RequestStop, Terminate

    d = desired(job_yaml())
    run_id = d.jobs["train"].run_id()
    ref, _ = running("train", run_id, 1)
    warned = WorkerState(WorkerPhase.RUNNING, provider_state="running", notice="spot capacity reclaimed in 30 s")
    p = plan(d, Observed(workers={ref: warned}, runs={("train", run_id): RunObservation(lease_epoch=1)}),
             {"train": with_attempt(d)}, NOW)
    asks = [a for a in p.actions if isinstance(a, RequestStop)]
    assert [a.ref for a in asks] == [ref] and not any(isinstance(a, Terminate) for a in p.actions)
    assert "asked the worker to save and leave" in p.statuses["train"].message
    store = f"file://{tmp_path}/runs"
    execute(p.actions, jobs=d.jobs, adapters={}, settings=Settings(storage=store))
    reason = RunFolder.for_run(store, "train", run_id).stop_request(1)
    assert reason is not None and "spot capacity reclaimed" in reason


def test_free_quota_hours_bind_by_our_own_ledger_when_the_provider_reports_none() -> None:
    free = PROVIDERS.replace("spec: {settings: {type: local}, concurrency: 1}",
                             "spec: {settings: {type: local}, concurrency: 1, free_quota_hours: 2}")
    d = desired(job_yaml(), providers=free)
    spent = JobStatus(job="old", phase=Phase.SUCCEEDED, attempts=[Attempt(
        epoch=1, provider="free", worker="w", started=NOW - 3 * 3600, ended=NOW - 600, outcome=Outcome.SUCCEEDED)])
    p = plan(d, Observed(), {"old": spent}, NOW)
    assert launched(p) == ["paid"]  # 2.8 h used of 2 free hours this week
    fresh = plan(desired(job_yaml(), providers=free), Observed(), {}, NOW)
    assert launched(fresh) == ["free"]


@pytest.mark.parametrize(("stopping", "outcome"), [("deadline", Outcome.SESSION_END), ("signal", Outcome.INTERRUPTION),
                                                   (None, Outcome.INTERRUPTION)])
def test_an_exit_75_after_the_sdk_saw_its_deadline_is_a_session_end(stopping: str | None, outcome: Outcome) -> None:
    d = desired(job_yaml())
    run_id = d.jobs["train"].run_id()
    ref, _ = running("train", run_id, 1)
    run = RunObservation(lease_epoch=1, durable_step=40, heartbeat_step=40, heartbeat_epoch=1,
                         heartbeat_stopping=stopping)
    p = plan(d, Observed(workers={ref: WorkerState(WorkerPhase.EXITED, 75, "COMPLETED")},
                         runs={("train", run_id): run}), {"train": with_attempt(d)}, NOW)
    assert p.statuses["train"].attempts[0].outcome == outcome


@pytest.mark.parametrize(("stopping", "outcome"), [("deadline", Outcome.SESSION_END), ("signal", Outcome.INTERRUPTION),
                                                   ("request", Outcome.INTERRUPTION), (None, Outcome.JOB_ERROR)])
@pytest.mark.parametrize("code", [1, 137])
def test_a_launchers_exit_after_the_sdks_stopping_beat_is_a_clean_stop(stopping: str | None, outcome: Outcome,
                                                                       code: int) -> None:
    # torchrun exits 1 when its ranks exit 75, srun the highest task code (137 for a task it ended
    # after the first exited); without the SDK's stopping beat, such a code stays a failure.
    d = desired(job_yaml())
    run_id = d.jobs["train"].run_id()
    ref, _ = running("train", run_id, 1)
    run = RunObservation(lease_epoch=1, durable_step=40, heartbeat_step=40, heartbeat_epoch=1,
                         heartbeat_stopping=stopping)
    p = plan(d, Observed(workers={ref: WorkerState(WorkerPhase.EXITED, code, "COMPLETED")},
                         runs={("train", run_id): run}), {"train": with_attempt(d)}, NOW)
    assert p.statuses["train"].attempts[0].outcome == outcome


@pytest.mark.parametrize(("hours_ago", "avoided"), [(1, ("501",)), (7, ())])
def test_a_machine_that_lost_a_worker_lately_is_avoided_by_every_job_on_that_provider(
        hours_ago: float, avoided: tuple[str, ...]) -> None:
    d = desired(job_yaml("fresh", extra="  placement: {providers: [paid]}"))
    other = JobStatus(job="other", phase=Phase.SUCCEEDED, attempts=[Attempt(
        epoch=1, provider="paid", worker="i-1", host="501", started=NOW - 10 * 3600,
        ended=NOW - hours_ago * 3600, outcome=Outcome.INTERRUPTION)])
    [launch] = [a for a in plan(d, Observed(), {"other": other}, NOW).actions if isinstance(a, Launch)]
    assert launch.avoid_hosts == avoided


def test_the_machine_a_worker_ran_on_is_kept_in_its_attempt_and_the_relaunch_avoids_it() -> None:
    d = desired(job_yaml(extra="  placement: {providers: [paid]}"))
    run_id = d.jobs["train"].run_id()
    ref, _ = running("train", run_id, 1, provider="paid")
    gone = WorkerState(WorkerPhase.PREEMPTED, None, "stopped (intended running)", host="501")
    p = plan(d, Observed(workers={ref: gone}, runs={("train", run_id): RunObservation(lease_epoch=1)}),
             {"train": with_attempt(d, provider="paid")}, NOW)
    st = p.statuses["train"]
    assert st.attempts[0].host == "501" and st.attempts[0].outcome == Outcome.INTERRUPTION
    [launch] = [a for a in p.actions if isinstance(a, Launch)]
    assert (launch.provider, launch.avoid_hosts) == ("paid", ("501",))


SPOT_AND_ON_DEMAND = """
apiVersion: reconciler.dev/v1
kind: Provider
metadata: {name: spot}
spec: {settings: {type: vast}, price_per_hour: 0.2}
---
apiVersion: reconciler.dev/v1
kind: Provider
metadata: {name: ondemand}
spec: {settings: {type: vast, interruptible: false}, price_per_hour: 0.6}
"""


@pytest.mark.parametrize(("interruptible", "where"), [(True, "spot"), (False, "ondemand")])
def test_a_job_that_forbids_interruptible_machines_goes_to_an_on_demand_provider(
        interruptible: bool, where: str) -> None:
    from desired.parse import parse_desired

    job = job_yaml(extra=f"  placement: {{interruptible: {str(interruptible).lower()}}}")
    d = parse_desired({"desired/j.yaml": job, "desired/p.yaml": SPOT_AND_ON_DEMAND}, "storage: s3://b/runs\n")
    assert not d.errors, d.errors
    assert launched(plan(d, Observed(), {}, NOW)) == [where]
    if not interruptible:
        only_spot = parse_desired({"desired/j.yaml": job.replace("interruptible: false",
                                                                 "interruptible: false, providers: [spot]"),
                                   "desired/p.yaml": SPOT_AND_ON_DEMAND}, "storage: s3://b/runs\n")
        message = plan(only_spot, Observed(), {}, NOW).statuses["train"].message
        assert "spot: its machines can be taken away (interruptible) and the job forbids that" in message
