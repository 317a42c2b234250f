"""`reconciler logs` as a user meets it, on a real state repository: the newest attempt by default,
--attempt for an older one, a masked secret, and one-sentence errors for a job, an attempt or a
provider that is not there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import yaml

from adapters.storage import RunFolder
from reconciler.daemon.logs import locate, new_lines
from reconciler.daemon.loop import Reconciler
from status.models import Attempt, JobStatus, Outcome, Phase, render_status
from tests import zygote
from tests.adapters.conftest import free_port
from tests.cli.test_cli import cli
from tests.conftest import StateRepoFixture
from tests.daemon.test_loop_local import job, tick_until

SECRET = "tok3n-canary-77aa11"


def printing_job(name: str) -> str:
    """Prints its token and the attempt's epoch; fails its first attempt, succeeds its second."""
    code = ("import os, sys; print('token', os.environ['API_TOKEN']); epoch = os.environ['RECONCILER_EPOCH']; "
            "print('attempt epoch', epoch, flush=True); "
            "from reconciler.worker import open_run; r = open_run(); "
            "sys.exit(3) if epoch == '1' else r.complete(1)")
    return job(name, [sys.executable, "-c", code], "secrets: [API_TOKEN]\ntarget_steps: 1")


def test_logs_show_the_newest_attempt_and_an_older_one_with_the_secret_masked(
        state_repo: StateRepoFixture) -> None:
    state_repo.write("desired/echo.yaml", printing_job("echo"))
    state_repo.commit("add echo")
    env = {"API_TOKEN": SECRET}
    rec = Reconciler(state_repo.path, environ={**os.environ, **env})
    final = tick_until(rec, lambda r: r.statuses["echo"].phase.terminal)
    assert final.statuses["echo"].phase is Phase.SUCCEEDED and len(final.statuses["echo"].attempts) == 2
    newest = cli("logs", "echo", "--repo", str(state_repo.path), env=env)
    assert "attempt epoch 2" in newest.stdout and "token ***" in newest.stdout
    assert "attempt 2 on local" in newest.stderr
    older = cli("logs", "echo", "--attempt", "1", "--repo", str(state_repo.path), env=env)
    assert "attempt epoch 1" in older.stdout and "attempt epoch 2" not in older.stdout
    assert SECRET not in newest.stdout + newest.stderr + older.stdout + older.stderr


def test_unknown_job_and_missing_attempt_are_one_sentence(state_repo: StateRepoFixture) -> None:
    record(state_repo, "kept", "local")
    res = cli("logs", "nope", "--repo", str(state_repo.path), check=False)
    assert res.returncode == 1 and "error: no job named nope (jobs: kept)" in res.stderr
    res = cli("logs", "kept", "--attempt", "7", "--repo", str(state_repo.path), check=False)
    assert res.returncode == 1
    assert "error: job kept has no attempt 7 (its status keeps attempt 1)" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_provider_that_is_gone_or_unreachable_is_one_sentence(state_repo: StateRepoFixture) -> None:
    record(state_repo, "orphan", "vanished")
    res = cli("logs", "orphan", "--repo", str(state_repo.path), check=False)
    assert res.returncode == 1, res.stdout
    assert "error: provider vanished is no longer defined in desired/ and no stored log exists" in res.stderr
    state_repo.write("desired/box.yaml", yaml.safe_dump({  # an SSH host nobody listens for
        "apiVersion": "reconciler.dev/v1", "kind": "Provider", "metadata": {"name": "cloud"},
        "spec": {"settings": {"type": "ssh", "connect_timeout_seconds": 2,
                              "hosts": [{"name": "box", "address": "127.0.0.1", "port": free_port()}]}}}))
    record(state_repo, "remote", "cloud", worker="box/w-1")
    res = cli("logs", "remote", "--repo", str(state_repo.path), check=False)
    assert res.returncode == 1, res.stdout
    assert "error: provider cloud cannot be reached:" in res.stderr and "Traceback" not in res.stderr, res.stderr


def record(state_repo: StateRepoFixture, name: str, provider: str, worker: str = "w-1") -> None:
    """A committed status with one ended attempt on `provider`, as an earlier daemon left it."""
    att = Attempt(epoch=1, provider=provider, worker=worker, started=1.0e9, ended=1.0e9 + 60,
                  outcome=Outcome.JOB_ERROR, exit_code=1)
    st = JobStatus(job=name, phase=Phase.FAILED, run_id="r-1", attempts=[att], total_attempts=1)
    state_repo.write(f"status/{name}.yaml", render_status(st))
    state_repo.commit(f"status of {name}")


