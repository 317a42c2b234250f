"""bench/forecast.py in its smallest quick form: one trace kept aside, the coverage line with numbers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"coverage_p50=(\d\.\d\d) coverage_p90=(\d\.\d\d)")


def test_quick_run_on_the_smallest_case_ends_with_the_coverage_line() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "forecast.py"), "--quick", "--only-check",
                          "--traces", "1", "--futures", "100"], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    last = res.stdout.strip().splitlines()[-1]
    match = LINE.fullmatch(last)
    assert match, last
    p50, p90 = (float(v) for v in match.groups())
    assert 0.0 <= p50 <= p90 <= 1.0  # shares of the same outcomes, P90 at or above P50
