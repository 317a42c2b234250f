"""Sweeps in the planner: max_parallel bounds the members with a live attempt, and a changed matrix
starts and cancels only the members that changed (the mass-cancel guard holds a deleted sweep,
not an edited one)."""

from __future__ import annotations

from adapters.compute import WorkerPhase, WorkerRef, WorkerState
from desired.parse import DesiredState, parse_desired
from reconciler.planner.plan import Launch, Observed, RunObservation, Terminate, plan
from status.models import Attempt, JobStatus, Phase

NOW = 1_800_000_000.0
PROVIDER = "kind: Provider\nmetadata: {name: big}\nspec: {settings: {type: local}, concurrency: 10}\n"


def sweep(seeds: list[int], max_parallel: int | None = None, name: str = "sweep") -> str:
    limit = f", max_parallel: {max_parallel}" if max_parallel else ""
    return (f"kind: Job\nmetadata: {{name: {name}}}\nspec:\n  command: [train, '${{{{ matrix.seed }}}}']\n"
            f"  matrix: {{seed: {seeds}{limit}}}\n")


def desired(*docs: str) -> DesiredState:
    files = {f"desired/s{i}.yaml": text for i, text in enumerate(docs)}
    state = parse_desired({**files, "desired/providers.yaml": PROVIDER})
    assert not state.errors, state.errors
    return state


def running(d: DesiredState, job: str, phase: WorkerPhase = WorkerPhase.RUNNING,
            file: str = "desired/s0.yaml") -> tuple[JobStatus, WorkerRef, WorkerState]:
    run_id = d.jobs[job].run_id()
    st = JobStatus(job=job, run_id=run_id, phase=Phase.RUNNING, manifest=file, sweep=d.sweep_of[job],
                   total_attempts=1)
    st.attempts.append(Attempt(run_id=run_id, epoch=1, provider="big", worker=f"{job}.e1", started=NOW - 100))
    ref = WorkerRef("big", f"{job}.e1", job, run_id, 1)
    return st, ref, WorkerState(phase, provider_state=phase.value)


def launched(p: object) -> list[str]:
    return [a.job for a in p.actions if isinstance(a, Launch)]  # type: ignore[attr-defined]


def test_max_parallel_launches_that_many_members_and_the_others_wait_saying_why() -> None:
    p = plan(desired(sweep([1, 2, 3], max_parallel=2)), Observed(), {}, NOW)
    assert launched(p) == ["sweep-seed-1", "sweep-seed-2"]
    waiting = p.statuses["sweep-seed-3"]
    assert waiting.phase == Phase.PENDING and waiting.sweep == "sweep"
    assert waiting.message == ("waiting: sweep sweep has 2 members live, its max_parallel of 2; this one starts "
                               "when one of them ends")
    assert launched(plan(desired(sweep([1, 2, 3])), Observed(), {}, NOW)) == [
        "sweep-seed-1", "sweep-seed-2", "sweep-seed-3"]  # unset: no limit


def test_a_member_that_ends_frees_its_place_in_the_same_tick() -> None:
    d = desired(sweep([1, 2, 3], max_parallel=2))
    one, ref1, _ = running(d, "sweep-seed-1")
    two, ref2, ws2 = running(d, "sweep-seed-2")
    recorded = {"sweep-seed-1": one, "sweep-seed-2": two}
    workers = {ref1: WorkerState(WorkerPhase.EXITED, exit_code=0), ref2: ws2}
    runs = {("sweep-seed-1", one.run_id): RunObservation(lease_epoch=1, done=True, durable_step=10),
            ("sweep-seed-2", two.run_id): RunObservation(lease_epoch=1)}
    p = plan(d, Observed(workers=workers, runs=runs), recorded, NOW)
    assert p.statuses["sweep-seed-1"].phase == Phase.SUCCEEDED
    assert launched(p) == ["sweep-seed-3"]


