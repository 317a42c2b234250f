"""`reconciler drill` end to end: real worker processes on the local provider, a real git repository
and run storage, the daemon's ticks. A drill of the demo's model is exact; a workload that leaves
its scheduler out of restore() is reported at the first step that differs, with the usual causes;
the drill's interruption is charged to nothing."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml
from starlette.testclient import TestClient

from reconciler.daemon.loop import Reconciler, TickReport
from reconciler.web.app import create_app
from status.models import Drill as DrillStatus
from status.models import DrillPhase, JobStatus, Outcome, Phase
from tests import zygote
from tests.cli.test_cli import cli
from tests.conftest import StateRepoFixture
from tests.daemon.test_loop_local import tick_until

DRILLED = Path(__file__).parent / "workloads" / "drilled.py"


def job(name: str, command: list[str], env: dict[str, str] | None = None, target: int = 400,
        extra: dict[str, object] | None = None) -> str:
    return yaml.safe_dump({
        "apiVersion": "reconciler.dev/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"command": command, "target_steps": target, "checkpoint_every": 10,
                 "env": {"DEMO_STEP_SECONDS": "0.05", **(env or {})},
                 "retry": {"max_retries": 0, "backoff_seconds": 0.2}, **(extra or {})},
    })


def forgetful() -> list[str]:
    """The workload run as `python -c`, so that the worker imports the package from its working
    directory (this checkout), as the demo's `python -m` does."""
    return [sys.executable, "-c", DRILLED.read_text()]


def running_with_checkpoint(state_repo: StateRepoFixture, rec: Reconciler, name: str) -> JobStatus:
    """Ticks until the job's worker runs and has a durable checkpoint."""
    def ready(r: TickReport) -> bool:
        st = r.statuses.get(name)
        return (st is not None and st.phase == Phase.RUNNING
                and any((state_repo.storage / name / st.run_id / "checkpoints").glob("*")))
    return tick_until(rec, ready, timeout=90).statuses[name]


def waiting_cli(state_repo: StateRepoFixture, *args: str) -> subprocess.Popen[str]:
    """`reconciler drill ...` started as a user would, waiting for its verdict; returns once its
    request is committed (so that the test's ticks never race its commit)."""
    head = state_repo.git("rev-parse", "HEAD")
    proc = zygote.popen([sys.executable, "-m", "reconciler", "drill", *args, "--repo", str(state_repo.path)],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                        env={**os.environ, "COLUMNS": "240"})
    deadline = time.time() + 60
    while state_repo.git("rev-parse", "HEAD") == head:
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.1)
    return proc


def tick_until_exit(rec: Reconciler, proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str]:
    tick_until(rec, lambda _: proc.poll() is not None, timeout=timeout, between=0.3)
    out, errors = proc.communicate()
    return proc.returncode, out + errors


def drilled(rec: Reconciler, name: str, timeout: float = 120) -> JobStatus:
    def done(r: TickReport) -> bool:
        d = r.statuses[name].drill
        return d is not None and d.phase == DrillPhase.DONE
    return tick_until(rec, done, timeout=timeout).statuses[name]


def test_the_demo_model_on_the_local_provider_drills_exact_first_by_itself_then_on_request_charged_to_nothing(
        state_repo: StateRepoFixture, local_workdir: Path) -> None:
    state_repo.write("desired/demo.yaml", job("demo", [sys.executable, "-m", "reconciler.demo.train"],
                                              extra={"drill": "first_checkpoint"}))
    state_repo.commit("add demo")
    rec = Reconciler(state_repo.path)
    first = drilled(rec, "demo").drill  # spec.drill: first_checkpoint, after the run's first durable checkpoint
    assert first is not None and first.id.startswith("first-") and first.verdict == "exact", first
    running_with_checkpoint(state_repo, rec, "demo")
    code, out = tick_until_exit(rec, waiting_cli(state_repo, "demo"))
    said = " ".join(out.split())
    assert code == 0 and "requested: committed" in said and "demo: drill exact: steps" in said, out
    st = tick_until(rec, lambda r: True).statuses["demo"]
    d = st.drill
    assert d is not None and d.id != first.id and d.verdict == "exact", d
    assert d.step is not None and d.resumed_step == d.step and d.killed_at == d.step + 5
    for drill_end in st.attempts[:2]:
        assert drill_end.outcome == Outcome.CANCELLED and "a drill: charged to nothing" in drill_end.detail
    assert (st.failures, st.unproductive) == (0, 0)
    assert st.phase in (Phase.RUNNING, Phase.LAUNCHING) and st.current is not None and st.current.epoch == 3
    subjects = state_repo.git("log", "--format=%s", "--", "status/demo.yaml").splitlines()
    assert subjects.count("demo: drill exact") == 2
    listed = json.loads(cli("status", "--repo", str(state_repo.path), "--json").stdout)
    assert [row["drill"] for row in listed] == [d.summary()]
    described = " ".join(cli("describe", "demo", "--repo", str(state_repo.path)).stdout.split())
    assert f"drill {d.id}: exact: steps {d.step + 1}..{d.step + 5} reported the same metrics" in described
    shown = cli("logs", "demo", "--attempt", "2", "--repo", str(state_repo.path))
    assert f"ended: drill {d.id}: killed with no notice" in " ".join(shown.stderr.split())
    assert f"drill {d.id} requested" in shown.stdout  # the worker's own log says it took the drill up


