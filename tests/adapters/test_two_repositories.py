"""Two state repositories sharing one machine, SSH host or Slurm cluster (issue 8, item 0).

Each repository has its own daemon (a `Reconciler` ticking in a loop, as `reconciler run` does) and a
job with the same name, `train`. Before every worker carried its repository's identity, each daemon
took the other's worker for its own: it terminated it as a replaced run, or adopted it and read its
log. Now each sees, stops and reads only its own, and counts the other's as foreign.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from adapters.compute import ComputeAdapter, WorkerPhase
from adapters.local import LocalAdapter
from reconciler.daemon.loop import Reconciler, TickReport
from tests import zygote
from tests.adapters.e2e import provider_manifest
from tests.conftest import StateRepoFixture

KINDS = ["local", "ssh", "slurm"]


@dataclass
class Setup:
    provider: str | None  # None: the default local provider
    provider_text: str | None
    operator: Callable[[], ComputeAdapter]  # sees every owner's workers, for the checks and the cleanup


@pytest.fixture(params=KINDS)
def setup(request: pytest.FixtureRequest, tmp_path: Path, local_workdir: Path) -> Iterator[Setup]:
    kind: str = request.param
    workdir = tmp_path / f"{kind}-workdir"
    if kind == "local":
        the = Setup(None, None, lambda: LocalAdapter("local"))
    elif kind == "ssh":
        from adapters.ssh import SshAdapter

        settings = request.getfixturevalue("sshd").settings(workdir)
        the = Setup("box", provider_manifest("box", settings), lambda: SshAdapter("box", settings))
    else:
        from adapters.slurm import SlurmAdapter

        settings = request.getfixturevalue("slurm").settings(workdir)
        the = Setup("cluster", provider_manifest("cluster", settings), lambda: SlurmAdapter("cluster", settings))
    yield the
    operator = the.operator()
    for ref, state in operator.observe().items():
        if state.phase in (WorkerPhase.PENDING, WorkerPhase.RUNNING):
            operator.terminate(ref)


def repository(tmp_path: Path, name: str, setup: Setup, command: list[str], retries: int = 3) -> StateRepoFixture:
    repo = StateRepoFixture(tmp_path / name, tmp_path / f"{name}-runs")
    spec: dict = {"command": command, "retry": {"max_retries": retries, "backoff_seconds": 0.1}}
    if setup.provider_text is not None:
        repo.write("desired/provider.yaml", setup.provider_text)
        spec["placement"] = {"providers": [setup.provider]}
    job = {"apiVersion": "reconciler.dev/v1", "kind": "Job", "metadata": {"name": "train"}, "spec": spec}
    repo.write("desired/train.yaml", yaml.safe_dump(job))
    repo.commit(f"{name}: add train")
    return repo


def tick_both(daemons: list[Reconciler], until: Callable[[list[TickReport]], bool], timeout: float) -> list[list[str]]:
    """Ticks the two daemons in turn until `until(last reports)`; returns every action each took."""
    actions: list[list[str]] = [[] for _ in daemons]
    deadline = time.monotonic() + timeout
    while True:
        reports = [d.tick() for d in daemons]
        for mine, report in zip(actions, reports, strict=True):
            mine.extend(report.actions)
        if until(reports):
            return actions
        assert time.monotonic() < deadline, f"timed out; actions {actions}, errors {[r.errors for r in reports]}"
        time.sleep(0.3)


def running(report: TickReport) -> bool:
    st = report.statuses.get("train")
    return st is not None and st.phase.value == "Running"


def test_two_repositories_with_a_job_of_the_same_name_leave_each_other_s_worker_alone(
    setup: Setup, tmp_path: Path
) -> None:
    a = repository(tmp_path, "repo-a", setup, [sys.executable, "-c", "import time; time.sleep(300)"])
    b = repository(tmp_path, "repo-b", setup, [sys.executable, "-c", "import time; time.sleep(301)"])
    daemons = [Reconciler(a.path), Reconciler(b.path)]
    actions = tick_both(daemons, lambda reports: all(running(r) for r in reports), timeout=120)
    for _ in range(4):  # a few more ticks with both workers live: each now sees the other's
        for mine, more in zip(actions, tick_both(daemons, lambda _reports: True, 60), strict=True):
            mine.extend(more)
    for mine in actions:
        assert [x for x in mine if x.startswith("launch")] and not [x for x in mine if x.startswith("terminate")], mine
    ours = {d.tick().statuses["train"].run_id for d in daemons}  # Slurm is shared with other tests' jobs
    live = [ref for ref, st in setup.operator().observe().items()
            if st.phase is WorkerPhase.RUNNING and ref.run_id in ours]
    assert len(ours) == 2 and sorted(ref.job for ref in live) == ["train", "train"]
    for daemon in daemons:
        adapter = daemon._adapters[setup.provider or "local"][1]
        assert len(adapter.observe()) == 1 and adapter.foreign_workers >= 1


def test_a_failed_job_shows_its_own_log_not_the_other_repository_s(setup: Setup, tmp_path: Path) -> None:
    """Same job, same command (so the same run id and epoch in each repository's own storage): each
    repository's failure shows its own worker's output."""
    command = ["sh", "-c", 'echo "output of $RECONCILER_RUN_URI"; exit 3']
    a = repository(tmp_path, "repo-a", setup, command, retries=0)
    b = repository(tmp_path, "repo-b", setup, command, retries=0)
    daemons = [Reconciler(a.path), Reconciler(b.path)]

    def failed(reports: list[TickReport]) -> bool:
        return all(r.statuses.get("train") is not None and r.statuses["train"].phase.value == "Failed" for r in reports)

    tick_both(daemons, failed, timeout=120)
    for mine, theirs in ((a, b), (b, a)):
        tail = yaml.safe_load(mine.status_text("train"))["log_tail"] or ""
        assert "output of " in tail and str(mine.storage) in tail, tail
        assert str(theirs.storage) not in tail, tail


def test_two_daemons_as_users_run_them_leave_each_other_s_worker_alone(local_workdir: Path, tmp_path: Path) -> None:
    """The reproduction of the issue: two `reconciler run` processes, one machine, the default local
    provider, a job `train` in each repository with different commands. Before, each daemon terminated
    the other's worker as a replaced run, every tick, without end."""
    local = Setup(None, None, lambda: LocalAdapter("local"))
    repos = [
        repository(tmp_path, name, local, [sys.executable, "-c", f"import time; time.sleep({seconds})"])
        for name, seconds in (("repo-a", 300), ("repo-b", 301))
    ]
    daemons = [
        zygote.popen([sys.executable, "-m", "reconciler", "run", "--repo", str(r.path), "--tick-seconds", "0.5"],
                     stdout=open(tmp_path / f"daemon-{i}.log", "wb"), stderr=subprocess.STDOUT)
        for i, r in enumerate(repos)
    ]
    try:
        deadline = time.monotonic() + 90
        while not all(phase_of(r) == "Running" for r in repos):
            assert time.monotonic() < deadline and all(d.poll() is None for d in daemons), logs(tmp_path)
            time.sleep(0.5)
        time.sleep(6)  # about a dozen ticks each with both workers live
    finally:
        for d in daemons:
            d.send_signal(signal.SIGTERM)
            d.wait(30)
    for r in repos:
        st = yaml.safe_load(r.status_text("train"))
        assert st["phase"] == "Running" and len(st["attempts"]) == 1, (st, logs(tmp_path))
    live = [ref for ref, s in LocalAdapter("local").observe().items() if s.phase is WorkerPhase.RUNNING]
    assert len(live) == 2
    assert "workers of other state repositories seen, left alone" in " ".join(logs(tmp_path).split())


def phase_of(repo: StateRepoFixture) -> str:
    """The phase in the status file the daemon checks out (empty while it is being written)."""
    path = repo.path / "status" / "train.yaml"
    st = yaml.safe_load(path.read_text()) if path.exists() else None
    return str(st.get("phase")) if isinstance(st, dict) else ""


def logs(tmp_path: Path) -> str:
    return "".join(p.read_text(errors="replace")[-2000:] for p in sorted(tmp_path.glob("daemon-*.log")))
