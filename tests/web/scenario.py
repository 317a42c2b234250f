"""A state repository for the status page: real git commits of status files, as the loop writes
them, for jobs in every phase, and real run storage (lease, heartbeat, checkpoints, an attempt log).

`train` has a long history: 13 attempts across three providers with every outcome, more than a
status file keeps, so the page must read them from the history. Commit dates follow the attempts.
"""

from __future__ import annotations

import base64
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from adapters import series
from adapters.storage import CheckpointName, RunFolder
from status.models import (
    MAX_ATTEMPTS_KEPT,
    Attempt,
    Forecast,
    JobStatus,
    Outcome,
    Phase,
    Progress,
    Refusal,
    render_status,
)

CANARY = "webcanary-Zq7/x+Kp=4secret"
CANARY_ENV = "WEB_CANARY_TOKEN"
CANARY_FORMS = (CANARY, base64.b64encode(CANARY.encode()).decode())
HTML_JOB = "<img src=x onerror=window.__pwned=1>"
HTML_MESSAGE = "<script>window.__pwned=2</script><b>bold</b> & more"
HOUR = 3600.0
REFUSED_WHY = "local provider 'slurm': cannot create /w/workers: [Errno 20] Not a directory <b>'/w'</b>"

# provider, outcome, steps gained, steps lost (None outcome: the attempt still running)
TRAIN_ATTEMPTS: list[tuple[str, Outcome | None, int, int]] = [
    ("local", Outcome.INTERRUPTION, 300, 40), ("vast", Outcome.SESSION_END, 250, 0),
    ("vast", Outcome.STALLED, 0, 30), ("runpod", Outcome.JOB_ERROR, 100, 20),
    ("local", Outcome.INTERRUPTION, 200, 10), ("runpod", Outcome.INTERRUPTION, 150, 50),
    ("vast", Outcome.JOB_ERROR, 0, 0), ("local", Outcome.SESSION_END, 400, 0),
    ("runpod", Outcome.STALLED, 50, 25), ("vast", Outcome.INTERRUPTION, 300, 60),
    ("local", Outcome.INTERRUPTION, 250, 0), ("runpod", Outcome.CANCELLED, 0, 0), ("vast", None, 0, 0),
]
TARGET = 5000
RUN_ID = "r7f3a9c01"
REMOTE = "git@github.com:example/state.git"  # never contacted: the page only derives commit links from it


def manifest(name: str, target: int, secrets: list[str] | None = None) -> str:
    return yaml.safe_dump({"apiVersion": "reconciler.dev/v1", "kind": "Job", "metadata": {"name": name},
                           "spec": {"command": ["python", "train.py"], "target_steps": target,
                                    **({"secrets": secrets} if secrets else {})}})


