"""`reconciler status` as a newcomer sees it: in an 80-column terminal, piped, and in its
--output forms (wide, plain, json)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from status.models import (
    Attempt,
    Forecast,
    JobStatus,
    Phase,
    Progress,
    ProviderLedger,
    render_ledger,
    render_status,
)
from status.room import RoomEvidence, render_room
from tests import zygote
from tests.conftest import StateRepoFixture
from tests.daemon.test_loop_local import counter, job

LONG = ("attempt 3 running on local/train-demo.r-61a74c3b2ccb.e3 (relaunch after: interrupted: the worker "
        "was killed by SIGKILL, not by the reconciler; 11 steps lost since the last checkpoint at step 40)")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def recorded_repo(state_repo: StateRepoFixture) -> None:
    """Two jobs with recorded status as a running daemon leaves it: a long message and a forecast."""
    for name in ("train-demo", "eval-nightly"):
        state_repo.write(f"desired/{name}.yaml", job(name, counter(1.0), "deadline: '2030-01-04T18:30:00Z'"))
    now = time.time()
    st = JobStatus(job="train-demo", phase=Phase.RUNNING, run_id="r-61a74c3b2ccb", message=LONG,
                   progress=Progress(step=40, target=60), total_attempts=3, interruptions=2,
                   attempts=[Attempt(epoch=3, provider="local", worker="w3", started=now)],
                   forecast=Forecast(rate_steps_per_hour=900.0, eta=now + 3600, spent_usd=0.12,
                                     projected_cost_usd=3.4, slack_hours=14.0, risk="on track"))
    state_repo.write("status/train-demo.yaml", render_status(st))
    state_repo.write("status/eval-nightly.yaml", render_status(JobStatus(
        job="eval-nightly", phase=Phase.PENDING, message="waiting for a provider: local is at capacity")))
    state_repo.write("status/providers.yaml", render_ledger([ProviderLedger(
        provider="kaggle-free", type="kaggle", unit="gpu-hours", remaining=21.5, resets_at=now + 86400,
        period_start=now - 86400, worker_hours=8.5, gpu_hours=8.5)]))
    state_repo.write("status/room.yaml", render_room({"kaggle-free": RoomEvidence(
        seen_at=now, had_room=True, room_periods=10.0, short_room_periods=3.0, short_within_seconds=1200.0,
        mean_wait_hours=1.3)}))
    state_repo.commit("jobs and their recorded status")


def in_terminal(args: list[str], columns: int = 80) -> str:
    """The command's output in a pseudo-terminal `columns` wide (what a person's terminal shows)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: its stdout is the terminal
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
        os.execvpe(sys.executable, [sys.executable, "-m", "reconciler", *args], env)
    chunks = []
    while True:
        ready, _, _ = select.select([fd], [], [], 60)
        if not ready:
            break
        try:
            data = os.read(fd, 65536)
        except OSError:  # the child ended: EIO on Linux
            break
        if not data:
            break
        chunks.append(data)
    os.waitpid(pid, 0)
    return ANSI.sub("", b"".join(chunks).decode()).replace("\r\n", "\n")


def table_rows(out: str, job_name: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(job_name)]


def test_status_fits_an_80_column_terminal_without_cutting_a_cell(state_repo: StateRepoFixture) -> None:
    recorded_repo(state_repo)
    out = in_terminal(["status", "--repo", str(state_repo.path)])
    assert "…" not in out, out
    assert all(len(line) <= 80 for line in out.splitlines()), out
    assert "Running" in out and "Pending" in out and "40/60 67%" in out, out
    assert "21.5 gpu-hours" in out and "8.5 h (8.5 GPU h)" in out, out  # the ledger too, whole
    # and what the daemon has seen of the provider's room (status/room.yaml), wrapped but whole
    assert "kaggle-free: without room for 1.3 h on average; 30 % of room periods end within 20 min" in " ".join(
        out.split()), out
    row = [line for line in out.splitlines() if line.startswith("train-demo ")]
    assert len(row) == 1 and "Running" in row[0], out  # the row is one line, its cells whole
    said = " ".join(out.split())  # the message, wrapped on lines of its own, is all there
    assert " ".join(LONG.split()) in said and "on track (14 h slack, due 2030-01-04 18:30)" in said


