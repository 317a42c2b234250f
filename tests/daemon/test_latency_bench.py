"""bench/latency.py end to end in its quick form: a real origin, a real daemon with a webhook and
one polling, real pushes and real local workers; the result line keeps its shape."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"webhook_p50_s=(\S+) webhook_p99_s=(\S+) poll_p50_s=(\S+) relaunch_p99_s=(\S+) "
                  r"user_push_rejections=(\d+)")


def test_quick_run_launches_every_push_and_ends_with_the_result_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
           "TMPDIR": str(tmp_path)}
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "latency.py"), "--quick", "--pushes", "2",
                          "--kills", "1", "--poll-tick", "1"], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    last = res.stdout.strip().splitlines()[-1]
    match = LINE.fullmatch(last)
    assert match, last
    webhook_p50, webhook_p99, poll_p50, relaunch_p99 = (float(v) for v in match.groups()[:4])
    # Every push was launched and every kill relaunched within the bench's waits (a miss reads inf).
    assert all(math.isfinite(v) and v >= 0 for v in (webhook_p50, webhook_p99, poll_p50, relaunch_p99)), last
    assert webhook_p50 <= webhook_p99
    assert res.stdout.count("webhook push ") == 2 and res.stdout.count("poll push ") == 2
    assert "SIGKILL webhook-00: relaunch requested" in res.stdout
    # The rejections on the line are those the pushes met, one by one.
    assert int(match.group(5)) == sum(int(n) for n in re.findall(r"rejected pushes (\d+)", res.stdout))
