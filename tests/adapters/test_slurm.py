"""Slurm-specific behaviour: the state table, an outsider's scancel, the time limit with its warning
signal and RECONCILER_DEADLINE, sbatch rejections, jobs the controller has forgotten."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from adapters.compute import LaunchSpec, ProviderConfigError, ProviderUnavailable, WorkerPhase, WorkerRef, WorkerState
from adapters.slurm import SlurmAdapter, map_state, parse_scontrol, time_limit_seconds
from desired.models import SlurmSettings
from tests.adapters.conftest import Slurm
from tests.adapters.e2e import (
    daemon_running,
    finish,
    job_manifest,
    progress_step,
    provider_manifest,
    succeeded,
    wait_for,
)
from tests.adapters.test_contract import PROBE, ended, probe_records, running, wait_state
from tests.conftest import StateRepoFixture

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
    ("CANCELLED", "0:15", X, 143),
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
    assert outsider.phase is X and outsider.detail == "cancelled outside the reconciler by 1001"
    assert outsider.signal == "SIGTERM"  # a death by the signal scancel sent, not a preemption
    ours = map_state("CANCELLED", "0:15", by_reconciler=True)
    assert ours.phase is PRE and ours.detail == "cancelled by the reconciler"
    unknown = map_state("CANCELLED", "0:0")
    assert "outside the reconciler" in unknown.detail and "no accounting" in unknown.detail
    assert unknown.phase is X and unknown.signal == "SIGTERM"
    caught = map_state("CANCELLED by 1001", "75:0")  # the command caught SIGTERM and left after a checkpoint
    assert (caught.phase, caught.exit_code, caught.signal) == (X, 75, None)


def test_evidence_out_of_memory_and_signals_but_only_slurm_s_word_is_a_preemption() -> None:
    oom = map_state("OUT_OF_MEMORY", "0:125")
    assert (oom.phase, oom.exit_code, oom.oom) == (X, 137, True)
    segv = map_state("FAILED", "0:11")
    assert (segv.phase, segv.exit_code, segv.signal, segv.oom) == (X, 139, "SIGSEGV", False)
    assert map_state("FAILED", "3:0").signal is None
    for word in ("PREEMPTED", "NODE_FAIL", "BOOT_FAIL"):
        assert map_state(word, "0:15").phase is PRE


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


OWNER = "repo-a"


def adapter_for(settings: SlurmSettings, owner: str = OWNER) -> SlurmAdapter:
    return SlurmAdapter("slurm", settings, owner=owner)


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


@dataclass
class TimeLimited:
    adapter: SlurmAdapter
    polite: LaunchSpec
    stubborn: LaunchSpec
    refs: list[WorkerRef]
    started: float


@pytest.fixture(scope="module")
def time_limited(slurm: Slurm, tmp_path_factory: pytest.TempPathFactory) -> TimeLimited:
    """Two jobs with Slurm's shortest limit (one minute), started when the module starts and checked by
    its last test, so the minute passes while the other tests run."""
    tmp = tmp_path_factory.mktemp("time-limited")
    adapter = adapter_for(slurm.settings(tmp / "wd", time_limit="1", signal_seconds=30))
    polite = spec_for(tmp, "polite", sleep="300", on_term="75")  # checkpoints and leaves on the warning
    stubborn = spec_for(tmp, "stubborn", sleep="300", on_term="ignore")  # runs into the limit
    started = time.time()
    return TimeLimited(adapter, polite, stubborn, [adapter.launch(polite), adapter.launch(stubborn)], started)


def test_time_limited_job_asks_for_a_warning_and_passes_its_deadline(time_limited: TimeLimited) -> None:
    deadline = int(probe_records(time_limited.polite)[0]["env"]["RECONCILER_DEADLINE"])
    assert time_limited.started + 50 <= deadline <= time_limited.started + 75
    states = time_limited.adapter.observe()
    assert all(states[ref].phase in (P, R) for ref in time_limited.refs)


def test_outsider_scancel_is_a_signal_death_reported_as_not_ours(slurm: Slurm, tmp_path: Path) -> None:
    adapter = adapter_for(slurm.settings(tmp_path / "wd"))
    ref = adapter.launch(spec_for(tmp_path, "victim", sleep="60"))
    wait_state(adapter, ref, running)
    slurm.run("scancel", ref.id)
    state = wait_state(adapter, ref, ended)
    assert state.phase is X and state.provider_state.startswith("CANCELLED") and state.signal
    assert "outside the reconciler" in state.detail


def test_a_drills_kill_gives_no_notice_and_reads_as_ours(slurm: Slurm, tmp_path: Path) -> None:
    """`kill` (a drill): Slurm's harshest cancel (SIGKILL to every step and the batch script), and
    the end is reported as the reconciler's stop, never as the job's crash. Whether a SIGTERM of
    Slurm's own job termination reaches the worker a moment before the SIGKILL is Slurm's race (it
    did in about half the runs here); a drill holds the worker's saves, so it resumes at N either way."""
    adapter = adapter_for(slurm.settings(tmp_path / "wd"))
    spec = spec_for(tmp_path, "drilled", sleep="120", on_term="ignore")
    ref = adapter.launch(spec)
    wait_state(adapter, ref, running)
    adapter.kill(ref)
    state = wait_state(adapter, ref, ended)
    assert state.phase is WorkerPhase.PREEMPTED and "reconciler" in state.detail, state


