"""The failure rate learns from failures (reconciler.planner.outlook.reliability): a few interruptions overturn the
prior, every end the provider confirms counts, a quiet spell drifts back to the prior, and the
relaunch an interruption causes is told the figure that counts it. Planner-level: statuses and
observations in, the next worker's RECONCILER_MTBF_SECONDS (Launch.mtbf_seconds) out."""

from __future__ import annotations

import math

import pytest

from adapters.compute import WorkerPhase, WorkerState
from reconciler.planner.outlook.forecast import provider_reliabilities
from reconciler.planner.outlook.reliability import (
    HALF_LIFE_SECONDS,
    PRIOR_RELIABLE_MTBF_SECONDS,
    PRIOR_SPOT_MTBF_SECONDS,
    watched_records,
    weight,
)
from reconciler.planner.plan import LOST_AFTER_SECONDS, Launch, Observed, RunObservation, plan
from status.models import Attempt, JobStatus, Outcome, Phase
from tests.planner.test_plan import NOW, PROVIDERS, desired, job_yaml, running
from tests.planner.test_plan_interval import SPOT, history, launch_of

DAY = 86400.0


def stormy(provider: str, seconds: float, n: int = 5, end: float = NOW - 1) -> dict[str, JobStatus]:
    """Another job's record: `n` attempts on `provider`, each interrupted `seconds` after its launch."""
    return {"old": history("old", provider, [seconds / 3600] * n, Outcome.INTERRUPTION, end=end)}


@pytest.mark.parametrize(("providers", "prior"), [(SPOT, PRIOR_SPOT_MTBF_SECONDS),
                                                  (PROVIDERS.split("---")[0], PRIOR_RELIABLE_MTBF_SECONDS)],
                         ids=["interruptible", "reliable"])
def test_five_interruptions_a_few_seconds_apart_overturn_the_prior(providers: str, prior: float) -> None:
    """On one provider (with two, lost workers would send the relaunch to the other: reconciler.planner.health)."""
    d = desired(job_yaml(), providers=providers)
    launch = launch_of(plan(d, Observed(), {}, NOW))
    assert launch.mtbf_seconds == prior  # nothing seen: the prior for the provider's kind
    given = launch_of(plan(d, Observed(), stormy(launch.provider, 3.0), NOW)).mtbf_seconds
    assert given is not None and 3.0 <= given <= 30.0  # within ten times the 3 s observed


def test_a_quiet_spell_drifts_back_to_the_prior() -> None:
    d = desired(job_yaml(), providers=SPOT)
    hourly = stormy("spot", 3600.0)
    now = launch_of(plan(d, Observed(), hourly, NOW)).mtbf_seconds
    assert now is not None and 3600 <= now <= 1.5 * 3600  # one an hour, as observed
    # A week later, nothing having run there since: the old interruptions no longer count.
    idle = launch_of(plan(d, Observed(), hourly, NOW + 7 * DAY)).mtbf_seconds
    assert idle == pytest.approx(PRIOR_SPOT_MTBF_SECONDS, rel=0.01)
    # A day later, with a machine running there all day without interruption: past the prior.
    quiet = {**hourly, "calm": history("calm", "spot", [24.0], Outcome.SUCCEEDED, end=NOW + DAY - 60)}
    busy = launch_of(plan(d, Observed(), quiet, NOW + DAY)).mtbf_seconds
    assert busy is not None and busy > PRIOR_SPOT_MTBF_SECONDS


def test_a_few_seconds_apart_drift_back_within_days_when_nothing_runs() -> None:
    d = desired(job_yaml(), providers=SPOT)
    burst = stormy("spot", 5.0)
    figures = [launch_of(plan(d, Observed(), burst, NOW + days * DAY)).mtbf_seconds or 0.0 for days in (0, 1, 5)]
    assert figures[0] <= 50 and figures[0] < figures[1] < figures[2]
    assert figures[2] == pytest.approx(PRIOR_SPOT_MTBF_SECONDS, rel=0.05)


