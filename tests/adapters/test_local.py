"""Local-specific behaviour: evidence of how a worker died (signal, OOM), this machine's capacity, and
the shared helpers every adapter uses (labels, the minimal environment)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapters import bootstrap
from adapters.compute import (
    BASE_ENV,
    BASE_ENV_PREFIXES,
    LaunchSpec,
    ProviderConfigError,
    ProviderUnavailable,
    WorkerPhase,
    check_label,
    worker_base_env,
)
from adapters.local import LocalAdapter
from desired.models import LocalSettings
from tests.adapters.test_contract import OWNER, ended, wait_state


def adapter_in(tmp_path: Path, owner: str = OWNER) -> LocalAdapter:
    return LocalAdapter("local", LocalSettings(workdir=str(tmp_path / "wd")), owner=owner)


def test_a_segfault_is_reported_as_an_exit_by_sigsegv_not_a_preemption(tmp_path: Path) -> None:
    adapter = adapter_in(tmp_path)
    crash = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    ref = adapter.launch(LaunchSpec(job="crash", run_id="r-1", epoch=1, command=[sys.executable, "-c", crash]))
    state = wait_state(adapter, ref, ended)
    assert (state.phase, state.exit_code, state.signal, state.oom) == (WorkerPhase.EXITED, -11, "SIGSEGV", False)
    assert state.provider_state == "killed by SIGSEGV" and "not by the reconciler" in state.detail


@pytest.mark.parametrize(("preempt", "phase"), [(False, WorkerPhase.EXITED), (True, WorkerPhase.PREEMPTED)])
def test_kill_worker_reports_a_preemption_only_when_asked_to_simulate_one(tmp_path: Path, preempt: bool,
                                                                         phase: WorkerPhase) -> None:
    adapter = adapter_in(tmp_path)
    ref = adapter.launch(LaunchSpec(job="chaos", run_id="r-1", epoch=1,
                                    command=[sys.executable, "-c", "import time; time.sleep(60)"]))
    wait_state(adapter, ref, lambda s: s.phase == WorkerPhase.RUNNING)
    assert adapter.kill_worker(ref, preempt=preempt)
    state = wait_state(adapter, ref, ended)
    assert (state.phase, state.signal, state.provider_state) == (phase, "SIGKILL", "killed by SIGKILL")


def test_an_oom_kill_is_told_by_the_cgroup_s_oom_kill_counter(tmp_path: Path) -> None:
    """The counter the supervisor and the agent read before and after a SIGKILL death."""
    proc, cgroup = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("0::/user.slice/job\n")
    events = cgroup / "user.slice" / "job" / "memory.events"
    events.parent.mkdir(parents=True)
    events.write_text("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n")
    assert bootstrap.oom_kills(str(proc), str(cgroup)) == 2
    events.unlink()
    assert bootstrap.oom_kills(str(proc), str(cgroup)) is None
    (proc / "self" / "cgroup").write_text("4:memory:/box/7\n0::/\n")  # cgroup v1 memory controller
    control = cgroup / "memory" / "box" / "7" / "memory.oom_control"
    control.parent.mkdir(parents=True)
    control.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    assert bootstrap.oom_kills(str(proc), str(cgroup)) == 5
    control.unlink()  # a container sees its own cgroup as the mount's root
    (cgroup / "memory" / "memory.oom_control").write_text("oom_kill 1\n")
    assert bootstrap.oom_kills(str(proc), str(cgroup)) == 1


def test_local_worker_with_an_oom_marker_is_reported_oom(tmp_path: Path) -> None:
    """What the supervisor leaves when the counter rose across a SIGKILL death, as observe reads it."""
    adapter = adapter_in(tmp_path)
    ref = adapter.launch(LaunchSpec(job="hog", run_id="r-1", epoch=1, command=[sys.executable, "-c", "pass"]))
    wait_state(adapter, ref, ended)
    folder = tmp_path / "wd" / ref.id
    (folder / "oom").write_text("counter rose")
    (folder / "exit_code").write_text("-9")
    state = adapter.observe()[ref]
    assert (state.phase, state.signal, state.oom) == (WorkerPhase.EXITED, "SIGKILL", True)
    assert "OOM" in state.detail


def test_workers_go_in_the_workdir_itself_and_earlier_ones_under_workers_are_still_found(tmp_path: Path) -> None:
    """`workdir: X` used to put workers in X/workers/; a worker left there by that version is still
    observed, read and stopped, and new ones go to X."""
    earlier = LocalAdapter("local", LocalSettings(workdir=str(tmp_path / "wd" / "workers")), owner=OWNER)
    old = earlier.launch(LaunchSpec(job="old", run_id="r-1", epoch=1,
                                    command=[sys.executable, "-c", "print('from before', flush=True)"]))
    wait_state(earlier, old, ended)
    adapter = adapter_in(tmp_path)
    new = adapter.launch(LaunchSpec(job="new", run_id="r-1", epoch=1, command=[sys.executable, "-c", "pass"]))
    assert (tmp_path / "wd" / new.id / "labels.json").exists()
    assert not (tmp_path / "wd" / "workers" / new.id).exists()
    seen = adapter.observe()
    assert set(seen) == {old, new} and seen[old].phase is WorkerPhase.EXITED
    assert "from before" in adapter.logs(old)


def test_a_workdir_that_is_a_file_refuses_the_launch_saying_so(tmp_path: Path) -> None:
    (tmp_path / "wd").write_text("not a folder\n")
    with pytest.raises(ProviderUnavailable, match="its workdir .*/wd is a file, not a directory"):
        adapter_in(tmp_path).launch(LaunchSpec(job="j", run_id="r-1", epoch=1, command=["true"]))


def test_capacity_reports_this_machine(tmp_path: Path) -> None:
    capacity = adapter_in(tmp_path).capacity()
    assert capacity is not None and capacity.cpus == os.cpu_count()
    assert capacity.memory_gb is not None and capacity.memory_gb > 0
    assert capacity.gpus is not None and capacity.gpus >= 0


def test_an_adapter_without_an_owner_observes_everyone_and_launches_nothing(tmp_path: Path) -> None:
    ours = adapter_in(tmp_path)
    ref = ours.launch(LaunchSpec(job="seen", run_id="r-1", epoch=1, command=[sys.executable, "-c", "pass"]))
    operator = LocalAdapter("local", LocalSettings(workdir=str(tmp_path / "wd")))
    assert ref in operator.observe() and operator.foreign_workers == 0
    with pytest.raises(ProviderConfigError, match="owner"):
        operator.launch(LaunchSpec(job="x", run_id="r-1", epoch=1, command=["true"]))


@pytest.mark.parametrize("bad", ["x\n", "a/b", "..", "a..b", "", "-x", "x y", "x\x00"])
def test_labels_are_checked_with_a_full_match(bad: str) -> None:
    with pytest.raises(ProviderConfigError):
        check_label(bad, "job name")
    assert check_label("train-1.b_2", "job name") == "train-1.b_2"


def test_minimal_environment_keeps_only_the_listed_variables() -> None:
    environ = {"PATH": "/bin", "HOME": "/h", "LC_ALL": "C", "LANG": "C.UTF-8", "TZ": "UTC",
               "AWS_SECRET_ACCESS_KEY": "k", "PYTHONPATH": "/x", "SSH_AUTH_SOCK": "/s", "LOGNAME": "u"}
    assert worker_base_env(environ) == {"PATH": "/bin", "HOME": "/h", "LC_ALL": "C", "LANG": "C.UTF-8",
                                        "TZ": "UTC", "LOGNAME": "u"}
    # the agent on SSH hosts and Slurm nodes is stdlib-only and keeps its own copy of the list
    assert (bootstrap.BASE_ENV, bootstrap.BASE_ENV_PREFIXES) == (BASE_ENV, BASE_ENV_PREFIXES)


# A command that stops as the worker SDK does: its SIGTERM handler asks it to save, and once saved it
# restores the default handler (Run.close) and takes a moment to exit 75 (interpreter shutdown).
CLEAN_STOP = """
import signal, sys, time, pathlib
folder = pathlib.Path(sys.argv[1])
asked = []
signal.signal(signal.SIGTERM, lambda *_: asked.append(1))
(folder / "ready").touch()
while not asked:
    time.sleep(0.05)
