"""`reconciler drill` says no, in one sentence, before it commits anything: a job that is not
running, one without a durable checkpoint, one whose deadline the forecast already has at risk, one
whose budget the drill would pass, an unknown `--to`; `--force` drills anyway."""

from __future__ import annotations

import json
from pathlib import Path

from desired.parse import DesiredState
from reconciler.cli.drill import drill_cost, estimate, refused
from status.models import Attempt, Forecast, JobStatus, Phase
from tests.planner.test_plan import NOW, desired, job_yaml, with_attempt


def running_status(d: DesiredState, tmp_path: Path, durable: int = 20, **forecast: object) -> JobStatus:
    """A running attempt whose run folder (under tmp_path) holds a checkpoint of step `durable`."""
    st = with_attempt(d, first_beat=NOW - 90)
    st.attempts = [a.model_copy(update={"run_id": st.run_id}) for a in st.attempts]
    st.storage = f"file://{tmp_path}/runs"
    st.forecast = Forecast(**forecast)  # type: ignore[arg-type]
    if durable:
        ckpt = tmp_path / "runs" / "train" / st.run_id / "checkpoints" / f"{durable:012d}-e1"
        ckpt.mkdir(parents=True)
        (ckpt / "COMMIT.json").write_text(json.dumps({"step": durable, "epoch": 1, "files": {}}))
    return st


def test_a_job_that_is_not_running_is_refused() -> None:
    d = desired(job_yaml())
    said = refused("train", JobStatus(job="train", phase=Phase.PENDING), d, None, False, 5)
    assert said == "train is not running (Pending); a drill interrupts a running worker, so start the job first"
    assert refused("nope", None, d, None, True, 5).startswith("no job named nope in desired/ at HEAD")


def test_a_job_without_a_durable_checkpoint_is_refused_unless_forced(tmp_path: Path) -> None:
    d = desired(job_yaml())
    st = running_status(d, tmp_path, durable=0)
    said = refused("train", st, d, None, False, 5)
    assert said.startswith("train has no durable checkpoint yet") and "--force" in said and said.count(".") == 0
    assert refused("train", st, d, None, True, 5) == ""


def test_a_deadline_the_forecast_has_at_risk_is_refused_unless_forced(tmp_path: Path) -> None:
    d = desired(job_yaml())
    st = running_status(d, tmp_path, risk="at risk")
    said = refused("train", st, d, None, False, 5)
    assert said.startswith("the forecast already says train's deadline is at risk") and "--force" in said
    assert refused("train", st, d, None, True, 5) == ""
    assert refused("train", running_status(d, tmp_path / "b", risk="on track"), d, None, False, 5) == ""


def test_a_drill_that_would_pass_the_budget_is_refused_and_its_cost_is_said(tmp_path: Path) -> None:
    d = desired(job_yaml(extra="  budget_usd: 10"))
    st = running_status(d, tmp_path, rate_steps_per_hour=600.0, projected_cost_usd=9.99)
    st.attempts = [a.model_copy(update={"provider": "paid"}) for a in st.attempts]
    hours, usd = drill_cost(st, d, 60)  # 60 steps at 600/h = 6 min, and the attempt's 10 s start-up
    assert hours is not None and abs(hours - (0.1 + 10 / 3600)) < 1e-9 and abs(usd - hours * 0.5) < 1e-9
    said = refused("train", st, d, None, False, 60)
    assert said.startswith("train's projected cost ($9.99) and the drill's would pass its budget of $10")
    assert estimate(st, d, 60).endswith("on paid: about 6.2 min, $0.05 at the provider's price")


def test_an_unknown_provider_for_the_relaunch_is_refused(tmp_path: Path) -> None:
    d = desired(job_yaml())
    said = refused("train", running_status(d, tmp_path), d, "elsewhere", True, 5)
    assert said.startswith("--to elsewhere: no provider of that name in desired/")


def test_the_estimate_says_when_the_rate_is_not_measured_yet(tmp_path: Path) -> None:
    d = desired(job_yaml())
    st = running_status(d, tmp_path)
    st.attempts = [Attempt(epoch=1, provider="free", worker="w", started=NOW, run_id=st.run_id)]
    assert "(not yet measured for this run)" in estimate(st, d, 5)
