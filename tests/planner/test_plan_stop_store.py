"""Terminate carries the store the run's folder is in, so the executor writes the stop request
where the worker reads it (a run may live in a store other than the settings' `storage:`)."""

from __future__ import annotations

from reconciler.planner.plan import Observed, RunObservation, Terminate, plan
from tests.planner.test_plan import NOW, desired, job_yaml, running, with_attempt

OTHER = "s3://elsewhere/runs"


def _terminates(p: object) -> list[Terminate]:
    return [a for a in p.actions if isinstance(a, Terminate)]  # type: ignore[attr-defined]


def test_a_stop_names_the_store_the_status_records_for_the_run() -> None:
    d = desired(job_yaml(extra="  suspend: true"))
    run_id = d.jobs["train"].run_id()
    ref, state = running("train", run_id, 1)
    obs = Observed(workers={ref: state}, runs={("train", run_id): RunObservation(lease_epoch=1)},
                   run_storage={("train", run_id): OTHER})
    [stop] = _terminates(plan(d, obs, {"train": with_attempt(d)}, NOW))
    assert stop == Terminate(ref, "suspended by the manifest") and stop.store == OTHER


def test_a_stop_of_a_deleted_job_names_its_store_too() -> None:
    d = desired(job_yaml())
    rec = with_attempt(d)
    ref, state = running("train", rec.run_id, 1)
    obs = Observed(workers={ref: state}, run_storage={("train", rec.run_id): OTHER})
    [stop] = _terminates(plan(desired(job_yaml("other")), obs, {"train": rec}, NOW))
    assert stop.reason == "manifest deleted" and stop.store == OTHER


def test_without_a_recorded_store_the_executor_falls_back_to_the_settings() -> None:
    d = desired(job_yaml(extra="  suspend: true"))
    run_id = d.jobs["train"].run_id()
    ref, state = running("train", run_id, 1)
    obs = Observed(workers={ref: state}, runs={("train", run_id): RunObservation(lease_epoch=1)})
    [stop] = _terminates(plan(d, obs, {"train": with_attempt(d)}, NOW))
    assert stop.store is None