def test_a_worker_still_live_keeps_its_place_even_when_its_member_has_left_the_matrix() -> None:
    old = desired(sweep([1, 2, 3], max_parallel=2))
    st1, ref1, ws1 = running(old, "sweep-seed-1")
    st2, ref2, ws2 = running(old, "sweep-seed-2")
    new = desired(sweep([2, 3, 4], max_parallel=2))
    p = plan(new, Observed(workers={ref1: ws1, ref2: ws2}), {"sweep-seed-1": st1, "sweep-seed-2": st2}, NOW)
    assert Terminate(ref1, "no longer in the matrix of sweep sweep") in p.actions
    assert launched(p) == []  # seed-1 is stopping, not gone: 2 live, the limit
    gone = plan(new, Observed(workers={ref2: ws2}), {n: p.statuses[n] for n in ("sweep-seed-1", "sweep-seed-2")},
                NOW + 30)
    assert gone.statuses["sweep-seed-1"].phase == Phase.CANCELLED
    assert launched(gone) == ["sweep-seed-3"]


def all_running(state: DesiredState) -> tuple[dict[str, JobStatus], dict[WorkerRef, WorkerState]]:
    """Every member of the sweep with a live attempt: their statuses and workers."""
    recorded, workers = {}, {}
    for name in state.jobs:
        st, ref, ws = running(state, name)
        recorded[name], workers[ref] = st, ws
    return recorded, workers


def test_a_changed_matrix_keeps_the_unchanged_members_runs_and_cancels_only_the_removed() -> None:
    recorded, workers = all_running(desired(sweep([1, 2, 3])))
    new = desired(sweep([2, 3, 4], max_parallel=3))
    observed = Observed(workers=workers, runs={(n, st.run_id): RunObservation(lease_epoch=1)
                                               for n, st in recorded.items()})
    p = plan(new, observed, recorded, NOW)
    for kept in ("sweep-seed-2", "sweep-seed-3"):
        assert p.statuses[kept].run_id == recorded[kept].run_id and p.statuses[kept].phase == Phase.RUNNING
    stopped = [a.ref.job for a in p.actions if isinstance(a, Terminate)]
    assert stopped == ["sweep-seed-1"] and p.statuses["sweep-seed-1"].held is None
    assert "no longer in the matrix of sweep sweep" in p.statuses["sweep-seed-1"].message
    assert launched(p) == []  # seed-1 still live: 3 of max_parallel 3
    [change] = p.sweeps
    assert (change.start, change.stop, change.keep) == (["sweep-seed-4"], ["sweep-seed-1"],
                                                        ["sweep-seed-2", "sweep-seed-3"])


def test_an_edit_that_replaces_every_member_is_not_held_but_a_deleted_sweep_is() -> None:
    recorded, workers = all_running(desired(sweep([1, 2, 3])))
    edited = plan(desired(sweep([4, 5, 6])), Observed(workers=workers), recorded, NOW)
    assert not edited.notes and len([a for a in edited.actions if isinstance(a, Terminate)]) == 3
    assert launched(edited) == ["sweep-seed-4", "sweep-seed-5", "sweep-seed-6"]
    other = "kind: Job\nmetadata: {name: other}\nspec: {command: [sleep]}\n"
    deleted = plan(desired(other), Observed(workers=workers), recorded, NOW)
    assert deleted.notes and "would cancel 3 of 3 active jobs" in deleted.notes[0]
    assert not [a for a in deleted.actions if isinstance(a, Terminate)]
    assert all(deleted.statuses[n].held for n in recorded)
    assert [(c.sweep, c.stop) for c in deleted.sweeps] == [("sweep", list(recorded))]


def test_members_of_two_sweeps_count_against_their_own_sweep_only() -> None:
    d = desired(sweep([1, 2], max_parallel=1), sweep([1, 2], max_parallel=1, name="other"))
    assert launched(plan(d, Observed(), {}, NOW)) == ["other-seed-1", "sweep-seed-1"]