def test_sbatch_rejection_is_one_sentence_and_leaves_no_secret_behind(slurm: Slurm, tmp_path: Path) -> None:
    adapter = adapter_for(slurm.settings(tmp_path / "wd", partition="nosuchpartition"))
    spec = spec_for(tmp_path, "rejected")
    with pytest.raises(ProviderConfigError) as info:
        adapter.launch(spec)
    message = str(info.value)
    assert "'slurm'" in message and "partition" in message.lower() and "\n" not in message
    assert not any(b"tops3cret" in p.read_bytes() for p in (tmp_path / "wd").rglob("*") if p.is_file())
    assert not [ref for ref in adapter.observe() if ref.job == spec.job]


def test_bad_time_limit_is_a_config_error_naming_the_provider(slurm: Slurm, tmp_path: Path) -> None:
    with pytest.raises(ProviderConfigError, match="'slurm'.*time_limit"):
        adapter_for(slurm.settings(tmp_path / "wd", time_limit="soon"))


def test_job_forgotten_by_the_controller_is_read_from_its_exit_record(slurm: Slurm, tmp_path: Path) -> None:
    adapter = adapter_for(slurm.settings(tmp_path / "wd"))
    for job, job_id, record in (("done", "990001", {"code": 0}), ("gone", "990002", None)):
        folder = tmp_path / "wd" / "workers" / f"{OWNER}.{job}.r-old.e4"
        folder.mkdir(parents=True)
        labels = {"provider": "slurm", "owner": OWNER, "job": job, "run_id": "r-old", "epoch": 4}
        (folder / "labels.json").write_text(json.dumps(labels))
        (folder / "slurm_job_id").write_text(job_id)
        if record is not None:
            (folder / "exit.json").write_text(json.dumps(record))
    found = {ref.job: state for ref, state in adapter.observe().items()}
    assert (found["done"].phase, found["done"].exit_code) == (X, 0)
    assert found["gone"].phase is LOST and "990002" in found["gone"].detail


