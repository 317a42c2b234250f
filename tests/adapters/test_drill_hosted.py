"""`reconciler drill --to` a hosted provider, against its fake: the run starts on the local provider,
the drill kills it with no notice and the relaunch goes to the fake Vast (a real worker process
there, run storage in S3 on the moto server); the resumed run must report the same steps."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from desired.models import LocalSettings, VastSettings
from reconciler.daemon.loop import Reconciler
from status.models import Outcome
from tests.adapters import e2e
from tests.conftest import StateRepoFixture
from tests.daemon.test_drill_local import tick_until_exit, waiting_cli
from tests.daemon.test_loop_local import WORKLOAD, tick_until
from tests.fakes.vast import FakeVast, served
from tests.worker.conftest import s3_endpoint  # noqa: F401 - a fixture


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeVast]:
    yield from served(tmp_path / "vast", monkeypatch)


@pytest.mark.slow
def test_a_drill_moved_from_the_local_provider_to_vast_resumes_there_exactly(
        fake: FakeVast, state_repo: StateRepoFixture, local_workdir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, s3_endpoint: str) -> None:  # noqa: F811 - a fixture
    e2e.daemon_env(monkeypatch)
    bucket = e2e.s3_storage(state_repo, s3_endpoint, tick_seconds=0.5)
    state_repo.write("desired/here.yaml", e2e.priced("here", LocalSettings(), 0.1))  # cheaper: chosen first
    state_repo.write("desired/vast.yaml", e2e.priced("vast", VastSettings(api_url=fake.url, request_timeout_seconds=5,
                                                                         max_price_per_hour=40), 0.4))
    job = e2e.s3_job("count", "here", 0.1, 400)
    # The counter as `python -c`: the worker imports this checkout's package from its working directory.
    job["spec"]["command"] = [sys.executable, "-c", Path(WORKLOAD).read_text(), "0.1"]
    job["spec"]["placement"]["providers"] = ["here", "vast"]
    state_repo.write("desired/count.yaml", yaml.safe_dump(job))
    state_repo.commit("count on here, vast beside it, runs in s3")
    rec = Reconciler(state_repo.path)
    tick_until(rec, lambda r: r.statuses["count"].phase.value == "Running"
               and e2e.s3_step(s3_endpoint, bucket, "count") >= 12, timeout=120)
    code, out = tick_until_exit(rec, waiting_cli(state_repo, "count", "--to", "vast"), timeout=180)
    assert code == 0, out
    st = tick_until(rec, lambda r: True).statuses["count"]
    d = st.drill
    assert d is not None and d.verdict == "exact" and d.to == "vast", d
    assert d.step is not None and d.resumed_step == d.step
    assert [a.provider for a in st.attempts] == ["here", "vast"]
    assert st.attempts[0].outcome == Outcome.CANCELLED and "a drill: charged to nothing" in st.attempts[0].detail
    assert (st.failures, st.unproductive) == (0, 0)
