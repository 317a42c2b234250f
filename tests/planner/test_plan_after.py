"""`spec.after` in the planner: a job starts only once the jobs it names have succeeded, as the
statuses the tick read say. Tables of inputs and expected actions: no processes, no sleeps."""

from __future__ import annotations

import pytest

from adapters.compute import WorkerPhase, WorkerState
from desired.parse import DesiredState, parse_desired
from reconciler.planner.dependencies import held_by_dependency
from reconciler.planner.plan import Launch, LaunchResult, Observed, Plan, RunObservation, apply_results, plan
from status.models import Attempt, JobStatus, Outcome, Phase
from tests.planner.test_plan import NOW, PROVIDERS, desired, job_yaml, running

HELD_A = "held: a (Failed) will not succeed as it is; this job starts once it is fixed and succeeds"


def pair(a_command: str = '["python", "a.py"]', b_extra: str = "") -> DesiredState:
    """Job a, and job b that runs after it."""
    return desired(job_yaml("a", command=a_command), job_yaml("b", extra=f"  after: [a]\n{b_extra}"))


def status(d: DesiredState, job: str, phase: Phase, run_id: str | None = None) -> JobStatus:
    return JobStatus(job=job, run_id=run_id or d.jobs[job].run_id(), phase=phase, manifest="desired/job0.yaml")


def done(d: DesiredState, *jobs: str) -> Observed:
    """What storage says of jobs whose run has completed (a Succeeded status is read beside it)."""
    return Observed(runs={(j, d.jobs[j].run_id()): RunObservation(durable_step=100, done=True) for j in jobs})


def launched(p: Plan) -> list[str]:
    return [a.job for a in p.actions if isinstance(a, Launch)]


@pytest.mark.parametrize(("a_phase", "b_phase", "b_message", "b_starts"), [
    (None, Phase.PENDING, "waiting for: a (New)", False),
    (Phase.PENDING, Phase.PENDING, "waiting for: a (Pending)", False),
    (Phase.RUNNING, Phase.PENDING, "waiting for: a (Running)", False),
    (Phase.BACKOFF, Phase.PENDING, "waiting for: a (Backoff)", False),
    (Phase.SUSPENDED, Phase.PENDING, "waiting for: a (Suspended)", False),
    (Phase.SUCCEEDED, Phase.LAUNCHING, "launching on free", True),
    (Phase.FAILED, Phase.PENDING, HELD_A, False),
    (Phase.CANCELLED, Phase.PENDING, HELD_A.replace("Failed", "Cancelled"), False),
])
def test_a_job_starts_only_once_the_job_it_runs_after_has_succeeded(
        a_phase: Phase | None, b_phase: Phase, b_message: str, b_starts: bool) -> None:
    d = pair()
    recorded = {} if a_phase is None else {"a": status(d, "a", a_phase)}
    p = plan(d, done(d, "a") if a_phase == Phase.SUCCEEDED else Observed(), recorded, NOW)
    st = p.statuses["b"]
    assert (st.phase, st.message) == (b_phase, b_message)
    assert ("b" in launched(p)) == b_starts
    assert held_by_dependency(st) == (a_phase in (Phase.FAILED, Phase.CANCELLED))
    assert st.failures == 0 and st.total_attempts == 0  # held, not failed: it has used nothing


def test_a_job_waits_for_every_job_it_names_and_says_which() -> None:
    d = desired(job_yaml("a"), job_yaml("b"), job_yaml("c", extra="  after: [b, a]"))
    recorded = {"a": status(d, "a", Phase.SUCCEEDED), "b": status(d, "b", Phase.RUNNING)}
    assert plan(d, Observed(), recorded, NOW).statuses["c"].message == "waiting for: b (Running)"
    recorded["b"] = status(d, "b", Phase.SUCCEEDED)
    assert launched(plan(d, done(d, "a", "b"), recorded, NOW)) == ["c"]


def test_a_dependency_whose_manifest_changed_must_succeed_again_in_its_new_run() -> None:
    d = pair()
    old_run = status(d, "a", Phase.SUCCEEDED, run_id="r-000000000000")
    p = plan(d, Observed(), {"a": old_run}, NOW)
    assert p.statuses["b"].message == "waiting for: a (new run)"
    assert launched(p) == ["a"]