def ended_by(state: WorkerState, checkpointed: bool) -> tuple[Observed, JobStatus]:
    """The job's attempt on spot, launched 10 s ago, seen in `state`, with or without a new checkpoint."""
    d = desired(job_yaml(), providers=SPOT)
    run_id = d.jobs["train"].run_id()
    st = JobStatus(job="train", run_id=run_id, phase=Phase.RUNNING, manifest="desired/job0.yaml", total_attempts=1)
    st.attempts.append(Attempt(epoch=1, provider="spot", worker=f"train.{run_id}.e1", started=NOW - 10,
                               step_start=40, first_beat=NOW - 8, first_beat_step=40))
    ref, _ = running("train", run_id, 1, provider="spot")
    run = RunObservation(lease_epoch=1, durable_step=45 if checkpointed else 40, heartbeat_step=46,
                         heartbeat_epoch=1, heartbeat_time=NOW - 2,
                         heartbeat_stopping="request" if state.exit_code == 75 else None)  # the SDK's notice beat
    return Observed(workers={ref: state}, runs={("train", run_id): run}), st


PREEMPTED = WorkerState(WorkerPhase.PREEMPTED, None, "PREEMPTED")


@pytest.mark.parametrize(("state", "checkpointed"), [
    (PREEMPTED, False),  # reclaimed before any new checkpoint
    (PREEMPTED, True),
    (WorkerState(WorkerPhase.LOST, None, "NODE_FAIL"), False),  # host lost
    (WorkerState(WorkerPhase.SESSION_LIMIT, None, "TIMEOUT"), False),  # the session's end
    (WorkerState(WorkerPhase.EXITED, 75, "exited 75"), True),  # saved and left on the provider's notice
    (None, False),  # vanished from the provider's listing
], ids=["preempted", "preempted-after-checkpoint", "lost", "session-end", "notice", "vanished"])
def test_an_end_the_provider_confirms_counts_for_the_relaunch_it_causes(state: WorkerState | None,
                                                                       checkpointed: bool) -> None:
    d = desired(job_yaml(), providers=SPOT)
    observed, st = ended_by(state or PREEMPTED, checkpointed)
    if state is None:
        observed = Observed(runs=observed.runs)
        st.attempts[0] = st.attempts[0].model_copy(update={"unseen_since": NOW - LOST_AFTER_SECONDS})
    p = plan(d, observed, {"train": st}, NOW)
    closed = p.statuses["train"].attempts[0]
    assert closed.outcome in (Outcome.INTERRUPTION, Outcome.SESSION_END), closed.detail
    relaunch = [a for a in p.actions if isinstance(a, Launch)]
    assert relaunch and relaunch[0].provider == "spot"
    # One interruption after (at most) 10 s of machine time: told minutes, not the 6 h prior.
    assert relaunch[0].mtbf_seconds is not None and relaunch[0].mtbf_seconds <= 60
    after = provider_reliabilities(d.providers, p.statuses.values(), NOW)["spot"]
    assert after.interruptions == pytest.approx(1.0, rel=1e-3) and after.mtbf_seconds <= 60


def test_an_end_that_is_the_job_s_own_does_not_count() -> None:
    d = desired(job_yaml(), providers=SPOT)
    observed, st = ended_by(WorkerState(WorkerPhase.EXITED, 1, "exited 1"), checkpointed=True)
    p = plan(d, observed, {"train": st}, NOW)
    assert p.statuses["train"].attempts[0].outcome == Outcome.JOB_ERROR
    after = provider_reliabilities(d.providers, p.statuses.values(), NOW)["spot"]
    assert after.interruptions == 0.0 and after.mtbf_seconds > PRIOR_SPOT_MTBF_SECONDS


