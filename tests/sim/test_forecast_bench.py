"""bench/forecast.py in its smallest quick form: one trace kept aside and one seed of each known rate
of the simulator, the coverage lines with numbers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"coverage_p50=(\d\.\d\d) coverage_p90=(\d\.\d\d)")
SIM_LINE = re.compile(r"simulator: coverage_p50=(\d\.\d\d) coverage_p90=(\d\.\d\d)")
SIM_ROW = re.compile(r"\| simulator, known rates: MTBF (\d+) h \| 8 \| (\d+) \|")


def test_quick_run_on_the_smallest_case_ends_with_the_coverage_line() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "forecast.py"), "--quick", "--only-check",
                          "--traces", "1", "--seeds", "1", "--futures", "100"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.strip().splitlines()
    match = LINE.fullmatch(lines[-1])
    assert match, lines[-1]
    p50, p90 = (float(v) for v in match.groups())
    assert 0.0 <= p50 <= p90 <= 1.0  # shares of the same outcomes, P90 at or above P50
    # the simulator under known rates: a row per rate, each case forecast and then run to its end
    rows = {int(m.group(1)): int(m.group(2)) for m in map(SIM_ROW.match, lines) if m}
    assert rows == {2: 1, 6: 1, 24: 1}, res.stdout
    sim = SIM_LINE.fullmatch(lines[-2])
    assert sim, lines[-2]
    s50, s90 = (float(v) for v in sim.groups())
    assert 0.0 <= s50 <= s90 <= 1.0


def _bench() -> Any:
    """bench/forecast.py as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_forecast", ROOT / "bench" / "forecast.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up
    spec.loader.exec_module(bench)
    return bench


def test_the_table_counts_ties_with_the_quantile_as_at_or_under_and_not_as_under() -> None:
    """An uninterrupted finish is the same time in the futures and the outcome: both shares are given."""
    bench = _bench()
    rows = [{"p50": 10.0, "p90": 20.0, "c50": 1.0, "c90": 2.0, "outcome": x, "cost": 1.0, "hours": 8}
            for x in (5.0, 10.0, 10.0, 30.0)]
    assert bench.coverage(rows)[:2] == (0.75, 0.75)
    assert bench.under(rows) == (0.25, 0.75)


def test_by_state_splits_each_trace_set_into_cutoffs_running_and_waiting() -> None:
    """`--by-state`: the forecast errs one way with a machine running and the other right after an
    interruption (docs/performance.md), which the whole set's line hides."""
    bench = _bench()
    row = {"p50": 10.0, "p90": 20.0, "c50": 1.0, "c90": 2.0, "cost": 1.0, "hours": 8.0}
    rows = [{**row, "outcome": 5.0, "state": "running"}, {**row, "outcome": 15.0, "state": "running"},
            {**row, "outcome": 25.0, "state": "waiting"}]
    lines = bench.table({"check": rows}, by_state=True)
    assert lines[2].startswith("| check | 8 | 3 | 0.33 | 0.67 |")
    assert lines[3].startswith("| check: running | 8 | 2 | 0.50 | 1.00 |")
    assert lines[4].startswith("| check: waiting | 8 | 1 | 0.00 | 0.00 |")
    assert len(bench.table({"check": rows})) == 3


def test_the_quick_run_ci_makes_meets_the_coverage_goal() -> None:
    """Issue 26's goal, on what CI runs (no traces clone: the synthetic traces kept aside, 120
    cutoffs): P50 about 0.5 (here within 0.45-0.55) and P90 within 0.85-0.97. Deterministic: seeded
    traces and futures. It read 0.49 and 0.88 when the record began to age by the time watched,
    0.42 and 0.86 before."""
    env = {k: v for k, v in os.environ.items() if k != "SPOT_TRACES"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "forecast.py"), "--quick", "--only-check",
                          "--seeds", "1"], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    match = LINE.fullmatch(res.stdout.strip().splitlines()[-1])
    assert match, res.stdout
    p50, p90 = (float(v) for v in match.groups())
    assert 0.45 <= p50 <= 0.55 and 0.85 <= p90 <= 0.97, res.stdout


def test_the_spread_cost_bench_times_every_job_and_ends_with_its_line() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "spread_cost.py"), "--jobs", "3", "--rounds", "1",
                          "--futures", "50"], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    match = re.fullmatch(r"spread_cpu_seconds=(\d+\.\d+) jobs=3 attempts=(\d+) futures=50",
                         res.stdout.strip().splitlines()[-1])
    assert match and int(match.group(2)) > 3, res.stdout  # each job holds several attempts