def test_status_piped_is_as_readable_as_in_a_terminal(state_repo: StateRepoFixture) -> None:
    recorded_repo(state_repo)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    out = zygote.run([sys.executable, "-m", "reconciler", "status", "--repo", str(state_repo.path)],
                     capture_output=True, text=True, env=env, check=True).stdout
    assert "…" not in out and "Running" in out and len(table_rows(out, "train-demo ")) == 1, out


def test_status_output_wide_plain_and_json(state_repo: StateRepoFixture) -> None:
    recorded_repo(state_repo)

    def status(*args: str) -> str:
        return zygote.run([sys.executable, "-m", "reconciler", "status", "--repo", str(state_repo.path),
                           *args], capture_output=True, text=True, check=True).stdout

    wide = status("-o", "wide")
    row = [line for line in wide.splitlines() if "train-demo" in line]
    assert len(row) == 1 and LONG in row[0] and "interruptions" in wide, wide  # one line, however long
    plain = status("--output", "plain").splitlines()
    assert plain[0].split("\t")[:3] == ["job", "phase", "progress"]
    cells = dict(zip(plain[0].split("\t"), next(x for x in plain if x.startswith("train-demo")).split("\t"),
                     strict=True))
    assert cells["phase"] == "Running" and cells["message"] == LONG and cells["interruptions"] == "2"
    rows = json.loads(status("-o", "json"))
    assert rows == json.loads(status("--json")) and {r["job"] for r in rows} == {"train-demo", "eval-nightly"}
    assert json.loads(status("--job", "train-demo", "-o", "json"))["job"] == "train-demo"


def test_status_providers_gives_the_ledger_and_the_room_seen_as_text_and_as_json(
        state_repo: StateRepoFixture) -> None:
    """For scripts: `status --json` is a list of jobs; `--providers` gives what the daemon knows of
    each provider instead, the ledger with its times in ISO 8601 and the room with its words."""
    def status(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return zygote.run([sys.executable, "-m", "reconciler", "status", "--repo", str(state_repo.path), *args],
                          capture_output=True, text=True, check=check)

    empty = status("--providers")
    assert "no provider ledger yet" in empty.stdout and "train-demo" not in empty.stdout
    assert json.loads(status("--providers", "--json").stdout) == {"providers": [], "room": {}}
    recorded_repo(state_repo)
    text = " ".join(status("--providers").stdout.split())
    assert "kaggle-free" in text and "21.5 gpu-hours" in text and "train-demo" not in text, text
    assert "30 % of room periods end within 20 min" in text
    data = json.loads(status("--providers", "-o", "json").stdout)
    (row,) = data["providers"]
    assert row["provider"] == "kaggle-free" and row["remaining"] == 21.5 and "T" in row["resets_at"]
    room = data["room"]["kaggle-free"]
    assert room["room_periods"] == 10.0 and "T" in room["seen_at"] and room["words"].startswith("without room")
    both = status("--providers", "--job", "train-demo", check=False)
    assert both.returncode != 0 and "pass one of them" in both.stderr


def test_status_help_names_every_option(state_repo: StateRepoFixture) -> None:
    out = zygote.run([sys.executable, "-m", "reconciler", "status", "--help"], capture_output=True, text=True,
                     env={**os.environ, "COLUMNS": "200"}, check=True).stdout
    json_line = next(line for line in out.splitlines() if "--json" in line)
    assert "the same as --output json" in json_line and "wide" in out and "plain" in out
    assert Path(state_repo.path).exists()
