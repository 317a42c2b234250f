"""The drill's comparison (reconciler/planner/drill.py `judge`), on the records both sides write:
bit-identical is exact, a relative difference within the tolerance passes, the first step beyond
it is named with its values and the usual causes, and a resume at another step is a failed resume."""

from __future__ import annotations

from adapters.drills import TAKE_SECONDS, Seen, Side
from desired.parse import DesiredState
from reconciler.planner.drill import CAUSES, judge, relative
from reconciler.planner.plan import Launch, Observed, RunObservation, plan
from status.models import Attempt, Drill, DrillPhase, JobStatus, Outcome
from tests.planner.test_plan import NOW, desired, job_yaml, running, with_attempt

BEFORE = Side(epoch=1, step=20, points={21: {"loss": 0.5, "lr": 0.01}, 22: {"loss": 0.4, "lr": 0.01},
                                        23: {"loss": 0.3, "lr": 0.01}})


def after(**changes: dict[str, float]) -> Side:
    points = {s: dict(v) for s, v in BEFORE.points.items()}
    for key, values in changes.items():
        points[int(key.removeprefix("s"))].update(values)
    return Side(epoch=2, step=20, points=points)


def test_the_same_numbers_bit_for_bit_are_exact() -> None:
    verdict, detail = judge(Drill(id="d"), BEFORE, after())
    assert verdict == "exact" and "steps 21..23" in detail and "resuming at step 20" in detail


def test_a_difference_within_the_relative_tolerance_passes_and_says_the_largest() -> None:
    verdict, detail = judge(Drill(id="d", tolerance=1e-5), BEFORE, after(s22={"loss": 0.4 * (1 + 1e-6)}))
    assert verdict == "within tolerance" and "largest relative difference 1e-06" in detail


def test_the_first_step_beyond_the_tolerance_is_named_with_its_values_and_the_usual_causes() -> None:
    verdict, detail = judge(Drill(id="d", tolerance=1e-5), BEFORE,
                            after(s22={"lr": 0.02}, s23={"loss": 9.0}))
    assert verdict == "diverged"
    assert detail.startswith("first difference at step 22 (2 after the checkpoint): lr was 0.01 before and 0.02 after")
    assert "tolerance 1e-05" in detail and detail.endswith(CAUSES)


def test_any_difference_diverges_without_a_tolerance() -> None:
    verdict, detail = judge(Drill(id="d"), BEFORE, after(s21={"loss": 0.5000000000000001}))
    assert verdict == "diverged" and "step 21" in detail


def test_a_step_missing_after_the_resume_diverges_at_that_step() -> None:
    resumed = Side(epoch=2, step=20, points={21: BEFORE.points[21]})
    assert judge(Drill(id="d"), BEFORE, resumed) == (
        "diverged", "step 22 reported loss before the interruption but not after it")


def test_a_resume_at_another_step_is_a_failed_resume() -> None:
    verdict, detail = judge(Drill(id="d"), BEFORE, Side(epoch=2, step=0))
    assert verdict == "failed resume" and "started at step 0, not at the drill's checkpoint (step 20)" in detail


def test_a_notice_drill_counts_the_steps_lost_between_its_final_checkpoint_and_the_resume() -> None:
    stopped = Side(epoch=1, step=37, grace_used=0.4)
    assert judge(Drill(id="d", notice=True), stopped, Side(epoch=2, step=37))[0] == "exact"
    verdict, detail = judge(Drill(id="d", notice=True), stopped, Side(epoch=2, step=30))
    assert verdict == "failed resume" and "7 steps lost" in detail and "0.4s of the grace" in detail
    assert judge(Drill(id="d", notice=True), None, Side(epoch=2, step=30))[0] == "failed resume"


def test_relative_difference_is_zero_only_for_equal_values() -> None:
    assert relative(0.0, 0.0) == 0.0 and relative(1.0, 1.0) == 0.0
    assert relative(0.0, 1e-30) == 1.0 and relative(-2.0, 2.0) == 2.0


def drilled_status(d: DesiredState, *ends: Outcome) -> JobStatus:
    """A job whose drill (to provider `paid`) killed attempt 1; `ends` are the attempts after it."""
    st = with_attempt(d)
    st.attempts = [st.attempts[0].model_copy(update={"ended": NOW - 50, "outcome": Outcome.CANCELLED,
                                                     "run_id": st.run_id})]
    for i, outcome in enumerate(ends, start=2):
        st.attempts.append(Attempt(run_id=st.run_id, epoch=i, provider="paid", worker=f"w{i}", started=NOW - 40,
                                   ended=NOW - 30, outcome=outcome, detail="exited with code 1"))
    st.total_attempts = len(st.attempts)
    st.drill = Drill(id="d1", phase=DrillPhase.RESUMING, epoch=1, step=20, to="paid")
    return st


def test_the_relaunch_goes_to_the_drills_provider_once_and_a_resume_that_fails_ends_the_drill() -> None:
    d = desired(job_yaml(extra='  drill_request: {id: d1, to: paid}'))
    first = plan(d, Observed(), {"train": drilled_status(d)}, NOW)
    assert [(a.provider, a.reason) for a in first.actions if isinstance(a, Launch)] == [
        ("paid", "drill d1: the relaunch goes to paid")]
    after = plan(d, Observed(), {"train": drilled_status(d, Outcome.JOB_ERROR)}, NOW)
    drill = after.statuses["train"].drill
    assert drill is not None and drill.verdict == "failed resume"
    assert drill.detail.startswith("attempt 2 on paid ended (job-error: exited with code 1) before it reported")
    assert not any(isinstance(a, Launch) and "drill" in a.reason for a in after.actions)  # the guards decide now


def test_a_drill_no_worker_takes_up_is_given_up_after_ten_minutes_with_the_likely_reason() -> None:
    d = desired(job_yaml(extra="  drill_request: {id: d1}"))
    st = with_attempt(d, running_since=NOW - 900)
    st.drill = Drill(id="d1", phase=DrillPhase.ARMED, epoch=1, requested=NOW - TAKE_SECONDS - 1)
    ref, state = running("train", st.run_id, 1)
    seen = {("train", st.run_id): RunObservation(durable_step=10, drill=Seen("d1"))}
    untaken = plan(d, Observed(workers={ref: state}, runs=seen), {"train": st}, NOW).statuses["train"].drill
    assert untaken is not None and untaken.verdict == "not carried out"
    assert "did not take the drill up within 10 minutes" in untaken.detail and "torchrun" in untaken.detail
    taken = {("train", st.run_id): RunObservation(durable_step=10, drill=Seen("d1", taken=True))}
    waiting = plan(d, Observed(workers={ref: state}, runs=taken), {"train": st}, NOW).statuses["train"].drill
    assert waiting is not None and waiting.phase == DrillPhase.ARMED  # taken up: its lookahead may take longer
