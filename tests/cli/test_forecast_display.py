"""Time and money where users look: `status/README.md`, `reconciler status` (table, --json, --job)
and `reconciler plan`, from the forecast the planner writes into each job's status."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

from desired.parse import parse_desired
from reconciler.daemon.loop import Reconciler
from status.models import (
    Attempt,
    Forecast,
    JobStatus,
    Outcome,
    Phase,
    Progress,
    ProviderForecast,
    hours,
    iso,
    money,
    parse_status,
    render_index,
    render_status,
    short_note,
    when,
)
from tests.cli.test_cli import cli
from tests.conftest import StateRepoFixture
from tests.daemon.test_loop_local import counter, job

ETA = datetime(2027, 1, 1, 10, 20, tzinfo=UTC).timestamp()
DEADLINE = "2027-01-31T00:00:00Z"

BOX = """\
apiVersion: reconciler.dev/v1
kind: Provider
metadata: {name: box}
spec:
  settings: {type: local, workdir: %s}
  price_per_hour: 2.0
"""


def forecast(**over: object) -> Forecast:
    fields: dict[str, object] = dict(
        rate_steps_per_hour=15.0, eta=ETA, spent_usd=3.2, projected_cost_usd=11.0, slack_hours=14.0,
        risk="on track", decision="on box: 14 h of slack covers the expected 3 h of losses", placement="box",
        providers={"box": ProviderForecast(hours=3.9, cost_usd=7.8, measured=True),
                   "spot": ProviderForecast(hours=4.5, cost_usd=1.4, measured=False)})
    return Forecast.model_validate({**fields, **over})


def run_id(state_repo: StateRepoFixture, name: str) -> str:
    files = {f"desired/{p.name}": p.read_bytes() for p in (state_repo.path / "desired").glob("*.yaml")}
    return parse_desired(files).jobs[name].run_id()


def seed(state_repo: StateRepoFixture, tmp_path: Path) -> None:
    """Two jobs on a priced provider: `count` has run two hours on it and carries a forecast, as the
    reconciler writes it; `fresh` has never run."""
    state_repo.write("desired/box.yaml", BOX % (tmp_path / "box"))
    state_repo.write("desired/count.yaml", job("count", counter(1.0), f"deadline: {DEADLINE}\nbudget_usd: 50\n"
                                                                        "placement: {providers: [box]}"))
    state_repo.write("desired/fresh.yaml", job("fresh", counter(1.0), "placement: {providers: [box]}"))
    now = time.time()
    st = JobStatus(job="count", phase=Phase.BACKOFF, run_id=run_id(state_repo, "count"),
                   manifest="desired/count.yaml", message="relaunch after: interrupted",
                   progress=Progress(step=30, target=60), total_attempts=1, interruptions=1, cost_usd=3.2,
                   attempts=[Attempt(epoch=1, provider="box", worker="w1", started=now - 3 * 3600,
                                     ended=now - 3600, outcome=Outcome.INTERRUPTION, step_end=30, cost_usd=3.2)],
                   forecast=forecast())
    state_repo.write("status/count.yaml", render_status(st))
    state_repo.commit("two jobs; count has a status with a forecast")


def test_the_forecast_round_trips_through_the_status_file() -> None:
    st = JobStatus(job="count", phase=Phase.RUNNING, forecast=forecast())
    text = render_status(st)
    assert f"eta: '{iso(ETA)}'" in text
    again = parse_status(text)
    assert again is not None and again.forecast == st.forecast


def test_status_readme_table_shows_eta_cost_and_risk() -> None:
    running = JobStatus(job="count", phase=Phase.RUNNING, message="attempt 2 running on box",
                        progress=Progress(step=30, target=60), forecast=forecast())
    fresh = JobStatus(job="fresh", phase=Phase.PENDING, message="waiting | for box", forecast=Forecast(
        note="rate not measured yet: less than 15 min of attempt time with progress"))
    late = JobStatus(job="late", phase=Phase.RUNNING, forecast=forecast(risk="at risk", slack_hours=-2.5))
    done = JobStatus(job="done", phase=Phase.SUCCEEDED, cost_usd=12.34, message="run completed")
    lines = render_index([running, fresh, late, done], []).splitlines()
    header = next(line for line in lines if line.startswith("| job |"))
    assert header == ("| job | phase | progress | attempts | interruptions | failures | ETA (UTC) | spent / projected "
                      "| risk | message |")
    rows = {line.split(" | ")[0][2:]: line for line in lines if line.startswith("| ") and line != header}
    assert rows["count"] == ("| count | Running | 30/60 (50%) | 0 | 0 | 0 | 2027-01-01 10:20 | $3.20 / $11 "
                             "| on track (14 h slack) | attempt 2 running on box |")
    assert "| not measured | $0.00 / ? |  | waiting \\| for box |" in rows["fresh"]
    assert "| at risk (2.5 h short) |" in rows["late"]
    assert rows["done"].endswith("| Succeeded | 0 | 0 | 0 | 0 |  | $12 |  | run completed |")
    assert all(line.count(" | ") == header.count(" | ") for line in rows.values())
    due = render_index([running], [], deadlines={"count": ETA + 86400}).splitlines()[-1]
    assert f"| on track (14 h slack, due {when(ETA + 86400)}) |" in due


def test_figures_are_compact() -> None:
    assert [money(x) for x in (0, 3.2, 9.999, 11.0, 1234.5)] == ["$0.00", "$3.20", "$10.00", "$11", "$1,234"]
    assert [hours(x) for x in (0.25, 2.0, 2.5, 14.0)] == ["15 min", "2 h", "2.5 h", "14 h"]
    assert short_note("rate not measured yet: no durable progress") == "not measured"
    assert short_note("no target_steps: the work left is unknown, so there is no ETA") == "no target_steps"


def test_a_failed_job_keeps_no_eta() -> None:
    """A failed run's status may still hold its last forecast: the table shows its cost, no ETA."""
    failed = JobStatus(job="f", phase=Phase.FAILED, cost_usd=2.0, forecast=forecast())
    row = render_index([failed], []).splitlines()[-1]
    assert "2027-01-01" not in row and "on track" not in row and "| $2.00 |" in row