def test_controller_down_is_provider_unavailable(slurm: Slurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "slurm.conf"
    text = slurm.conf.read_text()
    port = text.split("SlurmctldPort=")[1].split()[0]
    conf.write_text(text.replace(f"SlurmctldPort={port}", "SlurmctldPort=1") + "MessageTimeout=2\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    adapter = adapter_for(slurm.settings(tmp_path / "wd", command_timeout_seconds=20))
    with pytest.raises(ProviderUnavailable, match="'slurm'"):
        adapter.observe()


def test_pending_job_that_is_cancelled_by_us_is_not_blamed_on_anyone(slurm: Slurm, tmp_path: Path) -> None:
    adapter = adapter_for(slurm.settings(tmp_path / "wd", sbatch_options=["--hold"]))
    ref = adapter.launch(spec_for(tmp_path, "held"))
    assert adapter.observe()[ref].phase is P
    adapter.terminate(ref)
    state = wait_state(adapter, ref, ended)
    assert state.phase is PRE and state.detail == "cancelled by the reconciler"
    assert not list((tmp_path / "wd").rglob("payload.json")), "a job that never ran must not keep its secrets"


@pytest.mark.slow
def test_end_to_end_outsider_scancel_and_time_limit_are_relaunched_and_complete(
    slurm: Slurm, state_repo: StateRepoFixture, tmp_path: Path
) -> None:
    """`reconciler run --until-done` with two slurm providers on the test cluster: an admin scancels
    one job's worker; the other job's worker is warned before its one-minute limit and checkpoints."""
    workdir = tmp_path / "slurm-workdir"
    state_repo.write("desired/cluster.yaml", provider_manifest("cluster", slurm.settings(workdir)))
    # Slurm checks for the warning about every 30 s, so a 40 s job with a one-minute limit is warned once.
    short = slurm.settings(workdir, time_limit="1", signal_seconds=50)
    state_repo.write("desired/short.yaml", provider_manifest("short", short))
    state_repo.write("desired/victim.yaml", job_manifest("victim", "cluster", step_seconds=0.1, target=60))
    state_repo.write("desired/overtime.yaml", job_manifest("overtime", "short", step_seconds=0.1, target=400, every=20))
    state_repo.commit("two jobs on slurm")
    log = tmp_path / "daemon.log"
    with daemon_running(state_repo, log) as daemon:
        first = "workers/*.victim.*.e1/slurm_job_id"
        job_id = wait_for(lambda: read(next(iter(workdir.glob(first)), None)), 60, "victim", daemon, log)
        wait_for(lambda: progress_step(state_repo, "victim") >= 12, 60, "victim checkpoints", daemon, log)
        slurm.run("scancel", str(job_id))  # an admin, not the reconciler
        finish(daemon, log, timeout=150)
    victim = succeeded(state_repo, "victim")
    assert [a["outcome"] for a in victim["attempts"]] == ["interruption", "succeeded"], victim["attempts"]
    # the worker caught scancel's SIGTERM, checkpointed and left with 75 (else: the outsider is named)
    assert any(w in victim["attempts"][0]["detail"] for w in ("outside the reconciler", "exit 75"))
    assert victim["attempts"][1]["step_start"] > 0 and victim["failures"] == 0
    overtime = succeeded(state_repo, "overtime")
    outcomes = [a["outcome"] for a in overtime["attempts"]]
    assert outcomes[0] == "session-end" and outcomes[-1] == "succeeded", overtime["attempts"]
    assert set(outcomes[1:-1]) <= {"session-end"} and overtime["failures"] == 0
    # Slurm may warn up to a minute early; every session after one that checkpointed resumes from it.
    resumed = [a["step_start"] for a in overtime["attempts"][1:]]
    assert resumed == sorted(resumed) and resumed[-1] > 0, "sessions must resume from the final checkpoints"


def read(path: Path | None) -> str:
    return path.read_text().strip() if path is not None and path.exists() else ""


def test_time_limited_jobs_end_as_session_limit_with_or_without_the_worker_s_help(
    time_limited: TimeLimited,
) -> None:
    """Runs last in the module: the polite worker checkpointed on the warning and left with 75; the
    stubborn one ignored it and Slurm stopped it at the limit (TIMEOUT). Both are session ends."""
    adapter = time_limited.adapter
    polite, stubborn = (wait_state(adapter, ref, ended, timeout=120) for ref in time_limited.refs)
    assert (polite.phase, polite.exit_code) == (SL, 75), polite
    assert "warning" in polite.detail
    assert stubborn.phase is SL and stubborn.provider_state == "TIMEOUT", stubborn
    assert Path(time_limited.stubborn.env["PROBE_OUT"] + ".term").exists(), "the warning never reached the worker"
    warned_at = float(Path(time_limited.polite.env["PROBE_OUT"] + ".term").read_text().split()[0])
    assert warned_at < time_limited.started + 60, "the warning must come before the limit"


def test_outsider_is_named_when_accounting_can_tell(
    slurm: Slurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test cluster has no slurmdbd, so a stand-in `sacct` answers as one with accounting would."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sacct"
    fake.write_text('#!/bin/sh\n# sacct -j ID -X -n -P -o FIELDS\necho "$2|CANCELLED by 0|0:15"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    adapter = adapter_for(slurm.settings(tmp_path / "wd"))
    ref = adapter.launch(spec_for(tmp_path, "named", sleep="60"))
    wait_state(adapter, ref, running)
    slurm.run("scancel", ref.id)
    state = wait_state(adapter, ref, ended)
    assert state.phase is X
    assert state.detail == "cancelled outside the reconciler by root (uid 0)"


def test_gpu_model_is_asked_for_as_a_typed_gres(tmp_path: Path) -> None:
    adapter = adapter_for(SlurmSettings(workdir=str(tmp_path / "wd")))
    spec = LaunchSpec(job="big", run_id="r-1", epoch=1, command=["true"], gpus=2, gpu_model="a100")
    argv = adapter._sbatch_argv(spec, tmp_path, tmp_path / "batch.sh")
    assert "--gres=gpu:a100:2" in argv
    assert f"--comment=reconciler:{OWNER}:slurm:big:r-1:1" in argv and f"--job-name=rc-{OWNER}-big" in argv
    untyped = LaunchSpec(job="big", run_id="r-1", epoch=1, command=["true"], gpus=1)
    assert "--gres=gpu:1" in adapter._sbatch_argv(untyped, tmp_path, tmp_path / "batch.sh")
    assert adapter.capacity() is None