def test_a_held_job_goes_on_when_its_failed_dependency_is_fixed_and_its_new_run_succeeds() -> None:
    failed = pair()
    recorded = {"a": status(failed, "a", Phase.FAILED)}
    p = plan(failed, Observed(), recorded, NOW)
    assert p.statuses["b"].message == HELD_A and launched(p) == []
    fixed = pair(a_command='["python", "a.py", "--fixed"]')  # a new run of a
    p = plan(fixed, Observed(), {**recorded, "b": p.statuses["b"]}, NOW + 30)
    assert launched(p) == ["a"]
    assert (p.statuses["b"].phase, p.statuses["b"].message) == (Phase.PENDING, "waiting for: a (new run)")
    recorded = {"a": status(fixed, "a", Phase.SUCCEEDED), "b": p.statuses["b"]}
    assert launched(plan(fixed, done(fixed, "a"), recorded, NOW + 60)) == ["b"]


def test_a_dependency_that_completes_during_a_tick_starts_its_dependent_at_the_next() -> None:
    d = pair()
    run_id = d.jobs["a"].run_id()
    ref, _ = running("a", run_id, 1)
    a = status(d, "a", Phase.RUNNING)
    a.attempts.append(Attempt(run_id=run_id, epoch=1, provider="free", worker=ref.id, started=NOW - 100))
    obs = Observed(workers={ref: WorkerState(WorkerPhase.EXITED, 0)},
                   runs={("a", run_id): RunObservation(lease_epoch=1, durable_step=100, done=True, done_time=NOW - 5)})
    first = plan(d, obs, {"a": a}, NOW)
    assert first.statuses["a"].phase == Phase.SUCCEEDED
    assert first.statuses["b"].message == "waiting for: a (Running)" and launched(first) == []
    obs.workers = {}
    assert launched(plan(d, obs, first.statuses, NOW + 30)) == ["b"]


def test_a_started_run_is_relaunched_whatever_its_dependency_does_since() -> None:
    d = pair()
    b = status(d, "b", Phase.RUNNING)
    b.total_attempts = 1
    b.attempts.append(Attempt(run_id=b.run_id, epoch=1, provider="free", worker="w", started=NOW - 100,
                              ended=NOW - 10, outcome=Outcome.INTERRUPTION))
    p = plan(d, Observed(), {"a": status(d, "a", Phase.FAILED), "b": b}, NOW)
    assert "b" in launched(p)


def test_a_relaunch_is_handed_the_inputs_its_run_started_with_whatever_its_dependency_ran_since() -> None:
    """b's run started on a's run r1; a's manifest then changed (its new run r2 running, later
    succeeded). b's relaunches resume on r1's outputs: r2's are for b's next run."""
    d = pair()
    first = plan(d, done(d, "a"), {"a": status(d, "a", Phase.SUCCEEDED)}, NOW)
    launch = next(a for a in first.actions if isinstance(a, Launch) and a.job == "b")
    r1 = d.jobs["a"].run_id()
    assert [(i.job, i.run_id) for i in launch.inputs] == [("a", r1)]
    apply_results(first, [LaunchResult(launch, ref=running("b", launch.run_id, 1)[0])], NOW, {})
    b = first.statuses["b"]
    assert [(i.dir, i.job, i.run_id) for i in b.inputs or []] == [("a", "a", r1)]
    b.attempts[-1] = b.attempts[-1].model_copy(update={"ended": NOW + 10, "outcome": Outcome.INTERRUPTION})
    changed = pair(a_command='["python", "a.py", "--more"]')
    r2 = changed.jobs["a"].run_id()
    for a_now in (status(changed, "a", Phase.RUNNING), status(changed, "a", Phase.SUCCEEDED)):
        p = plan(changed, done(changed, "a"), {"a": a_now, "b": b}, NOW + 60)
        relaunch = next(a for a in p.actions if isinstance(a, Launch) and a.job == "b")
        assert [(i.job, i.run_id) for i in relaunch.inputs] == [("a", r1)], a_now.phase
    assert r2 != r1