def test_a_scheduler_left_out_of_restore_is_reported_at_the_first_step_that_differs(
        state_repo: StateRepoFixture, local_workdir: Path) -> None:
    state_repo.write("desired/slip.yaml", job("slip", forgetful(), {"FORGET_SCHEDULER": "1"}))
    state_repo.commit("add slip")
    rec = Reconciler(state_repo.path)
    running_with_checkpoint(state_repo, rec, "slip")
    code, out = tick_until_exit(rec, waiting_cli(state_repo, "slip", "--lookahead", "3", "--json"))
    assert code == 1, out
    d = DrillStatus.model_validate(json.loads(out)["drill"])
    assert d.verdict == "diverged", d
    assert d.step is not None and f"first difference at step {d.step + 1}" in d.detail
    assert "lr was" in d.detail and "restore()" in d.detail and "RNG" in d.detail
    page = TestClient(create_app(state_repo.path)).get("/job/slip").text  # the job page overlays the two sides
    drill_section = re.search(r'<p class="drill v-failed" id="drill">(.*?)</p>.*?<div class="charts" id="drill-charts">'
                              r'(.*?)</div>\s*<p class="hint">', page, re.S)
    assert drill_section, page
    assert f"drill {d.id}: diverged: first difference at step {d.step + 1}" in html.unescape(drill_section.group(1))
    charts = drill_section.group(2)
    for metric in ("loss", "lr"):
        chart = re.search(rf'data-metric="{metric}">(.*?)</svg>', charts, re.S)
        assert chart and chart.group(1).count('data-label="before the interruption"') == 1
        assert chart.group(1).count('data-label="after the resume"') == 1


def test_a_job_without_a_durable_checkpoint_is_refused_in_one_sentence(
        state_repo: StateRepoFixture, local_workdir: Path) -> None:
    state_repo.write("desired/slow.yaml", job("slow", [sys.executable, "-m", "reconciler.demo.train"],
                                              {"DEMO_STEP_SECONDS": "5"}))
    state_repo.commit("add slow")
    rec = Reconciler(state_repo.path)
    tick_until(rec, lambda r: r.statuses["slow"].phase == Phase.RUNNING, timeout=60)
    head = state_repo.git("rev-parse", "HEAD")
    res = cli("drill", "slow", "--repo", str(state_repo.path), check=False)
    assert res.returncode == 1
    said = " ".join(res.stderr.split())
    assert "slow has no durable checkpoint yet" in said and "--force" in said and said.count(". ") == 0
    assert state_repo.git("rev-parse", "HEAD") == head  # nothing committed


def test_a_notice_drill_stops_on_sigterm_with_a_final_checkpoint_and_loses_no_step(
        state_repo: StateRepoFixture, local_workdir: Path) -> None:
    state_repo.write("desired/demo.yaml", job("demo", [sys.executable, "-m", "reconciler.demo.train"]))
    state_repo.commit("add demo")
    rec = Reconciler(state_repo.path)
    running_with_checkpoint(state_repo, rec, "demo")
    code, out = tick_until_exit(rec, waiting_cli(state_repo, "demo", "--notice"))
    assert code == 0, out
    st = tick_until(rec, lambda r: True).statuses["demo"]
    d = st.drill
    assert d is not None and d.notice and d.verdict == "exact" and d.steps_lost == 0, d
    assert d.resumed_step == d.step and d.grace_used is not None and 0 <= d.grace_used < 30
    assert "0 steps lost" in d.detail and st.attempts[0].outcome == Outcome.CANCELLED
    assert (st.failures, st.unproductive) == (0, 0)
