"""The failure rate the worker's checkpoint interval is chosen from: the planner learns the
provider's MTBF (reconciler.planner.outlook.reliability), the launch carries it, and the executor puts it in the
worker's environment as RECONCILER_MTBF_SECONDS, where a real local worker reads it."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from adapters.compute import with_mtbf
from adapters.local import LocalAdapter
from desired.models import LocalSettings, Settings
from reconciler.daemon.execute import execute
from reconciler.planner.outlook.reliability import PRIOR_RELIABLE_MTBF_SECONDS, PRIOR_SPOT_MTBF_SECONDS
from reconciler.planner.plan import Launch, Observed, plan
from status.models import Attempt, JobStatus, Outcome, Phase
from tests.planner.test_plan import NOW, PROVIDERS, desired, job_yaml

SPOT = """
apiVersion: reconciler.dev/v1
kind: Provider
metadata: {name: spot}
spec: {settings: {type: sim, interruptible: true}, concurrency: 4}
"""


def launch_of(p: object) -> Launch:
    launches = [a for a in p.actions if isinstance(a, Launch)]  # type: ignore[attr-defined]
    assert len(launches) == 1, launches
    return launches[0]


def history(job: str, provider: str, hours: list[float], outcome: Outcome, end: float = NOW - 60) -> JobStatus:
    """A finished job whose attempts on `provider` ran `hours` each, one after the other up to
    `end`, and ended with `outcome`."""
    st = JobStatus(job=job, phase=Phase.SUCCEEDED)
    t = end - sum(hours) * 3600
    for i, h in enumerate(hours, start=1):
        st.attempts.append(Attempt(epoch=i, provider=provider, worker=f"{job}.e{i}", started=t,
                                   ended=t + h * 3600, outcome=outcome))
        t += h * 3600
    return st


def test_a_provider_with_no_record_gets_the_prior_for_its_kind() -> None:
    reliable = launch_of(plan(desired(job_yaml()), Observed(), {}, NOW))
    assert (reliable.provider, reliable.mtbf_seconds) == ("free", PRIOR_RELIABLE_MTBF_SECONDS)
    spot = launch_of(plan(desired(job_yaml(), providers=SPOT), Observed(), {}, NOW))
    assert (spot.provider, spot.mtbf_seconds) == ("spot", PRIOR_SPOT_MTBF_SECONDS)


def test_interruptions_on_the_provider_set_the_figure_and_quiet_machine_time_lengthens_it() -> None:
    d = desired(job_yaml(), providers=SPOT)
    quiet = {"old": history("old", "spot", [2.0, 2.0, 2.0], Outcome.SUCCEEDED)}
    stormy = {"old": history("old", "spot", [1.0, 0.5, 1.5, 1.0], Outcome.INTERRUPTION)}
    calm = launch_of(plan(d, Observed(), quiet, NOW)).mtbf_seconds
    rough = launch_of(plan(d, Observed(), stormy, NOW)).mtbf_seconds
    assert calm is not None and calm > PRIOR_SPOT_MTBF_SECONDS  # 6 h without a failure: longer than the prior
    assert rough is not None and 3600 <= rough <= 1.5 * 3600  # one an hour, as observed, not pulled to 6 h


def test_the_job_s_own_interrupted_attempts_count() -> None:
    d = desired(job_yaml(), providers=SPOT)
    run_id = d.jobs["train"].run_id()
    own = history("train", "spot", [0.5, 0.5], Outcome.INTERRUPTION)
    own.run_id, own.phase, own.manifest = run_id, Phase.PENDING, "desired/job0.yaml"
    launch = launch_of(plan(d, Observed(), {"train": own}, NOW))
    assert launch.mtbf_seconds is not None and 1800 <= launch.mtbf_seconds <= 2 * 1800


def test_the_figure_reaches_the_next_worker_on_the_local_provider(tmp_path: Path) -> None:
    """Five interruptions a few seconds apart on a provider whose machines nobody takes away (prior:
    30 days): the next worker's RECONCILER_MTBF_SECONDS is within ten times what was observed."""
    d = desired(job_yaml(command=json.dumps([sys.executable, "-c", (
        "import json, os, sys; json.dump({k: v for k, v in os.environ.items() if k.startswith('RECONCILER_')}, "
        "open(sys.argv[1], 'w'))"), str(tmp_path / "env.json")])),
        providers=PROVIDERS.split("---")[0])  # free alone: lost workers put a provider last (planner.health)
    stormy = {"old": history("old", "free", [4 / 3600] * 5, Outcome.INTERRUPTION)}  # 4 s each
    p = plan(d, Observed(), stormy, NOW)
    launch = launch_of(p)
    assert launch.provider == "free" and launch.mtbf_seconds is not None and launch.mtbf_seconds <= 40
    adapter = LocalAdapter("free", LocalSettings(workdir=str(tmp_path / "wd")), owner="test-owner")
    report = execute(p.actions, jobs=d.jobs, adapters={"free": adapter},
                     settings=Settings(storage=f"file://{tmp_path}/runs"))
    try:
        assert [r.error for r in report.launches] == [None]
        deadline = time.monotonic() + 30
        while not (tmp_path / "env.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        seen = json.loads((tmp_path / "env.json").read_text())
    finally:
        for ref in adapter.observe():
            adapter.terminate(ref)
    assert seen["RECONCILER_MTBF_SECONDS"] == str(int(launch.mtbf_seconds))
    assert seen["RECONCILER_EPOCH"] == "1" and seen["RECONCILER_JOB"] == "train"


def test_no_figure_means_no_variable() -> None:
    assert "RECONCILER_MTBF_SECONDS" not in with_mtbf({"A": "1"}, None)
    assert with_mtbf({}, 7200.4) == {"RECONCILER_MTBF_SECONDS": "7200"}
