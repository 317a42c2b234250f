"""`reconciler demo --scenario week`: the simulated week meets its deadline on cheap capacity, says
so in its last line, and costs less than the same job on the on-demand machine alone."""

from __future__ import annotations

import os
import re
import sys

import pytest
from rich.console import Console

from reconciler.demo.week import Week, WeekRun, hours_of, render, simulate
from tests import zygote

SUMMARY = re.compile(r"deadline (met|missed): finished (\w{3} \d\d:\d\d) \((\d+\.\d) h (before|after) the deadline\), "
                     r"cost \$(\d+\.\d\d), on-demand only would cost \$(\d+\.\d\d)")


@pytest.fixture(scope="module")
def week_runs() -> tuple[WeekRun, WeekRun]:
    week = Week()
    return simulate(week), simulate(week, ondemand_only=True)


def test_the_week_is_met_on_free_and_spot_capacity_for_a_fraction_of_on_demand(
        week_runs: tuple[WeekRun, WeekRun]) -> None:
    run, base = week_runs
    week = run.week
    assert run.phase == "Succeeded" and run.finished is not None and run.finished <= run.deadline
    held = hours_of(run)
    assert held.get("kaggle", 0.0) <= week.kaggle_quota_hours + 0.01  # the free quota is not overdrawn
    assert len([p for p, h in held.items() if h > 1.0]) >= 2
    assert set(hours_of(base)) == {"ondemand"}
    # the comparison is what 60 h (plus checkpoints and the launch) cost on the on-demand machine
    assert week.job_hours * week.ondemand_price <= base.cost <= 1.2 * week.job_hours * week.ondemand_price
    assert run.cost < base.cost / 2


def test_the_output_shows_each_hour_s_provider_and_ends_with_the_summary(
        week_runs: tuple[WeekRun, WeekRun]) -> None:
    console = Console(width=100, record=True, color_system=None)
    line = render(*week_runs, console)
    text = console.export_text()
    strips = [re.sub(r"finished.*", "", x) for x in re.findall(r"^  \w{3}   job(.*)$", text, re.M)]
    assert len(strips) == 5  # Monday to Friday, the deadline at Saturday 00:00 (a day after the finish is blank)
    letters = set("".join(strips)) - {" ", "."}
    assert len(letters) >= 2, strips
    assert "on vast:" in text  # the policy's reasoning is shown when it changes
    m = SUMMARY.fullmatch(line)
    assert m, line
    assert m[1] == "met" and m[4] == "before"
    assert float(m[5]) < float(m[6])


def test_the_cli_runs_the_week_and_keeps_chaos_as_the_default() -> None:
    res = zygote.run([sys.executable, "-m", "reconciler", "demo", "--scenario", "week"],
                     capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    assert lines[0].startswith("Simulated providers.")
    assert SUMMARY.fullmatch(lines[-1]), lines[-1]
    assert "launched" not in res.stderr  # the loop's log lines stay out of the story
    helped = zygote.run([sys.executable, "-m", "reconciler", "demo", "--help"], capture_output=True, text=True,
                        timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert re.search(r"--scenario\s+<chaos\|week>.*\[default: chaos\]", helped.stdout, re.S), helped.stdout