@pytest.mark.parametrize("update", [{"unconfirmed": True}, {"detail": "storage fault: ended (exited 1) while run "
                                                                        "storage is full; not charged"},
                                    {"detail": "exited with code 42 (free by the job's exit_codes rule)"}],
                         ids=["unconfirmed", "storage-fault", "free-by-the-job-s-rule"])
def test_an_interruption_the_provider_did_not_make_counts_neither_for_its_rate_nor_its_health(
        update: dict[str, object]) -> None:
    """A signal with no word from the provider, an end a full or read-only run store caused, or an exit
    the job's own rule makes free is an interruption of the job but says nothing of the provider's
    machines."""
    from reconciler.planner.health import troubles

    ends = stormy("spot", 3.0)
    ends["old"].attempts = [a.model_copy(update=update) for a in ends["old"].attempts]
    d = desired(job_yaml(), providers=SPOT)
    rel = provider_reliabilities(d.providers, ends.values(), NOW)["spot"]
    assert rel.interruptions == 0.0 and rel.mtbf_seconds > PRIOR_SPOT_MTBF_SECONDS  # quiet machine time
    assert troubles(ends.values()) == []
    assert troubles(stormy("spot", 3.0).values())  # the same ends, confirmed by the provider, do count


def test_a_providers_changeover_runs_from_launch_to_the_first_step_not_to_the_heartbeat_seen() -> None:
    """The loop sees the first heartbeat a tick late, when the worker has already done some steps:
    the changeover back-dates it by those steps at the attempt's own speed, as the futures do."""
    first = Attempt(epoch=1, provider="spot", worker="w1", started=NOW - 7200, first_beat=NOW - 7200 + 300,
                    first_beat_step=120, step_start=0, step_end=6900, ended=NOW, outcome=Outcome.INTERRUPTION)
    st = JobStatus(job="old", run_id="r-1", attempts=[first], total_attempts=1)
    rel = provider_reliabilities(desired(job_yaml(), providers=SPOT).providers, [st], NOW)["spot"]
    # 6,780 steps in 6,900 s after the heartbeat: 120 steps took about 120 s of the 300.
    assert rel.changeover_seconds == pytest.approx(300 - 120 * 6900 / 6780, abs=0.01)


def test_a_wait_without_a_machine_ages_nothing_in_the_watched_record() -> None:
    """watched_records: an interruption 1 h of machine time ago counts as 1 h old, whether the
    calendar says 1 h or 10 h; two machines at once age it by the time either ran, not twice."""
    ended = Attempt(epoch=1, provider="spot", worker="w1", started=NOW - 12 * 3600, ended=NOW - 10 * 3600,
                    outcome=Outcome.INTERRUPTION)
    live = Attempt(epoch=2, provider="spot", worker="w2", started=NOW - 3600)
    beside = Attempt(epoch=3, provider="spot", worker="w3", started=NOW - 1800)
    records = watched_records([ended, live, beside], NOW)
    assert records[0].interruptions == pytest.approx(weight(3600.0))
    assert records[0].exposure_seconds == pytest.approx(
        HALF_LIFE_SECONDS / math.log(2.0) * (weight(3600.0) - weight(3 * 3600.0)))
    assert records[1].interruptions == 0.0 and records[2].exposure_seconds == pytest.approx(
        HALF_LIFE_SECONDS / math.log(2.0) * (1.0 - weight(1800.0)))


def test_a_provider_nobody_used_for_days_drifts_back_towards_its_prior_in_the_watched_record() -> None:
    """Beyond a day without any machine there, the calendar ages the record again: an interruption
    three days ago, nothing since, is two days old."""
    old = Attempt(epoch=1, provider="spot", worker="w1", started=NOW - 3 * DAY - 3600, ended=NOW - 3 * DAY,
                  outcome=Outcome.INTERRUPTION)
    assert watched_records([old], NOW)[0].interruptions == pytest.approx(weight(2 * DAY))
