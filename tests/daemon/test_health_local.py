"""Provider health with real processes: a local provider whose working directory is a file refuses
every launch ("Not a directory"); the refusal cools it down for every job, and costs no attempt number."""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path

import pytest
import yaml

from adapters.local import LocalAdapter
from reconciler.clock import ManualClock
from reconciler.daemon.loop import Reconciler, TickReport
from reconciler.daemon.metrics import Metrics, serve
from reconciler.planner.health import REFUSAL_COOLDOWN_SECONDS
from status.models import Outcome, Phase
from tests.cli.test_cli import cli
from tests.conftest import StateRepoFixture
from tests.daemon.test_loop_local import counter, job, tick_until
from tests.daemon.test_metrics import scrape, value


def providers(blocker: Path) -> str:
    def one(name: str, price: float, workdir: str | None) -> dict[str, object]:
        settings = {"type": "local", **({"workdir": workdir} if workdir else {})}
        return {"apiVersion": "reconciler.dev/v1", "kind": "Provider", "metadata": {"name": name},
                "spec": {"settings": settings, "concurrency": 4, "price_per_hour": price}}
    return yaml.safe_dump_all([one("broken", 0.0, str(blocker / "workers")), one("good", 0.01, None)])


def test_a_refused_launch_cools_the_provider_down_for_jobs_committed_later(
        state_repo: StateRepoFixture, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the provider's working directory should be\n")
    state_repo.write("desired/providers.yaml", providers(blocker))
    state_repo.write("desired/a.yaml", job("a", counter(0.5)))
    state_repo.commit("a, on the cheaper provider first")
    clock = ManualClock(time.time())
    rec = Reconciler(state_repo.path, clock=clock)
    first = rec.tick().statuses["a"]
    assert [r.provider for r in first.refusals] == ["broken"] and "Not a directory" in first.refusals[0].error
    assert not first.attempts

    clock.advance(27)
    state_repo.write("desired/b.yaml", job("b", counter(0.5)))
    state_repo.write("desired/c.yaml", job("c", counter(0.5), "placement: {providers: [broken]}"))
    state_repo.commit("b and c, 27 s later")
    with caplog.at_level(logging.INFO, logger="reconciler"):
        report = rec.tick()
    a, b, c = (report.statuses[n] for n in "abc")
    assert [x.provider for x in b.attempts] == ["good"] and not b.refusals  # b never tried broken
    assert [x.provider for x in a.attempts] == ["good"] and len(a.refusals) == 1
    # The refusal used up no attempt number: the log, the message and `describe` (#1) agree.
    assert a.attempts[0].epoch == 1 and a.message.startswith("attempt 1 launched on good")
    assert any(r.getMessage().startswith("launched a attempt 1 on good") for r in caplog.records)
    assert c.phase == Phase.PENDING and not c.attempts and not c.refusals
    assert c.message.startswith("waiting: broken is cooling down until ")
    assert c.message.endswith(f"Not a directory: '{blocker}/workers')")


def refused_once(state_repo: StateRepoFixture, tmp_path: Path) -> TickReport:
    """One tick of job `a`, allowed only on `broken`, whose working directory is a file."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file\n")
    state_repo.write("desired/providers.yaml", providers(blocker))
    state_repo.write("desired/a.yaml", job("a", counter(0.5), "placement: {providers: [broken]}"))
    state_repo.commit("a, on broken only")
    return Reconciler(state_repo.path).tick()


def test_plan_says_what_waits_and_why_and_describe_lists_the_refusals(
        state_repo: StateRepoFixture, tmp_path: Path) -> None:
    refused = refused_once(state_repo, tmp_path).statuses["a"]
    assert [r.provider for r in refused.refusals] == ["broken"]
    out = cli("plan", "--repo", str(state_repo.path)).stdout
    assert "the world matches the desired state" not in out
    assert "no actions now: 1 job is waiting (why, below)" in out
    assert "provider broken is cooling down until " in out and "(refused: local provider 'broken'" in out
    assert "a: Pending — waiting: broken is cooling down until " in out
    described = cli("describe", "a", "--repo", str(state_repo.path)).stdout
    assert "refused launches (the newest few)" in described and "Not a directory" in described


def test_the_metrics_show_each_providers_health(state_repo: StateRepoFixture, tmp_path: Path) -> None:
    metrics = Metrics()
    report = refused_once(state_repo, tmp_path)
    metrics.record(report)
    refused_at = report.statuses["a"].refusals[0].refused
    server, port = serve(metrics, "127.0.0.1", 0)
    try:
        got = scrape(port)
    finally:
        server.shutdown()
        server.server_close()
    assert value(got, "reconciler_provider_state", provider="broken", state="cooling-down") == 1
    assert value(got, "reconciler_provider_state", provider="broken", state="healthy") == 0
    assert value(got, "reconciler_provider_state", provider="good", state="healthy") == 1
    assert value(got, "reconciler_provider_cooldown_until_timestamp_seconds",
                 provider="broken") == refused_at + REFUSAL_COOLDOWN_SECONDS
    assert value(got, "reconciler_provider_cooldown_until_timestamp_seconds", provider="good") is None
    assert value(got, "reconciler_provider_recent_refusals", provider="broken") == 1
    assert value(got, "reconciler_provider_recent_lost_workers", provider="broken") == 0
    assert value(got, "reconciler_provider_strikes", provider="broken") == 1


def test_a_provider_that_lost_two_workers_is_not_chosen_over_one_that_lost_one(
        state_repo: StateRepoFixture) -> None:
    """cheap loses x's and y's workers 25 s apart, dear then loses z's: z stays on dear, whose
    cool-down (one loss) ends before cheap's (two in a row, so doubled)."""
    two = [{"apiVersion": "reconciler.dev/v1", "kind": "Provider", "metadata": {"name": name},
            "spec": {"settings": {"type": "local"}, "concurrency": limit, "price_per_hour": price}}
           for name, price, limit in (("cheap", 0.0, 2), ("dear", 0.01, 4))]
    state_repo.write("desired/providers.yaml", yaml.safe_dump_all(two))
    for name in "xyz":
        state_repo.write(f"desired/{name}.yaml", job(name, counter(0.5)))
    state_repo.commit("x, y and z")
    clock = ManualClock(time.time())
    rec = Reconciler(state_repo.path, clock=clock)
    report = rec.tick()
    assert {n: report.statuses[n].attempts[-1].provider for n in "xyz"} == {"x": "cheap", "y": "cheap", "z": "dear"}

    def lose(name: str) -> TickReport:
        """Kill the job's worker once it has saved a checkpoint (a signal is then an interruption)."""
        cur = rec.tick().statuses[name].current
        assert cur is not None
        tick_until(rec, lambda r: r.statuses[name].progress.step > cur.step_start)
        adapter = LocalAdapter(cur.provider)
        ref = next(r for r in adapter.observe() if r.job == name and r.epoch == cur.epoch)
        # The provider's word that the machine is gone: a bare SIGKILL on a machine still there is an
        # unconfirmed interruption, which says nothing of the provider (Attempt.provider_ended).
        assert adapter.kill_worker(ref, signal.SIGKILL, preempt=True)
        return tick_until(rec, lambda r: r.statuses[name].attempts[0].outcome is not None)

    assert lose("x").statuses["x"].attempts[0].outcome == Outcome.INTERRUPTION
    clock.advance(25)
    lose("y")
    clock.advance(10)
    report = lose("z")
    z = report.statuses["z"]
    assert [(a.provider, a.outcome) for a in z.attempts] == [("dear", Outcome.INTERRUPTION), ("dear", None)]
    assert {n: report.statuses[n].attempts[-1].provider for n in "xy"} == {"x": "dear", "y": "dear"}


def test_a_launch_that_may_have_started_a_worker_keeps_its_epoch(tmp_path: Path) -> None:
    """A refusal before anything started gives its epoch back; a launch whose answer was lost (a
    timeout after the provider acted) does not: the next launch must not write under the same epoch
    as a worker that may be running (found by the simulator's chaos run)."""
    import json
    import sys

    from adapters.compute import LaunchSpec, ProviderUnavailable, WorkerRef
    from desired.models import LocalSettings, Settings
    from reconciler.daemon.execute import execute
    from reconciler.planner.plan import Launch, Observed, plan
    from tests.planner.test_plan import PROVIDERS, desired, job_yaml

    class AnswerLost(LocalAdapter):
        def launch(self, spec: LaunchSpec) -> WorkerRef:
            super().launch(spec)
            raise ProviderUnavailable("local provider 'free': launch timed out (it may have happened)")

    command = json.dumps([sys.executable, "-c", "import time; time.sleep(30)"])
    d = desired(job_yaml(command=command), providers=PROVIDERS.split("---")[0])
    actions = [a for a in plan(d, Observed(), {}, time.time()).actions if isinstance(a, Launch)]
    adapter = AnswerLost("free", LocalSettings(workdir=str(tmp_path / "wd")), owner="test-owner")
    settings = Settings(storage=f"file://{tmp_path}/runs")
    try:
        for _ in range(2):
            report = execute(actions, jobs=d.jobs, adapters={"free": adapter}, settings=settings)
            assert [r.error for r in report.launches] == ["local provider 'free': launch timed out (it may have "
                                                          "happened)"]
        epochs = sorted(ref.epoch for ref in adapter.observe())
        assert epochs == [1, 2]  # the second launch did not take the first one's epoch again
    finally:
        for ref in adapter.observe():
            adapter.terminate(ref)