def test_status_table_json_and_job_view_show_the_forecast(state_repo: StateRepoFixture, tmp_path: Path) -> None:
    seed(state_repo, tmp_path)
    rows = {r["job"]: r for r in json.loads(cli("status", "--repo", str(state_repo.path), "--json").stdout)}
    count, fresh = rows["count"], rows["fresh"]
    assert count["eta"] == "2027-01-01T10:20:00Z" and count["deadline"] == DEADLINE
    assert (count["spent_usd"], count["projected_cost_usd"], count["slack_hours"]) == (3.2, 11.0, 14.0)
    assert count["risk"] == "on track" and count["decision"].startswith("on box: 14 h of slack")
    assert count["note"] == ""
    assert fresh["eta"] is None and fresh["projected_cost_usd"] is None and fresh["spent_usd"] == 0.0
    assert fresh["phase"] == "New" and fresh["risk"] == "" and fresh["deadline"] is None

    table = cli("status", "--repo", str(state_repo.path)).stdout
    assert "ETA (UTC)" in table and "spent / projected" in table and "risk" in table
    line = next(x for x in table.splitlines() if x.startswith("count "))
    assert "2027-01-01 10:20" in line and "$3.20 / $11" in line
    assert "on track (14 h slack, due 2027-01-31 00:00)" in line
    said = next(x for x in table.splitlines() if x.startswith("count: "))  # the message: a line of its own
    assert said == "count: relaunch after: interrupted; interruptions 1, failures 0"

    detail = cli("status", "--repo", str(state_repo.path), "--job", "count").stdout
    assert "decision: on box: 14 h of slack covers the expected 3 h of losses" in detail
    assert "budget: $50" in detail and "ETA: 2027-01-01 10:20 UTC" in detail
    box = next(x for x in detail.splitlines() if "│ box " in x)
    spot = next(x for x in detail.splitlines() if "│ spot " in x)
    assert "3.9 h" in box and "$7.80" in box and "measured" in box and "borrowed" not in box
    assert "4.5 h" in spot and "$1.40" in spot and "borrowed" in spot
    one = json.loads(cli("status", "--repo", str(state_repo.path), "--job", "count", "--json").stdout)
    assert one["providers"]["spot"] == {"hours": 4.5, "cost_usd": 1.4, "measured": False}
    assert one["budget_usd"] == 50 and one["placement"] == "box"
    missing = cli("status", "--repo", str(state_repo.path), "--job", "nope", check=False)
    assert missing.returncode == 1 and "no job named nope" in missing.stderr


def test_plan_shows_projected_cost_and_eta_or_why_not(state_repo: StateRepoFixture, tmp_path: Path) -> None:
    seed(state_repo, tmp_path)
    lines = cli("plan", "--repo", str(state_repo.path)).stdout.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("  count: "))
    assert lines[at + 1].startswith("    forecast: $") and "projected ($3.20 spent), ETA 20" in lines[at + 1]
    assert "UTC, on track (" in lines[at + 1]
    # The planner's own figure, not the recorded one: $3.20 spent plus the steps left at 15 steps an hour
    # on a $2/h box (30 by the status; 60 by run storage, which holds no checkpoint here) and the
    # changeover of a launch, to two significant figures.
    projected = float(lines[at + 1].split("forecast: $")[1].split(" ")[0])
    assert 7.2 <= projected <= 12
    at = next(i for i, x in enumerate(lines) if x.startswith("  fresh: "))
    assert lines[at + 1] == ("    forecast: $0.00 spent; cost and ETA unknown (rate not measured yet: less than "
                             "15 min of attempt time with progress)")
    assert any(x.startswith("- launch ") for x in lines)  # the existing lines stay


def test_a_real_tick_writes_the_new_columns_to_the_status_readme(state_repo: StateRepoFixture) -> None:
    state_repo.write("desired/count.yaml", job("count", counter(1.0)))
    state_repo.commit("add count")
    report = Reconciler(state_repo.path).tick()
    assert report.statuses["count"].forecast is not None
    index = (state_repo.path / "status" / "README.md").read_text()
    assert "| ETA (UTC) | spent / projected | risk | message |" in index
    row = next(x for x in index.splitlines() if x.startswith("| count |"))
    assert "| not measured | $0.00 / ? |" in row
    recorded = yaml.safe_load(state_repo.status_text("count"))
    assert recorded["forecast"]["note"].startswith("rate not measured yet")
