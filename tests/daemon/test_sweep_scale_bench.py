"""bench/sweep_scale.py at its smallest: a sweep in a real git repository is planned, launched,
ticked steadily and shown by `status`, and the run ends with the summary line. No timing is
checked, only that every measure ran and said what it saw."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"sweep_scale plan_exponent=(\S+) tick_exponent=(\S+) status_exponent=(\S+)")
SIZE = re.compile(r"# (\d+) members: .*; (\d+) launches planned, (\d+) running, \d+ status rows \((\d+) Running\), "
                  r"(\d+) steady status commits, (\d+) tick errors")


def test_smallest_sweeps_run_every_measure_and_end_with_the_summary_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
           "TMPDIR": str(tmp_path)}
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "sweep_scale.py"), "--sizes", "2,4", "--repeat", "1",
                          "--steady", "1"], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    last = res.stdout.strip().splitlines()[-1]
    match = LINE.fullmatch(last)
    assert match, last
    assert all(math.isfinite(float(v)) for v in match.groups()), last
    sizes = [tuple(int(x) for x in m.groups()) for m in SIZE.finditer(res.stderr)]
    # plan launches every member, the first tick did, status lists each as Running, a steady tick
    # commits nothing and no tick had an error.
    assert sizes == [(2, 2, 2, 2, 0, 0), (4, 4, 4, 4, 0, 0)], res.stderr
    # Both tables (wall and CPU) have a row per size.
    assert res.stdout.count("| 2 (1x) |") == 2 and res.stdout.count("| 4 (2x) |") == 2, res.stdout
    assert not list(tmp_path.glob("sweep-scale-*")), "the bench leaves no repository behind"