def test_suspend_and_guards_come_before_waiting() -> None:
    suspended = pair(b_extra="  suspend: true")
    assert plan(suspended, Observed(), {}, NOW).statuses["b"].phase == Phase.SUSPENDED
    late = pair(b_extra="  deadline: 2020-01-01T00:00:00Z")
    st = plan(late, Observed(), {}, NOW).statuses["b"]
    assert st.phase == Phase.FAILED and "deadline" in st.message


def test_a_job_after_one_whose_manifest_has_errors_is_held_naming_it() -> None:
    files = {"desired/a.yaml": job_yaml("a", extra="  after: [a]"),
             "desired/b.yaml": job_yaml("b", extra="  after: [a]"), "desired/providers.yaml": PROVIDERS}
    d = parse_desired(files)
    assert [e.file for e in d.errors] == ["desired/a.yaml"] and set(d.jobs) == {"b"}
    st = plan(d, Observed(), {}, NOW).statuses["b"]
    assert st.message == ("held: a (manifest has errors) will not succeed as it is; this job starts once it is fixed "
                          "and succeeds")
    assert held_by_dependency(st)


def test_a_running_job_whose_after_became_invalid_is_held_as_it_is() -> None:
    d = desired(job_yaml("a"))
    run_id = d.jobs["a"].run_id()
    ref, state = running("a", run_id, 1)
    rec = status(d, "a", Phase.RUNNING)
    rec.attempts.append(Attempt(run_id=run_id, epoch=1, provider="free", worker=ref.id, started=NOW - 100))
    broken = parse_desired({"desired/job0.yaml": job_yaml("a", extra="  after: [nope]"),
                            "desired/providers.yaml": PROVIDERS})
    assert "a" not in broken.jobs
    p = plan(broken, Observed(workers={ref: state}), {"a": rec}, NOW)
    assert not p.actions
    assert p.statuses["a"].phase == Phase.RUNNING and "has errors" in p.statuses["a"].message


def sweep_then_eval() -> DesiredState:
    """A two-member sweep, and a job that runs after the whole sweep."""
    return desired(job_yaml("sweep", command='["python", "train.py", "${{ matrix.seed }}"]',
                            extra="  matrix: {seed: [1, 2]}"),
                   job_yaml("eval", extra="  after: [sweep]"))


@pytest.mark.parametrize(("phases", "message", "starts"), [
    ((Phase.SUCCEEDED, Phase.RUNNING), "waiting for: sweep (sweep: 1 of 2 members Succeeded)", False),
    ((Phase.SUCCEEDED, Phase.SUCCEEDED), "launching on free", True),
    ((Phase.SUCCEEDED, Phase.FAILED), "held: sweep (sweep: sweep-seed-2 (Failed)) will not succeed as it is; "
                                      "this job starts once it is fixed and succeeds", False),
])
def test_a_job_after_a_sweep_starts_once_every_member_has_succeeded(
        phases: tuple[Phase, Phase], message: str, starts: bool) -> None:
    d = sweep_then_eval()
    members = ["sweep-seed-1", "sweep-seed-2"]
    recorded = {m: status(d, m, phase) for m, phase in zip(members, phases, strict=True)}
    finished = [m for m, phase in zip(members, phases, strict=True) if phase == Phase.SUCCEEDED]
    p = plan(d, done(d, *finished), recorded, NOW)
    assert p.statuses["eval"].message == message
    assert ("eval" in launched(p)) == starts


def test_a_sweep_after_itself_is_one_error_of_its_file_and_after_a_sweep_is_known() -> None:
    state = parse_desired({"desired/s.yaml": job_yaml("sweep", command='["x", "${{ matrix.seed }}"]',
                                                      extra="  matrix: {seed: [1, 2]}\n  after: [sweep]")})
    assert [(e.field, e.message) for e in state.errors] == [
        ("spec.after", "a job cannot run after itself; remove sweep from `after`")]
    assert not state.jobs
    assert not sweep_then_eval().errors
