"""`reconciler drill --to`: the relaunch after the drill's kill goes to another provider, here from the
local provider to the SSH provider (a real sshd on 127.0.0.1), and the resumed run is the same run."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import yaml

from adapters.compute import WorkerPhase
from adapters.ssh import SshAdapter
from desired.models import LocalSettings
from reconciler.daemon.loop import Reconciler
from status.models import Outcome
from tests.adapters import e2e
from tests.adapters.conftest import Sshd
from tests.adapters.test_contract import OWNER, ended, running, wait_state
from tests.adapters.test_ssh import probe_spec
from tests.conftest import StateRepoFixture
from tests.daemon.test_drill_local import running_with_checkpoint, tick_until_exit, waiting_cli
from tests.daemon.test_loop_local import tick_until

ROOT = Path(__file__).resolve().parents[2]


def test_a_drill_moved_to_the_ssh_provider_resumes_there_exactly(
        sshd: Sshd, state_repo: StateRepoFixture, local_workdir: Path, tmp_path: Path) -> None:
    state_repo.write("desired/here.yaml", e2e.provider_manifest("here", LocalSettings()))
    state_repo.write("desired/box.yaml", e2e.provider_manifest("box", sshd.settings(tmp_path / "box")))
    state_repo.write("desired/demo.yaml", yaml.safe_dump({
        "apiVersion": "reconciler.dev/v1", "kind": "Job", "metadata": {"name": "demo"},
        "spec": {"command": [sys.executable, "-m", "reconciler.demo.train"], "target_steps": 400,
                 "checkpoint_every": 10, "placement": {"providers": ["here", "box"]},
                 # this checkout's package, wherever the worker starts (the host's folder, or here)
                 "env": {"DEMO_STEP_SECONDS": "0.05", "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT))}},
    }))
    state_repo.commit("add demo on here, box beside it")
    rec = Reconciler(state_repo.path)
    st = running_with_checkpoint(state_repo, rec, "demo")
    assert st.current is not None and st.current.provider == "here"
    code, out = tick_until_exit(rec, waiting_cli(state_repo, "demo", "--to", "box"))
    assert code == 0, out
    st = tick_until(rec, lambda r: True).statuses["demo"]
    d = st.drill
    assert d is not None and d.verdict == "exact" and d.to == "box", d
    assert [a.provider for a in st.attempts] == ["here", "box"]
    assert st.attempts[0].outcome == Outcome.CANCELLED and "drill" in st.attempts[0].detail


def test_a_drills_kill_over_ssh_gives_no_notice_and_reads_as_ours(sshd: Sshd, tmp_path: Path) -> None:
    """The SSH adapter's `kill`: SIGKILL at once (a worker that would note SIGTERM never sees one),
    and the end is reported as stopped by the reconciler, never as the job's crash."""
    adapter = SshAdapter("ssh", sshd.settings(tmp_path / "wd", terminate_grace_seconds=60), owner=OWNER)
    spec = probe_spec(tmp_path, "drilled", [], sleep="120", on_term="ignore")
    ref = adapter.launch(spec)
    wait_state(adapter, ref, running)
    started = time.monotonic()
    adapter.kill(ref)
    state = wait_state(adapter, ref, ended)
    assert time.monotonic() - started < 30  # not the 60 s grace of a terminate
    assert state.phase is WorkerPhase.PREEMPTED and state.signal == "SIGKILL"
    assert state.detail == "stopped by the reconciler"
    assert not Path(str(tmp_path / "drilled.e1.jsonl") + ".term").exists()  # no SIGTERM came first