@dataclass
class Scenario:
    path: Path
    storage: Path
    start: float
    commits: dict[str, list[str]] = field(default_factory=dict)  # job -> its status commits, oldest first

    def git(self, *args: str, when: float | None = None) -> str:
        stamp = f"@{int(when if when is not None else time.time())} +0000"
        env = {**os.environ, "GIT_AUTHOR_NAME": "reconciler", "GIT_AUTHOR_EMAIL": "reconciler@localhost",
               "GIT_COMMITTER_NAME": "reconciler", "GIT_COMMITTER_EMAIL": "reconciler@localhost",
               "GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp}
        return subprocess.run(["git", "-C", str(self.path), *args], check=True, capture_output=True, text=True,
                              env=env).stdout

    def put(self, st: JobStatus, message: str, when: float | None = None) -> str:
        """Commits one job's status file, as a tick of the loop would."""
        target = self.path / "status" / f"{st.job}.yaml"
        target.parent.mkdir(exist_ok=True)
        kept = st.model_copy(update={"attempts": st.attempts[-MAX_ATTEMPTS_KEPT:]})
        target.write_text(render_status(kept))
        self.git("add", "-A", when=when)
        self.git("commit", "-q", "-m", message, when=when)
        sha = self.git("rev-parse", "HEAD").strip()
        self.commits.setdefault(st.job, []).append(sha)
        return sha


def build(root: Path, hostile: bool = True) -> Scenario:
    """The repository: settings, manifests (`train` names the canary secret), then status history.
    Without `hostile`, no HTML job and no canary in messages (for the README's screenshots)."""
    path, storage = root / "state", root / "runs"
    path.mkdir(parents=True)
    start = float(int(time.time() - 14 * HOUR))
    sc = Scenario(path, storage, start)
    sc.git("init", "-q", "-b", "main")
    sc.git("remote", "add", "origin", REMOTE)
    (path / "reconciler.yaml").write_text(f"storage: file://{storage}\ntick_seconds: 5\n")
    (path / "desired").mkdir()
    (path / "desired" / "train.yaml").write_text(manifest("train", TARGET, [CANARY_ENV]))
    (path / "desired" / "new-job.yaml").write_text(manifest("new-job", 100))
    if hostile:
        (path / "desired" / "broken.yaml").write_text("apiVersion: reconciler.dev/v1\nkind: Job\nmetadata: {}\n")
    sc.git("add", "-A", when=start - 60)
    sc.git("commit", "-q", "-m", "jobs", when=start - 60)
    _train_history(sc)
    _one_per_phase(sc, hostile)
    _storage(sc)
    return sc


def _train_history(sc: Scenario) -> None:
    st = JobStatus(job="train", phase=Phase.LAUNCHING, run_id=RUN_ID, manifest="desired/train.yaml",
                   progress=Progress(step=0, target=TARGET))
    step, t = 0, sc.start
    for epoch, (provider, outcome, gained, lost) in enumerate(TRAIN_ATTEMPTS, start=1):
        a = Attempt(epoch=epoch, provider=provider, worker=f"{provider}-w{epoch}", started=t, step_start=step)
        st.attempts.append(a)
        st.phase, st.total_attempts, st.message = Phase.RUNNING, epoch, f"attempt {epoch} running on {provider}"
        sc.put(st, f"train: Running on {provider} (e{epoch})", when=t + 60)
        if outcome is None:
            break
        t += HOUR * (0.5 + (epoch % 3) * 0.25)
        step += gained
        a.ended, a.outcome, a.step_end, a.steps_lost = t, outcome, step, lost
        a.cost_usd = 0.0 if provider == "local" else round(0.4 * HOUR / 3600, 2)
        a.exit_code = 1 if outcome is Outcome.JOB_ERROR else None
        st.progress = Progress(step=step, target=TARGET)
        st.steps_lost += lost
        st.interruptions += outcome in (Outcome.INTERRUPTION, Outcome.SESSION_END)
        st.failures += outcome.charged
        st.phase = Phase.BACKOFF if outcome.charged else Phase.LAUNCHING
        st.message = f"attempt {epoch} on {provider}: {outcome.value}"
        sc.put(st, f"train: {outcome.value} on {provider} (e{epoch})", when=t)
        t += 300
    st.forecast = Forecast(rate_steps_per_hour=260.0, eta=time.time() + 11 * HOUR, spent_usd=3.2,
                           projected_cost_usd=7.9, risk="on track", slack_hours=20.0,
                           decision="vast: cheapest capacity under the price cap")
    sc.put(st, "train: forecast", when=time.time() - 120)


def _one_per_phase(sc: Scenario, hostile: bool) -> None:
    now = time.time() - 600
    def att(epoch: int, outcome: Outcome | None, provider: str = "local") -> Attempt:
        return Attempt(epoch=epoch, provider=provider, worker=f"w{epoch}", started=now - 3 * HOUR + epoch * 600,
                       ended=None if outcome is None else now - 3 * HOUR + epoch * 600 + 500, outcome=outcome,
                       step_start=0, step_end=None if outcome is None else 10 * epoch)
    phases = {
        "pending-job": JobStatus(job="pending-job", message="waiting: slurm is cooling down",
                                 refusals=[Refusal(provider="slurm", refused=now + 600 - ago, error=REFUSED_WHY)
                                           for ago in (600, 400, 200, 30)]),
        "launching-job": JobStatus(job="launching-job", phase=Phase.LAUNCHING, run_id="r1", total_attempts=1,
                                   attempts=[att(1, None, "slurm")], message="launched on slurm"),
        "backoff-job": JobStatus(job="backoff-job", phase=Phase.BACKOFF, run_id="r2", failures=1, total_attempts=1,
                                 attempts=[att(1, Outcome.JOB_ERROR)], message="exit 1; retrying in 60 s"),
        "succeeded-job": JobStatus(job="succeeded-job", phase=Phase.SUCCEEDED, run_id="r3", total_attempts=1,
                                   progress=Progress(step=100, target=100), cost_usd=1.25,
                                   attempts=[att(1, Outcome.SUCCEEDED, "vast")], message="done"),
        "failed-job": JobStatus(job="failed-job", phase=Phase.FAILED, run_id="r4", failures=3, total_attempts=3,
                                attempts=[att(e, Outcome.JOB_ERROR) for e in (1, 2, 3)],
                                message=f"retry budget spent; token {CANARY_FORMS[1]}",
                                log_tail=f"Traceback (most recent call last):\n  File \"train.py\", line 3\n"
                                         f"ValueError: bad batch (key={CANARY})\n"),
        "suspended-job": JobStatus(job="suspended-job", phase=Phase.SUSPENDED, run_id="r5", message="suspended"),
        "cancelled-job": JobStatus(job="cancelled-job", phase=Phase.CANCELLED, run_id="r6", message="manifest deleted"),
        HTML_JOB: JobStatus(job=HTML_JOB, phase=Phase.PENDING, message=HTML_MESSAGE),
    }
    if not hostile:
        del phases[HTML_JOB]
        phases["failed-job"].message = "retry budget spent: 3 failures in a row"
        phases["failed-job"].log_tail = ("Traceback (most recent call last):\n  File \"train.py\", line 3\n"
                                         "ValueError: bad batch\n")
    for st in phases.values():
        sc.put(st, f"{st.job}: {st.phase.value}", when=now)


def _storage(sc: Scenario) -> None:
    """The running attempt's heartbeat and checkpoints; the launching job's log copy holds the canary."""
    folder = RunFolder.for_run(f"file://{sc.storage}", "train", RUN_ID)
    epoch = 0
    while epoch < len(TRAIN_ATTEMPTS):
        epoch = folder.bump_lease()
    now = time.time()
    durable = sum(g for _, o, g, _ in TRAIN_ATTEMPTS if o is not None)
    for i, step in enumerate((durable + 40, durable + 80)):
        folder.commit_checkpoint(epoch, CheckpointName(step, epoch), {"files": {}, "time": now - 300 + 120 * i})
    folder.write_progress(epoch, {"epoch": epoch, "step": durable + 95, "target": TARGET, "time": now - 30,
                                  "metrics": {"loss": 0.42}})
    losses = series.Series()  # what the worker's heartbeats reported over the attempt (adapters/series.py)
    for step in range(durable + 5, durable + 96, 5):
        losses.add(step, {"loss": round(0.42 + 0.3 * (durable + 95 - step) / 95 + 0.02 * (step % 3), 4)})
    series.write(folder.store, epoch, losses)
    other = RunFolder.for_run(f"file://{sc.storage}", "launching-job", "r1")
    other.write_attempt_log(1, f"starting\nconnecting with password {CANARY}\n")
