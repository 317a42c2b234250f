"""The planner under a storage fault (pure): whatever ends is not charged, nothing is launched,
moved or judged stalled, the live worker is kept, and each job's message names the fault."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest

from adapters.compute import WorkerPhase, WorkerState
from adapters.stores import StorageError
from adapters.stores.faults import StoreFault, classify
from reconciler.daemon.notices import store_messages
from reconciler.planner.plan import Launch, Observed, RunObservation, plan
from status.models import Outcome, Phase
from tests.planner.test_plan import NOW, desired, job_yaml, running, with_attempt

FULL = StoreFault("full", "No space left on device", "file:///runs")


@pytest.mark.parametrize("state", [WorkerState(WorkerPhase.EXITED, 1, "exited 1"),
                                   WorkerState(WorkerPhase.EXITED, 0, "exited 0"),
                                   WorkerState(WorkerPhase.EXITED, None, "killed", signal="SIGKILL")])
def test_an_attempt_that_ends_during_a_storage_fault_is_free_and_nothing_is_relaunched(state: WorkerState) -> None:
    d = desired(job_yaml())
    run_id = d.jobs["train"].run_id()
    ref, _ = running("train", run_id, 1)
    obs = Observed(workers={ref: state}, store_fault=FULL,
                   runs={("train", run_id): RunObservation(lease_epoch=1, durable_step=40)})
    p = plan(d, obs, {"train": with_attempt(d)}, NOW)
    st = p.statuses["train"]
    assert st.attempts[0].outcome == Outcome.INTERRUPTION and "storage fault" in st.attempts[0].detail
    assert st.failures == 0 and st.unproductive == 0  # nor is it a step towards the crash-loop guard
    assert not any(isinstance(a, Launch) for a in p.actions)
    assert st.phase == Phase.PENDING and "run storage file:///runs is full" in st.message


def test_no_new_job_is_launched_while_the_store_is_full_and_it_is_launched_after() -> None:
    d = desired(job_yaml())
    held = plan(d, Observed(store_fault=FULL), {}, NOW)
    assert held.actions == [] and held.statuses["train"].phase == Phase.PENDING
    assert "nothing is charged or launched until it is back" in held.statuses["train"].message
    assert any(isinstance(a, Launch) for a in plan(d, Observed(), {}, NOW).actions)


def test_a_live_worker_is_kept_and_not_judged_stalled_while_it_cannot_write_heartbeats() -> None:
    d = desired(job_yaml(extra="  stall_timeout_seconds: 60"))
    run_id = d.jobs["train"].run_id()
    ref, state = running("train", run_id, 1)
    obs = Observed(workers={ref: state}, store_fault=FULL, runs={("train", run_id): RunObservation(
        lease_epoch=1, heartbeat_epoch=1, heartbeat_step=10, heartbeat_time=NOW - 5000,
        heartbeat_unchanged_since=NOW - 600, heartbeat_unchanged_ticks=30)})
    p = plan(d, obs, {"train": with_attempt(d)}, NOW)
    st = p.statuses["train"]
    assert p.actions == [] and st.current is not None and st.failures == 0
    assert st.phase == Phase.RUNNING and "is full" in st.message and "nothing is charged" in st.message


def test_a_completed_run_still_succeeds_during_a_fault() -> None:
    d = desired(job_yaml())
    run_id = d.jobs["train"].run_id()
    ref, _ = running("train", run_id, 1)
    obs = Observed(workers={ref: WorkerState(WorkerPhase.EXITED, 0)}, store_fault=FULL,
                   runs={("train", run_id): RunObservation(lease_epoch=1, durable_step=100, done=True)})
    assert plan(d, obs, {"train": with_attempt(d)}, NOW).statuses["train"].phase == Phase.SUCCEEDED


@pytest.mark.parametrize(("cause", "kind"), [
    (OSError(errno.ENOSPC, "No space left on device"), "full"),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), "full"),
    (OSError(errno.EROFS, "Read-only file system"), "read_only"),
    (OSError(errno.EACCES, "Permission denied"), "permission"),
    (OSError(errno.ESTALE, "Stale file handle"), "gone"),
])
def test_os_errors_of_the_store_are_classified_by_errno(cause: OSError, kind: str) -> None:
    try:
        try:
            raise cause
        except OSError as exc:
            raise StorageError(f"cannot write file:///runs/x.tmp-{id(exc)}: {exc}") from exc
    except StorageError as wrapped:
        fault = classify(wrapped)
    assert fault is not None and fault.kind == kind and fault.detail == cause.strerror  # no temporary name


def test_s3_errors_are_classified_by_code_and_status() -> None:
    from botocore.exceptions import ClientError, EndpointConnectionError

    def s3(code: str, status: int) -> ClientError:
        return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")

    assert classify(s3("ServiceUnavailable", 503)) == StoreFault("unavailable", "HTTP 503 ServiceUnavailable")
    assert classify(s3("SlowDown", 503)).kind == "throttled"  # type: ignore[union-attr]
    assert classify(s3("AccessDenied", 403)).kind == "permission"  # type: ignore[union-attr]
    assert classify(s3("NoSuchBucket", 404)).kind == "gone"  # type: ignore[union-attr]
    assert classify(s3("PreconditionFailed", 412)) is None  # a fence, not the store's fault
    assert classify(EndpointConnectionError(endpoint_url="http://127.0.0.1:1")).kind == "unavailable"  # type: ignore[union-attr]
    assert classify(ValueError("bad json")) is None


def test_one_storage_fault_message_per_change() -> None:
    from desired.models import Notifications

    rules = Notifications.model_validate({"targets": [{"url_env": "HOOK"},
                                                      {"url_env": "ONCALL", "events": ["failed"]}]})
    said = FULL.describe()
    assert store_messages(None, None, rules) == [] and store_messages(said, said, rules) == []
    (start,) = store_messages(None, said, rules)
    assert start.url_env == "HOOK" and start.level == "warning" and "is full" in start.body
    (end,) = store_messages(said, None, rules)
    assert end.level == "success" and "works again" in end.title


def test_a_store_that_held_runs_and_now_holds_nothing_is_gone_not_new(tmp_path: Path) -> None:
    from adapters.stores import open_store
    from adapters.stores.faults import MARKER, probe

    root = tmp_path / "runs"
    store = open_store(f"file://{root}")
    assert probe(store, holds_runs=False) is None  # a new store: nothing has run there yet
    store.write("train/r-1/progress.json", b"{}")
    assert probe(store, holds_runs=True) is None and store.read(MARKER) is not None
    shutil.rmtree(root)  # an unmounted disk, a deleted folder
    fault = probe(store, holds_runs=True)
    assert fault is not None and fault.kind == "gone" and MARKER in fault.detail
    assert not root.exists()  # the probe did not make an empty store look alive again
    root.mkdir()
    (root / MARKER).write_text("")  # emptied on purpose: the user says so
    assert probe(store, holds_runs=True) is None
