"""SSH-specific behaviour against a real sshd on 127.0.0.1: quoting, silence, stale workers, login errors."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapters.compute import LaunchSpec, ProviderConfigError, ProviderUnavailable, WorkerPhase, WorkerRef
from adapters.ssh import SshAdapter
from desired.models import Capacity
from tests.adapters import e2e
from tests.adapters.conftest import Sshd, free_port
from tests.adapters.test_contract import OWNER, PROBE, ended, pid_alive, probe_records, running, wait_state
from tests.conftest import StateRepoFixture

METACHARACTERS = "'\"`$\\;&|<>(){}[]*?~!#%^= \t\n\r-"


def generated_strings(seed: int, count: int) -> list[str]:
    """Random strings made mostly of characters a shell would act on, plus some unicode."""
    rng = random.Random(seed)
    alphabet = METACHARACTERS + "abcXYZ019é中"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24))) for _ in range(count)]


def probe_spec(tmp: Path, job: str, args: list[str], epoch: int = 1, **env: str) -> LaunchSpec:
    return LaunchSpec(
        job=job,
        run_id="r-ssh",
        epoch=epoch,
        command=[sys.executable, "-u", PROBE, *args],
        env={
            "PROBE_OUT": str(tmp / f"{job}.e{epoch}.jsonl"),
            **{f"PROBE_{k.upper()}": v for k, v in env.items()},
        },
    )


def test_shell_metacharacters_reach_the_worker_verbatim_and_nothing_else_runs(sshd: Sshd, tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    attacks = [
        f"$(touch {canary})",
        f"`touch {canary}`",
        f"; touch {canary}",
        f"' ; touch {canary} ; '",
        f'" ; touch {canary} ; "',
        f"\ntouch {canary}\n",
        f"&& touch {canary}",
        f"| touch {canary}",
        f"$'\\n'touch {canary}",
        "${IFS}",
        "-o",
        "--",
        "~",
        "*",
    ]
    args = attacks + generated_strings(seed=4, count=200)
    adapter = SshAdapter("ssh", sshd.settings(tmp_path / "wd"), owner=OWNER)
    spec = probe_spec(tmp_path, "quoting", args, plain=f"$(touch {canary}) '\"`")
    ref = adapter.launch(spec)
    state = wait_state(adapter, ref, ended)
    assert (state.phase, state.exit_code) == (WorkerPhase.EXITED, 0)
    record = probe_records(spec)[0]
    assert record["argv"] == args
    assert record["env"]["PROBE_PLAIN"] == f"$(touch {canary}) '\"`"
    assert not canary.exists(), "a shell interpreted part of an argument"


def running_then_host_down(sshd: Sshd, tmp_path: Path, name: str,
                           **settings: float) -> tuple[SshAdapter, WorkerRef, int]:
    """A probe worker (two minutes of sleep) running on the host, which then stops answering
    (sshd stopped; the worker lives on): the adapter, the worker and its pid."""
    adapter = SshAdapter("ssh", sshd.settings(tmp_path / "wd", **settings), owner=OWNER)
    spec = probe_spec(tmp_path, name, [], sleep="120")
    ref = adapter.launch(spec)
    pid = probe_records(spec)[0]["pid"]
    wait_state(adapter, ref, running)
    sshd.stop()
    return adapter, ref, pid


def test_unreachable_host_is_lost_only_after_sustained_silence_and_its_worker_survives(
    sshd: Sshd, tmp_path: Path
) -> None:
    adapter, ref, pid = running_then_host_down(sshd, tmp_path, "silent", lost_after_failures=3,
                                               lost_after_seconds=1.5)
    try:
        for _ in range(2):  # one or two failed probes say nothing about the worker
            with pytest.raises(ProviderUnavailable, match="box"):
                adapter.observe()
        time.sleep(0.3)
        with pytest.raises(ProviderUnavailable):  # three failures, but not yet for long enough
            adapter.observe()
        time.sleep(1.5)
        state = adapter.observe()[ref]
        assert state.phase is WorkerPhase.LOST
        assert "box" in state.detail and "4 failed probes" in state.detail
        assert pid_alive(pid), "the worker must keep running while its host is unreachable"
    finally:
        sshd.start()
    assert running(adapter.observe()[ref])  # the host is back and so is the worker
    adapter.terminate(ref)


def test_silent_host_beside_a_healthy_one_keeps_last_known_state(sshd: Sshd, tmp_path: Path) -> None:
    """With one host down, the others are still observed and launched on; nothing is raised."""
    dead = sshd.host("dead").model_copy(update={"port": free_port()})
    settings = sshd.settings(tmp_path / "wd", hosts=[dead, sshd.host("box", max_workers=2)])
    adapter = SshAdapter("ssh", settings, owner=OWNER)
    spec = probe_spec(tmp_path, "beside", [], sleep="60")
    ref = adapter.launch(spec)
    assert ref.id.startswith("box/")
    assert running(wait_state(adapter, ref, running))
    assert adapter.free_slots() == 1
    adapter.terminate(ref)


def test_stale_worker_on_a_host_that_comes_back_is_terminated(sshd: Sshd, tmp_path: Path) -> None:
    adapter, ref, pid = running_then_host_down(sshd, tmp_path, "stale", lost_after_failures=2,
                                               lost_after_seconds=0)
    try:
        with pytest.raises(ProviderUnavailable):
            adapter.observe()
        assert adapter.observe()[ref].phase is WorkerPhase.LOST
        adapter.terminate(ref)  # the planner replaces the run; the stop waits for the host
        assert pid_alive(pid)
    finally:
        sshd.start()
    state = wait_state(adapter, ref, ended)
    assert state.phase is WorkerPhase.PREEMPTED and state.signal and state.detail == "stopped by the reconciler"
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(pid)


def test_host_key_mismatch_is_one_sentence_naming_the_host(sshd: Sshd, tmp_path: Path) -> None:
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kind, key = Path(f"{other}.pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {kind} {key}\n")
    adapter = SshAdapter("ssh", sshd.settings(tmp_path / "wd", known_hosts=str(known)), owner=OWNER)
    with pytest.raises(ProviderConfigError) as info:
        adapter.launch(probe_spec(tmp_path, "mismatch", []))
    message = str(info.value)
    assert "'box'" in message and "known_hosts" in message and "\n" not in message


def test_unknown_host_key_is_refused_by_default_and_recorded_with_accept_new(sshd: Sshd, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    strict = SshAdapter("ssh", sshd.settings(tmp_path / "wd", known_hosts=str(known)), owner=OWNER)
    with pytest.raises(ProviderUnavailable, match="known_hosts"):
        strict.observe()
    trusting = SshAdapter(
        "ssh", sshd.settings(tmp_path / "wd", known_hosts=str(known), host_key_policy="accept-new"), owner=OWNER
    )
    assert trusting.observe() == {}
    found = subprocess.run(["ssh-keygen", "-F", f"[127.0.0.1]:{sshd.port}", "-f", str(known)], capture_output=True)
    assert found.returncode == 0, "accept-new should have recorded the host key"


def test_missing_key_file_is_one_sentence_naming_the_file(sshd: Sshd, tmp_path: Path) -> None:
    host = sshd.host().model_copy(update={"key_file": str(tmp_path / "no-such-key")})
    adapter = SshAdapter("ssh", sshd.settings(tmp_path / "wd", hosts=[host]), owner=OWNER)
    with pytest.raises(ProviderConfigError) as info:
        adapter.launch(probe_spec(tmp_path, "nokey", []))
    assert "no-such-key" in str(info.value) and "'box'" in str(info.value)


def test_worker_folder_on_the_host_holds_labels_and_no_secret(sshd: Sshd, tmp_path: Path) -> None:
    adapter = SshAdapter("ssh", sshd.settings(tmp_path / "wd"), owner=OWNER)
    spec = probe_spec(tmp_path, "labels", [])
    spec = LaunchSpec(**{**spec.__dict__, "secret_env": {"PROBE_SECRET": "hunter2-xyz"}})
    ref = adapter.launch(spec)
    wait_state(adapter, ref, ended)
    folder = tmp_path / "wd" / "workers" / ref.id.split("/", 1)[1]
    labels = json.loads((folder / "labels.json").read_text())
    assert (labels["provider"], labels["owner"], labels["job"], labels["run_id"], labels["epoch"]) == (
        "ssh",
        OWNER,
        "labels",
        "r-ssh",
        1,
    )
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    assert probe_records(spec)[0]["env"]["PROBE_SECRET"] == "hunter2-xyz"
    assert not any(b"hunter2-xyz" in p.read_bytes() for p in (tmp_path / "wd").rglob("*") if p.is_file())


@pytest.mark.slow
def test_end_to_end_worker_killed_on_the_host_is_relaunched_and_completes(
    sshd: Sshd, state_repo: StateRepoFixture, tmp_path: Path
) -> None:
    """`reconciler run --until-done` with an ssh provider; someone kills the worker process on the host."""
    workdir = tmp_path / "ssh-workdir"
    state_repo.write("desired/box.yaml", e2e.provider_manifest("box", sshd.settings(workdir)))
    state_repo.write("desired/count.yaml", e2e.job_manifest("count", "box", step_seconds=0.1, target=60))
    state_repo.commit("count on an ssh box")
    log = tmp_path / "daemon.log"
    with e2e.daemon_running(state_repo, log) as daemon:
        first = "workers/*.count.*.e1/child.pid"
        pid_file = e2e.wait_for(lambda: next(iter(workdir.glob(first)), None), 60, "the first worker", daemon, log)
        assert isinstance(pid_file, Path)
        e2e.wait_for(lambda: e2e.progress_step(state_repo, "count") >= 12, 60, "checkpoints", daemon, log)
        os.kill(json.loads(pid_file.read_text())["pid"], signal.SIGKILL)
        e2e.finish(daemon, log, timeout=120)
    st = e2e.succeeded(state_repo, "count")
    outcomes = [a["outcome"] for a in st["attempts"]]
    assert outcomes == ["interruption", "succeeded"], st["attempts"]
    assert st["interruptions"] == 1 and st["failures"] == 0
    assert st["attempts"][0]["provider"] == "box" and "SIGKILL" in st["attempts"][0]["detail"]
    assert st["attempts"][1]["step_start"] > 0, "the relaunch must resume from a checkpoint"


def test_control_master_reuses_one_connection_when_asked(sshd: Sshd, tmp_path: Path) -> None:
    adapter = SshAdapter("ssh", sshd.settings(tmp_path / "wd", control_persist_seconds=5), owner=OWNER)
    assert adapter.observe() == {}
    assert adapter._control_dir is not None
    sockets = list(Path(adapter._control_dir).iterdir())
    assert len(sockets) == 1, "one master connection per host"
    assert adapter.observe() == {}
    assert list(Path(adapter._control_dir).iterdir()) == sockets


def test_job_is_placed_only_on_a_host_whose_declared_resources_fit(sshd: Sshd, tmp_path: Path) -> None:
    """An A100 job never lands on a host declared `gpu_models: [rtx4090]` (issue 8, item 7)."""
    gaming = sshd.host("gaming").model_copy(update={"resources": Capacity(gpus=2, gpu_models=["rtx4090"])})
    lab = sshd.host("lab").model_copy(update={"resources": Capacity(cpus=8, gpus=1, gpu_models=["A100"])})
    adapter = SshAdapter("ssh", sshd.settings(tmp_path / "wd", hosts=[gaming, lab]), owner=OWNER)
    assert adapter.capacity() == Capacity(cpus=8, gpus=2, gpu_models=["A100", "rtx4090"])
    spec = probe_spec(tmp_path, "a100", [])
    spec = LaunchSpec(**{**spec.__dict__, "gpus": 1, "gpu_model": "a100"})
    ref = adapter.launch(spec)
    assert ref.id.startswith("lab/")
    wait_state(adapter, ref, ended)
    only_gaming = SshAdapter("ssh", sshd.settings(tmp_path / "wd2", hosts=[gaming]), owner=OWNER)
    with pytest.raises(ProviderConfigError, match="gaming: needs GPU model a100, offers rtx4090"):
        only_gaming.launch(LaunchSpec(**{**spec.__dict__, "job": "a100-nowhere"}))
    assert not (tmp_path / "wd2" / "workers").exists(), "nothing may start on a host that does not fit"
    assert SshAdapter("ssh", sshd.settings(tmp_path / "wd"), owner=OWNER).capacity() is None

