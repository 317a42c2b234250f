"""Slurm-specific behaviour: the state table, an outsider's scancel, the time limit with its warning
signal and RECONCILER_DEADLINE, sbatch rejections, jobs the controller has forgotten."""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

import pytest

from adapters.compute import LaunchSpec, ProviderConfigError, ProviderUnavailable, WorkerPhase, WorkerState
from adapters.slurm import SlurmAdapter, map_state, parse_scontrol, time_limit_seconds
from tests.adapters.conftest import Slurm
from tests.adapters.test_contract import PROBE, ended, probe_records, running, wait_state

P, R, X = WorkerPhase.PENDING, WorkerPhase.RUNNING, WorkerPhase.EXITED
PRE, SL, LOST = WorkerPhase.PREEMPTED, WorkerPhase.SESSION_LIMIT, WorkerPhase.LOST

# Every state code squeue/sacct document (provider-apis.md §6), with the phase it must map to.
TABLE = [
    ("PENDING", "0:0", P, None),
    ("RUNNING", "0:0", R, None),
    ("COMPLETING", "0:0", R, None),
    ("COMPLETED", "0:0", X, 0),
    ("FAILED", "3:0", X, 3),
    ("FAILED", "0:9", X, 137),
    ("CANCELLED", "0:15", PRE, 143),
    ("TIMEOUT", "0:15", SL, 143),
    ("PREEMPTED", "0:15", PRE, 143),
    ("NODE_FAIL", "0:0", PRE, 0),
    ("BOOT_FAIL", "0:0", PRE, 0),
    ("OUT_OF_MEMORY", "0:125", X, 137),
    ("OUT_OF_MEMORY", "1:0", X, 1),
    ("DEADLINE", "0:0", SL, 0),
    ("SUSPENDED", "0:0", P, None),
    ("STOPPED", "0:0", P, None),
    ("CONFIGURING", "0:0", P, None),
    ("REQUEUED", "0:0", P, None),
    ("REQUEUE_HOLD", "0:0", P, None),
    ("REQUEUE_FED", "0:0", P, None),
    ("SPECIAL_EXIT", "4:0", X, 4),
    ("RESIZING", "0:0", R, None),
    ("REVOKED", "0:0", PRE, 0),
    ("RESV_DEL_HOLD", "0:0", P, None),
    ("SIGNALING", "0:0", R, None),
    ("STAGE_OUT", "0:0", R, None),
    ("SOMETHING_NEW", "0:0", LOST, None),
]


@pytest.mark.parametrize(("state", "exit_code", "phase", "code"), TABLE)
def test_every_slurm_state_maps_to_one_worker_phase(
    state: str, exit_code: str, phase: WorkerPhase, code: int | None
) -> None:
    mapped = map_state(state, exit_code)
    assert (mapped.phase, mapped.exit_code) == (phase, code)
    assert mapped.provider_state == state


def test_cancelled_names_who_and_whether_it_was_us() -> None:
    outsider = map_state("CANCELLED by 1001", "0:15")
    assert outsider.phase is PRE and outsider.detail == "cancelled outside the reconciler by 1001"
    ours = map_state("CANCELLED", "0:15", by_reconciler=True)
    assert ours.phase is PRE and ours.detail == "cancelled by the reconciler"
    unknown = map_state("CANCELLED", "0:15")
    assert "outside the reconciler" in unknown.detail and "no accounting" in unknown.detail


def test_warned_worker_that_checkpoints_and_leaves_is_a_session_end_not_a_job_error() -> None:
    assert map_state("FAILED", "75:0", warned=True) == WorkerState(
        SL, 75, "FAILED", "time-limit warning received; worker checkpointed and stopped"
    )
    assert map_state("FAILED", "75:0").phase is X  # without the warning, 75 is the worker's own word


def test_scontrol_lines_and_time_limits_parse() -> None:
    line = (
        "JobId=7 JobName=rc-a UserId=root(0) JobState=CANCELLED Reason=None ExitCode=0:15 "
        "Command=/a b/batch.sh Comment=reconciler:p:a:r-1:2  StdOut=/x/log"
    )
    fields = parse_scontrol(line)
    assert fields["JobId"] == "7" and fields["Command"] == "/a b/batch.sh"
    assert fields["Comment"] == "reconciler:p:a:r-1:2" and fields["ExitCode"] == "0:15"
    assert [time_limit_seconds(t) for t in ("1", "0:10", "1:30", "01:00:00", "1-0", "2-03:04:05", None)] == [
        60, 60, 120, 3600, 86400, 2 * 86400 + 3 * 3600 + 5 * 60, None,
    ]  # fmt: skip


def spec_for(tmp: Path, name: str, **env: str) -> LaunchSpec:
    job = f"{name}-{uuid.uuid4().hex[:6]}"
    return LaunchSpec(
        job=job,
        run_id="r-slurm",
        epoch=1,
        command=[sys.executable, "-u", PROBE],
        env={"PROBE_OUT": str(tmp / f"{job}.jsonl"), **{f"PROBE_{k.upper()}": v for k, v in env.items()}},
        secret_env={"PROBE_SECRET": "tops3cret"},
    )