time.sleep(0.3)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
(folder / "closed").touch()
time.sleep(1.5)
sys.exit(75)
"""


def test_a_worker_asked_to_stop_again_while_it_exits_still_ends_with_its_own_exit_75(tmp_path: Path) -> None:
    """The daemon asks on every tick until the worker is gone: only the first ask may signal it, or a
    later SIGTERM lands after the command restored its default handler and kills it mid-exit (-15)."""
    adapter = adapter_in(tmp_path)
    marks = tmp_path / "marks"
    marks.mkdir()
    ref = adapter.launch(LaunchSpec(job="stop", run_id="r-1", epoch=1,
                                    command=[sys.executable, "-c", CLEAN_STOP, str(marks)]))
    wait_for(marks / "ready")
    adapter.terminate(ref)
    wait_for(marks / "closed")
    adapter.terminate(ref)  # the next tick, while the worker is still on its way out
    state = wait_state(adapter, ref, ended)
    assert (state.phase, state.exit_code) == (WorkerPhase.EXITED, 75)
    assert state.detail == "stopped by the reconciler"


def wait_for(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_the_ssh_and_slurm_agent_also_stops_a_worker_once(tmp_path: Path) -> None:
    """The agent beside SSH and Slurm workers: a second `terminate` (the next tick) neither signals
    the command again nor puts off the SIGKILL that ends the grace."""
    marks = tmp_path / "marks"
    marks.mkdir()
    folder = tmp_path / "workers" / "w.e1"
    agent = [sys.executable, bootstrap.__file__]
    payload = {"labels": {"provider": "ssh", "job": "stop", "run_id": "r-1", "epoch": 1},
               "command": [sys.executable, "-c", CLEAN_STOP, str(marks)], "grace": 30}
    subprocess.run([*agent, "launch", str(folder)], input=json.dumps(payload), text=True, check=True,
                   capture_output=True, timeout=30)
    wait_for(marks / "ready")
    subprocess.run([*agent, "terminate", str(folder)], check=True, capture_output=True, timeout=30)
    wait_for(marks / "closed")
    subprocess.run([*agent, "terminate", str(folder)], check=True, capture_output=True, timeout=30)
    wait_for(folder / "exit.json")
    assert json.loads((folder / "exit.json").read_text())["code"] == 75
