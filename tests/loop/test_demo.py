"""The README's demo command, end to end: chaos on, the job succeeds, the last line sums it up."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def test_demo_succeeds_under_chaos_and_prints_the_summary_last(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "reconciler", "demo", "--dir", str(tmp_path / "demo"), "--seed", "7",
         "--steps", "200"],
        capture_output=True, text=True, timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    last = res.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"demo: succeeded: attempts=(\d+) interruptions=(\d+) lost_steps=(\d+)", last)
    assert m, last
    attempts, interruptions = int(m[1]), int(m[2])
    assert interruptions >= 1 and attempts == interruptions + 1
    assert "final parameters equal an uninterrupted run: yes" in res.stdout
    assert "killed by SIGKILL" in res.stdout  # the git log of status commits is shown
