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
    history = f"git -C {tmp_path / 'demo' / 'repo'} log -p -- status/train-demo.yaml"
    assert history in res.stdout.splitlines()[-2], res.stdout[-500:]  # on one line, to copy, even in a pipe


def test_demo_attempt_table_keeps_rows_short_at_80_columns() -> None:
    from rich.console import Console

    from reconciler.demo.local import attempts_table
    from status.models import Attempt, JobStatus, Outcome

    detail = "interrupted: killed by SIGKILL, not by the reconciler, after a new checkpoint"  # as the demo says
    st = JobStatus(job="train-demo", attempts=[
        Attempt(epoch=n, provider="local", worker=f"w{n}", started=0.0, ended=1.0, outcome=Outcome.INTERRUPTION,
                detail=detail, step_start=40 * (n - 1), step_end=40 * n, steps_lost=5) for n in (1, 2)])
    console = Console(width=80, record=True)
    console.print(attempts_table(st))
    out = console.export_text()
    rows = [line for line in out.splitlines() if line.strip()]
    assert "…" not in out and detail in " ".join(out.split()), out
    assert len(rows) <= 2 + 2 * 2, out  # the header, its rule, then at most two lines a row


def test_a_demo_folder_that_cannot_be_made_is_one_error_sentence(tmp_path: Path) -> None:
    from rich.console import Console

    from reconciler.demo.local import run_demo

    (tmp_path / "a-file").write_text("not a folder")
    console = Console(width=400, record=True)
    assert run_demo(tmp_path / "a-file" / "demo", console=console) == 2
    said = console.export_text().strip()
    assert said == (f"error: cannot create the demo folder at {tmp_path / 'a-file' / 'demo'}: Not a directory; "
                    "pass --dir a folder you can write to"), said