def test_follow_prints_new_lines_and_ctrl_c_stops_it_cleanly(state_repo: StateRepoFixture) -> None:
    code = ("import time\nfor i in range(600):\n    print('tick', i, flush=True)\n    time.sleep(0.2)\n")
    state_repo.write("desired/ticker.yaml", job("ticker", [sys.executable, "-c", code]))
    state_repo.commit("add ticker")
    tick_until(Reconciler(state_repo.path), lambda r: r.statuses["ticker"].phase is Phase.RUNNING)
    proc = zygote.popen([sys.executable, "-m", "reconciler", "logs", "ticker", "-f", "--tail", "1", "--poll",
                         "0.3", "--repo", str(state_repo.path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        text=True)
    try:
        assert proc.stdout is not None
        seen = [proc.stdout.readline() for _ in range(8)]  # more lines than --tail: they came while following
        numbers = [int(line.split()[1]) for line in seen]
        assert numbers == list(range(numbers[0], numbers[0] + 8)), seen  # each once, in order
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr


def test_new_lines_finds_where_a_sliding_window_moved_on() -> None:
    log = [f"l{i}" for i in range(10)]
    assert new_lines([], log[:3]) == log[:3]
    assert new_lines(log[:3], log[:5]) == log[3:5]  # the log grew within the window
    assert new_lines(log[2:6], log[5:9]) == log[6:9]  # the window slid on by three lines
    assert new_lines(log[2:6], log[2:6]) == []  # nothing new
    assert new_lines(log[0:2], log[5:9]) == log[5:9]  # moved on by more than a window: all of it


def test_an_attempt_of_an_earlier_run_is_read_from_that_runs_worker(state_repo: StateRepoFixture) -> None:
    def says(word: str) -> str:
        code = f"print('run', {word!r}, flush=True); from reconciler.worker import open_run; open_run().complete(1)"
        return job("twice", [sys.executable, "-c", code], "target_steps: 1")

    state_repo.write("desired/twice.yaml", says("one"))
    state_repo.commit("first run")
    rec = Reconciler(state_repo.path)
    first = tick_until(rec, lambda r: r.statuses["twice"].phase is Phase.SUCCEEDED).statuses["twice"].run_id
    state_repo.write("desired/twice.yaml", says("two"))
    state_repo.commit("a changed command: a new run")
    tick_until(rec, lambda r: r.statuses["twice"].run_id != first and r.statuses["twice"].phase is Phase.SUCCEEDED)
    assert "run two" in cli("logs", "twice", "--repo", str(state_repo.path)).stdout
    older = cli("logs", "twice", "--attempt", "1", "--repo", str(state_repo.path)).stdout
    assert "run one" in older and "run two" not in older
    assert locate(Reconciler(state_repo.path), "twice", 1).ref.run_id == first  # where Slurm and storage look


def test_a_gone_providers_attempt_is_read_from_the_copy_in_the_run_folder(state_repo: StateRepoFixture) -> None:
    """What a hosted bootstrap leaves in the run folder (logs/e<epoch>.log) outlives its provider."""
    record(state_repo, "orphan", "vanished")
    folder = RunFolder.for_run(state_repo.storage.as_uri(), "orphan", "r-1")
    folder.write_attempt_log(1, f"from the bootstrap\ntoken {SECRET}\n")
    res = cli("logs", "orphan", "--repo", str(state_repo.path), env={"API_TOKEN": SECRET})
    assert res.stdout == "from the bootstrap\ntoken ***\n"


LEAKY = """import base64, html, json, os, sys, time, urllib.parse as u
s = os.environ['API_TOKEN']
print('plain', s)
print('url', u.quote(s, safe='').lower())
print('html', html.escape(s))
print('json', json.dumps(s))
print('basic', base64.b64encode(('user:' + s).encode()).decode(), flush=True)
half = len(s) // 2
sys.stdout.write('split ' + s[:half]); sys.stdout.flush(); time.sleep(0.3)
sys.stdout.write(s[half:] + ' end\\n'); sys.stdout.flush()
sys.exit(1)
"""


def test_a_printed_secret_is_masked_in_the_stored_log_and_in_logs_run_from_an_empty_environment(
        state_repo: StateRepoFixture, local_workdir) -> None:  # type: ignore[no-untyped-def]
    """Masked where the output is captured: the worker's log file on disk holds no form of the secret,
    and `reconciler logs` shows none even from a shell that does not have the secret."""
    from tests.trust.test_redaction import ENCODINGS, HARD

    state_repo.write("desired/box.yaml", yaml.safe_dump({
        "apiVersion": "reconciler.dev/v1", "kind": "Provider", "metadata": {"name": "box"},
        "spec": {"settings": {"type": "local", "workdir": str(local_workdir)}}}))
    state_repo.write("desired/leak.yaml", job("leak", [sys.executable, "-c", LEAKY],
                                              "secrets: [API_TOKEN]\nretry: {max_retries: 0}\n"
                                              "placement: {providers: [box]}"))
    state_repo.commit("a job that prints its secret")
    rec = Reconciler(state_repo.path, environ={**os.environ, "API_TOKEN": HARD})
    tick_until(rec, lambda r: r.statuses["leak"].phase.terminal)
    stored = b"".join(p.read_bytes() for p in local_workdir.rglob("*") if p.is_file())
    assert b"plain ***\nurl ***\nhtml ***\njson \"***\"\n" in stored and b"split *** end\n" in stored
    shown = zygote.run([sys.executable, "-m", "reconciler", "logs", "leak", "--repo", str(state_repo.path)],
                       env={"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
                       capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "split *** end" in shown.stdout, shown.stdout + shown.stderr
    for name, encode in ENCODINGS.items():
        form = encode(HARD)
        assert form.encode() not in stored, f"{name} form in the stored log"
        assert form not in shown.stdout + shown.stderr, f"{name} form in `logs`"
    assert b"dXNlcjp" in stored and "***" in shown.stdout  # the Basic header's "user:" part is kept
