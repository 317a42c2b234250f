"""bench/mtbf.py end to end in its quick form: the real tick in simulated time on a provider that
fails every minute and then every hour; the MTBF the planner learns follows it, and the workers'
useful fraction with it reaches the goal against Daly's interval with the true rate."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"learned_vs_true_after_10=(\S+) every_minute=(\S+) every_hour=(\S+)")


def told(stdout: str, phase: str) -> list[float]:
    """The MTBF told after the phase's 1st, 5th and 10th interruption, from its table row."""
    row = next(line for line in stdout.splitlines() if line.startswith(f"| {phase} |"))
    return [float(x.replace(",", "")) for x in row.split("|")[3].split("/")]


def test_quick_run_learns_each_rate_and_meets_the_goal_after_ten_interruptions() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "mtbf.py"), "--quick"], capture_output=True,
                         text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    match = LINE.fullmatch(res.stdout.strip().splitlines()[-1])
    assert match, res.stdout
    worst, minute, hour = (float(v) for v in match.groups())
    assert worst == min(minute, hour) >= 0.95, res.stdout
    first, _, tenth = told(res.stdout, "every minute")
    assert tenth <= 10 * 60 and tenth < first  # the 6 h prior overturned: within ten times the true minute
    first, _, tenth = told(res.stdout, "every hour")
    assert tenth > 10 * first  # and back up once the provider calms down
    assert "invariant violations: 0 learned, 0 true rate" in res.stdout