def test_time_limit_warns_the_worker_passes_the_deadline_and_ends_as_session_limit(
    slurm: Slurm, tmp_path: Path
) -> None:
    """One minute is Slurm's shortest limit; both jobs run side by side to spend it once."""
    adapter = SlurmAdapter("slurm", slurm.settings(tmp_path / "wd", time_limit="1", signal_seconds=30))
    polite = spec_for(tmp_path, "polite", sleep="300", on_term="75")  # checkpoints and leaves on the warning
    stubborn = spec_for(tmp_path, "stubborn", sleep="300", on_term="ignore")  # runs into the limit
    started = time.time()
    refs = [adapter.launch(polite), adapter.launch(stubborn)]
    deadline = int(probe_records(polite)[0]["env"]["RECONCILER_DEADLINE"])
    assert started + 50 <= deadline <= started + 75
    states = [wait_state(adapter, ref, ended, timeout=110) for ref in refs]
    assert (states[0].phase, states[0].exit_code) == (SL, 75), states[0]
    assert "warning" in states[0].detail
    assert states[1].phase is SL and states[1].provider_state == "TIMEOUT", states[1]
    assert Path(stubborn.env["PROBE_OUT"] + ".term").exists(), "the stubborn worker never got the warning"
    warned_at = float(Path(polite.env["PROBE_OUT"] + ".term").read_text().split()[0])
    assert warned_at < started + 60, "the warning must come before the limit"


def test_outsider_scancel_is_preempted_and_reported_as_not_ours(slurm: Slurm, tmp_path: Path) -> None:
    adapter = SlurmAdapter("slurm", slurm.settings(tmp_path / "wd"))
    ref = adapter.launch(spec_for(tmp_path, "victim", sleep="60"))
    wait_state(adapter, ref, running)
    slurm.run("scancel", ref.id)
    state = wait_state(adapter, ref, ended)
    assert state.phase is PRE and state.provider_state.startswith("CANCELLED")
    assert "outside the reconciler" in state.detail


def test_sbatch_rejection_is_one_sentence_and_leaves_no_secret_behind(slurm: Slurm, tmp_path: Path) -> None:
    adapter = SlurmAdapter("slurm", slurm.settings(tmp_path / "wd", partition="nosuchpartition"))
    spec = spec_for(tmp_path, "rejected")
    with pytest.raises(ProviderConfigError) as info:
        adapter.launch(spec)
    message = str(info.value)
    assert "'slurm'" in message and "partition" in message.lower() and "\n" not in message
    assert not any(b"tops3cret" in p.read_bytes() for p in (tmp_path / "wd").rglob("*") if p.is_file())
    assert not [ref for ref in adapter.observe() if ref.job == spec.job]


def test_bad_time_limit_is_a_config_error_naming_the_provider(slurm: Slurm, tmp_path: Path) -> None:
    with pytest.raises(ProviderConfigError, match="'slurm'.*time_limit"):
        SlurmAdapter("slurm", slurm.settings(tmp_path / "wd", time_limit="soon"))


def test_job_forgotten_by_the_controller_is_read_from_its_exit_record(slurm: Slurm, tmp_path: Path) -> None:
    adapter = SlurmAdapter("slurm", slurm.settings(tmp_path / "wd"))
    for job, job_id, record in (("done", "990001", {"code": 0}), ("gone", "990002", None)):
        folder = tmp_path / "wd" / "workers" / f"{job}.r-old.e4"
        folder.mkdir(parents=True)
        labels = {"provider": "slurm", "job": job, "run_id": "r-old", "epoch": 4}
        (folder / "labels.json").write_text(json.dumps(labels))
        (folder / "slurm_job_id").write_text(job_id)
        if record is not None:
            (folder / "exit.json").write_text(json.dumps(record))
    found = {ref.job: state for ref, state in adapter.observe().items()}
    assert (found["done"].phase, found["done"].exit_code) == (X, 0)
    assert found["gone"].phase is LOST and "990002" in found["gone"].detail


def test_controller_down_is_provider_unavailable(
    slurm: Slurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "slurm.conf"
    text = slurm.conf.read_text()
    port = text.split("SlurmctldPort=")[1].split()[0]
    conf.write_text(text.replace(f"SlurmctldPort={port}", "SlurmctldPort=1") + "MessageTimeout=2\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    adapter = SlurmAdapter("slurm", slurm.settings(tmp_path / "wd", command_timeout_seconds=20))
    with pytest.raises(ProviderUnavailable, match="'slurm'"):
        adapter.observe()


def test_pending_job_that_is_cancelled_by_us_is_not_blamed_on_anyone(slurm: Slurm, tmp_path: Path) -> None:
    adapter = SlurmAdapter("slurm", slurm.settings(tmp_path / "wd", sbatch_options=["--hold"]))
    ref = adapter.launch(spec_for(tmp_path, "held"))
    assert adapter.observe()[ref].phase is P
    adapter.terminate(ref)
    state = wait_state(adapter, ref, ended)
    assert state.phase is PRE and state.detail == "cancelled by the reconciler"
