"""bench/policy_cost.py at its smallest: the situations of a real run, each decided by both
policies (the lookahead also with short room periods on spot), a table row a deadline and the
summary line. No timing is checked."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"\| 1 h \| (\S+) W \| (\d+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| (\d+)x \| ([\d.]+) \| ([\d.]+) \|")
LINE = re.compile(r"lookahead_ms_per_call=([\d.]+) lookahead_vs_rules=(\d+) lookahead_short_ms_per_call=([\d.]+)")


def test_the_smallest_policy_cost_bench_times_both_policies_on_every_deadline() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "policy_cost.py"), "--hours", "1", "--traces", "1",
                          "--repeat", "1"], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = ROW.findall(res.stdout)
    assert [r[0] for r in rows] == ["1.1", "1.5", "2"], res.stdout
    assert all(int(r[1]) > 0 for r in rows), "every run handed the policy situations to decide"
    assert LINE.fullmatch(res.stdout.strip().splitlines()[-1]), res.stdout
