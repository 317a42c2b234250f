"""Status page: time to first byte and weight of the overview for 1,000 jobs (goal: under 500 ms
and under 1 MB), against a baseline measured in the same run: the time to read the statuses alone
(`Reconciler.read_recorded` at HEAD, in a fresh reader, as the page's first request must).

The repository is real git: one manifest and one status file per job, in a mix of phases (running
jobs with attempts across providers, a forecast and a live heartbeat in local run storage, which the
overview reads for every running job), plus a short history. `reconciler serve` runs in its own
process on 127.0.0.1; each figure is the median of `--repeat` requests over one keep-alive-free
connection each. Beside them: the first request after start (the server reads every status before
it listens), the first request after a new status commit, and the gzipped size.

    python bench/page.py [--jobs 1000] [--repeat 15]

Prints a table, then one line:
ttfb_ms=X overview_bytes=Y gzip_bytes=G baseline_ms=Z ratio=R baseline_again_ms=W
cold_ttfb_ms=C after_commit_ttfb_ms=A job_ttfb_ms=J
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from adapters.storage import RunFolder  # noqa: E402
from status.models import Attempt, Forecast, JobStatus, Outcome, Phase, Progress, render_status  # noqa: E402

PHASES = [Phase.RUNNING] * 4 + [Phase.SUCCEEDED] * 3 + [Phase.PENDING, Phase.BACKOFF, Phase.FAILED]
PROVIDERS = ["local", "vast", "runpod", "kaggle"]


def git(path: Path, *args: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "reconciler", "GIT_AUTHOR_EMAIL": "r@localhost",
           "GIT_COMMITTER_NAME": "reconciler", "GIT_COMMITTER_EMAIL": "r@localhost"}
    subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True, env=env)


def status_for(i: int, now: float) -> JobStatus:
    name = f"job-{i:05d}"
    phase = PHASES[i % len(PHASES)]
    target = 10_000
    attempts = []
    t, step = now - 20 * 3600, 0
    for e in range(1, 2 + i % 3):
        last = e == 1 + i % 3
        a = Attempt(epoch=e, provider=PROVIDERS[(i + e) % 4], worker=f"w-{i}-{e}", started=t, step_start=step)
        if not (last and phase is Phase.RUNNING):
            t += 3600
            step += 1500
            a.ended, a.step_end = t, step
            a.outcome = Outcome.SUCCEEDED if last and phase is Phase.SUCCEEDED else Outcome.INTERRUPTION
        attempts.append(a)
    forecast = None
    if phase is Phase.RUNNING:
        forecast = Forecast(rate_steps_per_hour=900.0, eta=now + 8 * 3600, spent_usd=1.5, projected_cost_usd=4.2,
                            risk="on track", slack_hours=30.0)
    return JobStatus(job=name, phase=phase, run_id=f"r{i:08x}", progress=Progress(step=step, target=target),
                     total_attempts=len(attempts), interruptions=len(attempts) - 1, attempts=attempts,
                     forecast=forecast, message=f"{phase.value.lower()} on {attempts[-1].provider}",
                     cost_usd=1.25 if phase.terminal else 0.0)


def build(root: Path, jobs: int) -> Path:
    repo, storage = root / "state", root / "runs"
    (repo / "desired").mkdir(parents=True)
    (repo / "status").mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "reconciler.yaml").write_text(f"storage: file://{storage}\n")
    now = time.time()
    for i in range(jobs):
        st = status_for(i, now)
        (repo / "desired" / f"{st.job}.yaml").write_text(yaml.safe_dump({
            "apiVersion": "reconciler.dev/v1", "kind": "Job", "metadata": {"name": st.job},
            "spec": {"command": ["python", "train.py", str(i)], "target_steps": 10_000}}))
        (repo / "status" / f"{st.job}.yaml").write_text(render_status(st))
        if st.phase is Phase.RUNNING:
            folder = RunFolder.for_run(f"file://{storage}", st.job, st.run_id)
            epoch = folder.bump_lease()
            folder.write_progress(epoch, {"epoch": epoch, "step": st.progress.step + 120, "target": 10_000,
                                          "time": now - 20, "metrics": {}})
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "jobs and status")
    for k in range(5):  # a short history for the job page
        st = status_for(0, now)
        st.message = f"tick {k}"
        (repo / "status" / f"{st.job}.yaml").write_text(render_status(st))
        git(repo, "commit", "-q", "-am", f"job-00000: tick {k}")
    return repo


def baseline_ms(repo: Path, repeat: int) -> tuple[float, float]:
    """Reading every status at HEAD the loop's way (`read_recorded`): in a fresh Reconciler (what the
    page's first read must do), and again in the same one (blobs read again, parses reused)."""
    code = ("import sys, time; sys.path.insert(0, sys.argv[2]); from reconciler.daemon.loop import Reconciler; "
            "r = Reconciler(sys.argv[1]); h = r.repo.head(); t = time.perf_counter(); r.read_recorded(h); "
            "t1 = time.perf_counter(); r.read_recorded(h); print((t1 - t) * 1000, (time.perf_counter() - t1) * 1000)")
    cold, warm = [], []
    for _ in range(max(3, repeat // 3)):
        out = subprocess.run([sys.executable, "-c", code, str(repo), str(ROOT)], check=True, capture_output=True,
                             text=True).stdout.split()
        cold.append(float(out[0]))
        warm.append(float(out[1]))
    return statistics.median(cold), statistics.median(warm)


def fetch(port: int, path: str, gzip: bool = False) -> tuple[float, int, int]:
    """(ms to the first byte of the response, body bytes as sent, status code)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.connect()
    t0 = time.perf_counter()
    conn.request("GET", path, headers={"Accept-Encoding": "gzip"} if gzip else {})
    res = conn.getresponse()
    first = (time.perf_counter() - t0) * 1000
    body = res.read()
    conn.close()
    return first, len(body), res.status


def serve(repo: Path) -> tuple[subprocess.Popen[bytes], int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen([sys.executable, "-m", "reconciler", "serve", "--repo", str(repo), "--listen",
                             f"127.0.0.1:{port}"], env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("reconciler serve did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        repo = build(Path(tmp), args.jobs)
        print(f"built {args.jobs} jobs in {time.perf_counter() - t:.1f} s")
        base, base_warm = baseline_ms(repo, args.repeat)
        proc, port = serve(repo)
        try:
            cold, _, code = fetch(port, "/")
            assert code == 200, code
            warm = [fetch(port, "/") for _ in range(args.repeat)]
            gzipped = fetch(port, "/", gzip=True)[1]
            job = [fetch(port, "/job/job-00000") for _ in range(args.repeat)]
            after = []  # the daemon commits a changed status: the next request reads HEAD anew
            for k in range(max(3, args.repeat // 3)):
                st = status_for(1, time.time())
                st.message = f"changed {k}"
                (repo / "status" / f"{st.job}.yaml").write_text(render_status(st))
                git(repo, "commit", "-q", "-am", f"job-00001: change {k}")
                after.append(fetch(port, "/")[0])
        finally:
            proc.terminate()
            proc.wait(10)
    ttfb = statistics.median(w[0] for w in warm)
    size = warm[-1][1]
    job_ttfb = statistics.median(j[0] for j in job)
    print(f"| {args.jobs:,} jobs | median of {args.repeat} | ")
    print("|---|---|")
    print(f"| baseline: read every status (fresh reader) | {base:.0f} ms |")
    print(f"| baseline: read every status again (same reader, parses reused) | {base_warm:.0f} ms |")
    print(f"| overview, first request after start (statuses read at start-up) | {cold:.0f} ms |")
    print(f"| overview, time to first byte | {ttfb:.0f} ms ({ttfb / base:.2f}x baseline) |")
    css = len((ROOT / "reconciler/web/static/style.css").read_bytes())
    print(f"| overview, page weight (HTML; the stylesheet is {css:,} bytes more) | {size:,} bytes "
          f"({gzipped:,} gzipped) |")
    print(f"| overview, first request after a status commit | {statistics.median(after):.0f} ms "
          f"({statistics.median(after) / base_warm:.1f}x the second read) |")
    print(f"| one job's page (5 status commits), time to first byte | {job_ttfb:.0f} ms |")
    print(f"ttfb_ms={ttfb:.0f} overview_bytes={size} gzip_bytes={gzipped} baseline_ms={base:.0f} "
          f"ratio={ttfb / base:.2f} baseline_again_ms={base_warm:.0f} "
          f"cold_ttfb_ms={cold:.0f} after_commit_ttfb_ms={statistics.median(after):.0f} job_ttfb_ms={job_ttfb:.0f}")


if __name__ == "__main__":
    main()
